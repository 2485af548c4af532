"""qkmlp.pretrained: the path to the exchange, the up/down gauge, the weight-space
probes, outliers by position, and the per-unit exchange, each against a plain formula,
finite differences or linear algebra (never against the module itself)."""
from __future__ import annotations

import math

import pytest
import torch

from qkmlp import GatedMLP
from qkmlp.pretrained import (alignment_rank, gauge_balanced, gauge_statistics, mean_input_probes, pair_distance,
                              partially_swapped, residual_outliers, unit_peaks, variant, weight_probes)
from qkmlp.pretrained.outliers import MASSIVE_ABS  # noqa: F401
from qkmlp.pretrained.probes import mean_row_ratio
from qkmlp.pretrained.textrun import expand, key, merge, parse_key

F64 = torch.float64
SILU = torch.nn.functional.silu


def layer(d=6, m=5, seed=0, scale=3.0):
    torch.manual_seed(seed)
    g = GatedMLP(d, m, dtype=F64)
    with torch.no_grad():
        g.query.mul_(scale)
        g.key.mul_(scale)
    return g


def formula(g, x, f):
    q, k, v = g.query[:, 0].detach(), g.key[:, 0].detach(), g.value.detach()
    return f(x @ q.T, x @ k.T) @ v


# --- the path to the exchange and the gauge --------------------------------------------------

@pytest.mark.parametrize("t", [0.25, 0.5, 1.0])
def test_toward_swap_is_the_straight_path_to_the_exchange(t):
    g = layer()
    x = torch.randn(40, 6, dtype=F64)
    expected = formula(g, x, lambda a, b: (1 - t) * SILU(a) * b + t * SILU(b) * a)
    torch.testing.assert_close(variant(g, "toward_swap", t)(x), expected)
    if t == 0.5:
        torch.testing.assert_close(variant(g, "symmetrized")(x), expected)
    if t == 1.0:
        torch.testing.assert_close(variant(g, "swap")(x), expected)


def test_toward_swap_rejects_t_outside_the_path():
    g = layer()
    for t in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            variant(g, "toward_swap", t)
    with pytest.raises(ValueError, match="alpha is required"):
        variant(g, "toward_swap")


def test_gauge_balanced_is_the_same_function_with_equal_norms():
    g = layer()
    with torch.no_grad():
        g.key.mul_(torch.tensor([0.1, 1.0, 7.0, 0.5, 2.0], dtype=F64).view(5, 1, 1))
    b = gauge_balanced(g)
    x = torch.randn(30, 6, dtype=F64)
    torch.testing.assert_close(b(x), g(x))
    torch.testing.assert_close(b.key[:, 0].norm(dim=1), b.value.norm(dim=1))
    torch.testing.assert_close(b.query, g.query)
    # the exchange is not gauge-invariant: in the balanced gauge it is another function
    assert (variant(b, "swap")(x) - variant(g, "swap")(x)).abs().max() > 1e-3
    # but rescaling commutes with the gauge
    torch.testing.assert_close(variant(b, "rescale", -2.0)(x), variant(g, "rescale", -2.0)(x))


def test_gauge_statistics_are_gauge_invariant_where_they_should_be():
    g = layer(d=8, m=200, seed=1)
    c = torch.exp(1.0 + torch.randn(200, dtype=F64))    # any positive gauge per unit
    h = GatedMLP(8, 200, dtype=F64)
    with torch.no_grad():
        h.query.copy_(g.query)
        h.key.copy_(g.key * c.view(-1, 1, 1))
        h.value.copy_(g.value / c.view(-1, 1))
    x = torch.randn(20, 8, dtype=F64)
    torch.testing.assert_close(h(x), g(x))
    s_g, s_h = gauge_statistics(g, torch.Generator().manual_seed(0)), gauge_statistics(h, torch.Generator().manual_seed(0))
    assert s_g["balance_fixed"]["mean"] == pytest.approx(s_h["balance_fixed"]["mean"], rel=1e-12)
    assert s_g["balance_fixed"]["sd"] == pytest.approx(s_h["balance_fixed"]["sd"], rel=1e-12)
    assert abs(s_g["balance"]["mean"] - s_h["balance"]["mean"]) > 0.1        # the raw balance moved
    q, k, v = (t.detach() for t in (h.query[:, 0], h.key[:, 0], h.value))
    lk, lv = k.norm(dim=1).log(), v.norm(dim=1).log()
    assert s_h["corr_log_k_log_v"] == pytest.approx(float(torch.corrcoef(torch.stack([lk, lv]))[0, 1]), rel=1e-9)


# --- weight-space probes ---------------------------------------------------------------------

def test_mean_row_ratio_extremes_and_chance():
    assert mean_row_ratio(torch.ones(10, 4)) == pytest.approx(1.0)
    assert mean_row_ratio(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(0.0)
    r = [mean_row_ratio(torch.randn(400, 64, generator=torch.Generator().manual_seed(s))) for s in range(20)]
    assert sum(r) / 20 == pytest.approx(1 / math.sqrt(400), rel=0.1)
    with pytest.raises(ValueError):
        mean_row_ratio(torch.ones(1, 3))
    p = weight_probes(layer(m=50))
    assert p["chance"] == pytest.approx(1 / math.sqrt(50)) and set(p["mean_row"]) == {"gate", "up", "down"}


def test_mean_input_probes_against_the_formula():
    g = layer(d=6, m=40, seed=2)
    x = torch.randn(300, 6, dtype=F64) + torch.tensor([2.0, 0, 0, 0, 0, -1.0], dtype=F64)
    gain = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0, 1.0], dtype=F64)
    p = mean_input_probes(g, x, gain)
    q, k = g.query[:, 0].detach(), g.key[:, 0].detach()
    xbar = x.mean(0)
    assert p["frac_gate_against"] == pytest.approx(float((q @ xbar < 0).double().mean()))
    assert p["frac_up_against"] == pytest.approx(float((k @ xbar < 0).double().mean()))
    assert p["mean_share"] == pytest.approx(float(xbar @ xbar / (x * x).sum(1).mean()))
    a = x @ q.T
    assert p["gate_offset"] == pytest.approx(float((a.mean(0) / a.std(0)).mean()))
    flat = xbar / gain * gain.mean()
    assert p["frac_gate_against_flat_gain"] == pytest.approx(float((q @ flat < 0).double().mean()))
    # a gate row set against the mean input is counted as such
    with torch.no_grad():
        g.query[0, 0].copy_(-xbar)
    assert mean_input_probes(g, x)["frac_gate_against"] >= p["frac_gate_against"]
    with pytest.raises(ValueError, match="without zeros"):
        mean_input_probes(g, x, torch.zeros(6, dtype=F64))


# --- outliers by position ----------------------------------------------------------------------

def test_residual_outliers_keep_position_zero_apart():
    h = torch.randn(3, 10, 64, dtype=F64, generator=torch.Generator().manual_seed(0))
    h[:, 0, 5] = 5000.0                               # every window: a massive entry at position 0
    h[1, 7, 9] = -3000.0                              # one window: another at position 7
    h[2, 4, 9] = 50.0                                 # large but under Sun et al.'s 100
    r = residual_outliers(h)
    assert r["max_pos0"] == 5000.0 and r["max_rest"] == 3000.0
    assert r["massive_pos0"] == 3 and r["massive_rest"] == 1 and r["windows_massive_rest"] == 1
    assert 50.0 < MASSIVE_ABS
    assert r["median"] == pytest.approx(float(h.abs().median()))
    from qkmlp.pretrained.outliers import is_massive

    assert is_massive(r["max_pos0"], r["median"]) and not is_massive(50.0, 0.001)
    assert not is_massive(500.0, 1.0)                 # above 100 but only 500x the median


def test_unit_peaks_against_the_formula():
    g = layer(d=4, m=3, seed=3)
    x = torch.randn(2, 6, 4, dtype=F64)
    x[1, 0] *= 50                                     # window 1's first token is huge
    p = unit_peaks(g, x)
    h = formula(g, x.reshape(-1, 4), lambda a, b: SILU(a) * b)   # noqa: F841 (shape check below)
    q, k = g.query[:, 0].detach(), g.key[:, 0].detach()
    hh = (SILU(x @ q.T) * (x @ k.T)).abs()
    torch.testing.assert_close(p["peak"], hh.amax((0, 1)))
    torch.testing.assert_close(p["peak_rest"], hh[:, 1:].amax((0, 1)))
    assert p["peak_position"].shape == (2, 3) and torch.equal(p["peak_position"], hh.argmax(1))
    with pytest.raises(ValueError, match="positions >= 2"):
        unit_peaks(g, x[:, :1])


# --- the per-unit exchange ---------------------------------------------------------------------

def test_pair_distance_and_partial_swap():
    g = layer(d=5, m=4, seed=4)
    with torch.no_grad():
        g.key[1].copy_(g.query[1])                   # q = k: distance 0, the exchange changes nothing
        g.key[2].copy_(-g.query[2])                  # q = −k: distance 1
    d = pair_distance(g)
    assert d[1] == 0 and d[2] == pytest.approx(1.0) and ((0 <= d) & (d <= 1)).all()
    x = torch.randn(25, 5, dtype=F64)
    p = partially_swapped(g, [0, 1])
    q, k, v = g.query[:, 0].detach(), g.key[:, 0].detach(), g.value.detach()
    a, b = x @ q.T, x @ k.T
    h = SILU(a) * b
    h[:, 0] = SILU(b[:, 0]) * a[:, 0]
    h[:, 1] = SILU(b[:, 1]) * a[:, 1]
    torch.testing.assert_close(p(x), h @ v)
    torch.testing.assert_close(partially_swapped(g, [1])(x), g(x))                   # q = k
    torch.testing.assert_close(partially_swapped(g, torch.ones(4, dtype=torch.bool))(x), variant(g, "swap")(x))
    with pytest.raises(IndexError):
        partially_swapped(g, [4])


def test_alignment_rank_orders_units_by_abs_cosine():
    g = layer(d=5, m=4, seed=4)
    with torch.no_grad():
        g.key[1].copy_(-2 * g.query[1])              # |cos| = 1: the most aligned, whatever the sign
        g.key[3].copy_(g.query[3] + 1e-3 * torch.ones(5, dtype=F64))
    q, k = g.query[:, 0].detach(), g.key[:, 0].detach()
    cos = [abs(float(q[j] @ k[j]) / float(q[j].norm() * k[j].norm())) for j in range(4)]
    want = {j: 1 + sum(c > cos[j] for c in cos) for j in range(4)}
    assert [alignment_rank(g, j) for j in range(4)] == [want[j] for j in range(4)]
    assert alignment_rank(g, 1) == 1 and alignment_rank(g, 3) == 2
    with pytest.raises(IndexError, match="out of range"):
        alignment_rank(g, 4)


transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        for lay in model.model.layers:
            lay.mlp.gate_proj.weight.mul_(30.0)
            lay.mlp.up_proj.weight.mul_(30.0)
    return model


def _loss_with_added(model, ids, l, delta):
    """Mean window loss with ``delta`` (n, L, d) added to layer l's MLP output."""
    from qkmlp.pretrained import decoder_layers, window_losses

    h = decoder_layers(model)[l].mlp.register_forward_hook(lambda mod, a, out: out + delta)
    try:
        return float(window_losses(model, ids, batch_size=ids.shape[0]).mean())
    finally:
        h.remove()


def test_mlp_output_grads_against_finite_differences():
    from qkmlp.pretrained import mlp_output_grads

    torch.set_num_threads(1)
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    grads = mlp_output_grads(model, ids, [0, 1], batch_size=1)
    assert set(grads) == {0, 1} and grads[1].shape == (2, 9, 16)
    u = torch.randn(2, 9, 16, dtype=F64, generator=torch.Generator().manual_seed(1))
    eps = 1e-3             # Llama's RMSNorm runs in float32 even in a float64 model: no smaller steps
    for l in (0, 1):
        fd = (_loss_with_added(model, ids, l, eps * u) - _loss_with_added(model, ids, l, -eps * u)) / (2 * eps)
        # grads are of the per-window losses; the mean window loss is their average
        assert float((grads[l].double() * u).sum() / 2) == pytest.approx(fd, rel=1e-3)


def test_unit_swap_costs_are_the_first_order_change():
    from qkmlp.pretrained import gated_mlps, layer_inputs, mlp_output_grads, mlps_replaced, unit_swap_costs

    torch.set_num_threads(1)
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    g = gated_mlps(model)
    with mlps_replaced(model, dict(enumerate(g))):
        _, _, xin = layer_inputs(model, ids, mlp_inputs=True)
        grads = mlp_output_grads(model, ids, [1])
        c = unit_swap_costs(g[1], xin[1], grads[1])
        q, k, v = g[1].query[:, 0], g[1].key[:, 0], g[1].value
        a, b = xin[1] @ q.T, xin[1] @ k.T
        for j in (0, 7, 23):
            change = ((SILU(b) * a - SILU(a) * b)[..., j:j + 1] * v[j])             # (n, L, d)
            eps = 1e-3 / float(change.abs().max())
            fd = (_loss_with_added(model, ids, 1, eps * change)
                  - _loss_with_added(model, ids, 1, -eps * change)) / (2 * eps)
            assert float(c["predicted"][j]) == pytest.approx(fd, rel=1e-3, abs=1e-9)
        f = g[1](xin[1])
        j = 5
        size = ((SILU(b) * a - SILU(a) * b)[..., j:j + 1] * v[j]).norm() / f.norm()
        assert float(c["local"][j]) == pytest.approx(float(size), rel=1e-9)


# --- keys and merging --------------------------------------------------------------------------

def test_keys_round_trip_and_expand():
    assert key("swap") == "swap" and key("rescale", 2) == "rescale:2" and key("toward_swap", 0.25) == "toward_swap:0.25"
    for k in ("swap", "rescale:-0.5", "toward_swap:0.25"):
        assert key(*parse_key(k)) == k
    assert expand(["none", "rescale", "toward_swap"], {"rescale": [2, -1], "toward_swap": [0.5]}) == [
        ("none", None), ("rescale", 2.0), ("rescale", -1.0), ("toward_swap", 0.5)]


def test_merge_puts_parts_together_and_refuses_disagreement():
    prep = {"inputs": [], "base": [1.0, 2.0], "all": {}}
    a = {"base": [1.0, 2.0], "layer": {"swap": {0: [1.5, 2.5]}}}
    b = {"base": [1.0, 2.0], "layer": {"swap": {2: [1.1, 2.1]}}}
    t = merge(3, [prep, a, b])
    assert t["layer"]["swap"] == [[1.5, 2.5], None, [1.1, 2.1]]
    with pytest.raises(ValueError, match="disagree"):
        merge(3, [prep, {"base": [1.0, 2.1], "layer": {}}])
    with pytest.raises(ValueError, match="exactly one"):
        merge(3, [a])
