"""Chapter 10, the cost of the layers: the verdict tables the chapter reads off stored
benchmark runs, laid out for a phone (the verdict first, three columns).

- :func:`verdict_rows`: for both fused layers and both passes, the pooled paired ratio to
  the Llama MLP with its 95 % interval, the A/A control's spread over the same runs, and
  the verdict (``faster``, ``slower`` or ``parity``) of :func:`qkmlp.bench.control_verdict`.
- :func:`verdict_table`: the same as an HTML table, verdict | layer, pass | median
  [95 % interval], with the A/A spreads in the caption.
"""
from __future__ import annotations

from typing import Sequence

from .. import bench
from . import figures

__all__ = ["LAYERS", "PASSES", "RATIO_CANDIDATES", "ratio_panels", "verdict_rows", "verdict_table"]

#: The fused layers the headline suite times against the Llama MLP.
LAYERS = ("gated_mlp", "symmetric_mlp")
#: (timing key, paired-ratio key) of the two passes.
PASSES = (("forward", "fwd_vs_llama"), ("forward_backward", "fwd_bwd_vs_llama"))
_SHORT = {"gated_mlp": "gated", "symmetric_mlp": "symmetric", "forward": "fwd",
          "forward_backward": "fwd+bwd"}


def verdict_rows(headlines: Sequence[dict]) -> tuple[list[dict], dict]:
    """Pooled ratios to the Llama MLP, the A/A spread and the verdict, per layer and pass.

    ``headlines``: headline results of stored runs (one per run, as ``bench.run`` stores
    them under ``suites.headline``). Returns ``(rows, spreads)``: one row per (pass,
    layer), in the order of :data:`PASSES` and :data:`LAYERS`, with keys ``pass``,
    ``layer``, ``median``, ``lo``, ``hi`` (the pooled paired ratio and its
    distribution-free 95 % interval, :func:`qkmlp.bench.pooled_paired_ratio`) and
    ``verdict``; ``spreads`` maps each pass to the A/A control's (lo, hi) over the runs
    (:func:`qkmlp.bench.aa_spread`).
    """
    headlines = list(headlines)
    if not headlines:
        raise ValueError("verdict_rows needs at least one stored headline result")
    rows, spreads = [], {}
    for timing, key in PASSES:
        spread = bench.aa_spread(headlines, key)
        spreads[timing] = spread
        for layer in LAYERS:
            p = bench.pooled_paired_ratio(headlines, layer, timing)
            rows.append({"pass": timing, "layer": layer, "median": p["median"], "lo": p["lo"],
                         "hi": p["hi"], "verdict": bench.control_verdict(p, spread)})
    return rows, spreads


def verdict_table(headlines: Sequence[dict], *, what: str = "ratio to the Llama MLP"):
    """Show :func:`verdict_rows` as a three-column table (verdict first) and return
    ``(rows, spreads)``. The A/A spreads go into the caption, so no column needs them."""
    rows, spreads = verdict_rows(headlines)
    caption = (f"{what}, pooled over {len(list(headlines))} run(s): median [95 % interval]. "
               f"A/A spread: forward [{spreads['forward'][0]:.3f}, {spreads['forward'][1]:.3f}], "
               f"fwd+bwd [{spreads['forward_backward'][0]:.3f}, {spreads['forward_backward'][1]:.3f}]")
    figures.table(["verdict", "layer, pass", "median [95 %]"],
                  [[r["verdict"], f"{_SHORT[r['layer']]}, {_SHORT[r['pass']]}",
                    f"{r['median']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"] for r in rows],
                  caption=caption)
    return rows, spreads


#: (candidate, colour index in figures.COLORS, marker, label) drawn by :func:`ratio_panels`.
RATIO_CANDIDATES = (("gated_mlp", 0, "o", "gated_mlp"), ("symmetric_mlp", 1, "s", "symmetric_mlp"),
                    ("llama_mlp_copy", 7, "^", "A/A control"))


def ratio_panels(headlines: list, tables=(("fwd_vs_llama", "forward"),
                                          ("fwd_bwd_vs_llama", "forward + backward")),
                 candidates=RATIO_CANDIDATES, xlabel: str = "stored run") -> list:
    """One panel per ``(ratio key, title)`` of ``tables``: for each headline result (one
    per stored run, in order) the paired ratio to the Llama MLP of every candidate
    (median, error bar the 95 % interval), the A/A spread (:func:`qkmlp.bench.aa_spread`) shaded and
    1 drawn. ``headlines``: headline dicts of :func:`qkmlp.bench.bench_headline`. Returns the
    matplotlib figures (show them with ``figures.show``)."""
    if not headlines:
        raise ValueError("ratio_panels needs at least one headline result")
    out = []
    for key, title in tables:
        fig, ax = figures.panel(height=3.4)
        spread = bench.aa_spread(headlines, key)
        ax.axhspan(spread[0], spread[1], color="0.85", label="A/A spread")
        for j, (k, col, mk, lab) in enumerate(candidates):
            p = [h["paired_ratios"][k][key] for h in headlines]
            xs = [i + 1 + 0.2 * (j - 1) for i in range(len(headlines))]
            med = [q["median"] for q in p]
            err = [[q["median"] - q["lo"] for q in p], [q["hi"] - q["median"] for q in p]]
            ax.errorbar(xs, med, yerr=err, fmt=mk, color=figures.COLORS[col], capsize=2, label=lab)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(range(1, len(headlines) + 1))
        ax.set(xlabel=xlabel, ylabel="time / Llama MLP", title=title)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
        out.append(fig)
    return out
