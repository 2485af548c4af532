"""Chapter 11's strongest matched control, on a tiny random Llama (float64, byte tokens):
the bisection that returns the closest fraction evaluated (on constructed functions and on
the stored evaluations of the first matching), control names that exchange named units as
well, the search for the units whose exchange moves the start most (against an exhaustive
search written with the plain formula), the second measures of distance (against hooks and
formulas written here), and the declared verdict on a control with named units."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp.book import ch11_report as CR  # noqa: E402
from qkmlp.pretrained import retrain as R  # noqa: E402
from qkmlp.pretrained.retrain import core  # noqa: E402
from qkmlp.pretrained.retrain.matching import bisect_closest  # noqa: E402
from test_retrain import PlainUnits, tiny_cfg, tiny_data, tiny_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- the bisection returns the closest fraction it evaluated ------------------------------

@pytest.mark.parametrize("target", [0.3, 17.77, 250.0, 998.0 ** 1.5 / 31.6])
def test_bisect_closest_on_a_monotone_function_is_the_grid_argmin(target):
    loss = lambda k: k ** 1.5 / 31.6  # noqa: E731  strictly rising
    got = bisect_closest(loss, target, 1, 999)
    brute = min(range(1, 1000), key=lambda k: (abs(loss(k) - target), k))
    assert got["k"] == brute
    assert got["value"] == loss(brute)
    assert len(got["evaluations"]) <= 2 + 10            # two ends and log2(998) halvings


def test_bisect_closest_on_the_first_matchings_evaluations_returns_the_closest():
    # the stored evaluations of the symmetrised arm's matching: the final bracket was
    # (0.258, 0.259), but 0.257 (and 0.261), evaluated on the way, lie closer to the target
    stored = json.loads((ROOT / "book/data/pretrained/retrain_matching.json").read_text())["matches"]["symmetrized"]
    table = {round(e["fraction"] * 1000): e["start"] for e in stored["evaluations"]}
    target = stored["target"]

    def loss(k):
        if k not in table:
            raise AssertionError(f"the bisection asked for k = {k}, which the stored run never evaluated")
        return table[k]

    got = bisect_closest(loss, target, 1, 999)
    closest = min(table, key=lambda k: abs(table[k] - target))
    assert got["k"] == closest == 257
    assert set(got["evaluations"]) == set(table)         # the same path as the stored run
    assert abs(table[257] - target) < abs(table[258] - target)


def test_bisect_closest_refines_around_a_jump_only_when_the_match_is_poor():
    # a rising step function with a jump at 500 that the bisection brackets without landing
    # near the target; the refined neighbours hold the value closest to it
    loss = lambda k: k / 100 + (5.0 if k >= 500 else 0.0) + (0.3 if k == 497 else 0.0)  # noqa: E731
    target = 5.25
    plain = bisect_closest(loss, target, 1, 999)
    assert plain["k"] == 499 and not plain["refined"]
    got = bisect_closest(loss, target, 1, 999, refine=3, refine_above=0.1)
    assert got["refined"] and got["k"] == 497                     # 4.97 + 0.3 = 5.27, |0.02| < |5.25 - 4.99|
    assert {496, 497, 498, 500, 501, 502} <= set(got["evaluations"])
    brute = min(got["evaluations"], key=lambda k: abs(loss(k) - target))
    assert got["k"] == brute
    calm = bisect_closest(loss, target, 1, 999, refine=3, refine_above=1.0)   # 0.26 is within 1.0
    assert not calm["refined"] and calm["evaluations"] == plain["evaluations"]


def test_bisect_closest_refuses_bad_input():
    with pytest.raises(ValueError, match="outside the starts"):
        bisect_closest(lambda k: float(k), 5000.0, 1, 999)
    with pytest.raises(ValueError, match="lo < hi"):
        bisect_closest(lambda k: float(k), 5.0, 9, 9)
    with pytest.raises(ValueError, match="refine"):
        bisect_closest(lambda k: float(k), 5.0, 1, 9, refine=-1)


# --- control names with named units --------------------------------------------------------

def test_arm_names_with_units_round_trip_and_are_checked():
    assert core.partial_swap_arm(0.8123, [(1, 83)]) == "swapped-f0.812+L1U83"
    assert core.partial_swap_arm(0.5, [(4, 2), (1, 83)]) == "swapped-f0.500+L1U83+L4U2"
    assert core.partial_swap_arm(0.5) == "swapped-f0.500"
    assert core.arm_units("swapped-f0.500+L1U83+L4U2") == (0.5, [(1, 83), (4, 2)])
    assert core.arm_units("swapped-f0.258") == (0.258, [])
    for bad in ([(1, 83), (1, 83)], [(-1, 2)], [(1.5, 2)], ["ab"]):
        with pytest.raises(ValueError, match="units must"):
            core.partial_swap_arm(0.5, bad)
    for bad in ("swapped-f0.500+L4U2+L1U83", "swapped-f0.500+L1U83+L1U83", "swapped-f0.5+L1U8", "swapped+L1U8"):
        with pytest.raises(ValueError):
            core.arm_units(bad)
        with pytest.raises(ValueError, match="unknown arm"):
            R.build_arm(tiny_llama(), bad)
    with pytest.raises(IndexError, match="beyond"):
        R.build_arm(tiny_llama(), "swapped-f0.500+L3U0")          # the tiny model has layers 0-2
    with pytest.raises(IndexError, match="extra units"):
        R.build_arm(tiny_llama(), "swapped-f0.500+L1U48")         # and 48 units
    assert tiny_cfg(arm_blocks=[["gated", "swapped-f0.125+L0U3"]])["arm_blocks"] == [["gated", "swapped-f0.125+L0U3"]]


def test_a_control_with_named_units_is_the_plain_formula():
    hf = tiny_llama()
    m = hf.config.intermediate_size
    ids = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(7))
    f = 0.25
    drawn = {i: torch.randperm(m, generator=torch.Generator().manual_seed(i))[:round(f * m)].tolist() for i in range(3)}
    free = {i: [u for u in range(m) if u not in drawn[i]] for i in range(3)}
    # layer 0: one unit outside the draw; layer 1: one already drawn (exchanged once, not twice);
    # layer 2: two outside the draw
    extra = {0: free[0][:1], 1: drawn[1][:1], 2: [free[2][0], free[2][-1]]}
    ref = copy.deepcopy(hf)
    for i, layer in enumerate(ref.model.layers):
        layer.mlp = PlainUnits(layer.mlp, sorted(set(drawn[i]) | set(extra[i])))
    model = copy.deepcopy(hf)
    R.build_arm(model, core.partial_swap_arm(f, [(i, u) for i in extra for u in extra[i]]))
    plain = copy.deepcopy(hf)
    R.build_arm(plain, core.partial_swap_arm(f))
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits
        want = ref(input_ids=ids, use_cache=False).logits
        without = plain(input_ids=ids, use_cache=False).logits
    assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max()
    assert (got - without).abs().max() > 1e-4                  # the named units matter


def test_a_control_naming_only_drawn_units_is_the_plain_control():
    hf = tiny_llama()
    m = hf.config.intermediate_size
    draw = [torch.randperm(m, generator=torch.Generator().manual_seed(i)).tolist() for i in range(3)]
    inside, outside = draw[1][3], draw[1][-1]             # drawn at f = 0.5 (24 of 48), and not
    assert core.drawn_units(0.5, 1, m) == sorted(draw[1][:24])
    assert core.plain_equivalent(f"swapped-f0.500+L1U{inside}", m) == "swapped-f0.500"
    assert core.plain_equivalent(f"swapped-f0.500+L1U{outside}", m) == f"swapped-f0.500+L1U{outside}"
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(3))
    outs = []
    for arm in (f"swapped-f0.500+L1U{inside}", "swapped-f0.500", f"swapped-f0.500+L1U{outside}"):
        model = copy.deepcopy(hf)
        R.build_arm(model, arm)
        with torch.no_grad():
            outs.append(model(input_ids=ids, use_cache=False).logits)
    assert torch.equal(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])


# --- the unit search against an exhaustive search -------------------------------------------

def _val_mean(model, data):
    from qkmlp.pretrained.heldout import window_losses
    with torch.no_grad():
        return float(np.mean([window_losses(model, ids, batch_size=2).mean().item() for ids in data.validation.values()]))


def test_unit_search_finds_the_unit_an_exhaustive_search_finds():
    from qkmlp.pretrained.retrain.unitsearch import unit_search

    cfg = tiny_cfg()
    data = tiny_data(cfg)
    hf = tiny_llama()
    before = copy.deepcopy(hf.state_dict())
    base = _val_mean(hf, data)
    exact = {}
    for l in range(hf.config.num_hidden_layers):
        for j in range(hf.config.intermediate_size):
            ref = copy.deepcopy(hf)
            ref.model.layers[l].mlp = PlainUnits(hf.model.layers[l].mlp, [j])
            exact[l, j] = _val_mean(ref, data) - base
    best = max(exact, key=exact.get)
    got = unit_search(hf, data, top=6, n_select=1, symmetric_top=2, eval_batch=2)
    assert got["selected"] == [best]
    assert got["base"] == pytest.approx(base, abs=1e-10)
    assert got["n_units"] == len(exact)
    changes = [r["change"] for r in got["candidates"]]
    assert changes == sorted(changes, reverse=True) and len(got["candidates"]) <= 12
    for r in got["candidates"]:
        assert r["change"] == pytest.approx(exact[r["layer"], r["unit"]], abs=1e-10)
    # σ(ab) in that unit alone, written on the HF weights
    for r in got["candidates"][:2]:
        ref = copy.deepcopy(hf)
        ref.model.layers[r["layer"]].mlp = PlainUnits(hf.model.layers[r["layer"]].mlp, [r["unit"]], "symmetric")
        assert r["symmetric_change"] == pytest.approx(_val_mean(ref, data) - base, abs=1e-10)
    assert "symmetric_change" not in got["candidates"][2]
    after = hf.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)   # the model is left as it was
    with pytest.raises(ValueError, match="n_select"):
        unit_search(hf, data, top=2, n_select=3)


def test_restore_search_finds_the_unit_sigma_ab_breaks_most_by_exhaustion():
    from qkmlp.pretrained.retrain.unitsearch import restore_search

    cfg = tiny_cfg()
    data = tiny_data(cfg)
    hf = tiny_llama()
    n_layers, m = hf.config.num_hidden_layers, hf.config.intermediate_size

    def sym_model(gated_at=None):
        ref = copy.deepcopy(hf)
        for i, layer in enumerate(ref.model.layers):
            gated = [gated_at[1]] if gated_at and gated_at[0] == i else []
            layer.mlp = PlainUnits(hf.model.layers[i].mlp, gated, "gated", elsewhere="symmetric")
        return ref

    base = _val_mean(sym_model(), data)
    fall = {(l, j): base - _val_mean(sym_model((l, j)), data) for l in range(n_layers) for j in range(m)}
    best = max(fall, key=fall.get)
    got = restore_search(hf, data, base_arm="symmetric", top=6, exchange_top=2, eval_batch=2)
    assert got["selected"] == [best]
    assert got["base"] == pytest.approx(base, abs=1e-10)
    assert got["trained"] == pytest.approx(_val_mean(hf, data), abs=1e-10)
    for r in got["candidates"]:
        assert r["fall"] == pytest.approx(fall[r["layer"], r["unit"]], abs=1e-10)
    for r in got["candidates"][:2]:
        ref = copy.deepcopy(hf)
        ref.model.layers[r["layer"]].mlp = PlainUnits(hf.model.layers[r["layer"]].mlp, [r["unit"]])
        assert r["exchange_change"] == pytest.approx(_val_mean(ref, data) - got["trained"], abs=1e-10)
    with pytest.raises(ValueError, match="base_arm"):
        restore_search(hf, data, base_arm="gated")


def test_next_unit_search_finds_the_intact_unit_that_moves_a_controls_start_most():
    from qkmlp.pretrained.retrain.unitsearch import next_unit_search

    cfg = tiny_cfg()
    data = tiny_data(cfg)
    hf = tiny_llama()
    n_layers, m, f = hf.config.num_hidden_layers, hf.config.intermediate_size, 0.5
    drawn = {i: torch.randperm(m, generator=torch.Generator().manual_seed(i))[:round(f * m)].tolist() for i in range(n_layers)}

    def control(extra=None):
        ref = copy.deepcopy(hf)
        for i, layer in enumerate(ref.model.layers):
            layer.mlp = PlainUnits(hf.model.layers[i].mlp, drawn[i] + ([extra[1]] if extra and extra[0] == i else []))
        return ref

    base = _val_mean(control(), data)
    change = {(l, j): _val_mean(control((l, j)), data) - base
              for l in range(n_layers) for j in range(m) if j not in drawn[l]}
    best = max(change, key=change.get)
    got = next_unit_search(hf, data, core.partial_swap_arm(f), top=6, restore_top=2, eval_batch=2)
    assert got["selected"] == [best] and got["n_units"] == len(change)
    assert got["base"] == pytest.approx(base, abs=1e-10)
    for r in got["candidates"]:
        assert (r["layer"], r["unit"]) in change                    # never a unit the control exchanges already
        assert r["change"] == pytest.approx(change[r["layer"], r["unit"]], abs=1e-10)
    sym = copy.deepcopy(hf)
    for i, layer in enumerate(sym.model.layers):
        layer.mlp = PlainUnits(hf.model.layers[i].mlp, [], "gated", elsewhere="symmetric")
    s_base = _val_mean(sym, data)
    for r in got["candidates"][:2]:
        one = copy.deepcopy(sym)
        one.model.layers[r["layer"]].mlp = PlainUnits(hf.model.layers[r["layer"]].mlp, [r["unit"]], "gated",
                                                      elsewhere="symmetric")
        assert r["symmetric_restore_fall"] == pytest.approx(s_base - _val_mean(one, data), abs=1e-10)
    with pytest.raises(ValueError, match="partially swapped control"):
        next_unit_search(hf, data, "symmetric")


# --- the second measures of distance -------------------------------------------------------

def test_distances_are_the_plain_starts_and_relative_mlp_changes():
    from qkmlp.pretrained.retrain.distance import distances
    from qkmlp.pretrained.retrain.matching import start_loss

    cfg = tiny_cfg()
    data = tiny_data(cfg)
    hf = tiny_llama()
    got = distances(hf, data, ["gated", "symmetric"], eval_batch=2)
    g, s = got["gated"], got["symmetric"]
    assert max(g["mlp_change"]["local"] + g["mlp_change"]["in_model"]) < 1e-12
    # starts: the validation mean is the matching's start; every text's start is its windows' mean
    assert s["validation_mean"] == pytest.approx(start_loss(hf, data, "symmetric", 2)["mean"], abs=1e-12)
    assert set(s["start"]) == set(data.heldout) | set(data.validation)
    # the MLP changes, with the inputs and outputs recorded by hooks written here
    ref = copy.deepcopy(hf)
    for layer in ref.model.layers:
        layer.mlp = PlainUnits(layer.mlp, range(hf.config.intermediate_size), "symmetric")

    def record(model):
        ins, outs = {}, {}
        def keep(i):
            def hook(mod, args, out):
                ins.setdefault(i, []).append(args[0])
                outs.setdefault(i, []).append(out)
            return hook

        hooks = [layer.mlp.register_forward_hook(keep(i)) for i, layer in enumerate(model.model.layers)]
        with torch.no_grad():
            for ids in data.validation.values():
                model.model(input_ids=ids, use_cache=False)
        for h in hooks:
            h.remove()
        return {i: torch.cat(v) for i, v in ins.items()}, {i: torch.cat(v) for i, v in outs.items()}

    x0, y0 = record(hf)
    _, y1 = record(ref)
    for l in range(3):
        with torch.no_grad():
            local = ref.model.layers[l].mlp(x0[l])
        assert s["mlp_change"]["local"][l] == pytest.approx(float((local - y0[l]).norm() / y0[l].norm()), rel=1e-9)
        assert s["mlp_change"]["in_model"][l] == pytest.approx(float((y1[l] - y0[l]).norm() / y0[l].norm()), rel=1e-9)
    assert s["mlp_change"]["in_model"][0] == pytest.approx(s["mlp_change"]["local"][0], rel=1e-12)
    assert s["mlp_change"]["in_model"][2] != pytest.approx(s["mlp_change"]["local"][2], rel=1e-3)
    assert min(s["mlp_change"]["local"]) > 0.05


# --- the declared verdict on a control with named units --------------------------------------

TEXTS = ["shakespeare_test", "python_test", "pydoc_topics"]


def _results(delta, control="swapped-f0.812+L1U83", n=16):
    """End windows: control c, σ(ab) arm S = c + 2 + noise, its matched control
    M = S + delta[seed] + noise; a stored older control for the same arm beside it."""
    runs = []
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        c = {t: (3.0 + rng.normal(0, 0.5, n)).tolist() for t in TEXTS}
        s = {t: (np.array(c[t]) + 2.0 + rng.normal(0, 0.01, n)).tolist() for t in TEXTS}
        m = {t: (np.array(s[t]) + delta[seed] + rng.normal(0, 0.01, n)).tolist() for t in TEXTS}
        old = {t: (np.array(s[t]) - 1.0).tolist() for t in TEXTS}
        runs += [{"arm": "gated", "seed": seed, "windows_after": c}, {"arm": "symmetric", "seed": seed, "windows_after": s},
                 {"arm": control, "seed": seed, "windows_after": m},
                 {"arm": "swapped-f0.836", "seed": seed, "windows_after": old}]
    res = {"config": {"heldout_texts": TEXTS, "main_text": "pydoc_topics",
                      "arm_blocks": [["gated", "symmetric"], ["swapped-f0.836", control]]}, "runs": runs}
    return res, {"matches": {"symmetric": {"control": control}}}


@pytest.mark.parametrize("delta, verdict", [
    ((-0.5, -0.4), "symmetric form costs beyond its distance"),
    ((0.0, 0.0), "distance accounts for the gap"),
    ((0.5, 0.6), "gated form costs more at equal distance"),
    ((-0.05, -0.3), "not resolved"),
])
def test_the_declared_verdict_reads_a_control_with_named_units(delta, verdict):
    res, matching = _results(delta)
    out = CR.matched_control(res, matching, {"alpha": 0.05, "equivalence": {"margin": 0.1}})
    assert list(out["arms"]) == ["symmetric"] and out["arms"]["symmetric"]["verdict"] == verdict
    assert out["arms"]["symmetric"]["control"] == "swapped-f0.812+L1U83"
    cells = out["cells"]
    assert len(cells) == 6                                     # its own family: 3 texts x 2 seeds
    for c in cells:
        m = CR.run_of(res, "swapped-f0.812+L1U83", c["seed"])["windows_after"][c["text"]]
        s = CR.run_of(res, "symmetric", c["seed"])["windows_after"][c["text"]]
        assert c["D"] == pytest.approx(np.mean(m) - np.mean(s), abs=1e-12)
    ps = sorted(c["p"] for c in cells)
    assert min(c["holm_p"] for c in cells) == pytest.approx(min(1.0, 6 * ps[0]))
    assert CR.is_matched_control("swapped-f0.812+L1U83")


def _three(deltas):
    """σ(ab), the control and three matched controls of σ(ab), each M = S + its delta[seed]."""
    controls = ["swapped-f0.836", "swapped-f0.700+L2U90", "swapped-f0.810+L27U903"]
    runs = []
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        c = {t: (3.0 + rng.normal(0, 0.5, 16)).tolist() for t in TEXTS}
        s = {t: (np.array(c[t]) + 2.0 + rng.normal(0, 0.01, 16)).tolist() for t in TEXTS}
        runs += [{"arm": "gated", "seed": seed, "windows_after": c}, {"arm": "symmetric", "seed": seed, "windows_after": s}]
        for ctrl, d in zip(controls, deltas):
            runs.append({"arm": ctrl, "seed": seed,
                         "windows_after": {t: (np.array(s[t]) + d[seed] + rng.normal(0, 0.01, 16)).tolist() for t in TEXTS}})
    res = {"config": {"heldout_texts": TEXTS, "main_text": "pydoc_topics",
                      "arm_blocks": [["gated", "symmetric"], controls]}, "runs": runs}
    tests = [({"matches": {"symmetric": {"control": c}, **({"symmetrized": {"control": "x"}} if i == 0 else {})}},
              {"alpha": 0.05, "equivalence": {"margin": 0.1}}) for i, c in enumerate(controls)]
    return res, tests


def test_the_verdict_against_confounds_is_the_agreed_one_or_not_resolved():
    beyond, level = (-0.5, -0.4), (0.0, 0.0)
    res, tests = _three([beyond, beyond, beyond])
    out = CR.verdict_against_confounds(res, tests)
    assert out["verdict"] == "symmetric form costs beyond its distance"
    assert set(out["by_control"]) == {"swapped-f0.836", "swapped-f0.700+L2U90", "swapped-f0.810+L27U903"}
    res, tests = _three([beyond, beyond, level])
    out = CR.verdict_against_confounds(res, tests)
    assert out["verdict"] == CR.NOT_RESOLVED_CONFOUNDS
    assert out["by_control"]["swapped-f0.810+L27U903"] == "distance accounts for the gap"
    # each test is its own family of 6 cells, even where its matching lists another arm too
    assert all(len(t["cells"]) == 6 for t in out["tests"])
    with pytest.raises(KeyError, match="no control for 'symmetric'"):
        CR.verdict_against_confounds(res, [({"matches": {}}, {"alpha": 0.05, "equivalence": {"margin": 0.1}})])
