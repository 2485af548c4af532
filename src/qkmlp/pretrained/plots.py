"""The chapter's figures, drawn from a stored results file onto ``qkmlp.figures`` panels.

Every function takes the results dict of :func:`qkmlp.pretrained.runner.run` and a
matplotlib axes, draws one panel and returns the axes. Colours follow
:data:`qkmlp.figures.COLORS`, one per series.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..book import figures
from .report import all_changes, key, layer_changes

__all__ = ["LABELS", "COLOR", "plot_alignment_spread", "plot_cos_histogram", "plot_balance", "plot_gate_inputs",
           "plot_silu_range", "plot_projection_shift", "plot_outliers", "plot_layer_losses", "plot_local_change", "plot_alpha"]

C = figures.COLORS

#: One colour per intervention, the same in every figure of the chapter.
COLOR = {"none": C[7], "swap": C[1], "symmetrized": C[2], "linear": C[3], "identity": C[4],
         "symmetric": C[5], "rescale:2": C[0], "rescale:0.5": C[6]}
MARKER = {"none": "o", "swap": "s", "symmetrized": "D", "linear": "^", "identity": "v",
          "symmetric": "P", "rescale:2": "o", "rescale:0.5": "D"}

#: Short labels of the interventions, as the figures and tables name them.
LABELS = {
    "none": "no MLP", "swap": "swap q↔k", "symmetrized": "symmetrised", "identity": "σ → identity",
    "linear": "σ → tangent z/2", "symmetric": "σ(ab)", "rescale:0.5": "α = 1/2", "rescale:2": "α = 2",
}


def _layers(results) -> np.ndarray:
    return np.arange(results["model"]["n_layers"])


def plot_alignment_spread(results: dict, ax):
    """Per layer: the standard deviation of cos(q_j, k_j), of the shuffled baseline, and
    1/√d (independent random directions), with the share of |cos| > 0.5 on a second axis."""
    L = _layers(results)
    an = results["anatomy"]
    d = results["model"]["d_model"]
    ax.plot(L, [a["cos"]["sd"] for a in an], "o-", color=C[0], ms=3, label="pairs (q_j, k_j)")
    ax.plot(L, [a["shuffled_cos"]["sd"] for a in an], "s-", color=C[1], ms=3, label="shuffled pairs")
    ax.axhline(1 / math.sqrt(d), color=C[7], ls="--", lw=1, label="1/√d")
    ax.set_xlabel("layer")
    ax.set_ylabel("sd of cos(q, k)")
    ax.set_ylim(0, 1.55 * max(a["cos"]["sd"] for a in an))
    ax.legend(loc="upper left")
    return ax


def plot_cos_histogram(results: dict, ax):
    """cos(q_j, k_j) pooled over all layers against the shuffled pairs (log counts)."""
    an = results["anatomy"]
    bins = len(an[0]["cos_hist"])
    edges = np.linspace(-1, 1, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    for name, col, lab, mk in (("cos_hist", C[0], "pairs (q_j, k_j)", "o"),
                               ("shuffled_cos_hist", C[1], "shuffled pairs", "s")):
        counts = np.sum([a[name] for a in an], axis=0).astype(float)
        counts[counts == 0] = np.nan
        ax.plot(centres, counts, marker=mk, ms=3, color=col, label=lab, drawstyle="steps-mid")
    ax.set_yscale("log")
    ax.set_ylim(0.5, None)
    ax.set_ylim(top=ax.get_ylim()[1] * 30)         # room for the legend above the peak
    ax.set_xlabel("cos(q, k)")
    ax.set_ylabel(f"units (all {len(an)} layers)")
    ax.legend(loc="upper left")
    return ax


def plot_balance(results: dict, ax):
    """Per layer: mean ± sd of the balance log(‖q_j‖/‖k_j‖), paired and shuffled."""
    L = _layers(results)
    an = results["anatomy"]
    for name, col, lab, dx in (("balance", C[0], "pairs (q_j, k_j)", -0.15),
                               ("shuffled_balance", C[1], "shuffled pairs", 0.15)):
        m = np.array([a[name]["mean"] for a in an])
        s = np.array([a[name]["sd"] for a in an])
        ax.errorbar(L + dx, m, yerr=s, fmt="o", ms=3, color=col, capsize=0, lw=1, label=lab)
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("log(‖q‖ / ‖k‖)")
    ax.legend(loc="lower left")
    return ax


def plot_gate_inputs(results: dict, ax, band: float = 1.0):
    """Per layer: quantiles of the gate pre-activations a = x·q_j on the held-out tokens
    (1–99 % and 25–75 % bands, median), over the band |a| ≤ ``band``."""
    L = _layers(results)
    q = np.array([r["a"]["quantiles"] for r in results["inputs"]])      # QUANTILES order
    ax.axhspan(-band, band, color=C[7], alpha=0.08, lw=0)
    ax.fill_between(L, q[:, 1], q[:, 7], color=C[0], alpha=0.25, lw=0, label="1–99 %")
    ax.fill_between(L, q[:, 3], q[:, 5], color=C[0], alpha=0.5, lw=0, label="25–75 %")
    ax.plot(L, q[:, 4], color=C[0], lw=1.4, label="median")
    ax.set_xlabel("layer")
    ax.set_ylabel("a = x·q (gate input)")
    ax.legend(loc="upper left")
    return ax


def plot_silu_range(results: dict, ax, layers: Sequence[int] = (0, 29)):
    """σ = SiLU and its tangent z/2 over the range of a; the 1–99 % range of a for
    ``layers`` drawn as horizontal bars below the curve."""
    lo = min(results["inputs"][l]["a"]["quantiles"][1] for l in layers)
    hi = max(results["inputs"][l]["a"]["quantiles"][7] for l in layers)
    z = np.linspace(min(lo, -4) - 0.5, max(hi, 4) + 0.5, 400)
    ax.plot(z, z / (1 + np.exp(-z)), color=C[0], label="SiLU(z)")
    ax.plot(z, z / 2, color=C[7], ls="--", lw=1, label="tangent z/2")
    for i, (l, col) in enumerate(zip(layers, (C[1], C[2], C[3]))):
        qs = results["inputs"][l]["a"]["quantiles"]
        y = -2.2 - 0.6 * i
        ax.plot([qs[1], qs[7]], [y, y], color=col, lw=4, solid_capstyle="butt", label=f"layer {l}: 1–99 % of a")
        ax.plot([qs[4]], [y], "|", color="k", ms=8)
    ax.set_xlabel("z")
    ax.set_ylim(-2.2 - 0.6 * len(layers), None)
    ax.legend(loc="upper left")
    return ax


def plot_projection_shift(results: dict, ax):
    """Per layer, the mean of the gate inputs a = x·q_j and of the up inputs b = x·k_j
    over all tokens and units, in units of their standard deviation."""
    L = _layers(results)
    for name, col, lab, mk in (("a", C[0], "gate a = x·q", "o"), ("b", C[1], "up b = x·k", "s")):
        ax.plot(L, [r[name]["mean"] / r[name]["sd"] for r in results["inputs"]], marker=mk, ms=3,
                color=col, label=lab)
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean / sd over tokens, units")
    ax.legend(loc="lower right")
    return ax


def plot_outliers(results: dict, ax):
    """Median and largest peak |σ(a)b| (relative to the layer's median unit) per bin of
    the input-space alignment |corr(a, b)|, all layers pooled."""
    b = results["alignment_bins"]["corr_ab"]
    e = np.array(b["edges"])
    centres = (e[:-1] + e[1:]) / 2
    med = np.array([np.nan if v is None else v for v in b["median"]])
    mx = np.array([np.nan if v is None else v for v in b["max"]])
    q99 = np.array([np.nan if v is None else v for v in b["q99"]])
    ax.plot(centres, mx, "^-", color=C[1], ms=4, label="largest")
    ax.plot(centres, q99, "s-", color=C[2], ms=3, label="99th percentile")
    ax.plot(centres, med, "o-", color=C[0], ms=3, label="median")
    ax.set_yscale("log")
    ax.set_xlabel("|corr(a, b)| on real tokens")
    ax.set_ylabel("peak |σ(a)b| / layer median")
    ax.legend(loc="upper left")
    return ax


def _legend_below(ax, ncol: int = 2):
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False,
              handlelength=1.6, columnspacing=1.0)


def plot_layer_losses(results: dict, ax, kinds: Sequence[str], *, log: bool = True):
    """Per layer, the held-out loss change (nats) of each intervention in ``kinds``
    (results keys such as ``"swap"`` or ``"rescale:2"``), ± one standard error; on a
    log scale (every change must then be positive) or a linear one."""
    for kname in kinds:
        kind, alpha = (("rescale", float(kname.split(":")[1])) if kname.startswith("rescale:") else (kname, None))
        ch = layer_changes(results, kind, alpha)
        L = [l for l, c in enumerate(ch) if c is not None]
        m = np.array([ch[l][0] for l in L])
        s = np.array([ch[l][1] for l in L])
        if log and (m <= 0).any():
            raise ValueError(f"{kname}: a log scale needs positive changes; use log=False")
        ax.errorbar(L, m, yerr=s, fmt=MARKER.get(kname, "o") + "-", ms=3.5, lw=1, capsize=0,
                    color=COLOR.get(kname, C[7]), mec="k" if kname == "rescale:0.5" else None, mew=0.5,
                    label=LABELS.get(kname, kname))
    if log:
        ax.set_yscale("log")
    else:
        ax.axhline(0, color=C[7], lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("Δ held-out loss (nats)")
    _legend_below(ax)
    return ax


def plot_local_change(results: dict, ax, kinds: Sequence[str] = ("swap", "symmetrized", "linear", "rescale:2")):
    """Per layer, the relative change of the MLP's output on its own real inputs."""
    L = _layers(results)
    for kname in kinds:
        ax.plot(L, [lc[kname] for lc in results["local_change"]], MARKER.get(kname, "o") + "-", ms=3,
                color=COLOR.get(kname, C[7]), label=LABELS.get(kname, kname))
    ax.set_xlabel("layer")
    ax.set_ylabel("‖f′(x) − f(x)‖ / ‖f(x)‖")
    ax.legend(loc="upper left")
    return ax


def plot_alpha(results: dict, ax):
    """Held-out loss change of q → αq, k → k/α in every layer against |α| (log scales),
    for α > 0 and α < 0 (α = 1, the model itself, is left out: its change is 0), with the
    levels of the tangent layer (the α → 0 limit), the exchange and no MLP in every layer."""
    alphas = sorted(float(a) for a in results["config"]["alphas_all"] if float(a) != 1.0)
    for sign, lab, mk, ls in ((1, "α > 0", "o", "-"), (-1, "α < 0", "s", "--")):
        al = [a for a in alphas if a * sign > 0]
        ch = [all_changes(results, "rescale", a)[0] for a in al]
        ax.plot([abs(a) for a in al], ch, marker=mk, ms=4, ls=ls, color=COLOR["rescale:2"], label=lab)
    for kname, ls, lab in (("none", ":", "no MLP"), ("swap", "-.", "swap q↔k"), ("linear", "--", "σ → z/2")):
        ax.axhline(all_changes(results, kname)[0], color=COLOR[kname], ls=ls, lw=1.2, label=lab)
    ax.axvline(1.0, color=C[7], lw=0.8, alpha=0.5)
    ax.text(1.0, 0.03, " α = 1: the model", transform=ax.get_xaxis_transform(), fontsize=figures.FONT_PT,
            va="bottom", ha="left", color=C[7])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("|α| (every layer)")
    ax.set_ylabel("Δ held-out loss (nats)")
    _legend_below(ax, ncol=3)
    return ax
