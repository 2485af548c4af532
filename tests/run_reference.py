"""Write tests/data/run_reference.json: tiny runs of every task and every language-model family.

``tests/test_run_reference.py`` reruns them and compares: the numbers of a run may change
only together with ``qkmlp.experiments.runner.RUN_CODE_VERSION`` or the task's
``Task.version`` (the cache key of every stored grid's per-run records). After a deliberate
change of what runs compute, bump the version it concerns and regenerate this file::

    python tests/run_reference.py
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from qkmlp.experiments import TASKS, run_cell
from qkmlp.experiments.runner import RUN_CODE_VERSION
from qkmlp.experiments.tasks import LM_FAMILIES

PATH = Path(__file__).parent / "data" / "run_reference.json"
FIELDS = ("val_loss", "test_loss", "best_step", "steps", "stopped")


def cases():
    """(task, cell, seed, config) of every reference run: the first quick cell of each toy
    task, and every language-model family on the excerpt for 12 steps."""
    out = []
    for name, t in TASKS.items():
        if name == "lm":
            continue
        out.append((name, t.cells(t.quick)[0], 3, {**t.quick, "lr": 1e-2}))
    lm = TASKS["lm"].quick
    out += [("lm", {"family": f}, 3, {**lm, "lr": 1e-2}) for f in LM_FAMILIES]
    return out


def task_versions() -> dict:
    return {name: t.version for name, t in TASKS.items()}


def run_case(task, cell, seed, cfg) -> dict:
    torch.set_num_threads(1)
    rec = run_cell(task, cell, seed, cfg)
    return {"task": task, "cell": cell, "seed": seed, **{k: rec[k] for k in FIELDS},
            "train_loss": rec["curve"]["train_loss"], "val_curve": rec["curve"]["val_loss"]}


def main() -> None:
    rows = [run_case(*c) for c in cases()]
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps({"run_code_version": RUN_CODE_VERSION, "task_versions": task_versions(),
                                "torch": torch.__version__, "runs": rows}, indent=1) + "\n")
    print(f"{len(rows)} reference runs at RUN_CODE_VERSION {RUN_CODE_VERSION} -> {PATH}")


if __name__ == "__main__":
    main()
