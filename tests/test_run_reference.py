"""A run's numbers change only together with RUN_CODE_VERSION, the cache key of stored grids.

Every stored grid is assembled from per-run records keyed on (task, config,
``RUN_CODE_VERSION``); a change to the training loop, a task, a layer or an initialisation
that alters what a run computes must bump that version, or a resumed grid would mix runs of
two codes. These tiny runs (tests/data/run_reference.json, written by
tests/run_reference.py) catch a change that forgot the bump.
"""
from __future__ import annotations

import json
import math

import pytest

from qkmlp.experiments.runner import RUN_CODE_VERSION

import run_reference as ref
from numerics_tolerance import ABS_TOL, REL_TOL

STORED = json.loads(ref.PATH.read_text())


def test_the_reference_is_of_the_current_code_versions():
    assert STORED["run_code_version"] == RUN_CODE_VERSION, (
        f"RUN_CODE_VERSION is {RUN_CODE_VERSION} but tests/data/run_reference.json was written at "
        f"{STORED['run_code_version']}: regenerate it with `python tests/run_reference.py`")
    assert STORED["task_versions"] == ref.task_versions(), (
        f"task versions are {ref.task_versions()} but the reference was written at {STORED['task_versions']}: "
        f"regenerate it with `python tests/run_reference.py`")


def _close(a, b, rel=REL_TOL):
    """Equal up to REL_TOL: the rounding of every kernel set torch may pick, measured
    (tests/numerics_tolerance.py), far below a real change of the numerics."""
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=ABS_TOL)
    return a == b


@pytest.mark.parametrize("case", ref.cases(), ids=lambda c: f"{c[0]}-{'-'.join(str(v) for v in c[1].values())}")
def test_a_run_computes_what_the_reference_stored(case):
    task, cell, seed, _ = case
    stored = [r for r in STORED["runs"] if r["task"] == task and r["cell"] == cell and r["seed"] == seed]
    assert len(stored) == 1, f"no reference run for {task} {cell}: regenerate with `python tests/run_reference.py`"
    live = ref.run_case(*case)
    diff = {k: (stored[0][k], live[k]) for k in live if not _close(stored[0][k], live[k])}
    assert not diff, (f"{task} {cell}: the run's numbers changed ({sorted(diff)}; first: "
                      f"{next(iter(diff.values()))}). If the change is deliberate, bump RUN_CODE_VERSION in "
                      f"qkmlp/experiments/runner.py and regenerate tests/data/run_reference.json "
                      f"(`python tests/run_reference.py`); otherwise the change altered training by accident.")


def test_a_deliberate_change_of_the_numerics_trips_the_guard(monkeypatch):
    """Adam's epsilon 1e-7 instead of 1e-8 in the first toy case moves its numbers past REL_TOL."""
    import torch

    case = ref.cases()[0]
    stored = [r for r in STORED["runs"] if r["task"] == case[0] and r["cell"] == case[1] and r["seed"] == case[2]][0]
    assert all(_close(stored[k], v) for k, v in ref.run_case(*case).items())
    for name in ("Adam", "AdamW"):
        orig = getattr(torch.optim, name)
        monkeypatch.setattr(torch.optim, name, lambda *a, _o=orig, **k: _o(*a, **{**k, "eps": 1e-7}))
    live = ref.run_case(*case)
    assert not all(_close(stored[k], v) for k, v in live.items())
