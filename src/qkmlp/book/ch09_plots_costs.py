"""The chapter's figures of what each change costs, drawn from a stored results file.

Every function takes the results dict of :func:`qkmlp.pretrained.runner.run` and a
matplotlib axes, draws one panel and returns the axes; ``text=`` picks the held-out text
(default the run's main text). Loss changes are paired by window (mean ± one standard
error over the windows, :mod:`qkmlp.pretrained.report`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import figures
from ..pretrained.report import all_changes, loss_change, text_results
from ..pretrained.textrun import parse_key
from .ch09_plots import legend_below

__all__ = ["LABELS", "COLOR", "MARKER", "label", "plot_layer_costs", "plot_cost_vs_size", "plot_alpha",
           "plot_texts", "plot_unit_costs", "plot_unit_groups"]

C = figures.COLORS

#: One colour and marker per intervention, the same in every figure of the chapter.
COLOR = {"none": C[7], "swap": C[1], "toward_swap:0.25": C[4], "symmetrized": C[2], "linear": C[3],
         "identity": C[5], "symmetric": C[3], "rescale:2": C[0], "rescale:0.5": C[0], "rescale:-0.5": C[5],
         "rescale:-1": C[5], "rescale:-2": C[5], "q4_noise": C[6]}
MARKER = {"none": "o", "swap": "s", "toward_swap:0.25": "s", "symmetrized": "D", "linear": "^", "identity": "v",
          "symmetric": "P", "rescale:2": "o", "rescale:0.5": "o", "rescale:-0.5": "v", "rescale:-1": "v",
          "rescale:-2": "v"}

#: Short labels of the interventions, as the figures and tables name them.
LABELS = {
    "none": "no MLP", "swap": "exchange q↔k", "toward_swap:0.25": "¼ way to exchange",
    "symmetrized": "symmetrised (½ way)", "identity": "σ → identity", "linear": "σ → tangent z/2",
    "symmetric": "σ(ab)", "q4_noise": "one more 4-bit rounding",
}


def label(k: str) -> str:
    """The label of a results key (``"rescale:-1"`` -> ``"α = -1"``)."""
    if k in LABELS:
        return LABELS[k]
    kind, p = parse_key(k)
    if kind == "rescale":
        return f"α = {p:g}".replace("-", "−")
    return k


def _layer_series(results, k, text):
    t = text_results(results, text)
    rows = t["layer"][k]
    L = [l for l, r in enumerate(rows) if r is not None]
    ch = [loss_change(t["base"], rows[l]) for l in L]
    return np.array(L), np.array([c[0] for c in ch]), np.array([c[1] for c in ch])


def plot_layer_costs(results: dict, ax, keys: Sequence[str], *, text: Optional[str] = None, log=True):
    """Per layer, the held-out loss change (nats) of each intervention in ``keys`` (results
    keys such as ``"swap"`` or ``"rescale:-1"``), ± one standard error; on a log scale
    (``log=True``: every change must then be positive), a linear one (``False``) or a
    symmetric log scale, linear within ±0.01 nats (``"symlog"``)."""
    if log not in (True, False, "symlog"):
        raise ValueError(f"log must be True, False or 'symlog', got {log!r}")
    for k in keys:
        L, m, s = _layer_series(results, k, text)
        if log is True and (m <= 0).any():
            raise ValueError(f"{k}: a log scale needs positive changes; use log=False")
        ax.errorbar(L, m, yerr=s, fmt=MARKER.get(k, "o") + "-", ms=3.5, lw=1, capsize=0,
                    color=COLOR.get(k, C[7]), label=label(k))
    if log is True:
        ax.set_yscale("log")
    else:
        ax.axhline(0, color=C[7], lw=0.8)
        if log == "symlog":
            ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("layer")
    ax.set_ylabel("Δ held-out loss (nats)")
    legend_below(ax)
    return ax


def plot_cost_vs_size(results: dict, ax, keys: Sequence[str], *, text: Optional[str] = None,
                      layers: Optional[Sequence[int]] = None, floor: float = 1e-3):
    """Cost against size, one point per layer and intervention: x the relative change of
    the layer's MLP output on the held-out tokens (positions ≥ 1), y the loss change of
    that intervention in that layer alone (log scales; a change below ``floor``, including
    any negative one, is drawn at ``floor``)."""
    t = text_results(results, text)
    n = results["model"]["n_layers"]
    layers = range(n) if layers is None else layers
    for k in keys:
        xs, ys = [], []
        for l in layers:
            r = t["layer"][k][l]
            if r is None:
                continue
            xs.append(t["local_change"][l][k]["rest"])
            ys.append(max(loss_change(t["base"], r)[0], floor))
        kind, p = parse_key(k)
        ax.plot(xs, ys, MARKER.get(k, "o"), ms=4, color=COLOR.get(k, C[7]),
                mfc="none" if kind == "rescale" and p is not None and abs(p) < 1 else None, ls="none", label=label(k))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("size: ‖Δf‖ / ‖f‖ on held-out tokens")
    ax.set_ylabel("Δ held-out loss (nats)")
    legend_below(ax)
    return ax


def plot_alpha(results: dict, ax, *, text: Optional[str] = None):
    """Held-out loss change of q → αq, k → k/α in every layer against |α| (log scales),
    for α > 0 and α < 0 (α = 1, the model itself, is left out), with the levels of the
    tangent layer (the α → 0 limit), the exchange and no MLP in every layer."""
    t = text_results(results, text)
    alphas = sorted(parse_key(k)[1] for k in t["all"] if k.startswith("rescale:") and parse_key(k)[1] != 1.0)
    for sign, lab, mk, ls in ((1, "α > 0", "o", "-"), (-1, "α < 0", "s", "--")):
        al = [a for a in alphas if a * sign > 0]
        ch = [all_changes(results, "rescale", a, text=text)[0] for a in al]
        ax.plot([abs(a) for a in al], ch, marker=mk, ms=4, ls=ls, color=C[0] if sign > 0 else C[5], label=lab)
    for k, ls in (("none", ":"), ("swap", "-."), ("linear", "--")):
        ax.axhline(all_changes(results, k, text=text)[0], color=COLOR[k], ls=ls, lw=1.2, label=label(k))
    ax.axvline(1.0, color=C[7], lw=0.8, alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("|α| (every layer)")
    ax.set_ylabel("Δ held-out loss (nats)")
    legend_below(ax)
    return ax


def plot_texts(results: dict, ax, k: str, *, versus: Optional[str] = None, texts: Optional[Sequence[str]] = None):
    """Per layer and text, the loss change of ``k``; with ``versus`` another key, the
    difference k − versus instead (symmetric log scale)."""
    names = list(texts) if texts is not None else results["config"]["texts"]
    for i, n in enumerate(names):
        L, m, s = _layer_series(results, k, n)
        if versus is not None:
            _, m2, _ = _layer_series(results, versus, n)
            m = m - m2
        ax.plot(L, m, ["o-", "s--", "^:"][i % 3], ms=3.5, color=C[i], label=n)
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("layer")
    ax.set_ylabel("Δ loss difference (nats)" if versus else "Δ held-out loss (nats)")
    ax.set_title(label(k) + (f" minus {label(versus)}" if versus else ""))
    legend_below(ax)
    return ax


def plot_unit_costs(results: dict, ax, layer: int, distance: Sequence[float], *, text: Optional[str] = None):
    """Per unit of ``layer``: the first-order estimate of its exchange cost against the
    pair distance d_j (``distance``, computed from the weights), symmetric log scale."""
    u = text_results(results, text)["units"]["layers"][str(layer)]
    pred = np.array(u["predicted"])
    d = np.asarray(distance, dtype=float)
    if d.shape != pred.shape:
        raise ValueError(f"distance must have one value per unit ({pred.shape[0]}), got {d.shape}")
    ax.plot(d, pred, ".", ms=2.5, color=C[0], alpha=0.6, label=f"units of layer {layer}")
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xlabel("d_j = ‖q_j − k_j‖ / (‖q_j‖ + ‖k_j‖)")
    ax.set_ylabel("estimated Δ loss (nats)")
    ax.legend(loc="upper left")
    return ax


def plot_unit_groups(results: dict, ax, layer: int, *, text: Optional[str] = None):
    """The groups of ``layer``'s units ordered by estimated cost: the exact loss change of
    exchanging each group's units together against the sum of their estimates."""
    t = text_results(results, text)
    u = t["units"]["layers"][str(layer)]
    pred = [g["predicted"] for g in u["groups"]]
    exact = [loss_change(t["base"], g["losses"])[0] for g in u["groups"]]
    idx = np.arange(1, len(pred) + 1)
    ax.plot(idx, pred, "o-", color=C[0], ms=4, label="sum of first-order estimates")
    ax.plot(idx, exact, "s--", color=C[1], ms=4, label="exact, units exchanged together")
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel(f"layer {layer}: groups, cheapest estimate first")
    ax.set_ylabel("Δ held-out loss (nats)")
    ax.legend(loc="upper left")
    return ax
