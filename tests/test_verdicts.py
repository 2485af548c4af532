"""Verdicts at the strength of their tests (qkmlp.book.ch08_verdicts), the leak measurements
(qkmlp.experiments.leaks), the width cost (qkmlp.experiments.width) and the compute figures:
each against an independent computation (scipy, brute force, a plain formula)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, ttest_1samp, wilcoxon

from qkmlp.book import ch08_report as report, ch08_verdicts as verdicts
from qkmlp.experiments import leaks, width
from qkmlp.experiments.tasks import split3


def _row(diffs, task="t"):
    """A gain row as report.gain makes it (positive: a better), from plain differences."""
    from qkmlp.runbase.stats import paired_comparison

    r = paired_comparison(diffs, [0.0] * len(diffs))
    r["task"] = task
    return r


def _holm_brute(p, alpha):
    """Holm's step-down rule applied directly: the set of rejected indices at level alpha."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out = set()
    for k, i in enumerate(order):
        if p[i] > alpha / (len(p) - k):
            break
        out.add(i)
    return out


def test_family_tests_against_scipy_and_the_holm_rule():
    rng = np.random.default_rng(3)
    diffs = [list(rng.normal(mu, sd, 10)) for mu, sd in ((1.2, 0.5), (0.0, 0.5), (-0.9, 0.5), (0.05, 0.5),
                                                         (0.3, 1.5))]
    rows = verdicts.family_tests([_row(d) for d in diffs], margin=0.6, missing=2)
    m = len(diffs) + 2
    t = [ttest_1samp(d, 0).pvalue for d in diffs] + [1.0, 1.0]
    w = [wilcoxon(d, method="exact").pvalue for d in diffs] + [1.0, 1.0]
    s = [binomtest(sum(x > 0 for x in d), len(d)).pvalue for d in diffs] + [1.0, 1.0]
    for alpha in (0.01, 0.05, 0.2):        # Holm-adjusted p below alpha <=> rejected by the rule
        for key, p in (("p_holm", t), ("wilcoxon_holm", w), ("sign_holm", s)):
            assert {i for i, r in enumerate(rows) if r[key] < alpha} == (_holm_brute(p, alpha) - {5, 6})
    for r, d in zip(rows, diffs):
        lower = ttest_1samp(d, -0.6, alternative="greater").pvalue
        upper = ttest_1samp(d, 0.6, alternative="less").pvalue
        assert r["tost_p"] == pytest.approx(max(lower, upper), rel=1e-9)
        assert r["family_size"] == m and r["margin"] == 0.6
    assert [r["verdict"] for r in rows] == ["a better", "level", "b better", "level", "not resolved"]
    assert rows[4]["mde"] > abs(rows[4]["mean_diff"])


def test_family_tests_margins_by_task_and_bad_input():
    rows = [_row([0.1, 0.2, 0.15, 0.12], "x"), _row([1.0, 2.0, 1.5, 1.2], "y")]
    out = verdicts.family_tests(rows, {"x": 0.5, "y": 0.1})
    assert [r["margin"] for r in out] == [0.5, 0.1]
    with pytest.raises(KeyError, match="no equivalence margin for task 'y'"):
        verdicts.family_tests([_row([1.0, 2.0, 1.5], "y")], {"x": 0.5})
    with pytest.raises(ValueError, match="at least one comparison"):
        verdicts.family_tests([], 0.1)
    with pytest.raises(ValueError, match="missing must be"):
        verdicts.family_tests(rows, 0.1, missing=-1)


def test_cells_of_narrow_tables():
    assert verdicts.signed(-0.0123, 3) == "\u22120.012" and verdicts.signed(0.0004, 3) == "+0.000"
    assert verdicts.signed(-0.0004, 3) == "+0.000"          # no minus zero
    assert verdicts.interval((-0.0117, 0.0223), 3) == "[\u22120.012,\u00a0+0.022]"
    row = {"mean_diff": 0.0053, "ci": (-0.0117, 0.0223), "verdict": "not resolved", "mde": 0.0251, "margin": 0.005}
    assert verdicts.gain_cell(row, 3) == "+0.005 [\u22120.012,\u00a0+0.022]"
    assert verdicts.gain_cell({**row, "mean_diff": 0.0039}, 2, scale=100) == "+0.39 [\u22121.17,\u00a0+2.23]"
    assert verdicts.verdict_cell(row, "SwiGLU", "control") == "not resolved"
    assert verdicts.gain_cell(row, 3, mde_digits=3) == "+0.005 [\u22120.012,\u00a0+0.022] (detectable 0.025)"
    assert verdicts.breakable("Symmetrised SwiGLU, symmetrised") == "Sym\u00admet\u00adrised SwiGLU, sym\u00admet\u00adrised"
    assert verdicts.breakable("symmetrised").replace("\u00ad", "") == "symmetrised"
    assert verdicts.breakable("symmetric SiLU") == "sym\u00admet\u00adric SiLU"
    assert verdicts.gain_cell({**row, "verdict": "level"}, 3, mde_digits=3) == "+0.005 [\u22120.012,\u00a0+0.022]"
    assert verdicts.verdict_cell({**row, "verdict": "level"}, "a", "b") == "level (±0.005)"
    assert verdicts.verdict_cell({**row, "verdict": "b better"}, "gated", "control") == "control better"


def _results(losses: dict) -> dict:
    runs = [{"family": f, "seed": s, "test_loss": v, "git_commit": "c", "git_dirty": False}
            for f, by in losses.items() for s, v in by.items()]
    return {"meta": {"metric": "test_loss"}, "runs": runs}


DECL = {"p": {"id": "p", "comparison": {"a": {"family": "a"}, "b": {"family": "b"}}, "metric": "test_loss",
              "alpha": 0.05, "equivalence": {"margin": 0.005}, "path": "x",
              "grids": ["g_1500.json", "g_6000.json", "g_24000.json"]}}
TREND = {"id": "tr", "metric": "test_loss", "alpha": 0.05, "equivalence": {"margin": 0.001},
         "grids": ["g_1500.json", "g_6000.json", "g_24000.json"],
         "comparisons": [{"a": {"family": "a"}, "b": {"family": "b"}}]}


def _grid(steps, lead):
    rng = np.random.default_rng(steps)
    b = {s: 2.0 - 0.1 * math.log2(steps) + 0.01 * rng.normal() for s in range(10)}
    return _results({"a": {s: b[s] - lead + 0.001 * rng.normal() for s in range(10)}, "b": b})


def test_budget_rows_name_the_budgets_not_stored():
    assert verdicts.declared_steps(DECL["p"]) == [1500, 6000, 24000]
    with pytest.raises(ValueError, match="step budget"):
        verdicts.declared_steps({"grids": ["lm.json"]})
    rows = verdicts.budget_rows(DECL, {1500: _grid(1500, 0.02)})
    assert [(r["steps"], r["verdict"]) for r in rows] == [(1500, "a lower"), (6000, "not yet run"),
                                                           (24000, "not yet run")]
    assert rows[0]["holm_m"] == 3          # Holm over the three declared grids, two entering as p = 1
    none = verdicts.budget_rows(DECL, {})
    assert [r["verdict"] for r in none] == ["not yet run"] * 3


def test_trend_and_multiplier_say_what_the_stored_budgets_allow():
    one = {1500: _grid(1500, 0.02)}
    assert verdicts.trend_status(TREND, one)["status"] == "not yet run"
    two = {1500: _grid(1500, 0.02), 6000: _grid(6000, 0.03)}
    st = verdicts.trend_status(TREND, two)
    assert st["status"] == "a difference of two budgets" and st["stored"] == [1500, 6000]
    (row,) = st["rows"]
    # with two budgets the slope in log2(steps) is the difference of the gaps over log2(4) = 2
    gaps = {s: np.array([two[s]["runs"][i]["test_loss"] - two[s]["runs"][10 + i]["test_loss"] for i in range(10)])
            for s in two}
    assert row["slopes"] == pytest.approx(list((gaps[6000] - gaps[1500]) / 2), rel=1e-9)
    three = {**two, 24000: _grid(24000, 0.04)}
    assert verdicts.trend_status(TREND, three)["status"] == "trend"
    mult = {"id": "m", "metric": "test_loss", "grids": TREND["grids"], "comparisons": TREND["comparisons"]}
    rows_one = verdicts.multiplier_status(mult, one, verdicts.budget_rows(DECL, one), n_boot=20)
    assert [r["status"] for r in rows_one] == ["not yet run", "not yet run"]
    budget = verdicts.budget_rows(DECL, two)
    rows_two = verdicts.multiplier_status(mult, two, budget, n_boot=20)
    assert [r["status"] for r in rows_two] == ["estimated", "not yet run"]
    assert rows_two[0]["multiplier"] > 1
    unresolved = [{**r, "verdict": "not resolved"} for r in budget]
    assert verdicts.multiplier_status(mult, two, unresolved, n_boot=20)[0]["status"] == "not resolved"


def test_compute_figures_draw_the_stored_budgets_only():
    from qkmlp.book.figures import panel

    g = _grid(1500, 0.02)
    for r in g["runs"]:
        r["family"] = {"a": "gated1-silu", "b": "kv-relu"}[r["family"]]
    grids = {1500: g}
    fig, ax = panel()
    report.plot_loss_vs_budget(grids, ["gated1-silu", "kv-relu"], ax, [1500, 6000, 24000])
    assert len(ax.containers) == 2                                 # one error bar per family
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "1\u2009500" and labels[1].endswith("not yet run")
    fig, ax = panel()
    decl = {"p": {**DECL["p"], "comparison": {"a": {"family": "gated1-silu"}, "b": {"family": "kv-relu"}}}}
    rows = verdicts.budget_rows(decl, grids)
    report.plot_gaps_vs_budget(rows, ax, [1500, 6000, 24000], {("gated1-silu", "kv-relu"): "a − b"}, margin=0.005)
    means = [c for c in ax.collections if len(c.get_offsets()) == 1]
    assert len(means) == 1 and means[0].get_offsets()[0][1] == pytest.approx(rows[0]["mean_diff"])
    want = np.mean([g["runs"][i]["test_loss"] - g["runs"][10 + i]["test_loss"] for i in range(10)])
    assert rows[0]["mean_diff"] == pytest.approx(want, rel=1e-9)


def test_split_overlap_of_the_seeded_and_the_fixed_split():
    n, fracs = 200, [0.6, 0.2, 0.2]
    old = leaks.split_overlap(leaks.seeded_split, n, fracs, [100], range(5))
    for s in range(5):        # brute force: the test indices of seed s in seed 100's validation split
        perm_t = torch.randperm(n, generator=torch.Generator().manual_seed(100)).tolist()
        perm_s = torch.randperm(n, generator=torch.Generator().manual_seed(s)).tolist()
        test, val = perm_s[40:80], perm_t[:40]
        assert old["in_tuning_val"][s] == sum(i in val for i in test) / 40
        assert old["in_own_train_or_val"][s] == 0.0
    assert 0 < np.mean(list(old["in_tuning_val"].values())) < 0.4
    new = leaks.split_overlap(split3, n, fracs, [100], range(5))
    assert set(new["in_tuning_any"].values()) == {0.0} == set(new["in_own_train_or_val"].values())
    with pytest.raises(ValueError, match="at least one"):
        leaks.split_overlap(split3, n, fracs, [], [1])


def test_recall_overlap_counts_shared_sequences_and_tables():
    cfg = dict(n_subjects=3, n_relations=2, n_values=4, n_filler=2, seq_len=4, n_train=40, n_val=10, n_test=10)
    same = leaks.recall_overlap(cfg, tune_seeds=[5], seeds=[5])     # a tuning seed that is an evaluation seed
    assert same["same_table"] and same["in_tuning"][5] >= same["in_own_train"][5]
    other = leaks.recall_overlap(cfg, tune_seeds=[100], seeds=[0, 1])
    assert not other["same_table"]
    from qkmlp.experiments.tasks import recall_splits
    tune = {tuple(r) for x in (recall_splits(cfg, 100)[1][0], recall_splits(cfg, 100)[1][2]) for r in x.tolist()}
    for s in (0, 1):
        test = [tuple(r) for r in recall_splits(cfg, s)[1][4].tolist()]
        assert other["in_tuning"][s] == sum(r in tune for r in test)


def test_width_model_sizes_and_step_timer():
    from qkmlp.experiments.lm import SIZES

    cfg = SIZES["cpu"]
    for d in (64, 128):
        model = width.build_model(d)
        ffn = model.blocks[0].ffn
        m = round(4 * d * 2 * d / (3 * d))                          # the gated width at the kv budget
        assert ffn.d_hidden == m
        blocks = cfg["n_layer"] * (4 * d * d + 2 * d + 3 * m * d)     # qkv, out, two norms, the gated FFN
        want = 96 * d + cfg["ctx"] * d + blocks + d + d * 96          # embeddings, final norm, head
        assert sum(p.numel() for p in model.parameters()) == want
    assert width.build_model(64).blocks[0].ffn.d_hidden == 171           # the stored model's
    run, _ = width.step_timer(64)
    assert run(1) > 0
    with pytest.raises(ValueError, match="multiple of n_head"):
        width.build_model(66)
    with pytest.raises(ValueError, match="rounds"):
        width.measure(rounds=0)


def test_status_text_says_what_is_stored_and_what_the_trend_can_say():
    labels = {"b": "control b"}
    one = {1500: _grid(1500, 0.02)}
    rows = verdicts.budget_rows(DECL, one)
    mult = {"id": "m", "metric": "test_loss", "grids": TREND["grids"], "comparisons": TREND["comparisons"]}
    text = verdicts.status_text(rows, verdicts.trend_status(TREND, one),
                                verdicts.multiplier_status(mult, one, rows, n_boot=20), labels)
    assert "**Stored:** 1\u202f500 steps." in text and "**Not yet run:** 6\u202f000 and 24\u202f000 steps." in text
    assert "**Trend:** not yet run" in text and "**Compute multiplier:** not yet run" in text
    two = {1500: _grid(1500, 0.02), 6000: _grid(6000, 0.03)}
    rows = verdicts.budget_rows(DECL, two)
    text = verdicts.status_text(rows, verdicts.trend_status(TREND, two),
                                verdicts.multiplier_status(mult, two, rows, n_boot=20), labels)
    assert "two budgets only" in text and "SwiGLU gains with compute" in text     # a's lead grows by 0.01
    assert "needs" in text and "times the steps to match SwiGLU at 1\u202f500" in text


def test_status_text_words_a_multiplier_outside_the_grid_as_declared():
    # rows as multiplier_status makes them; the words are checked against the declaration's
    # "beyond the grid" and the factor the grid reaches (24 000 / 1 500 = 16)
    labels = {"b": "control b", "c": "control c", "d": "control d"}
    budget = [{"a": "a", "b": x, "steps": s, "verdict": "a lower"} for x in "bcd" for s in (1500, 6000, 24000)]
    trend = {"status": "not yet run", "rows": []}
    mult = [{"a": "a", "b": "b", "steps": 1500, "status": "estimated", "multiplier": math.inf,
             "ci": (9.5, math.inf), "outside_grid": 0.93},
            {"a": "a", "b": "c", "steps": 1500, "status": "estimated", "multiplier": 5.04,
             "ci": (2.51, math.inf), "outside_grid": 0.04},
            {"a": "a", "b": "d", "steps": 6000, "status": "estimated", "multiplier": 1.44,
             "ci": (1.21, 1.69), "outside_grid": 0.0}]
    text = verdicts.status_text(budget, trend, mult, labels)
    assert "inf" not in text
    assert ("the control b does not reach SwiGLU's loss at 1\u202f500 within the grid: beyond the grid "
            "(more than 16 times the steps; 93 % of the seed resamples outside it)") in text
    assert ("the control c needs 5 times the steps to match SwiGLU at 1\u202f500 "
            "(95 % interval 2.5 to beyond the grid, which reaches 16)") in text
    assert "the control d needs 1.4 times the steps to match SwiGLU at 6\u202f000 (95 % interval 1.2 to 1.7)" in text


def test_a_multiplier_is_declared_only_where_its_trend_is_resolved():
    # lm-compute-multiplier as written (settled in lm24k-twenty-seeds): a multiplier is
    # reported where the comparison's trend test is resolved; elsewhere it is undeclared
    labels = {"b": "control b"}
    two = {1500: _grid(1500, 0.02), 6000: _grid(6000, 0.03)}
    rows = verdicts.budget_rows(DECL, two)
    mult = {"id": "m", "metric": "test_loss", "grids": TREND["grids"], "comparisons": TREND["comparisons"]}
    trend = verdicts.trend_status(TREND, two)
    assert trend["rows"][0]["verdict"] == "a gains with compute"
    m = verdicts.multiplier_status(mult, two, rows, n_boot=20, trend=trend)
    assert m[0]["status"] == "estimated" and m[0]["declared"] is True
    assert verdicts.multiplier_status(mult, two, rows, n_boot=20)[0]["declared"] is None
    flat = {**trend, "rows": [{**trend["rows"][0], "verdict": "not resolved"}]}
    m2 = verdicts.multiplier_status(mult, two, rows, n_boot=20, trend=flat)
    assert m2[0]["declared"] is False
    text = verdicts.status_text(rows, flat, m2, labels)
    assert "**Compute multiplier, undeclared**" in text and "**Compute multiplier:** " not in text
    assert "**Compute multiplier:** " in verdicts.status_text(rows, trend, m, labels)


def test_the_p_table_flags_a_t_wilcoxon_disagreement():
    labels = {"b": "control b"}
    row = {"b": "b", "steps": 1500, "verdict": "not resolved", "alpha": 0.05, "holm_p": 0.09, "tost_p": 0.7}
    _, body = verdicts.budget_p_table([{**row, "t_p": 0.018, "wilcoxon_p": 0.064},
                                       {**row, "t_p": 0.018, "wilcoxon_p": 0.027},
                                       {**row, "t_p": 0.2, "wilcoxon_p": 0.03},
                                       {**row, "verdict": "not yet run"}], labels)
    assert [b[3] for b in body] == ["0.064 (disagrees with t)", "0.027", "0.030 (disagrees with t)"]
    assert [b[2] for b in body] == ["0.018", "0.018", "0.200"]


def test_share_kept_is_one_minus_the_ratio_of_the_paired_means():
    rows = [{"b": "kv-relu", "steps": 1500, "verdict": "a lower", "mean_diff": -0.04},
            {"b": "symgated1-silu", "steps": 1500, "verdict": "not resolved", "mean_diff": 0.01},
            {"b": "kv-relu", "steps": 6000, "verdict": "a lower", "mean_diff": -0.04},
            {"b": "symgated1-silu", "steps": 6000, "verdict": "a lower", "mean_diff": -0.01},
            {"b": "kv-relu", "steps": 24000, "verdict": "not yet run"}]
    # SwiGLU leads the key-value MLP by 0.04; the control is 0.01 behind SwiGLU at 6 000,
    # so it keeps 0.03 of 0.04; at 1 500 it is 0.01 ahead of SwiGLU: 0.05 of 0.04
    assert verdicts.share_kept(rows) == pytest.approx({1500: 1.25, 6000: 0.75})
    with pytest.raises(KeyError, match="no stored budget"):
        verdicts.share_kept(rows[:1])
    with pytest.raises(ValueError, match="tie exactly"):
        verdicts.share_kept([{**rows[0], "mean_diff": 0.0}, rows[1]])


def test_extension_table_reads_a_constructed_re_test():
    from qkmlp.experiments.declared import extension_tests, load_declarations

    rng = np.random.default_rng(3)
    res = {}
    for steps, seeds in ((1500, range(10)), (6000, range(10)), (24000, range(20))):
        base = {s: 1.6 + 0.02 * rng.normal() for s in seeds}
        # seeds 10-19 of the last budget flip the symmetrised control's sign: 'opposite sign'
        sym = {s: base[s] + (0.01 if s < 10 else -0.004) + 0.002 * rng.normal() for s in seeds}
        res[steps] = {"meta": {"metric": "test_loss"},
                      "runs": [{"family": f, "seed": s, "test_loss": v}
                               for f, by in (("gated1-silu", base), ("symgated1-silu", sym),
                                             ("sym1-silu", {s: base[s] + 0.02 * rng.normal() for s in seeds}),
                                             ("kv-relu", {s: base[s] + 0.05 + 0.003 * rng.normal() for s in seeds}))
                               for s, v in by.items()]}
    decls = load_declarations("book/data/experiments/declared")
    per = {k: decls[k] for k in ("lm-compute-gated-vs-kv", "lm-compute-p1-symmetrized", "lm-compute-p1-symmetric")}
    out = extension_tests(decls["lm24k-twenty-seeds"], per, res, 24000, range(20), range(10, 20))
    labels = {"kv-relu": "key-value", "symgated1-silu": "symmetrised", "sym1-silu": "symmetric"}
    head, body = verdicts.extension_table(out, labels)
    assert head[2] == "SwiGLU − control, 20 seeds (95 % interval)" and head[4] == "seeds 10–19 alone (replication)"
    by = {r["id"]: (r, b) for r, b in zip(out["rows"], body)}
    r, b = by["gated-vs-kv"]
    assert b[0] == "SwiGLU lower" and b[4].endswith("same sign") and "(detectable" not in b[2]
    r, b = by["p1-symmetrized"]
    rep = {x["id"]: x for x in out["replication"]}["p1-symmetrized"]
    assert r["mean_diff"] < 0 < rep["mean_diff"] and b[4].endswith("opposite sign")
    assert b[3] == f"{r['holm_p']:.3f} / {r['t_p']:.3f} / {r['wilcoxon_p']:.3f}" + (
        " (disagrees with t)" if (r["t_p"] < 0.05) != (r["wilcoxon_p"] < 0.05) else "")
    r, b = by["p1-symmetric"]
    assert b[0] == "not resolved" and f"(detectable {r['mde']:.3f})" in b[2]


@pytest.mark.parametrize("noise, expected", [(0.002, "level (±0.005)"), (0.02, "not resolved")])
def test_corpus_table_reads_constructed_comparisons(noise, expected):
    from qkmlp.experiments.declared import corpus_tests

    decl = json.loads(open("book/data/experiments/declared/lm-python-p1.json").read())
    rng = np.random.default_rng(5)
    base = {s: 1.4 + 0.02 * rng.normal() for s in range(20, 30)}
    res = {"meta": {"metric": "test_loss"},
           "runs": [{"family": f, "seed": s, "test_loss": v}
                    for f, by in (("gated1-silu", base),
                                  ("symgated1-silu", {s: base[s] + noise * rng.normal() for s in base}),
                                  ("kv-relu", {s: base[s] + 0.05 + 0.003 * rng.normal() for s in base}))
                    for s, v in by.items()]}
    rows = corpus_tests(decl, res)
    head, body = verdicts.corpus_table(rows, {"symgated1-silu": "symmetrised", "kv-relu": "key-value"})
    assert head[-1] == "TOST (±0.005)" and len(body) == 2
    by = {r["b"]: (r, b) for r, b in zip(rows, body)}
    r, b = by["kv-relu"]
    assert b[0] == "SwiGLU lower" and b[3] == "10 of 10" and "(detectable" not in b[2]
    assert b[4].startswith(f"{r['holm_p']:.3g} / {r['t_p']:.3g} / ")
    r, b = by["symgated1-silu"]
    assert b[0] == expected
    assert ("(detectable" in b[2]) == (expected == "not resolved")
    assert b[3] == f"{sum(d < 0 for d in r['diffs'])} of 10" and b[5] == f"{r['tost_p']:.2f}"
