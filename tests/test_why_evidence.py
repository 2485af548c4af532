"""qkmlp.book.why_evidence: SwiGLU's lead with the declared tests' intervals, checked
against scipy's t-interval and against what is drawn on the axes."""
import math
import random

import numpy as np
import pytest
from scipy import stats

from qkmlp.book import figures, why_evidence as we


def _row(b, steps, diffs, verdict, holm_m=9, alpha=0.05):
    mean = sum(diffs) / len(diffs)
    ci = stats.t.interval(0.95, len(diffs) - 1, loc=mean, scale=stats.sem(diffs))
    return {"id": f"t-{b}", "a": "gated1-silu", "b": b, "steps": steps, "mean_diff": mean, "ci": tuple(ci),
            "diffs": list(diffs), "alpha": alpha, "holm_m": holm_m, "verdict": verdict}


def _rows():
    rng = random.Random(3)
    d = lambda mu, n: [rng.gauss(mu, 0.01) for _ in range(n)]          # noqa: E731
    return [_row("kv-relu", 6000, d(-0.04, 10), "a lower"), _row("kv-relu", 1500, d(-0.03, 10), "a lower"),
            _row("sg", 1500, d(0.002, 10), "not resolved"), _row("sg", 6000, d(-0.01, 20), "a lower"),
            {"id": "t-sg", "b": "sg", "steps": 24000, "verdict": "not yet run"}]


def test_leads_are_the_negated_differences_with_scipys_intervals():
    rows = _rows()
    got = we.leads(rows, ["kv-relu", "sg"])
    assert [(g["b"], g["steps"]) for g in got] == [("kv-relu", 1500), ("kv-relu", 6000), ("sg", 1500), ("sg", 6000)]
    for g in got:
        r = next(r for r in rows if (r["b"], r["steps"]) == (g["b"], g["steps"]))
        x = -np.asarray(r["diffs"])                       # the lead, seed by seed
        assert g["lead"] == pytest.approx(x.mean(), abs=1e-15) and g["n"] == len(x)
        lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert g["ci95"] == pytest.approx((lo, hi), abs=1e-12)
        lo, hi = stats.t.interval(1 - 0.05 / 9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert g["ci_family"] == pytest.approx((lo, hi), abs=1e-12)
        assert g["ci_family"][0] < g["ci95"][0] < g["lead"] < g["ci95"][1] < g["ci_family"][1]
        assert g["resolved"] == (r["verdict"] == "a lower")


def test_bad_input_is_named():
    rows = _rows()
    with pytest.raises(ValueError, match="no stored declared test against 'swap'"):
        we.leads(rows, ["swap"])
    with pytest.raises(ValueError, match="non-empty list"):
        we.leads(rows, "kv-relu")
    with pytest.raises(KeyError, match="holm_m"):
        we.leads([{k: v for k, v in rows[0].items() if k != "holm_m"}], ["kv-relu"])
    with pytest.raises(ValueError, match="holm_m"):
        we.leads([{**rows[0], "holm_m": 0}], ["kv-relu"])
    fig, ax = figures.panel()
    with pytest.raises(ValueError, match="no label for \\['sg'\\]"):
        we.plot_leads(we.leads(rows, ["kv-relu", "sg"]), ax, {"kv-relu": "plain"})


def test_the_axes_show_each_lead_and_both_intervals():
    rows = _rows()
    leads = we.leads(rows, ["kv-relu", "sg"])
    fig, ax = figures.panel()
    we.plot_leads(leads, ax, {"kv-relu": "over the plain MLP", "sg": "over the control"})
    bars = [tuple(line.get_ydata()) for line in ax.lines if len(line.get_xdata()) == 2
            and line.get_xdata()[0] == line.get_xdata()[1]]
    dots = [line for line in ax.lines if len(line.get_xdata()) == 1]
    assert len(dots) == len(leads) and len(bars) == 2 * len(leads)
    for g, dot in zip(leads, dots):
        assert dot.get_ydata()[0] == g["lead"]
        assert (dot.get_markerfacecolor() == "white") == (not g["resolved"])
        assert g["ci95"] in bars and g["ci_family"] in bars
    # the budgets are the ticks, each lead drawn near its own budget
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1,500", "6,000"]
    for g, dot in zip(leads, dots):
        assert math.isclose(round(dot.get_xdata()[0]), [1500, 6000].index(g["steps"]))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["over the plain MLP", "over the control"]
