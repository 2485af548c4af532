"""Distance-matched controls: the fraction of swapped units whose start matches an arm's.

A symmetric arm starts far from the trained model; the control starts on it. To ask whether
the symmetric arm's end gap comes from the symmetry it lacks or from the distance it starts
at, chapter 11 trains a gated control that starts as far away: the control with q and k
exchanged in a fraction f of every layer's units (:func:`~.core.partially_swapped`). f is
chosen here, on the *validation* texts only: the starting loss (mean over the validation
texts of the mean window loss, before any step) of the partially swapped control equals
the symmetric arm's, by bisection on f at three decimals.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from .core import build_arm, evaluate

__all__ = ["start_loss", "match_fraction", "write_matching"]


def start_loss(model, data, arm: str, eval_batch: int = 8) -> dict:
    """``{"texts": {name: mean window loss}, "mean": mean over the validation texts}`` of
    ``arm`` built into a copy of ``model`` (a trained model, left untouched), before training."""
    m = copy.deepcopy(model)
    build_arm(m, arm)
    per = {n: sum(v) / len(v) for n, v in evaluate(m, data.validation, eval_batch).items()}
    return {"texts": per, "mean": sum(per.values()) / len(per)}


def match_fraction(model, data, target: float, *, eval_batch: int = 8, log=None) -> dict:
    """The fraction f in (0, 1), at three decimals, whose partially swapped control starts at
    validation loss ``target``: bisection on the grid of thousandths, assuming the start
    rises with f (the swapped sets are nested); the f whose start lies closest to the target
    among the last bracket is returned. ``evaluations`` lists every (f, start) computed, so
    the matching can be checked (and plotted) from the stored file."""
    from .core import partial_swap_arm

    evals = {}

    def loss(k: int) -> float:
        if k not in evals:
            t0 = time.perf_counter()
            evals[k] = start_loss(model, data, partial_swap_arm(k / 1000), eval_batch)["mean"]
            if log:
                log(f"f = {k / 1000:.3f}: validation start {evals[k]:.4f} (target {target:.4f}, "
                    f"{time.perf_counter() - t0:.0f} s)")
        return evals[k]

    lo, hi = 1, 999
    if not loss(lo) <= target <= loss(hi):
        raise ValueError(f"target {target:.4f} lies outside the starts of f = 0.001 ({evals[lo]:.4f}) and "
                         f"f = 0.999 ({evals[hi]:.4f})")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if loss(mid) < target:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda k: abs(evals[k] - target))
    return {"fraction": best / 1000, "start": evals[best], "target": target,
            "evaluations": [{"fraction": k / 1000, "start": evals[k]} for k in sorted(evals)]}


def write_matching(grid, arms, path, *, command=None, log=None) -> Path:
    """Match a partially swapped control to each of ``arms`` on ``grid``'s model and
    validation windows; write ``{"meta", "matches": {arm: {...}}}`` to ``path``. Each match
    holds the arm's start (per validation text and mean), the fraction, its arm name and every
    evaluation of the bisection."""
    from ...runbase.provenance import IMPORT_GIT, machine, versions
    from .core import partial_swap_arm

    model, _, data = grid._base()
    c = grid.cfg
    t0 = time.perf_counter()
    matches = {}
    for arm in arms:
        target = start_loss(model, data, arm, c["eval_batch"])
        found = match_fraction(model, data, target["mean"], eval_batch=c["eval_batch"], log=log)
        control = partial_swap_arm(found["fraction"])
        matches[arm] = {"arm_start": target, "control": control,
                        "control_start": start_loss(model, data, control, c["eval_batch"]), **found}
    meta = {"command": command, **IMPORT_GIT, "run_key": grid.key, "model": grid.model_id,
            "validation_texts": list(c["validation_texts"]), "n_windows": c["n_windows"], "seq_len": c["seq_len"],
            "versions": versions("transformers"), "machine": machine(), "wall_s": time.perf_counter() - t0,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "matches": matches}, indent=1) + "\n")
    return path
