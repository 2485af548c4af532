"""The why page's picture of the from-scratch evidence: SwiGLU's lead over other layers at
each declared budget, with the declared tests' intervals.

The rows are those of the declared tests (:func:`qkmlp.experiments.declared.budget_tests`
or the ``"family"`` of :func:`~qkmlp.experiments.declared.extension_tests`): paired
differences a − b of test loss, ``a`` SwiGLU. The lead is b − a (positive: SwiGLU lower).
Each lead carries two intervals of its paired differences, both Student-t:

- ``ci95``: the row's own 95 % interval (``ci``, as chapter 8 prints it), negated;
- ``ci_family``: the interval at level 1 − α/m for the m tests of the row's Holm family
  (Bonferroni), the width at which the nine tests together are read. Holm's step-down
  rejects at least what Bonferroni rejects, so this interval excludes zero only where the
  row's verdict is a difference; the converse can fail in general (the page asserts it
  holds for the stored tests).

Use::

    from qkmlp.book import why_evidence
    leads = why_evidence.leads(rows, ["kv-relu", "symgated1-silu"])
    fig, ax = figures.panel()
    why_evidence.plot_leads(leads, ax, {"kv-relu": "over the plain MLP", ...})
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..runbase.stats import t_interval

__all__ = ["RESOLVED", "leads", "plot_leads"]

#: The declared verdicts that are a difference (the rest: "level", "not resolved").
RESOLVED = ("a lower", "b lower")
_NEEDED = ("b", "steps", "mean_diff", "ci", "diffs", "alpha", "holm_m", "verdict")


def leads(rows: Sequence[dict], others: Sequence[str]) -> list[dict]:
    """One dict per (other layer, budget), in the order of ``others`` and then of steps:
    ``b``, ``steps``, ``n``, ``lead`` (= −mean_diff), ``ci95``, ``ci_family`` (both as
    (low, high) of the lead; see the module's text), ``verdict`` and ``resolved``.

    Rows whose verdict is ``"not yet run"`` are left out; every family in ``others`` must
    have at least one stored row, and every row used must carry the fields of a declared
    test row (``b``, ``steps``, ``mean_diff``, ``ci``, ``diffs``, ``alpha``, ``holm_m``,
    ``verdict``).
    """
    if isinstance(others, str) or not others:
        raise ValueError(f"others must be a non-empty list of family names, got {others!r}")
    out = []
    for b in others:
        mine = sorted((r for r in rows if r.get("b") == b and r.get("verdict") != "not yet run"),
                      key=lambda r: r["steps"])
        if not mine:
            have = sorted({str(r.get("b")) for r in rows})
            raise ValueError(f"no stored declared test against {b!r}; the rows compare against {have}")
        for r in mine:
            missing = [k for k in _NEEDED if k not in r]
            if missing:
                raise KeyError(f"row {r.get('id', '?')} at {r.get('steps', '?')} steps lacks {missing}; "
                               f"expected a declared test row (qkmlp.experiments.declared.budget_tests)")
            if not (isinstance(r["holm_m"], int) and r["holm_m"] >= 1 and 0 < r["alpha"] < 1):
                raise ValueError(f"row {r.get('id', '?')}: holm_m must be an integer >= 1 and alpha in (0, 1), "
                                 f"got {r['holm_m']!r} and {r['alpha']!r}")
            lo, hi = t_interval(r["diffs"], level=1 - r["alpha"] / r["holm_m"])
            out.append({"b": b, "steps": r["steps"], "n": len(r["diffs"]), "lead": -r["mean_diff"],
                        "ci95": (-r["ci"][1], -r["ci"][0]), "ci_family": (-hi, -lo),
                        "verdict": r["verdict"], "resolved": r["verdict"] in RESOLVED})
    return out


def plot_leads(rows: Sequence[dict], ax, labels: Mapping[str, str], colors: Sequence[str] | None = None):
    """Draw :func:`leads` on ``ax``: one colour per other layer (``labels``: {b: name in
    the legend}), the budgets side by side on the x axis. Each lead is a dot (filled where
    the declared test resolves it, hollow where it does not) on a thick bar (its 95 %
    interval) over a thin one (the interval for the whole Holm family); a line at zero."""
    from matplotlib.lines import Line2D

    from .figures import COLORS

    colors = list(colors or COLORS)
    keys = list(labels)
    unknown = sorted({r["b"] for r in rows} - set(keys))
    if unknown:
        raise ValueError(f"no label for {unknown}; labels name {keys}")
    if len(keys) > len(colors):
        raise ValueError(f"{len(keys)} layers but {len(colors)} colours")
    steps = sorted({r["steps"] for r in rows})
    for i, (key, color) in enumerate(zip(keys, colors)):
        mine = [r for r in rows if r["b"] == key]
        shift = 0.14 * (i - (len(keys) - 1) / 2)
        for r in mine:
            x = steps.index(r["steps"]) + shift
            ax.plot([x, x], r["ci_family"], color=color, lw=1.0, zorder=2, solid_capstyle="butt")
            ax.plot([x, x], r["ci95"], color=color, lw=3.2, zorder=3, solid_capstyle="butt")
            ax.plot([x], [r["lead"]], "o", ms=6.5, zorder=4, color=color, mew=1.5,
                    mfc=color if r["resolved"] else "white")
    ax.axhline(0, color="0.2", lw=0.8, zorder=1)
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels([f"{s:,}" for s in steps])
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.set_xlabel("training steps")
    ax.set_ylabel("SwiGLU's lead (nats/char)")
    ax.grid(axis="x", visible=False)
    # one entry per layer, in its colour (filled and hollow dots are said in the caption)
    handles = [Line2D([], [], color=c, marker="o", lw=3.2, ms=6.5, label=labels[k]) for k, c in zip(keys, colors)]
    ax.figure.legend(handles=handles, loc="outside lower center", ncol=1, handletextpad=0.4)
    return ax
