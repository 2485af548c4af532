"""Every layer under ``torch.autocast``, dtype by dtype, against the same function written
with ``nn.Linear`` (and, for the rank-1 gated layer, a Llama MLP) from the same weights.

What ``nn.Linear`` does is measured here, not assumed: under CPU autocast it casts every
floating input and weight but float64 to the autocast dtype (float16 and bfloat16 too),
never casts float64, and raises when a float64 tensor meets any other dtype. A layer must
raise exactly where its ``nn.Linear`` twin raises, return the twin's dtype where it does
not, and give the twin's values up to the autocast dtype's rounding.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import layer_cases
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)
from qkmlp.bench import LlamaMLP

D, M, O = 8, 6, 5
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
AUTOCAST = [torch.bfloat16, torch.float16]
LAYERS = layer_cases((1, 2))
IDS = [f"{c.__name__}-r{r}" for c, r in LAYERS]


def _lin(w: torch.Tensor) -> nn.Linear:
    """A bias-free nn.Linear holding ``w`` (out, in), in w's dtype."""
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def _twin(layer):
    """The layer's function written with nn.Linear (and matmul) from copies of its weights."""
    act = layer.activation
    if isinstance(layer, KeyValueMLP):
        k, v = _lin(layer.key.detach()), _lin(layer.value.detach().T)
        return lambda x: v(act(k(x))), [k, v]
    if isinstance(layer, StaticQueryMLP):
        q, k, v = _lin(layer.query.detach().T), _lin(layer.key.detach()), _lin(layer.value.detach().T)
        return lambda x: v(act(k(q(x)))), [q, k, v]
    v = _lin(layer.value.detach().T)
    if isinstance(layer, BilinearAttentionMLP):
        a = _lin(layer.interaction.detach().permute(1, 0, 2).reshape(D, M * D).T)   # x ↦ (x A_j)_j
        return (lambda x: v(act(torch.matmul(a(x).unflatten(-1, (M, D)), x.unsqueeze(-1)).squeeze(-1))),
                [a, v])
    g, u, r = _lin(layer.query_weight.detach()), _lin(layer.key_weight.detach()), layer.rank

    def f(x):
        qa, kb = g(x).unflatten(-1, (M, r)), u(x).unflatten(-1, (M, r))
        if isinstance(layer, SymmetricBilinearMLP):
            h = act((qa * kb).sum(-1))
        elif isinstance(layer, GatedMLP):
            h = (act(qa) * kb).sum(-1)
        else:
            h = 0.5 * (act(qa) * kb + act(kb) * qa).sum(-1)
        return v(h)
    return f, [g, u, v]


def _make(cls, rank, dtype):
    torch.manual_seed(0)
    kw = {"rank": rank} if rank else {}
    return cls(D, M, O, **kw).to(dtype)      # the same draws in every dtype


def _run(f, x, ac):
    """(output, None) or (None, the exception) of f(x) under autocast to ``ac``."""
    try:
        with torch.autocast("cpu", dtype=ac):
            return f(x), None
    except (RuntimeError, TypeError) as e:
        return None, e


@pytest.mark.parametrize("cls,rank", LAYERS, ids=IDS)
@pytest.mark.parametrize("ac", AUTOCAST, ids=str)
def test_layer_casts_what_nn_linear_casts(cls, rank, ac):
    seen = set()
    for wdt, xdt in itertools.product(DTYPES, DTYPES):
        layer = _make(cls, rank, wdt)
        twin, lins = _twin(layer)
        x = (torch.randn(3, 4, D, generator=torch.Generator().manual_seed(1)) * 0.7).to(xdt)
        got, err = _run(layer, x, ac)
        want, twin_err = _run(twin, x, ac)
        case = f"weights {wdt}, input {xdt}, autocast {ac}"
        assert (err is None) == (twin_err is None), f"{case}: layer raised {err!r}, nn.Linear raised {twin_err!r}"
        if err is not None:
            assert isinstance(err, TypeError) and "does not meet" in str(err), (case, err)
            seen.add("raises")
            continue
        assert got.dtype == want.dtype, case
        if got.dtype == torch.float64:
            # nothing was cast: the float64 layer computes exactly what it computes outside autocast
            assert torch.equal(got, layer(x)), case
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            seen.add("float64")
        else:
            assert got.dtype == ac, case
            err_rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
            assert err_rel < 2e-2, (case, err_rel)
            seen.add("cast")
        # gradients: the weights' gradients in the weights' dtype, as for the twin's
        gy = torch.randn(got.shape, dtype=torch.float64).to(got.dtype)
        xg = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=ac):
            grads = torch.autograd.grad(layer(xg), [xg, *layer.parameters()], gy)
            xt = x.clone().requires_grad_()
            twin_grads = torch.autograd.grad(twin(xt), [xt, *(lin.weight for lin in lins)], gy)
        assert [g.dtype for g in grads[:1]] == [twin_grads[0].dtype], case
        assert all(g.dtype == wdt for g in grads[1:]) and all(g.dtype == wdt for g in twin_grads[1:]), case
    assert seen == {"raises", "float64", "cast"}


@pytest.mark.parametrize("ac", AUTOCAST, ids=str)
@pytest.mark.parametrize("wdt", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("xdt", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rank_one_gated_is_the_llama_mlp_under_autocast_bit_for_bit(ac, wdt, xdt):
    torch.manual_seed(2)
    llama = LlamaMLP(D, M).to(wdt)
    layer = GatedMLP.from_linear(llama.gate_proj, llama.up_proj, llama.down_proj, activation="silu")
    x = torch.randn(5, D).to(xdt)
    with torch.autocast("cpu", dtype=ac):
        y, want = layer(x), llama(x)
    assert y.dtype == want.dtype == ac
    assert torch.equal(y, want)


@pytest.mark.parametrize("cls,rank", [(GatedMLP, 1), (SymmetricBilinearMLP, 2), (KeyValueMLP, None)])
def test_a_float64_model_stays_float64_under_autocast(cls, rank):
    """A float64 model under bfloat16 autocast once returned bfloat16 (0.7 % error); its
    output and gradients are the float64 ones, bit for bit."""
    layer = _make(cls, rank, torch.float64)
    x = torch.randn(4, D, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(4, O, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        g = torch.autograd.grad(y, [x, *layer.parameters()], gy)
    y0 = layer(x)
    g0 = torch.autograd.grad(y0, [x, *layer.parameters()], gy)
    assert y.dtype == torch.float64 and torch.equal(y, y0)
    assert all(torch.equal(a, b) for a, b in zip(g, g0))


def test_float64_into_a_float32_layer_raises_with_the_fix():
    layer = GatedMLP(D, M)
    x = torch.randn(2, D, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError):
            F.linear(x, layer.query_weight)                    # what nn.Linear does
        with pytest.raises(TypeError, match=r"never casts float64 \(nn.Linear raises here too\); "
                                            r"convert the input \(x.to\(torch.float32\)\)"):
            layer(x)
