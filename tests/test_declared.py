"""Declared tests: the commit-order check from git, and the declared analysis against
independent computations (scipy, numpy, constructed curves)."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from scipy.stats import ttest_1samp, ttest_rel

from qkmlp.experiments.declared import (budget_tests, commit_order, compute_multiplier, extension_tests,
                                        load_declarations, trend_tests)

FOLDER = "book/data/experiments/declared"


def _results(losses: dict, commit="c0") -> dict:
    """{family: {seed: loss}} -> a results dict of the runner's format."""
    runs = [{"family": f, "seed": s, "test_loss": v, "git_commit": commit, "git_dirty": False}
            for f, by in losses.items() for s, v in by.items()]
    return {"meta": {"metric": "test_loss"}, "runs": runs}


def _decl(a="gated1-silu", b="symgated1-silu", margin=0.005, key="t"):
    return {key: {"id": key, "comparison": {"a": {"family": a}, "b": {"family": b}}, "metric": "test_loss",
                  "alpha": 0.05, "equivalence": {"margin": margin}, "path": "x"}}


def test_the_committed_declarations_load_and_name_their_grids():
    decls = load_declarations(FOLDER, prefix="lm-compute")
    assert {"lm-compute-p1-symmetrized", "lm-compute-p1-symmetric", "lm-compute-gated-vs-kv",
            "lm-compute-trend", "lm-compute-multiplier"} <= set(decls)
    for d in decls.values():
        assert d["grids"] == ["lm_compute_1500.json", "lm_compute_6000.json", "lm_compute_24000.json"]


def test_budget_tests_follow_the_declared_rule_and_agree_with_scipy():
    rng = np.random.default_rng(0)
    seeds = range(10)
    base = {s: 1.5 + 0.02 * rng.normal() for s in seeds}
    clear = {s: base[s] - 0.02 + 0.002 * rng.normal() for s in seeds}      # a clearly lower
    level = {s: base[s] + 0.0005 * rng.normal() for s in seeds}            # within a 0.005 margin
    noisy = {s: base[s] + 0.03 * rng.normal() for s in seeds}              # neither
    res = {1500: _results({"a": clear, "b": base, "c": level, "d": noisy})}
    decls = {**_decl("a", "b", key="x"), **_decl("c", "b", key="y"), **_decl("d", "b", key="z")}
    rows = {r["id"]: r for r in budget_tests(decls, res)}
    assert [rows[k]["verdict"] for k in "xyz"] == ["a lower", "level within ±margin", "not resolved"]
    for k, a in zip("xyz", (clear, level, noisy)):
        want = ttest_rel([a[s] for s in seeds], [base[s] for s in seeds]).pvalue
        assert rows[k]["t_p"] == pytest.approx(want, rel=1e-9)
    ps = sorted(r["t_p"] for r in rows.values())
    assert min(r["holm_p"] for r in rows.values()) == pytest.approx(min(1, 3 * ps[0]))
    # a declaration naming three grids of which one is stored: Holm over all 3 x 3 = 9
    named = {k: {**d, "grids": ["g1", "g2", "g3"]} for k, d in decls.items()}
    rows9 = {r["id"]: r for r in budget_tests(named, res)}
    assert rows9["x"]["holm_m"] == 9 and rows9["x"]["holm_p"] == pytest.approx(min(1, 9 * ps[0]))


def test_trend_slopes_are_least_squares_slopes_in_log2_budget():
    rng = np.random.default_rng(1)
    steps = [1500, 6000, 24000]
    gap = {s: -0.004 * math.log2(s) for s in steps}           # a's lead grows by 0.004 per doubling
    res = {}
    for s in steps:
        b = {sd: 1.6 - 0.05 * math.log2(s) + 0.01 * rng.normal() for sd in range(10)}
        a = {sd: b[sd] + gap[s] + 0.0005 * rng.normal() for sd in range(10)}
        res[s] = _results({"a": a, "b": b})
    decl = {"id": "tr", "metric": "test_loss", "alpha": 0.05, "equivalence": {"margin": 0.001},
            "comparisons": [{"a": {"family": "a"}, "b": {"family": "b"}}]}
    (row,) = trend_tests(decl, res)
    x = np.log2(steps)
    want = [np.polyfit(x, [res[s]["runs"][sd]["test_loss"] - res[s]["runs"][10 + sd]["test_loss"] for s in steps],
                       1)[0] for sd in range(10)]
    assert row["slopes"] == pytest.approx(want, rel=1e-9)
    assert row["t_p"] == pytest.approx(ttest_1samp(want, 0).pvalue, rel=1e-9)
    assert row["verdict"] == "a gains with compute" and row["mean_slope"] == pytest.approx(-0.004, abs=5e-4)


def test_compute_multiplier_recovers_a_known_shift():
    # b's loss at budget s equals a's at s / 4 on a curve linear in log2(steps): multiplier 4
    steps = [1000, 4000, 16000, 64000]
    curve = lambda s: 2.0 - 0.1 * math.log2(s)
    res = {s: _results({"a": {sd: curve(s) for sd in range(5)}, "b": {sd: curve(s / 4) for sd in range(5)}})
           for s in steps}
    decl = {"metric": "test_loss", "comparisons": [{"a": {"family": "a"}, "b": {"family": "b"}}]}
    rows = compute_multiplier(decl, res, n_boot=200)
    assert [r["multiplier"] for r in rows] == pytest.approx([4.0, 4.0, 4.0])
    assert rows[0]["ci"] == pytest.approx((4.0, 4.0)) and rows[0]["outside_grid"] == 0.0
    res8 = {s: _results({"a": {sd: curve(s) for sd in range(5)}, "b": {sd: curve(s / 8) for sd in range(5)}})
            for s in steps}
    rows8 = compute_multiplier(decl, res8, n_boot=50)
    assert [r["multiplier"] for r in rows8] == pytest.approx([8.0, 8.0, math.inf])   # 16,000 x 8 > 64,000
    flipped = compute_multiplier({**decl, "comparisons": [{"a": {"family": "b"}, "b": {"family": "a"}}]}, res,
                                 n_boot=50)
    assert flipped[0]["multiplier"] == 0.0                     # a is there already at the smallest budget
    assert flipped[1]["multiplier"] == pytest.approx(0.25)


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_commit_order_from_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.org")
    _git(repo, "config", "user.name", "t")
    (repo / "code.py").write_text("1")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "code before")
    before = _git(repo, "rev-parse", "HEAD")
    (repo / "decl.json").write_text(json.dumps({"id": "decl"}))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "declared")
    at = _git(repo, "rev-parse", "HEAD")
    (repo / "code.py").write_text("2")
    _git(repo, "commit", "-qam", "code after")
    after = _git(repo, "rev-parse", "HEAD")
    decl = {"id": "decl", "path": str(repo / "decl.json")}
    run = lambda c, dirty=False: {"family": "f", "seed": 0, "lr": 1e-3, "git_commit": c, "git_dirty": dirty}
    ok = commit_order(decl, [run(at), run(after)])
    assert ok["status"] == "declared before its runs" and ok["declared_in"] == at and ok["after"] == 2
    bad = commit_order(decl, [run(after), run(before)])
    assert bad["status"] == "NOT declared before its runs" and "does not descend" in bad["problems"][0]
    assert "uncommitted" in commit_order(decl, [run(after, dirty=True)])["problems"][0]
    assert "no commit" in commit_order(decl, [{"family": "f", "seed": 1}])["problems"][0]
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "decl.json").write_text("{}")
    assert commit_order({"path": str(loose / "decl.json")}, [run(at)])["status"].startswith("unknown")


def _holm_by_hand(ps):
    """Holm's step-down adjustment written out: sort, multiply by (m - i), running max, cap at 1."""
    order = np.argsort(ps)
    m, out, run = len(ps), np.empty(len(ps)), 0.0
    for i, j in enumerate(order):
        run = max(run, (m - i) * ps[j])
        out[j] = min(1.0, run)
    return out


def _three_budgets(rng, new_budget_seeds=range(20)):
    """Losses of four families at three budgets, ten seeds at the first two and more at the last;
    a is clearly below d, slightly below b, level with c."""
    res = {}
    for steps, seeds, shift in ((1500, range(10), 0.02), (6000, range(10), 0.01), (24000, new_budget_seeds, 0.006)):
        base = {s: 1.6 + 0.02 * rng.normal() for s in seeds}
        res[steps] = _results({"gated1-silu": base,
                               "symgated1-silu": {s: base[s] + shift + 0.006 * rng.normal() for s in seeds},
                               "sym1-silu": {s: base[s] + 0.0005 * rng.normal() for s in seeds},
                               "kv-relu": {s: base[s] + 3 * shift + 0.006 * rng.normal() for s in seeds}})
    return res


def test_extension_tests_read_the_committed_twenty_seed_declaration_against_scipy():
    from scipy.stats import nct, t as student_t

    decls = load_declarations(FOLDER)
    per = {k: decls[k] for k in ("lm-compute-gated-vs-kv", "lm-compute-p1-symmetrized", "lm-compute-p1-symmetric")}
    ext = decls["lm24k-twenty-seeds"]
    res = _three_budgets(np.random.default_rng(1))
    out = extension_tests(ext, per, res, 24000, seeds=range(20), new_seeds=range(10, 20))
    rows = {r["id"]: r for r in out["rows"]}
    assert set(rows) == {"p1-symmetrized", "p1-symmetric", "gated-vs-kv"}
    assert rows["p1-symmetrized"]["b"] == "symgated1-silu" and rows["p1-symmetric"]["b"] == "sym1-silu"

    def vals(steps, fam, seeds):
        by = {r["seed"]: r["test_loss"] for r in res[steps]["runs"] if r["family"] == fam}
        return [by[s] for s in seeds]

    # the nine-member family: scipy's paired t-tests, Holm by hand
    members = [(steps, b) for b in ("kv-relu", "symgated1-silu", "sym1-silu") for steps in (1500, 6000, 24000)]
    ps = [ttest_rel(vals(s, "gated1-silu", range(20 if s == 24000 else 10)),
                    vals(s, b, range(20 if s == 24000 else 10))).pvalue for s, b in members]
    adj = dict(zip(members, _holm_by_hand(ps)))
    for r in rows.values():
        assert r["n"] == 20 and r["holm_m"] == 9
        assert r["t_p"] == pytest.approx(ttest_rel(vals(24000, "gated1-silu", range(20)),
                                                   vals(24000, r["b"], range(20))).pvalue, rel=1e-9)
        assert r["holm_p"] == pytest.approx(adj[24000, r["b"]], rel=1e-9)
        # mde: a true difference of mde gives power 0.8 for a two-sided test at 0.05/9 (noncentral t)
        crit = student_t.ppf(1 - 0.05 / 9 / 2, 19)
        nc = r["mde"] / (r["sd_diff"] / math.sqrt(20))
        assert 1 - nct.cdf(crit, 19, nc) + nct.cdf(-crit, 19, nc) == pytest.approx(0.8, abs=0.01)
    assert rows["gated-vs-kv"]["verdict"] == "a lower"
    # the replication: seeds 10-19 alone, Holm over the three
    rep = {r["id"]: r for r in out["replication"]}
    rps = [ttest_rel(vals(24000, "gated1-silu", range(10, 20)), vals(24000, rep[k]["b"], range(10, 20))).pvalue
           for k in rows]
    for k, p, h in zip(rows, rps, _holm_by_hand(rps)):
        assert rep[k]["n"] == 10 and rep[k]["t_p"] == pytest.approx(p, rel=1e-9)
        assert rep[k]["holm_p"] == pytest.approx(h, rel=1e-9)
        assert rep[k]["same_sign"] == (np.sign(rep[k]["mean_diff"]) == np.sign(rows[k]["mean_diff"]))
        assert "verdict" not in rep[k]


def test_extension_tests_refuse_a_partial_grid_or_an_undeclared_comparison():
    decls = load_declarations(FOLDER)
    per = {k: decls[k] for k in ("lm-compute-gated-vs-kv", "lm-compute-p1-symmetrized", "lm-compute-p1-symmetric")}
    ext = decls["lm24k-twenty-seeds"]
    res = _three_budgets(np.random.default_rng(2), new_budget_seeds=range(17))
    with pytest.raises(ValueError, match=r"missing \[17, 18, 19\]"):
        extension_tests(ext, per, res, 24000, seeds=range(20), new_seeds=range(10, 20))
    res = _three_budgets(np.random.default_rng(2))
    with pytest.raises(KeyError, match="not one of the per-budget"):
        extension_tests(ext, {k: per[k] for k in ("lm-compute-gated-vs-kv",)}, res, 24000, range(20), range(10, 20))
    with pytest.raises(ValueError, match="subset"):
        extension_tests(ext, per, res, 24000, seeds=range(20), new_seeds=range(15, 25))
