"""qkmlp.book.ch11_report and ch11_plots on synthetic results whose gaps are known by
construction (the numbers below are written from the construction, not read back)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qkmlp.book import ch11_plots as plots, ch11_report as R

STEPS = [0, 10, 50, 100, 200, 300]
TEXTS = ["doc", "code"]
ORIG = {"doc": 3.0, "code": 2.5}


def _run(arm, seed, offsets, rng):
    """A run whose per-window loss is control(step) + offset(step) + window noise (the
    same noise in every arm of one seed, so paired gaps are exact at the windows' level
    up to the arm's own noise)."""
    heldout, before, after = {}, {}, {}
    for t in TEXTS:
        base = ORIG[t] - 0.2 * np.log1p(np.array(STEPS)) / np.log1p(300)       # the control's curve
        curve = base + offsets[t]
        heldout[t] = curve.tolist()
        w_noise = rng[t]                                                       # shared window noise
        w_noise = w_noise - w_noise.mean()
        own = np.array([0.01, -0.01, 0.02, -0.02]) if arm != "gated" else np.zeros(4)
        before[t] = (curve[0] + w_noise).tolist()
        after[t] = (curve[-1] + w_noise + own).tolist()
    rec = {"arm": arm, "seed": seed, "curve": {"step": STEPS, "heldout": heldout},
           "windows_before": before, "windows_after": after,
           "lr_per_step": [1e-4 * min(1, (i + 1) / 15) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 300)))
                           for i in range(300)]}
    if arm == "gated":
        rec["heldout_transformers"] = {t: [ORIG[t] + x for x in rng[t] - rng[t].mean()] for t in TEXTS}
    return rec


def results(gap_end=(0.3, 0.25), arms_=("gated", "symmetrized")):
    runs = []
    for seed, ge in zip((0, 1), gap_end):
        rng = {t: np.random.default_rng([seed, i]).normal(0, 0.3, 4) for i, t in enumerate(TEXTS)}
        # the arm's offset decays from 2.0 at step 0 to ge at the end, the same on both texts
        off = 2.0 + (ge - 2.0) * np.array(STEPS) / 300
        for arm in arms_:
            o = np.zeros(len(STEPS)) if arm == "gated" else off
            runs.append(_run(arm, seed, {t: o for t in TEXTS}, rng))
    return {"meta": {}, "tuning": {}, "texts": {t: {} for t in TEXTS},
            "config": {"arm_blocks": [["gated", "symmetrized", "symmetric"]], "main_text": "doc",
                       "heldout_texts": ["code", "doc"]},
            "runs": runs}


def test_arms_seeds_texts_and_curves():
    res = results()
    assert R.arms(res) == ["gated", "symmetrized"]
    assert R.seeds(res) == [0, 1] and R.texts(res) == ["doc", "code"]
    s, gap = R.gap_curve(res, "symmetrized", 1, "code")
    assert s.tolist() == STEPS
    np.testing.assert_allclose(gap, 2.0 + (0.25 - 2.0) * np.array(STEPS) / 300, atol=1e-12)
    assert R.original_loss(res, "code") == pytest.approx(2.5)


def test_closed_at_reads_the_construction():
    res = results()
    # the gap decays linearly from 2.0 to 0.25 (seed 1) over 300 steps: at step 50 it is
    # 2.0 - 1.75 / 6, so the share closed is (1.75 / 6) / 2.0
    assert R.closed_at(res, "symmetrized", 1, 50, "code") == pytest.approx(1.75 / 6 / 2.0, abs=1e-12)
    assert R.closed_at(res, "symmetrized", 0, 300) == pytest.approx(1 - 0.3 / 2.0, abs=1e-12)
    assert R.closed_at(res, "symmetrized", 0, 0) == 0.0
    with pytest.raises(ValueError, match="step 25 was not evaluated"):
        R.closed_at(res, "symmetrized", 0, 25)


def test_gap_summary_reads_the_construction():
    g = R.gap_summary(results(), "symmetrized")
    assert g["seeds"] == [0, 1]
    np.testing.assert_allclose(g["start"], [2.0, 2.0], atol=1e-12)
    np.testing.assert_allclose(g["end"], [0.3, 0.25], atol=1e-12)
    np.testing.assert_allclose(g["closed"], [1 - 0.3 / 2, 1 - 0.25 / 2], atol=1e-12)
    # the last 100 steps (200 -> 300) of a linear decay from 2.0 to ge over 300 steps
    np.testing.assert_allclose(g["tail_change"], [(0.3 - 2.0) / 3, (0.25 - 2.0) / 3], atol=1e-12)
    # the windows' own noise (±0.01, ±0.02, mean 0): sd of [0.01, -0.01, 0.02, -0.02] / 2
    se = np.std([0.01, -0.01, 0.02, -0.02], ddof=1) / 2
    np.testing.assert_allclose(g["end_se"], [se, se], atol=1e-12)
    assert all(p < 1e-3 for p in g["end_p"]) and g["same_sign"]
    ctrl_end = ORIG["doc"] - 0.2
    np.testing.assert_allclose(g["control_to_original"], [ctrl_end - 3.0] * 2, atol=1e-12)
    np.testing.assert_allclose(g["to_original"], [ctrl_end + 0.3 - 3.0, ctrl_end + 0.25 - 3.0], atol=1e-12)


def test_a_gap_of_changing_sign_or_unresolved_is_not_same_sign():
    assert not R.gap_summary(results(gap_end=(0.3, -0.3)), "symmetrized")["same_sign"]
    assert not R.gap_summary(results(gap_end=(0.3, 0.001)), "symmetrized")["same_sign"]


def test_recovery_rows():
    rows = R.recovery_rows(results())
    assert len(rows) == 1 and rows[0][0] == "symmetrized"
    assert rows[0][1] == "2.00" and rows[0][2].startswith("+0.300 ± ") and "; +0.250 ± " in rows[0][2]
    assert rows[0][3] == "85.0\u00a0% to 87.5\u00a0%"


def test_window_gap_between_two_arms():
    # a third arm whose end windows are the symmetrised arm's plus known per-window amounts
    res = results(arms_=("gated", "symmetrized", "swapped"))
    res["config"]["arm_blocks"] = [["gated", "symmetrized", "symmetric"], ["swapped"]]
    extra = np.array([0.10, 0.12, 0.08, 0.10])
    for r in res["runs"]:
        if r["arm"] == "swapped" and r["seed"] == 0:
            sz = R.run_of(res, "symmetrized", 0)
            r["windows_after"]["doc"] = (np.array(sz["windows_after"]["doc"]) + extra).tolist()
    w = R.window_gap(res, "symmetrized", 0, "doc", against="swapped")
    assert w["mean"] == pytest.approx(-0.10, abs=1e-12) and w["n"] == 4
    assert w["se"] == pytest.approx(np.std(extra, ddof=1) / 2, abs=1e-12) and w["p"] < 0.01
    # the default reference is still the control: symmetrised − control is 0.3 by construction
    assert R.window_gap(res, "symmetrized", 0, "doc")["mean"] == pytest.approx(0.3, abs=1e-12)
    with pytest.raises(ValueError, match="gap to itself"):
        R.window_gap(res, "swapped", 0, against="swapped")


def test_schedule_at():
    res = results()
    assert R.schedule_at(res, 14) == pytest.approx(1.0, abs=1e-3)
    assert R.schedule_at(res, 299) == pytest.approx(0.1, abs=1e-3)


def test_bad_input_is_refused(tmp_path):
    res = results()
    with pytest.raises(KeyError, match="no held-out text 'poem'"):
        R.curve(res, "gated", 0, "poem")
    with pytest.raises(KeyError, match="no stored run of arm 'symmetric'"):
        R.run_of(res, "symmetric", 0)
    with pytest.raises(ValueError, match="'before' or 'after'"):
        R.window_gap(res, "symmetrized", 0, when="during")
    bad = results()
    bad["runs"][1]["curve"]["step"] = STEPS[:-1] + [301]
    with pytest.raises(ValueError, match="different steps"):
        R.gap_curve(bad, "symmetrized", 0)
    bad = results()
    bad["runs"][2]["heldout_transformers"]["doc"][0] += 1.0
    with pytest.raises(ValueError, match="disagree on the original model"):
        R.original_loss(bad)
    bad = results()
    bad["runs"][1]["curve"]["heldout"]["doc"][-1] += 0.1      # curve and windows out of step
    with pytest.raises(ValueError, match="not the curve's last point"):
        R.gap_summary(bad, "symmetrized")
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"meta": {}, "runs": []}))
    with pytest.raises(ValueError, match="not a retraining results file: no config, tuning, texts"):
        R.load_retrain(p)
    p.write_text(json.dumps({**results(), "runs": []}))
    with pytest.raises(ValueError, match="no main runs"):
        R.load_retrain(p)


def test_plots_draw_every_arm_and_seed():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = results()
    fig, (a1, a2) = plt.subplots(1, 2)
    plots.plot_recovery(res, a1)
    plots.plot_gaps(res, a2, "code")
    assert len(a1.get_lines()) == 4 + 1 and a2.get_yscale() == "log" and len(a2.get_lines()) == 2
    np.testing.assert_allclose(a2.get_lines()[1].get_ydata(), R.gap_curve(res, "symmetrized", 1, "code")[1])
    fig2, a3 = plt.subplots()
    plots.plot_gaps(results(gap_end=(0.3, -0.3)), a3)
    assert a3.get_yscale() == "symlog"
    plt.close("all")


# ---- the declared matched-control test (retrain-matched-control.json) -------------------

MC_TEXTS = ["shakespeare_test", "python_test", "pydoc_topics"]
MC_DECL = {"alpha": 0.05, "equivalence": {"margin": 0.1}}


def _mc_results(delta, s_gap=2.0, n=16):
    """Windows at the end of training: control c, symmetric arm S = c + s_gap + noise,
    matched control M = S + delta[(arm, seed)] + noise (16 windows per text)."""
    runs = []
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        c = {t: (3.0 + rng.normal(0, 0.5, n)).tolist() for t in MC_TEXTS}
        runs.append({"arm": "gated", "seed": seed, "windows_after": c})
        for arm, m_arm in (("symmetrized", "swapped-f0.250"), ("symmetric", "swapped-f0.800")):
            s = {t: (np.array(c[t]) + s_gap + rng.normal(0, 0.01, n)).tolist() for t in MC_TEXTS}
            m = {t: (np.array(s[t]) + delta[arm, seed] + rng.normal(0, 0.01, n)).tolist() for t in MC_TEXTS}
            runs += [{"arm": arm, "seed": seed, "windows_after": s}, {"arm": m_arm, "seed": seed, "windows_after": m}]
    res = {"config": {"heldout_texts": MC_TEXTS, "main_text": "pydoc_topics",
                      "arm_blocks": [["gated", "symmetrized", "symmetric"], ["swapped-f0.250", "swapped-f0.800"]]},
           "runs": runs}
    matching = {"matches": {"symmetrized": {"control": "swapped-f0.250"}, "symmetric": {"control": "swapped-f0.800"}}}
    return res, matching


def _deltas(a, b, c=None, d=None):
    return {("symmetrized", 0): a, ("symmetrized", 1): b, ("symmetric", 0): a if c is None else c,
            ("symmetric", 1): b if d is None else d}


def test_matched_control_cells_are_the_plain_window_means():
    res, matching = _mc_results(_deltas(-0.5, -0.4))
    out = R.matched_control(res, matching, MC_DECL)
    assert len(out["cells"]) == 12 and out["margin"] == 0.1
    for cell in out["cells"]:
        m = R.run_of(res, cell["control"], cell["seed"])["windows_after"][cell["text"]]
        s = R.run_of(res, cell["arm"], cell["seed"])["windows_after"][cell["text"]]
        c = R.run_of(res, "gated", cell["seed"])["windows_after"][cell["text"]]
        assert cell["D"] == pytest.approx(sum(m) / 16 - sum(s) / 16, abs=1e-12)
        assert cell["G"] == pytest.approx(sum(s) / 16 - sum(c) / 16, abs=1e-12)
        assert cell["share"] == pytest.approx(-cell["D"] / cell["G"])
        assert cell["holm_p"] >= cell["p"] and cell["n"] == 16
    # Holm over all twelve: the smallest p is multiplied by 12 (capped at 1)
    ps = sorted(c["p"] for c in out["cells"])
    assert min(c["holm_p"] for c in out["cells"]) == pytest.approx(min(1.0, 12 * ps[0]))


@pytest.mark.parametrize("deltas, verdict", [
    (_deltas(-0.5, -0.4), "symmetric form costs beyond its distance"),
    (_deltas(0.0, 0.0), "distance accounts for the gap"),
    (_deltas(0.5, 0.6), "gated form costs more at equal distance"),
    (_deltas(-0.05, -0.3), "not resolved"),          # beyond the margin in one seed only
])
def test_matched_control_verdict_follows_the_declared_rule(deltas, verdict):
    res, matching = _mc_results(deltas)
    out = R.matched_control(res, matching, MC_DECL)
    assert {a["verdict"] for a in out["arms"].values()} == {verdict}


def test_matched_control_budget_qualifier_and_third_seed():
    res, matching = _mc_results(_deltas(-0.5, 0.5, -1.9, -1.8))
    out = R.matched_control(res, matching, MC_DECL)
    sz, sy = out["arms"]["symmetrized"], out["arms"]["symmetric"]
    assert sz["third_seed"] and not sy["third_seed"]          # seed means of opposite sign
    assert sz["verdict"] == "not resolved"
    assert sz["budget_limited"] and not sy["budget_limited"]   # M's own gap 1.5-2.5 vs 0.1-0.2
    assert sy["verdict"] == "symmetric form costs beyond its distance"


def test_matched_control_refuses_missing_runs():
    res, matching = _mc_results(_deltas(-0.5, -0.4))
    with pytest.raises(ValueError, match="matches"):
        R.matched_control(res, {}, MC_DECL)
    bad = {"matches": {"symmetrized": {"control": "swapped-f0.123"}}}
    with pytest.raises(KeyError, match="swapped-f0.123"):
        R.matched_control(res, bad, MC_DECL)


# ---- the learning-rate-weighted tail, the matched controls' status ------------------------

def test_shrink_per_full_rate_divides_by_the_rate_actually_used():
    res = results(gap_end=(0.3, 0.25))
    # the gap falls linearly from 2.0 at step 0 to ge at step 300: from step 200 it falls
    # (2.0 - ge) / 3 over updates 200..299, whose summed rate (as a share of the peak) is
    # written out here from the schedule of _run, not read from the code under test
    lr = [min(1, (i + 1) / 15) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 300))) for i in range(300)]
    full = sum(lr[200:300]) / max(lr)
    got = R.shrink_per_full_rate(res, "symmetrized", "doc", from_step=200, per=100)
    assert got == pytest.approx([(2.0 - 0.3) / 3 / full * 100, (2.0 - 0.25) / 3 / full * 100], rel=1e-9)
    # a slower rate at the end makes the same fall count for more per full-rate step
    assert got[0] > (2.0 - 0.3) / 3
    with pytest.raises(ValueError, match="evaluated step before the last"):
        R.shrink_per_full_rate(res, "symmetrized", "doc", from_step=250)
    with pytest.raises(ValueError, match="evaluated step before the last"):
        R.shrink_per_full_rate(res, "symmetrized", "doc", from_step=300)


def test_arms_can_leave_out_the_matched_controls():
    res, _ = _mc_results(_deltas(-0.5, -0.4))
    assert R.arms(res) == ["gated", "symmetrized", "symmetric", "swapped-f0.250", "swapped-f0.800"]
    assert R.arms(res, matched=False) == ["gated", "symmetrized", "symmetric"]
    assert R.is_matched_control("swapped-f0.250") and not R.is_matched_control("swapped")


def test_matched_status_counts_the_records():
    res, matching = _mc_results(_deltas(-0.5, -0.4))
    res.update(tuning={"lr": 1e-4}, meta={"run_key": "abc"})
    stored = {"main-swapped-f0.250-lr0.0001-s0-abc.json"}
    st = R.matched_status(res, matching, stored.__contains__)
    assert st["want"] == [("swapped-f0.250", 0), ("swapped-f0.250", 1), ("swapped-f0.800", 0), ("swapped-f0.800", 1)]
    assert st["have"] == [("swapped-f0.250", 0)] and not st["complete"]
    assert st["text"].startswith("1 of the 4 runs are stored (swapped-f0.250, seed 0)")
    assert st["in_results"] == ["swapped-f0.250", "swapped-f0.800"]
    everything = R.matched_status(res, matching, lambda job: True)
    assert everything["complete"] and everything["text"] == "all 4 runs are stored"


def test_plot_matched_draws_the_arm_and_its_control_per_seed():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = results(arms_=("gated", "symmetrized", "swapped-f0.250"))
    res["config"]["arm_blocks"].append(["swapped-f0.250"])
    fig, (a1, a2) = plt.subplots(1, 2)
    plots.plot_matched(res, a1, "symmetrized", "swapped-f0.250", "code")
    lines = a1.get_lines()
    assert len(lines) == 4
    np.testing.assert_allclose(lines[3].get_ydata(), R.gap_curve(res, "swapped-f0.250", 1, "code")[1])
    # the chapter's first figures leave the matched controls out unless asked
    plots.plot_gaps(res, a2)
    assert len(a2.get_lines()) == 2
    plt.close("all")


def _distance_file(tmp_path, name, arms, key="k1"):
    path = tmp_path / name
    path.write_text(json.dumps({"meta": {"run_key": key}, "arms": arms}))
    return path


def test_distance_summary_is_the_plain_mean_over_layers(tmp_path):
    arm = {"start": {"a": 10.0, "b": 12.0, "v": 11.0}, "validation_mean": 11.0,
           "mlp_change": {"local": [0.5, 1.5, 1.0], "in_model": [0.5, 2.5, 3.0]}}
    d = R.load_distances(_distance_file(tmp_path, "one.json", {"x": arm}),
                         _distance_file(tmp_path, "two.json", {"y": {**arm, "validation_mean": 3.0}}))
    s = R.distance_summary(d, "x", ["a", "b"])
    assert s["start"] == {"a": 10.0, "b": 12.0} and s["validation_mean"] == 11.0
    assert s["local"] == pytest.approx(1.0) and s["in_model"] == pytest.approx(2.0) and s["in_model_max"] == 3.0
    assert R.distance_summary(d, "y", ["a"])["validation_mean"] == 3.0
    with pytest.raises(KeyError, match="no distance stored for 'z'"):
        R.distance_summary(d, "z", ["a"])
    with pytest.raises(KeyError, match="no start on"):
        R.distance_summary(d, "x", ["c"])
    with pytest.raises(ValueError, match="different run keys"):
        R.load_distances(_distance_file(tmp_path, "one.json", {"x": arm}),
                         _distance_file(tmp_path, "three.json", {"y": arm}, key="k2"))
    other = {**arm, "start": {"a": 9.0}}
    with pytest.raises(ValueError, match="stored twice"):
        R.load_distances(_distance_file(tmp_path, "one.json", {"x": arm}),
                         _distance_file(tmp_path, "four.json", {"x": other}))


def test_layer_excess_counts_and_averages_by_hand():
    def arm(local, in_model):
        return {"mlp_change": {"local": local, "in_model": in_model}}

    d = {"s": arm([2.0, 1.0, 3.0, 1.0], [4.0, 1.0, 1.0, 0.9]),
         "c1": arm([1.0, 2.0, 1.0, 0.5], [1.0, 1.0, 0.8, 1.1]),
         "c2": arm([1.5, 0.5, 2.0, 0.9], [2.0, 0.9, 0.5, 1.0])}
    out = R.layer_excess(d, "s", ["c1", "c2"])
    # in its layer: layers 0, 2 and 3 exceed both controls; layer 1 does not (c1 has 2.0)
    assert out["n_local_more"] == 3
    # in the model: only layer 0 exceeds 1.5 times both (4 > 1.5 * 2); layer 2 has 1.0 < 1.5 * 0.8
    assert out["big"].tolist() == [True, False, False, False]
    assert out["rest_arm"] == pytest.approx((1.0 + 1.0 + 0.9) / 3)
    assert out["rest_controls"] == pytest.approx({"c1": (1.0 + 0.8 + 1.1) / 3, "c2": (0.9 + 0.5 + 1.0) / 3})
    assert R.layer_excess(d, "s", ["c1"], factor=1.2)["big"].tolist() == [True, False, True, False]
    with pytest.raises(KeyError, match="no distance stored for 'x'"):
        R.layer_excess(d, "s", ["x"])
    with pytest.raises(ValueError, match="at least one control"):
        R.layer_excess(d, "s", [])
    with pytest.raises(ValueError, match="one change per layer"):
        R.layer_excess({**d, "c2": arm([1.0], [1.0])}, "s", ["c1", "c2"])
    with pytest.raises(ValueError, match="every layer"):
        R.layer_excess(d, "s", ["c1"], factor=0.1)
