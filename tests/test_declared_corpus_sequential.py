"""The declared readings of P1 on a second corpus (corpus_tests) and of the group-sequential
test at 24,000 steps (sequential_test), on constructed records against scipy."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from qkmlp.experiments.declared import corpus_tests, load_declarations, sequential_test

FOLDER = Path("book/data/experiments/declared")


def _results(losses: dict) -> dict:
    runs = [{"family": f, "seed": s, "test_loss": v} for f, by in losses.items() for s, v in by.items()]
    return {"meta": {"metric": "test_loss"}, "runs": runs}


def _holm(ps):
    """Holm's step-down adjustment, written out here."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = running
    return adj


def test_the_committed_declarations_load():
    decls = load_declarations(FOLDER, prefix="lm")
    py, seq = decls["lm-python-p1"], decls["lm24k-p1-sequential"]
    assert [c["id"] for c in py["comparisons"]] == ["p1-symmetrized", "gated-vs-kv"]
    assert py["equivalence"]["margin"] == decls["lm-compute-p1-symmetrized"]["equivalence"]["margin"]
    assert [lk["information_fraction"] for lk in seq["looks"]] == [0.5, 1.0]
    assert seq["looks"][0]["seeds"] == list(range(40, 60)) and seq["looks"][1]["seeds"] == list(range(40, 80))
    assert seq["spending"]["kind"] == "obrien-fleming"


def test_corpus_tests_against_scipy_and_the_rule():
    decl = json.loads((FOLDER / "lm-python-p1.json").read_text())
    rng = np.random.default_rng(5)
    seeds = list(range(20, 30))
    sym = {s: 1.0 + 0.02 * rng.normal() for s in seeds}
    swiglu = {s: sym[s] - 0.004 + 0.006 * rng.normal() for s in seeds}
    kv = {s: sym[s] + 0.03 + 0.004 * rng.normal() for s in seeds}
    res = _results({"gated1-silu": swiglu, "symgated1-silu": sym, "kv-relu": kv})
    rows = {r["id"]: r for r in corpus_tests(decl, res, seeds)}
    a = [swiglu[s] for s in seeds]
    ps = []
    for cid, b in (("p1-symmetrized", sym), ("gated-vs-kv", kv)):
        bb = [b[s] for s in seeds]
        ref = sps.ttest_rel(a, bb)
        r = rows[cid]
        assert r["t_p"] == pytest.approx(ref.pvalue, rel=1e-9)
        assert r["wilcoxon_p"] == pytest.approx(sps.wilcoxon(a, bb, method="exact").pvalue, rel=1e-9)
        d = np.subtract(a, bb)
        se = d.std(ddof=1) / math.sqrt(len(d))
        tost = max(sps.t.sf((d.mean() + 0.005) / se, len(d) - 1), sps.t.cdf((d.mean() - 0.005) / se, len(d) - 1))
        assert r["tost_p"] == pytest.approx(tost, rel=1e-9)
        half = sps.t.ppf(0.975, len(d) - 1) * se
        assert r["ci"] == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
        ps.append(ref.pvalue)
    holm = _holm(ps)
    for r, h in zip((rows["p1-symmetrized"], rows["gated-vs-kv"]), holm):
        assert r["holm_p"] == pytest.approx(h, rel=1e-9)
        want = ("a lower" if r["mean_diff"] < 0 else "b lower") if h < 0.05 else \
            "level within ±margin" if r["tost_p"] < 0.05 else "not resolved"
        assert r["verdict"] == want
    assert rows["gated-vs-kv"]["verdict"] == "a lower"


def test_corpus_tests_refuse_a_partial_grid():
    decl = json.loads((FOLDER / "lm-python-p1.json").read_text())
    seeds = list(range(20, 30))
    full = {s: 1.0 for s in seeds}
    res = _results({"gated1-silu": full, "symgated1-silu": full, "kv-relu": {s: 1.0 for s in seeds[:-1]}})
    with pytest.raises(ValueError, match=r"missing \[29\]"):
        corpus_tests(decl, res)          # the seeds of the declared size, 20-29


def _seq_results(shift, sd, seeds, rng):
    sym = {s: 1.5 + 0.02 * rng.normal() for s in seeds}
    return _results({"gated1-silu": {s: sym[s] + shift + sd * rng.normal() for s in seeds},
                     "symgated1-silu": sym})


def _by_hand(diffs, nominal_p, margin=0.005):
    d = np.asarray(diffs)
    p = sps.ttest_1samp(d, 0.0).pvalue
    se = d.std(ddof=1) / math.sqrt(len(d))
    half = sps.t.isf(nominal_p / 2, len(d) - 1) * se
    lo, hi = d.mean() - half, d.mean() + half
    if p <= nominal_p:
        return ("a lower" if d.mean() < 0 else "b lower"), (lo, hi)
    if -margin < lo and hi < margin:
        return "level within ±margin", (lo, hi)
    return None, (lo, hi)


def test_sequential_test_stops_continues_and_decides_by_hand():
    decl = json.loads((FOLDER / "lm24k-p1-sequential.json").read_text())
    nominal = [0.0030506, 0.0489995]      # the published boundaries 2.9626, 1.9686 as two-sided p
    rng = np.random.default_rng(11)
    cases = {"clear": (-0.012, 0.008), "null": (0.0, 0.008), "tiny": (0.0, 0.0008), "open": (-0.004, 0.014)}
    seen = set()
    for name, (shift, sd) in cases.items():
        res = _seq_results(shift, sd, range(40, 80), rng)
        out = sequential_test(decl, res)
        assert [b["nominal_p"] for b in out["bounds"]] == pytest.approx(nominal, rel=1e-4)
        va = {r["seed"]: r["test_loss"] for r in res["runs"] if r["family"] == "gated1-silu"}
        vb = {r["seed"]: r["test_loss"] for r in res["runs"] if r["family"] == "symgated1-silu"}
        want = None
        for k, seeds in enumerate((range(40, 60), range(40, 80))):
            dec, rci = _by_hand([va[s] - vb[s] for s in seeds], nominal[k])
            assert out["looks"][k]["rci"] == pytest.approx(rci, rel=1e-4)
            if dec is not None:
                want = (dec, k + 1)
                break
        if want is None:
            want = ("not resolved", 2)
        assert (out["verdict"], out["stopped_at"]) == want and out["status"] == "decided"
        assert len(out["looks"]) == want[1]
        seen.add(want)
    # the constructed cases reach every branch: stop early for a difference and for
    # equivalence, decide at the last look, and stay open
    assert {("a lower", 1), ("level within ±margin", 1), ("level within ±margin", 2), ("not resolved", 2)} <= seen


def test_sequential_test_waits_for_a_complete_look():
    decl = json.loads((FOLDER / "lm24k-p1-sequential.json").read_text())
    rng = np.random.default_rng(12)
    part = _seq_results(0.0, 0.008, range(40, 59), rng)
    out = sequential_test(decl, part)
    assert out["verdict"] is None and out["looks"] == [] and "look 1" in out["status"]
    for empty in ({"meta": {"metric": "test_loss"}, "runs": []},
                  _results({"gated1-silu": {40: 1.5}})):                   # no run, or one family only
        out = sequential_test(decl, empty)
        assert out["verdict"] is None and out["looks"] == [] and "look 1" in out["status"]
    # look 1 complete and undecided, look 2 not yet stored: the reading waits
    res = _seq_results(0.0, 0.008, range(40, 60), np.random.default_rng(4))
    out = sequential_test(decl, res)
    assert out["looks"][0]["decision"] == "continue"
    assert out["verdict"] is None and "look 2" in out["status"]


def test_sequential_table_and_bound_read_the_looks_taken():
    from qkmlp.book import ch08_verdicts as verdicts

    decl = json.loads((FOLDER / "lm24k-p1-sequential.json").read_text())
    res = _seq_results(0.0, 0.008, range(40, 60), np.random.default_rng(4))      # look 1: continue
    out = sequential_test(decl, res)
    head, body = verdicts.sequential_table(out, "SwiGLU", "symmetrised")
    assert len(head) == len(body[0]) == 8 and len(body) == 1
    r = out["looks"][0]
    d = np.asarray(r["diffs"])
    assert body[0][0] == "1" and body[0][1] == "40–59 (20)" and body[0][-1] == "go on to the next look"
    assert body[0][3] == f"{sps.ttest_1samp(d, 0.0).pvalue:.3g} (stops at ≤ 0.00305)"
    assert body[0][6] == f"{int((d < 0).sum())} of 20"
    b = verdicts.sequential_bound(out)
    half = sps.t.isf(0.0030506 / 2, 19) * d.std(ddof=1) / math.sqrt(20)
    assert (b["look"], b["n"]) == (1, 20)
    assert b["lead"] == pytest.approx(half - d.mean(), rel=1e-4) and b["deficit"] == pytest.approx(d.mean() + half, rel=1e-4)
    clear = sequential_test(decl, _seq_results(-0.012, 0.008, range(40, 60), np.random.default_rng(11)))
    assert clear["verdict"] == "a lower" and clear["stopped_at"] == 1
    assert verdicts.sequential_table(clear)[1][0][-1] == "stop: SwiGLU lower"
    assert verdicts.sequential_bound(clear)["deficit"] < 0              # the interval lies below zero
    with pytest.raises(ValueError, match="no look"):
        verdicts.sequential_bound(sequential_test(decl, _seq_results(0.0, 0.008, range(40, 50), np.random.default_rng(1))))


def test_sequential_runs_reads_only_the_declared_seeds(tmp_path):
    from qkmlp.experiments.declared import sequential_runs

    decl = json.loads((FOLDER / "lm24k-p1-sequential.json").read_text())
    for seed in (39, 40, 79, 80):
        (tmp_path / f"eval_gated1-silu_lr0.002_s{seed}.json").write_text(json.dumps({"seed": seed}))
    (tmp_path / "tune_gated1-silu_lr0.002_s40.json").write_text("{}")
    assert [r["seed"] for r in sequential_runs(decl, tmp_path)] == [40, 79]
    with pytest.raises(FileNotFoundError, match="no folder"):
        sequential_runs(decl, tmp_path / "missing")
