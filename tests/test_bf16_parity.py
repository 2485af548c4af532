"""bfloat16 / float16 at parity with a Llama-style MLP of three ``nn.Linear``.

The rank-1 gated layer with the Llama MLP's weights (query = gate, key = up,
value = downᵀ) runs Llama's op sequence in the half dtype: its forward equals the
Llama MLP's bit for bit (on CPU V is multiplied in ``nn.Linear``'s layout), its error against a float64 evaluation of the same weights is the
Llama MLP's error, its gradients are the Llama MLP's to half precision (and close to float64), and the
profiler counts no dtype conversions, no more elementwise passes in forward, and in
forward + backward only the recomputation of σ(A) and H on top of Llama's (two passes
over (N, m) activations).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import FUSED
from qkmlp import GatedMLP
from qkmlp.bench import LlamaMLP, op_counts

HALVES = [torch.bfloat16, torch.float16]


def _twins(d, m, dtype, seed=0):
    """A Llama MLP and a rank-1 gated layer holding the same weights."""
    torch.manual_seed(seed)
    llama = LlamaMLP(d, m, dtype=dtype)
    return llama, GatedMLP.from_linear(llama.gate_proj, llama.up_proj, llama.down_proj, activation="silu")


def _float64_formula(x, llama):
    """down(silu(gate(x)) * up(x)) in float64 from the (rounded) half weights."""
    w = [lin.weight.double() for lin in (llama.gate_proj, llama.up_proj, llama.down_proj)]
    xd = x.double()
    return (F.silu(xd @ w[0].T) * (xd @ w[1].T)) @ w[2].T


@pytest.mark.parametrize("dtype", HALVES)
def test_half_forward_equals_the_llama_mlp_and_its_error(dtype):
    llama, gated = _twins(64, 172, dtype)
    x = torch.randn(37, 64, dtype=dtype)
    with torch.no_grad():
        y_l, y_g = llama(x), gated(x)
    exact = _float64_formula(x, llama)
    err_l = (y_l.double() - exact).norm() / exact.norm()
    err_g = (y_g.double() - exact).norm() / exact.norm()
    assert 0 < err_l < 2e-2                      # a half-precision error, not zero
    assert err_g <= err_l * 1.02, (err_g, err_l)  # Llama's own error (to 2 %)
    assert torch.equal(y_g, y_l)                 # Llama's op sequence, bit for bit


@pytest.mark.parametrize("dtype", HALVES)
def test_half_gradients_equal_the_llama_mlp_and_are_close_to_float64(dtype):
    llama, gated = _twins(32, 86, dtype, seed=1)
    x = torch.randn(19, 32, dtype=dtype)
    gy = torch.randn(19, 32, dtype=dtype)
    xl, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
    gl = torch.autograd.grad(llama(xl), [xl, llama.gate_proj.weight, llama.up_proj.weight,
                                         llama.down_proj.weight], gy)
    gg = torch.autograd.grad(gated(xg), [xg, gated.query_weight, gated.key_weight, gated.value], gy)
    # float64 gradients of the plain formula with the same (rounded) weights
    w = [lin.weight.detach().double().requires_grad_() for lin in
         (llama.gate_proj, llama.up_proj, llama.down_proj)]
    xd = x.double().requires_grad_()
    yd = (F.silu(xd @ w[0].T) * (xd @ w[1].T)) @ w[2].T
    gd = torch.autograd.grad(yd, [xd, *w], gy.double())
    for i, (a, b, e) in enumerate(zip(gl, gg, gd)):
        if i == 3:
            b = b.T                                  # value = down.weightᵀ
        err_l = (a.double() - e).norm() / e.norm()
        err_g = (b.double() - e).norm() / e.norm()
        assert err_l < 3e-2 and err_g < 3e-2, (i, err_l, err_g)
        assert err_g <= 1.5 * err_l + 1e-3, (i, err_g, err_l)


@pytest.mark.parametrize("cls", FUSED)
def test_half_gradients_match_finite_differences_of_the_float64_formula(cls):
    """The bf16 backward is the derivative of the layer (checked in float64, where the
    same fused path runs; the half run must agree with it to half precision)."""
    torch.manual_seed(2)
    layer = cls(12, 20, 6, dtype=torch.float64)
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    half = cls(12, 20, 6, dtype=torch.bfloat16)
    with torch.no_grad():
        for p, q in zip(half.parameters(), layer.parameters()):
            p.copy_(q)
    xh = x.detach().to(torch.bfloat16).requires_grad_()
    gy = torch.randn(5, 6, dtype=torch.float64)
    gh = torch.autograd.grad(half(xh), [xh, *half.parameters()], gy.to(torch.bfloat16))
    exact = cls(12, 20, 6, dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(exact.parameters(), half.parameters()):
            p.copy_(q)
    xe = xh.detach().double().requires_grad_()
    ge = torch.autograd.grad(exact(xe), [xe, *exact.parameters()], gy)
    for a, e in zip(gh, ge):
        assert a.dtype == torch.bfloat16
        assert (a.double() - e).norm() / e.norm() < 3e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_more_elementwise_passes_than_the_llama_mlp(dtype):
    llama, gated = _twins(32, 86, dtype, seed=3)
    n = 64                             # N·m above every weight's size (m·d)
    x = torch.randn(n, 32, dtype=dtype)
    gy = torch.randn(n, 32, dtype=dtype)
    act = n * 86                       # count passes over (N, m) activations only

    def step(mod):
        xg = x.clone().requires_grad_()
        return lambda: torch.autograd.grad(mod(xg), [xg, *mod.parameters()], gy)

    for mode in ("forward", "forward_backward"):
        if mode == "forward":
            with torch.no_grad():
                cl, cg = op_counts(lambda: llama(x), act), op_counts(lambda: gated(x), act)
        else:
            cl, cg = op_counts(step(llama), act), op_counts(step(gated), act)
        assert cg["conversions"] == 0 == cl["conversions"], (mode, cg["ops"])
        assert cl["elementwise"] >= (2 if mode == "forward" else 4)   # silu, mul (+ backward)
        if mode == "forward":
            assert cg["elementwise"] <= cl["elementwise"], (mode, cg, cl)
        else:
            # backward recomputes σ(A) and H (what halves the saved activations): two
            # (N, m) passes more
            assert cg["elementwise"] <= cl["elementwise"] + 2, (mode, cg, cl)
            assert cg["ops"]["aten::silu"] == 2 and cl["ops"]["aten::silu"] == 1


def test_op_counts_by_size():
    a, w = torch.randn(64, 8), torch.randn(8, 8)
    c = op_counts(lambda: (a * a, w.T.contiguous()), min_numel=100)
    assert c["elementwise"] == 1 and c["ops"]["aten::clone"] == 1


def test_op_counts_see_conversions():
    """The counter is not blind: an explicit float32 middle shows its casts."""
    a = torch.randn(8, 8, dtype=torch.bfloat16)
    c = op_counts(lambda: (F.silu(a.float()) * a.float()).to(torch.bfloat16))
    assert c["conversions"] == 3 and c["elementwise"] == 2, c
