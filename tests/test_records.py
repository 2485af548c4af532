"""qkmlp.runbase.records: the record folder and the resumable grid the three pipelines share."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from qkmlp.runbase.records import RecordFolder, load_record, run_jobs, save_record


def test_save_is_atomic_and_round_trips(tmp_path):
    p = save_record(tmp_path / "a" / "r.json", {"x": [1.5, None], "s": "σ"})
    assert load_record(p) == {"x": [1.5, None], "s": "σ"} and json.loads(p.read_text())["s"] == "σ"
    assert not [q for q in p.parent.iterdir() if q.suffix == ".tmp"]


def test_claims_keep_parts_off_each_others_jobs_and_expire_with_their_process(tmp_path):
    folder = RecordFolder(tmp_path)
    name = "eval_x_lr0.01_s0.json"
    claim = tmp_path / "eval_x_lr0.01_s0.claim"
    assert folder.claim(name) and claim.read_text() == f"{socket.gethostname()} {os.getpid()}"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    claim.write_text(f"{socket.gethostname()} {int(dead.stdout)}")      # its process has exited: taken over
    assert folder.claim(name) and claim.read_text().endswith(f" {os.getpid()}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim.write_text(f"{socket.gethostname()} {live.pid}")          # alive: respected
        assert not folder.claim(name)
    finally:
        live.kill()
        live.wait()
    claim.write_text(f"another-host-{socket.gethostname()} 1")          # another host: respected
    assert not folder.claim(name)
    folder.save(name, {"done": 1})                                       # saving releases the claim
    assert not claim.exists() and folder.load(name) == {"done": 1}


def _grid(n):
    return [f"job{i}.json" for i in range(n)]


def test_alone_runs_every_job_once_and_resumes_without_running_any(tmp_path):
    names, calls = _grid(5), []

    def compute(i):
        calls.append(i)
        return {"i": i, "square": i * i}

    folder = RecordFolder(tmp_path)
    out = run_jobs(names, compute, folder=folder)
    assert calls == [0, 1, 2, 3, 4] and out == {n: {"i": i, "square": i * i} for i, n in enumerate(names)}
    again = run_jobs(names, lambda i: pytest.fail("a stored job ran again"), folder=folder)
    assert again == out
    assert run_jobs(names, compute) == out and calls[5:] == [0, 1, 2, 3, 4]      # no folder: computed


def test_two_parts_share_the_work_and_the_idle_one_takes_over(tmp_path):
    names = _grid(6)
    ran = {0: [], 1: []}
    slow = threading.Event()

    def worker(rank):
        def compute(i):
            ran[rank].append(i)
            if rank == 0 and i == 0:
                slow.wait(5)           # part 1 is stuck on its first job ...
            return {"i": i}
        return run_jobs(names, compute, folder=RecordFolder(tmp_path), rank=rank, world=2, poll_s=0.05)

    results = {}
    t1 = threading.Thread(target=lambda: results.setdefault(1, worker(1)))
    t1.start()
    t1.join(timeout=3)                 # ... so part 2 does its share and takes over part 1's queue
    slow.set()
    results[0] = worker(0) if 0 not in results else results[0]
    t1.join()
    assert sorted(ran[0] + ran[1]) == list(range(6))          # every job ran once
    assert set(ran[1]) >= {1, 3, 5} and {2, 4} & set(ran[1])  # part 2 took over part 1's unstarted jobs
    assert results[0] == results[1] == {n: {"i": i} for i, n in enumerate(names)}


def test_a_torchrun_style_gather_needs_no_folder():
    names = _grid(4)
    seen = {}

    def gather(mine):
        seen.update(mine)
        return {**mine, **{n: {"i": int(n[3:-5]), "other": True} for n in names if n not in mine}}

    out = run_jobs(names, lambda i: {"i": i}, rank=1, world=2, gather=gather)
    assert set(seen) == {"job1.json", "job3.json"} and set(out) == set(names)
    with pytest.raises(ValueError, match="need a shared record folder"):
        run_jobs(names, lambda i: {}, rank=0, world=2)
