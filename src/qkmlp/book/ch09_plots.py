"""The chapter's figures of the weights and the inputs, drawn from a stored results file.

Every function takes the results dict of :func:`qkmlp.pretrained.runner.run` and a
matplotlib axes (and, where the figure reads one held-out text, ``text=``, default the
run's main text), draws one panel and returns the axes. The figures of the costs are in
:mod:`qkmlp.book.ch09_plots_costs`. Colours follow :data:`qkmlp.book.figures.COLORS`.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from . import figures
from ..pretrained.report import text_results

__all__ = ["legend_below", "plot_alignment_spread", "plot_cos_histogram", "plot_mean_rows", "plot_rows_against_mean",
           "plot_balance_fixed", "plot_gate_inputs", "plot_silu_range", "plot_offsets", "plot_residual_outliers",
           "plot_outlier_bins"]

C = figures.COLORS


def legend_below(ax, ncol: int = 2):
    """The axes' legend under the plot, spanning the figure's width (a figure legend at
    ``"outside lower center"``: constrained layout then keeps the axes as wide as the
    panel instead of shrinking them to the legend's width)."""
    handles, labels = ax.get_legend_handles_labels()
    return ax.figure.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False,
                            handlelength=1.2, handletextpad=0.4, columnspacing=0.8, borderaxespad=0.2)


def _layers(results) -> np.ndarray:
    return np.arange(results["model"]["n_layers"])


def plot_alignment_spread(results: dict, ax):
    """Per layer: the standard deviation of cos(q_j, k_j), of the shuffled baseline, and
    1/√d (independent random directions)."""
    L = _layers(results)
    w = results["weights"]
    d = results["model"]["d_model"]
    ax.plot(L, [a["cos"]["sd"] for a in w], "o-", color=C[0], ms=3, label="pairs (q_j, k_j)")
    ax.plot(L, [a["shuffled_cos"]["sd"] for a in w], "s-", color=C[1], ms=3, label="shuffled pairs")
    ax.axhline(1 / math.sqrt(d), color=C[7], ls="--", lw=1, label="1/√d")
    ax.set_xlabel("layer")
    ax.set_ylabel("sd of cos(q, k)")
    ax.set_ylim(0, 1.55 * max(a["cos"]["sd"] for a in w))
    ax.legend(loc="upper left")
    return ax


def plot_cos_histogram(results: dict, ax):
    """cos(q_j, k_j) pooled over all layers against the shuffled pairs (log counts)."""
    w = results["weights"]
    bins = len(w[0]["cos_hist"])
    edges = np.linspace(-1, 1, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    for name, col, lab, mk in (("cos_hist", C[0], "pairs (q_j, k_j)", "o"),
                               ("shuffled_cos_hist", C[1], "shuffled pairs", "s")):
        counts = np.sum([a[name] for a in w], axis=0).astype(float)
        counts[counts == 0] = np.nan
        ax.plot(centres, counts, marker=mk, ms=3, color=col, label=lab, drawstyle="steps-mid")
    ax.set_yscale("log")
    ax.set_ylim(0.5, None)
    ax.set_ylim(top=ax.get_ylim()[1] * 30)         # room for the legend above the peak
    ax.set_xlabel("cos(q, k)")
    ax.set_ylabel(f"units (all {len(w)} layers)")
    ax.legend(loc="upper left")
    return ax


def plot_mean_rows(results: dict, ax):
    """Per layer: ‖mean row‖ / RMS row norm of the gate rows, up rows and down columns,
    against the level of independent random rows, 1/√m (log scale)."""
    L = _layers(results)
    w = results["weights"]
    for name, col, mk, lab in (("gate", C[0], "o", "gate rows q_j"), ("up", C[1], "s", "up rows k_j"),
                               ("down", C[2], "^", "down columns v_j")):
        ax.plot(L, [a["probes"]["mean_row"][name] for a in w], marker=mk, ms=3, color=col, label=lab)
    ax.axhline(w[0]["probes"]["chance"], color=C[7], ls="--", lw=1, label="random rows, 1/√m")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("‖mean row‖ / RMS row")
    ax.legend(loc="upper right")
    return ax


def plot_rows_against_mean(results: dict, ax, texts: Optional[Sequence[str]] = None):
    """Per layer: the share of gate rows and of up rows pointing against the mean MLP input
    (positions ≥ 1), for each text (lines: the main text; band: the range over texts), and
    the gate's share with the norm gain replaced by its mean (main text)."""
    L = _layers(results)
    names = list(texts) if texts is not None else results["config"]["texts"]
    for field, col, mk, lab in (("frac_gate_against", C[0], "o", "gate rows"), ("frac_up_against", C[1], "s", "up rows")):
        vals = np.array([[r["mean_input"][field] for r in text_results(results, n)["inputs"]] for n in names])
        if len(names) > 1:
            ax.fill_between(L, vals.min(0), vals.max(0), color=col, alpha=0.2, lw=0)
        ax.plot(L, vals[0], marker=mk, ms=3, color=col, label=lab)
    main = text_results(results, names[0])["inputs"]
    if "frac_gate_against_flat_gain" in main[0]["mean_input"]:
        ax.plot(L, [r["mean_input"]["frac_gate_against_flat_gain"] for r in main], ":", color=C[0], lw=1.2,
                label="gate, gain → its mean")
    ax.axhline(0.5, color=C[7], lw=0.8)
    ax.set_ylim(0.3, 1.0)
    ax.set_xlabel("layer")
    ax.set_ylabel("share against mean input")
    ax.legend(loc="upper right")
    return ax


def plot_balance_fixed(results: dict, ax):
    """Per layer: mean ± sd of the gauge-invariant balance β̃_j = log‖q_j‖ − ½log(‖k_j‖‖v_j‖),
    paired and with q_j paired with another unit's (k, v)."""
    L = _layers(results)
    w = results["weights"]
    for name, col, lab, dx in (("balance_fixed", C[0], "pairs", -0.15),
                               ("shuffled_balance_fixed", C[1], "shuffled pairs", 0.15)):
        m = np.array([a["gauge"][name]["mean"] for a in w])
        s = np.array([a["gauge"][name]["sd"] for a in w])
        ax.errorbar(L + dx, m, yerr=s, fmt="o", ms=3, color=col, capsize=0, lw=1, label=lab)
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("β̃ (gauge fixed)")
    ax.legend(loc="lower left")
    return ax


def plot_gate_inputs(results: dict, ax, band: float = 1.0, text: Optional[str] = None):
    """Per layer: quantiles of the gate pre-activations a = x·q_j on the held-out tokens
    (positions ≥ 1; 1–99 % and 25–75 % bands, median), over the band |a| ≤ ``band``."""
    L = _layers(results)
    q = np.array([r["a"]["quantiles"] for r in text_results(results, text)["inputs"]])   # QUANTILES order
    ax.axhspan(-band, band, color=C[7], alpha=0.08, lw=0)
    ax.fill_between(L, q[:, 1], q[:, 7], color=C[0], alpha=0.25, lw=0, label="1–99 %")
    ax.fill_between(L, q[:, 3], q[:, 5], color=C[0], alpha=0.5, lw=0, label="25–75 %")
    ax.plot(L, q[:, 4], color=C[0], lw=1.4, label="median")
    ax.set_xlabel("layer")
    ax.set_ylabel("a = x·q (gate input)")
    ax.legend(loc="upper left")
    return ax


def plot_silu_range(results: dict, ax, layers: Sequence[int] = (0, 29), text: Optional[str] = None):
    """σ = SiLU and its tangent z/2 over the range of a; the 1–99 % range of a for
    ``layers`` drawn as horizontal bars below the curve."""
    inputs = text_results(results, text)["inputs"]
    lo = min(inputs[l]["a"]["quantiles"][1] for l in layers)
    hi = max(inputs[l]["a"]["quantiles"][7] for l in layers)
    z = np.linspace(min(lo, -4) - 0.5, max(hi, 4) + 0.5, 400)
    ax.plot(z, z / (1 + np.exp(-z)), color=C[0], label="SiLU(z)")
    ax.plot(z, z / 2, color=C[7], ls="--", lw=1, label="tangent z/2")
    for i, (l, col) in enumerate(zip(layers, (C[1], C[2], C[3]))):
        qs = inputs[l]["a"]["quantiles"]
        y = -2.2 - 0.6 * i
        ax.plot([qs[1], qs[7]], [y, y], color=col, lw=4, solid_capstyle="butt", label=f"layer {l}: 1–99 % of a")
        ax.plot([qs[4]], [y], "|", color="k", ms=8)
    ax.set_xlabel("z")
    ax.set_ylim(-2.2 - 0.6 * len(layers), None)
    ax.legend(loc="upper left")
    return ax


def plot_offsets(results: dict, ax, texts: Optional[Sequence[str]] = None):
    """Per layer and text: the mean over units of mean_t(a)/sd_t(a) for the gate input
    a = x·q_j and the same for the up input b (positions ≥ 1)."""
    L = _layers(results)
    names = list(texts) if texts is not None else results["config"]["texts"]
    styles = ["-", "--", ":"]
    for i, n in enumerate(names):
        inp = text_results(results, n)["inputs"]
        ls = styles[i % len(styles)]
        ax.plot(L, [r["mean_input"]["gate_offset"] for r in inp], ls, color=C[0], marker="o" if i == 0 else None,
                ms=3, label=f"gate, {n}")
        ax.plot(L, [r["mean_input"]["up_offset"] for r in inp], ls, color=C[1], marker="s" if i == 0 else None,
                ms=3, label=f"up, {n}")
    ax.axhline(0, color=C[7], lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean / sd over tokens")
    legend_below(ax)
    return ax


def plot_residual_outliers(results: dict, ax, text: Optional[str] = None):
    """Per layer: the largest |entry| of the residual stream entering it at position 0 and
    at positions ≥ 1, and the median |entry| (log scale), with Sun et al.'s threshold 100."""
    L = _layers(results)
    res = text_results(results, text)["residual"]
    ax.plot(L, [r["max_pos0"] for r in res], "o-", color=C[1], ms=3, label="largest, position 0")
    ax.plot(L, [r["max_rest"] for r in res], "s-", color=C[0], ms=3, label="largest, positions ≥ 1")
    ax.plot(L, [r["median"] for r in res], "-", color=C[7], lw=1.2, label="median")
    ax.axhline(100, color=C[7], ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("layer (stream entering it)")
    ax.set_ylabel("|residual entry|")
    ax.legend(loc="lower right")
    return ax


def plot_outlier_bins(results: dict, ax, by: str = "corr_ab", text: Optional[str] = None):
    """The 99th percentile and the largest peak |σ(a)b| (relative to the layer's median
    unit) per bin of alignment (``by`` = "corr_ab": |corr(a, b)| on the tokens, or "cos"),
    all layers pooled, with position 0 (open markers) and without it (filled)."""
    bins = text_results(results, text)["alignment_bins"]
    for suffix, fill, lab in (("all", "none", "with pos. 0"), ("rest", None, "pos. ≥ 1")):
        b = bins[f"{by}_{suffix}"]
        e = np.array(b["edges"])
        centres = (e[:-1] + e[1:]) / 2
        for field, col, mk in (("max", C[1], "^"), ("q99", C[2], "s")):
            y = np.array([np.nan if v is None else v for v in b[field]])
            ax.plot(centres, y, marker=mk, ms=4, color=col, mfc=fill if fill else col,
                    ls="--" if suffix == "all" else "-", label=f"{'max' if field == 'max' else '99 %'}, {lab}")
    ax.set_yscale("log")
    ax.set_xlabel("|corr(a, b)| on real tokens" if by == "corr_ab" else "|cos(q, k)|")
    ax.set_ylabel("peak |σ(a)b| / layer median")
    legend_below(ax)
    return ax
