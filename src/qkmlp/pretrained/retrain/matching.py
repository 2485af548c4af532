"""Distance-matched controls: the fraction of swapped units whose start matches an arm's.

A symmetric arm starts far from the trained model; the control starts on it. To ask whether
the symmetric arm's end gap comes from the symmetry it lacks or from the distance it starts
at, chapter 11 trains a gated control that starts as far away: the control with q and k
exchanged in a fraction f of every layer's units (:func:`~.core.partially_swapped`). f is
chosen here, on the *validation* texts only: the starting loss (mean over the validation
texts of the mean window loss, before any step) of the partially swapped control equals
the symmetric arm's, by bisection on f at three decimals (:func:`bisect_closest`: the
closest of every fraction evaluated). A control may also exchange named units in every
run (``swapped-f0.812+L1U83``), those a forward-pass search found to move the start most
(:mod:`~.unitsearch`); f is then matched with them exchanged.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from .core import build_arm, evaluate

__all__ = ["start_loss", "bisect_closest", "match_fraction", "write_matching"]


def start_loss(model, data, arm: str, eval_batch: int = 8) -> dict:
    """``{"texts": {name: mean window loss}, "mean": mean over the validation texts}`` of
    ``arm`` built into a copy of ``model`` (a trained model, left untouched), before training."""
    m = copy.deepcopy(model)
    build_arm(m, arm)
    per = {n: sum(v) / len(v) for n, v in evaluate(m, data.validation, eval_batch).items()}
    return {"texts": per, "mean": sum(per.values()) / len(per)}


def bisect_closest(loss, target: float, lo: int = 1, hi: int = 999, *, refine: int = 0,
                   refine_above: float = 0.0) -> dict:
    """Bisection on the integers ``lo`` … ``hi`` for the k whose ``loss(k)`` lies closest to
    ``target``, assuming ``loss`` rises with k: the bracket [lo, hi] is halved (mid goes to
    lo when ``loss(mid) < target``) until its ends are neighbours, and the k returned is the
    one closest to the target among *every* k evaluated on the way (not only the final
    bracket's two ends: where ``loss`` is not monotone an earlier point can be closer).
    Ties go to the smaller k. ``refine``: when that closest value is more than
    ``refine_above`` from the target, the ``refine`` integers either side of it (within
    [lo, hi]) are evaluated as well and the closest of all is returned (where ``loss`` jumps,
    a neighbour can be closer than anything the bisection visited). Returns
    ``{"k", "value", "refined", "evaluations": {k: loss(k)}}``; a target outside
    [loss(lo), loss(hi)] raises ``ValueError``."""
    if not (isinstance(lo, int) and isinstance(hi, int) and lo < hi):
        raise ValueError(f"need integers lo < hi, got lo={lo!r}, hi={hi!r}")
    if not (isinstance(refine, int) and refine >= 0 and refine_above >= 0):
        raise ValueError(f"refine must be an int >= 0 and refine_above >= 0, got {refine!r}, {refine_above!r}")
    lo0, hi0 = lo, hi
    evals = {}

    def f(k):
        if k not in evals:
            evals[k] = float(loss(k))
        return evals[k]

    if not f(lo) <= target <= f(hi):
        raise ValueError(f"target {target:.4f} lies outside the starts at {lo} ({evals[lo]:.4f}) and "
                         f"{hi} ({evals[hi]:.4f})")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    def closest():
        return min(sorted(evals), key=lambda k: abs(evals[k] - target))

    best = closest()
    refined = bool(refine) and abs(evals[best] - target) > refine_above
    if refined:
        for k in range(max(lo0, best - refine), min(hi0, best + refine) + 1):
            f(k)
        best = closest()
    return {"k": best, "value": evals[best], "refined": refined, "evaluations": dict(sorted(evals.items()))}


def match_fraction(model, data, target: float, *, units=(), refine: int = 0, refine_above: float = 0.0,
                   eval_batch: int = 8, log=None) -> dict:
    """The fraction f in (0, 1), at three decimals, whose partially swapped control (with the
    ``units``, (layer, unit) pairs, exchanged as well) starts closest to validation loss
    ``target``: :func:`bisect_closest` on the grid of thousandths (the swapped sets are
    nested in f), returning the closest of all the fractions evaluated (``refine``,
    ``refine_above``: as there, in thousandths and nats). ``evaluations``
    lists every (f, start) computed, so the matching can be checked (and plotted) from the
    stored file."""
    from .core import partial_swap_arm

    def loss(k: int) -> float:
        t0 = time.perf_counter()
        v = start_loss(model, data, partial_swap_arm(k / 1000, units), eval_batch)["mean"]
        if log:
            log(f"f = {k / 1000:.3f}: validation start {v:.4f} (target {target:.4f}, "
                f"{time.perf_counter() - t0:.0f} s)")
        return v

    found = bisect_closest(loss, target, 1, 999, refine=refine, refine_above=refine_above)
    return {"fraction": found["k"] / 1000, "start": found["value"], "target": target, "refined": found["refined"],
            "evaluations": [{"fraction": k / 1000, "start": v} for k, v in found["evaluations"].items()]}


def write_matching(grid, arms, path, *, units=(), units_from=None, refine: int = 0, refine_above: float = 0.0,
                   command=None, log=None) -> Path:
    """Match a partially swapped control (exchanging ``units`` as well, (layer, unit) pairs)
    to each of ``arms`` on ``grid``'s model and validation windows; write
    ``{"meta", "matches": {arm: {...}}}`` to ``path``. Each match holds the arm's start (per
    validation text and mean), the fraction, its arm name, the units and every evaluation of
    the bisection; ``units_from`` (the file the units were read from) goes into ``meta``."""
    from ...runbase.provenance import IMPORT_GIT, machine, versions
    from .core import partial_swap_arm

    model, _, data = grid._base()
    c = grid.cfg
    t0 = time.perf_counter()
    matches = {}
    for arm in arms:
        target = start_loss(model, data, arm, c["eval_batch"])
        found = match_fraction(model, data, target["mean"], units=units, refine=refine, refine_above=refine_above,
                               eval_batch=c["eval_batch"], log=log)
        control = partial_swap_arm(found["fraction"], units)
        matches[arm] = {"arm_start": target, "control": control, "units": [list(u) for u in units],
                        "control_start": start_loss(model, data, control, c["eval_batch"]), **found}
    meta = {"command": command, **IMPORT_GIT, "refine": refine, "refine_above": refine_above, "units_from": None if units_from is None else str(units_from), "run_key": grid.key, "model": grid.model_id,
            "validation_texts": list(c["validation_texts"]), "n_windows": c["n_windows"], "seq_len": c["seq_len"],
            "versions": versions("transformers"), "machine": machine(), "wall_s": time.perf_counter() - t0,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "matches": matches}, indent=1) + "\n")
    return path
