"""Figures of a stored retraining grid: recovery curves and the paired gap to the control.

Each function draws into a given axes (``qkmlp.book.figures.panel()``) and returns it.
Colours: one per arm (the control black); line style: one per seed.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import ch11_report as R
from .figures import COLORS

__all__ = ["ARM_COLORS", "ARM_LABELS", "plot_recovery", "plot_gaps", "plot_matched"]

ARM_COLORS = {"gated": "#000000", "symmetrized": COLORS[0], "symmetric": COLORS[1], "swapped": COLORS[2],
              "identity": COLORS[3]}
#: Short labels: the unit each arm computes from a = x·q_j (gate) and b = x·k_j (up).
ARM_LABELS = {"gated": "gated σ(a)b (control)", "symmetrized": "symmetrised ½[σ(a)b+σ(b)a]",
              "symmetric": "symmetric σ(ab)", "swapped": "swapped σ(b)a", "identity": "bilinear ab"}
_STYLES = ["-", "--", ":", "-."]


def _plain_ticks(ax, axis: str = "y"):
    # ticks at 1, 2, 3, 5, 7 times a power of ten, written '3', '0.5' (not 3×10⁰)
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0, 7.0)))
    a.set_major_formatter(FormatStrFormatter("%g"))
    a.set_minor_formatter(NullFormatter())


def _xsteps(steps: np.ndarray) -> np.ndarray:
    # step 0 on a log axis: drawn at step 1 (the axis is labelled so)
    return np.maximum(steps, 1)


def plot_recovery(results: dict, ax, text: Optional[str] = None, *, legend: bool = True,
                  arms: Optional[list] = None):
    """Held-out loss against training step on ``text``, every arm (default: all but the
    matched controls) and seed, with the original model's loss (dotted grey); log-log axes
    (step 0 drawn at 1)."""
    text = R._text(results, text)
    for arm in (R.arms(results, matched=False) if arms is None else arms):
        for i, s in enumerate(R.seeds(results, arm)):
            steps, loss = R.curve(results, arm, s, text)
            ax.plot(_xsteps(steps), loss, _STYLES[i % len(_STYLES)], color=ARM_COLORS.get(arm, "grey"),
                    label=ARM_LABELS.get(arm, arm) if i == 0 else None)
    ax.axhline(R.original_loss(results, text), color="grey", ls=":", lw=1.2, label="model as trained")
    ax.set(xscale="log", yscale="log", xlabel="step (step 0 at 1)", ylabel="held-out loss, nats/token",
           title=text)
    _plain_ticks(ax)
    if legend:
        ax.legend()
    return ax


def plot_gaps(results: dict, ax, text: Optional[str] = None, *, legend: bool = True,
              arms: Optional[list] = None):
    """The paired gap arm − control against step on ``text``, every arm (default: all but
    the matched controls) and seed; log y where every gap is positive, else symmetric-log."""
    text = R._text(results, text)
    lows = []
    for arm in (R.arms(results, matched=False) if arms is None else arms):
        if arm == R.CONTROL:
            continue
        for i, s in enumerate(R.seeds(results, arm)):
            if s not in R.seeds(results, R.CONTROL):
                continue
            steps, gap = R.gap_curve(results, arm, s, text)
            lows.append(gap.min())
            ax.plot(_xsteps(steps), gap, _STYLES[i % len(_STYLES)], color=ARM_COLORS.get(arm, "grey"),
                    label=f"{arm}, seed {s}")
    if lows and min(lows) > 0:
        ax.set_yscale("log")
        _plain_ticks(ax)
    else:
        ax.set_yscale("symlog", linthresh=0.01)
        ax.axhline(0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="step (step 0 at 1)", ylabel="gap to the control, nats/token", title=text)
    if legend:
        ax.legend()
    return ax


def plot_matched(results: dict, ax, arm: str, control: str, text: Optional[str] = None, *,
                 legend: bool = True):
    """Chapter 11's matched control: the gap to the control (arm − control, same seed)
    against step on ``text`` for the symmetric ``arm`` (its colour, solid) and its matched
    gated ``control`` (grey, dashed), one line per seed (thin: seed 0, thick: seed 1);
    log-log axes. Equal starts, then: below the arm's line is a gated model that recovers
    more from the same distance."""
    text = R._text(results, text)
    for a, color, ls in ((arm, ARM_COLORS.get(arm, "grey"), "-"), (control, "#777777", "--")):
        for i, s in enumerate(R.seeds(results, a)):
            if s not in R.seeds(results, R.CONTROL):
                continue
            steps, gap = R.gap_curve(results, a, s, text)
            ax.plot(_xsteps(steps), gap, ls, color=color, lw=1.0 + 0.8 * i,
                    label=f"{ARM_LABELS.get(a, a) if a == arm else 'matched gated ' + a}, seed {s}")
    ax.set(xscale="log", yscale="log", xlabel="step (step 0 at 1)", ylabel="gap, nats/token", title=text)
    _plain_ticks(ax)
    if legend:
        ax.legend()
    return ax
