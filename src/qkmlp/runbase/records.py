"""Run records on disk, and the resumable record grid the pipelines share.

A grid is a list of jobs, each named by the file its record is stored in (one JSON file per
finished run, in one folder). A job whose record exists is never run again, so a grid that
stopped resumes where it stopped, on this machine or a fresh clone with the records
committed. :func:`run_jobs` runs one worker's share of a grid:

- independent processes (``world`` parts sharing the folder): a part takes the jobs
  i with i mod world = rank, claiming each with a claim file (:meth:`RecordFolder.claim`);
  with ``take_over`` a part that has finished its share takes over the jobs the others
  have not started (from the ends of their queues), so no part idles while another still
  has a queue; then it waits until every record of the grid is in the folder;
- ``torchrun`` ranks (``gather``): each rank runs its share and the records are exchanged
  collectively (``gather(mine) -> all``), no folder needed.

Every record is written atomically (a temporary file, then a rename), so a killed run
leaves no half record.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["save_record", "load_record", "RecordFolder", "run_jobs"]

# Claims this process holds now (so that two grids in one process, e.g. threads, respect
# each other's claims, while a claim this process left behind after an error is taken over).
_HELD: set = set()


def save_record(path, record: dict, **dumps) -> Path:
    """Write ``record`` as JSON to ``path`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, **dumps))
    os.replace(tmp, path)
    return path


def load_record(path) -> dict:
    """The record stored at ``path``."""
    return json.loads(Path(path).read_text())


class RecordFolder:
    """A folder of per-job records ``<name>`` (file names ending in ``.json``), with claims.

    A claim ``<name without .json>.claim`` holds "host pid" of the process running the job.
    A claim left by a dead process on this host (or by this process itself, after an
    earlier grid in it stopped with an error) is taken over; a live claim (a running job of
    this process included), or one from another host, is respected.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.folder / name

    def has(self, name: str) -> bool:
        return self.path(name).exists()

    def load(self, name: str) -> dict:
        return load_record(self.path(name))

    def save(self, name: str, record: dict) -> Path:
        out = save_record(self.path(name), record)
        self.release(name)
        return out

    def _claim_path(self, name: str) -> Path:
        return self.path(name).with_suffix(".claim")

    def claim(self, name: str) -> bool:
        """Claim job ``name`` for this process (atomically); False if another live process has it."""
        claim = self._claim_path(name)
        for _ in range(2):
            try:
                fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if not self._stale(claim):
                    return False
                claim.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{socket.gethostname()} {os.getpid()}")
            _HELD.add(str(claim))
            return True
        return False

    def release(self, name: str) -> None:
        claim = self._claim_path(name)
        claim.unlink(missing_ok=True)
        _HELD.discard(str(claim))

    @staticmethod
    def _stale(claim: Path) -> bool:
        try:
            host, pid = claim.read_text().split()
            pid = int(pid)
        except (OSError, ValueError):
            return False
        if host != socket.gethostname():
            return False
        if pid == os.getpid():
            return str(claim) not in _HELD        # held by a running job of this process, or left over
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def run_jobs(names: Sequence[str], compute: Callable[[int], Optional[dict]], *, folder: Optional[RecordFolder] = None,
             rank: int = 0, world: int = 1, take_over: bool = True, wait: bool = True,
             gather: Optional[Callable[[dict], dict]] = None, poll_s: float = 20.0,
             on_wait: Optional[Callable[[int], None]] = None, on_done: Optional[Callable[[bool], None]] = None
             ) -> Optional[dict]:
    """Run this worker's share of the jobs ``names`` (module docstring); ``{name: record}``.

    ``compute(i)`` runs job i and returns its record (or a stored one, or None when it
    decides to skip); a record it returns is saved in ``folder`` when there is one. With a
    folder and ``world`` > 1 (independent parts), jobs are claimed, taken over (``take_over``)
    and, with ``wait``, awaited: the result then holds every job's record, read from the
    folder (None when ``wait`` is False and some are missing). With ``gather`` (torchrun) the
    records are exchanged collectively. ``on_wait(n_missing)`` is called once before the
    first wait, ``on_done(own)`` after each job this worker finished (own: from its share).
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world), got rank {rank}, world {world}")
    parts = world > 1 and gather is None
    if parts and folder is None:
        raise ValueError("independent parts (world > 1 without torch.distributed) need a shared record folder")
    mine: dict = {}

    def one(i: int, claim: bool) -> Optional[dict]:
        name = names[i]
        if folder is not None and folder.has(name):
            return folder.load(name)
        if claim:
            if not folder.claim(name):
                return None                     # another part has it
            if folder.has(name):                # finished by another part just before the claim
                folder.release(name)
                return folder.load(name)
        rec = compute(i)
        if rec is not None and folder is not None:
            folder.save(name, rec)
        return rec

    for i in range(rank, len(names), world):
        rec = one(i, claim=parts)
        if rec is not None:
            mine[names[i]] = rec
        if on_done:
            on_done(True)
    if parts:
        announced = False
        while True:
            if take_over:
                for i in reversed([i for i, n in enumerate(names) if not folder.has(n)]):
                    if not folder.has(names[i]) and (rec := one(i, claim=True)) is not None:
                        mine[names[i]] = rec
                        if on_done:
                            on_done(False)
            missing = [n for n in names if not folder.has(n)]
            if not wait or not missing:
                break
            if not announced and on_wait:
                on_wait(len(missing))
                announced = True
            time.sleep(poll_s)
        if any(not folder.has(n) for n in names):
            return None
        return {n: folder.load(n) for n in names}
    if gather is not None:
        return gather(mine)
    if folder is not None and wait and any(n not in mine for n in names):
        return {n: folder.load(n) for n in names}
    return mine
