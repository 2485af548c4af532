"""Read the stored SmolLM2 analysis: loss changes with their standard errors, and the
live rerun of one slice of it.

A loss change is paired by window: δ_i = L_i(intervention) − L_i(base), i = 1..n, with
L_i the mean next-token NLL of window i (nats). Reported: the mean δ̄ (equal windows, so
it is the change of the mean loss) and its standard error s_δ/√n.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch

__all__ = ["save_results", "load_results", "key", "loss_change", "layer_changes", "all_changes",
           "paired_t", "holm", "compare_layers", "rerun_slice"]


def _round(obj, digits: int = 7):
    if isinstance(obj, float):
        return obj if obj == 0.0 or not math.isfinite(obj) else float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v, digits) for v in obj]
    return obj


def save_results(result: dict, path) -> None:
    """Write ``result`` as JSON (floats to 7 significant digits), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_round(result), indent=1) + "\n")


def load_results(path) -> dict:
    """Read a results file written by :func:`save_results`."""
    return json.loads(Path(path).read_text())


def key(kind: str, alpha: Optional[float] = None) -> str:
    """The results key of an intervention: ``"swap"``, ``"rescale:2"``, ..."""
    return kind if alpha is None else f"rescale:{float(alpha):g}"


def _mean_se(deltas: list[float]) -> tuple[float, float]:
    n = len(deltas)
    mean = sum(deltas) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1)) if n > 1 else float("nan")
    return mean, sd / math.sqrt(n)


def loss_change(base: list[float], other: list[float]) -> tuple[float, float]:
    """(mean, standard error) of the paired per-window change ``other − base``."""
    if len(base) != len(other) or not base:
        raise ValueError(f"need two equally long, non-empty per-window lists; got {len(base)} and {len(other)}")
    return _mean_se([o - b for o, b in zip(other, base)])


def layer_changes(results: dict, kind: str, alpha: Optional[float] = None) -> list[Optional[tuple[float, float]]]:
    """Per layer, (mean, se) of the loss change of ``kind`` applied to that layer alone
    (``None`` for layers the run skipped)."""
    base = results["losses"]["base"]
    rows = results["losses"]["layer"][key(kind, alpha)]
    return [None if r is None else loss_change(base, r) for r in rows]


def all_changes(results: dict, kind: str, alpha: Optional[float] = None) -> tuple[float, float]:
    """(mean, se) of the loss change of ``kind`` applied to every layer at once."""
    return loss_change(results["losses"]["base"], results["losses"]["all"][key(kind, alpha)])


def paired_t(a: list[float], b: list[float]) -> dict:
    """Paired Student-t test of mean(b − a) = 0 over windows: ``mean``, ``se``, ``t``
    and the two-sided ``p`` (n − 1 degrees of freedom)."""
    from scipy.stats import t as student_t

    mean, se = loss_change(a, b)
    n = len(a)
    if n < 2:
        raise ValueError("a paired t-test needs at least 2 windows")
    if se == 0:
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    else:
        t = mean / se
        p = float(2 * student_t.sf(abs(t), df=n - 1))
    return {"mean": mean, "se": se, "t": t, "p": p}


def holm(pvalues: list[float], level: float = 0.05) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at family-wise ``level``.

    Sort the m p-values; reject the i-th smallest (i = 0, 1, ...) while
    p ≤ level / (m − i); stop at the first that is not rejected.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    m = len(pvalues)
    reject = [False] * m
    for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        if pvalues[i] > level / (m - rank):
            break
        reject[i] = True
    return reject


def compare_layers(results: dict, kind_a: str, kind_b: str, level: float = 0.05) -> list[dict]:
    """Per layer, the paired comparison of two stored per-layer interventions (results
    keys, e.g. ``"none"`` and ``"swap"``): :func:`paired_t` of b − a over the windows,
    with ``significant`` from :func:`holm` across the layers the run covered."""
    rows_a = results["losses"]["layer"][kind_a]
    rows_b = results["losses"]["layer"][kind_b]
    layers = [l for l in range(len(rows_a)) if rows_a[l] is not None and rows_b[l] is not None]
    tests = [paired_t(rows_a[l], rows_b[l]) | {"layer": l} for l in layers]
    for t, rej in zip(tests, holm([t["p"] for t in tests], level)):
        t["significant"] = rej
    return tests


@torch.no_grad()
def rerun_slice(model, tokenizer, results: dict, layer: int, kind: str, alpha: Optional[float] = None,
                window: int = 0, windows: Optional[torch.Tensor] = None) -> dict:
    """Recompute one stored number the simple way: the loss of held-out ``window`` with
    every MLP a :class:`~qkmlp.GatedMLP` (the base) and with ``kind`` in ``layer``,
    each by a full forward pass (the runner used the recorded residual stream instead).

    ``windows`` may pass the held-out windows already made with the stored run's
    settings (:func:`~qkmlp.pretrained.heldout.heldout_windows`), to skip tokenising
    the text again. Returns ``{"base": (stored, live), "intervention": (stored, live)}``.
    """
    from .heldout import heldout_windows, window_losses
    from .surgery import gated_mlps, mlps_replaced, variant

    cfg = results["config"]
    if windows is None:
        windows = heldout_windows(tokenizer, cfg["n_windows"], cfg["length"])
    if tuple(windows.shape) != (cfg["n_windows"], cfg["length"]):
        raise ValueError(f"windows must have the stored shape {(cfg['n_windows'], cfg['length'])}, "
                         f"got {tuple(windows.shape)}")
    ids = windows[window:window + 1]
    g = gated_mlps(model)
    with mlps_replaced(model, dict(enumerate(g))):
        base = float(window_losses(model, ids)[0])
        with mlps_replaced(model, {layer: variant(g[layer], kind, alpha)}):
            live = float(window_losses(model, ids)[0])
    stored = results["losses"]["layer"][key(kind, alpha)][layer]
    if stored is None:
        raise ValueError(f"the stored run skipped layer {layer}")
    return {"base": (results["losses"]["base"][window], base), "intervention": (stored[window], live)}
