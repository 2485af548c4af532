"""Learning-rate choice on validation loss, shared by the pipelines' tuning phases.

A rate is tuned on a grid of rates times tuning seeds: the rate with the lowest mean
validation loss wins (a diverged or non-finite run counts as +inf; ties go to the rate tried
first). A winner at the edge of the grid is not a tuned rate: the grid is extended past that
edge by its own ratio (:func:`next_rate`), up to a set number of times.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

__all__ = ["choose_rate", "grid_ratio", "next_rate"]


def choose_rate(losses: Mapping[float, Sequence[float]], tried: Sequence[float]) -> dict:
    """``{"lr", "val_loss_by_lr", "at_edge"}`` from the validation losses of each rate in
    ``tried`` (in the order tried). ``val_loss_by_lr`` maps ``repr(lr)`` to the mean, in
    increasing rate; ``at_edge``: the choice is the smallest or largest rate tried."""
    means = {}
    for lr in tried:
        vals = losses.get(lr)
        if not vals:
            raise KeyError(f"no tuning runs at lr {lr}")
        vals = [v if v is not None and math.isfinite(v) else math.inf for v in vals]
        means[lr] = sum(vals) / len(vals)
    order = list(tried)
    best = min(order, key=lambda lr: (means[lr], order.index(lr)))
    return {"lr": best, "val_loss_by_lr": {repr(lr): means[lr] for lr in sorted(means)},
            "at_edge": len(order) > 1 and best in (min(order), max(order))}


def grid_ratio(lrs: Sequence[float]) -> float:
    """The geometric step of a rate grid (1.0 for a single rate)."""
    return (max(lrs) / min(lrs)) ** (1 / (len(lrs) - 1)) if len(lrs) > 1 else 1.0


def next_rate(lr: float, tried: Sequence[float], ratio: float) -> float:
    """The rate one ``ratio`` step past the edge ``lr`` of ``tried`` (down from the smallest,
    up from the largest), rounded to 3 significant digits."""
    factor = 1 / ratio if lr == min(tried) else ratio
    return float(f"{lr * factor:.3g}")
