"""qkmlp.book.ch10_cost: the verdict rows against the bench functions called directly,
and the phone layout of the table (verdict first, three columns)."""
from __future__ import annotations

import pytest

from qkmlp import bench
from qkmlp.book import ch10_cost


@pytest.fixture(scope="module")
def tiny_headlines():
    runs = [bench.run(("headline",), sizes={"d": 16, "m": 40, "ns": (32,)}, reps=5)
            for _ in range(2)]
    return [r["suites"]["headline"][0] for r in runs]


def test_verdict_rows_match_the_bench_functions(tiny_headlines):
    rows, spreads = ch10_cost.verdict_rows(tiny_headlines)
    assert [(r["pass"], r["layer"]) for r in rows] == [
        (t, k) for t, _ in ch10_cost.PASSES for k in ch10_cost.LAYERS]
    for r in rows:
        key = dict(ch10_cost.PASSES)[r["pass"]]
        assert spreads[r["pass"]] == bench.aa_spread(tiny_headlines, key)
        p = bench.pooled_paired_ratio(tiny_headlines, r["layer"], r["pass"])
        assert (r["median"], r["lo"], r["hi"]) == (p["median"], p["lo"], p["hi"])
        assert r["verdict"] == bench.control_verdict(p, spreads[r["pass"]])
        assert r["lo"] <= r["median"] <= r["hi"]


def test_verdict_table_puts_the_verdict_first(tiny_headlines, monkeypatch):
    shown = {}
    monkeypatch.setattr(ch10_cost.figures, "table",
                        lambda header, rows, **kw: shown.update(header=header, rows=rows, **kw))
    rows, spreads = ch10_cost.verdict_table(tiny_headlines)
    assert shown["header"][0] == "verdict" and len(shown["header"]) == 3
    assert [r[0] for r in shown["rows"]] == [r["verdict"] for r in rows]
    assert f"{spreads['forward'][0]:.3f}" in shown["caption"]
    with pytest.raises(ValueError, match="at least one"):
        ch10_cost.verdict_rows([])
