"""torch.compile of the rank-r layers: values and gradients against the plain formula,
and what the compiled graph keeps for backward (the same as eager: x and [a; b]).

Most cases compile with ``backend="aot_eager"`` (AOTAutograd, no C++ compiler, fast);
two compile with inductor. The saved set is read two ways: from the backward graph that
inductor's partitioner makes (:func:`qkmlp.bench.compiled_saved_tensors`), and at run
time with ``saved_tensors_hooks`` (:func:`qkmlp.bench.saved_bytes`).
"""
from __future__ import annotations

import pytest
import torch
import torch._functorch.config as functorch_config

from conftest import FUSED, RANK_R
from qkmlp import GatedMLP, SymmetricBilinearMLP, SymmetrizedGatedMLP
from qkmlp import _fused_op
from qkmlp import functional as fn
from qkmlp.bench import LlamaMLP, compiled_saved_tensors, saved_bytes

REFERENCE = {GatedMLP: fn.gated_reference, SymmetricBilinearMLP: fn.symmetric_reference,
             SymmetrizedGatedMLP: fn.symmetrized_reference}


@pytest.fixture(autouse=True)
def _one_thread_fresh_dynamo():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(old)


def _plain(layer, x):
    """The layer's formula in plain autograd ops, x of shape (..., d)."""
    x2 = x.reshape(-1, layer.d_model)
    y = REFERENCE[type(layer)](x2, layer.query_weight, layer.key_weight, layer.value,
                               layer.activation, layer.d_hidden, layer.rank)
    return y.reshape(*x.shape[:-1], layer.d_out)


def _value_and_grads(f, x, params, gy):
    y = f(x)
    wanted = [t for t in (x, *params) if t.requires_grad]
    return (y, *torch.autograd.grad(y, wanted, gy))


def _check(layer, backend, x, rtol=None, atol=None):
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    gy = torch.randn(*x.shape[:-1], layer.d_out, dtype=x.dtype)
    params = list(layer.parameters())
    got = _value_and_grads(compiled, x, params, gy)
    want = _value_and_grads(lambda z: _plain(layer, z), x, params, gy)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), _plain(layer, x), rtol=rtol, atol=atol)


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("act", fn.FUSED_ACTIVATIONS)
def test_compiled_equals_plain_formula_every_activation(cls, act):
    """float64, rank 2, leading batch dims: output and every gradient."""
    torch.manual_seed(0)
    layer = cls(7, 5, 3, rank=2, activation=act, dtype=torch.float64)
    x = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    _check(layer, "aot_eager", x)


@pytest.mark.parametrize("cls", RANK_R)
@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "relu2"])
def test_compiled_equals_plain_formula(cls, rank, act):
    torch.manual_seed(1)
    layer = cls(6, 4, rank=rank, activation=act, dtype=torch.float64)
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    _check(layer, "aot_eager", x)


@pytest.mark.parametrize("cls", FUSED)
def test_compiled_float32(cls):
    torch.manual_seed(2)
    layer = cls(16, 12, rank=1)
    x = torch.randn(4, 9, 16, requires_grad=True)
    _check(layer, "aot_eager", x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls,rank,act", [(GatedMLP, 1, "silu"), (SymmetricBilinearMLP, 2, "gelu")])
def test_inductor_equals_plain_formula_and_saves_what_eager_saves(cls, rank, act):
    torch.manual_seed(3)
    d, m, n = 8, 6, 11
    layer = cls(d, m, rank=rank, activation=act)
    x = torch.randn(n, d, requires_grad=True)
    _check(layer, "inductor", x, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(layer, fullgraph=True, backend="inductor")
    params = list(layer.parameters())
    eager = saved_bytes(lambda: layer(x), params)
    assert eager == 4 * n * (d + 2 * m * rank)          # x and [a; b], float32
    assert saved_bytes(lambda: compiled(x), params) == eager


@pytest.mark.parametrize("which", ["x", "weights", "value"])
def test_compiled_some_inputs_need_grad(which):
    """Only x, only the weights, or only V require a gradient."""
    torch.manual_seed(4)
    layer = GatedMLP(6, 4, rank=2, dtype=torch.float64)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=which == "x")
    for name, p in layer.named_parameters():
        p.requires_grad_(which == "weights" or (which == "value" and name == "value"))
    _check(layer, "aot_eager", x)


def test_compiled_dynamic_shapes():
    """One graph with a symbolic token count (the fake ops take any N)."""
    torch.manual_seed(5)
    layer = SymmetricBilinearMLP(6, 4, rank=2, dtype=torch.float64)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (3, 7, 12):
        x = torch.randn(n, 6, dtype=torch.float64, requires_grad=True)
        y, gx = compiled(x), None
        gx, = torch.autograd.grad(y.sum(), x)
        want = _plain(layer, x)
        torch.testing.assert_close(y, want)
        torch.testing.assert_close(gx, torch.autograd.grad(want.sum(), x)[0])


@pytest.mark.parametrize("donated", [True, False])
def test_compiled_double_backward_raises(donated):
    """create_graph=True through a compiled layer: a clear error, never a wrong answer."""
    with functorch_config.patch(donated_buffer=donated):
        _double_backward_raises()


def _double_backward_raises():
    layer = GatedMLP(6, 4, dtype=torch.float64)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward|create_graph"):
        gx, = torch.autograd.grad(compiled(x).pow(2).sum(), x, create_graph=True)
        torch.autograd.grad(gx.sum(), x)


@pytest.mark.parametrize("kind,act", [("gated", "silu"), ("symmetric", "gelu"), ("gated", "tanh")])
def test_eager_custom_op_first_and_second_derivatives(kind, act):
    """Called directly in eager mode, the op's backward is ordinary autograd ops: first
    and second derivatives against finite differences."""
    torch.manual_seed(8)
    m, r = 3, 2
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    q, k = (torch.randn(m * r, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(m, 2, dtype=torch.float64, requires_grad=True)

    def f(x, q, k, v):
        return _fused_op.op_forward(x, q, k, v, kind, act, m, r)[0]

    ref = fn.gated_reference if kind == "gated" else fn.symmetric_reference
    from qkmlp import get_activation
    torch.testing.assert_close(f(x, q, k, v), ref(x, q, k, v, get_activation(act), m, r))
    assert torch.autograd.gradcheck(f, (x, q, k, v))
    assert torch.autograd.gradgradcheck(f, (x, q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_half_equals_eager_llama_bit_for_bit(dtype):
    """The compiled rank-1 gated layer runs the eager fused code: with a Llama MLP's
    weights its output and input gradient are the eager Llama MLP's, bit for bit."""
    torch.manual_seed(6)
    d, m = 16, 24
    llama = LlamaMLP(d, m, dtype=dtype)
    gated = GatedMLP.from_linear(llama.gate_proj, llama.up_proj, llama.down_proj, activation="silu")
    x = torch.randn(9, d, dtype=dtype, requires_grad=True)
    compiled = torch.compile(gated, fullgraph=True, backend="aot_eager")
    y, yl = compiled(x), llama(x)
    assert torch.equal(y, yl)
    gy = torch.randn_like(y)
    assert torch.equal(torch.autograd.grad(y, x, gy)[0], torch.autograd.grad(gated(x), x, gy)[0])


def _per_token(saved, n):
    """Numbers per token in the saved tensors that have a token axis of length n."""
    return sum(torch.Size(s).numel() // n for s, _ in saved if n in s)


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("rank", [1, 2])
def test_compiled_graph_saves_what_eager_saves(cls, rank):
    """The goal: under inductor's partitioner the layer keeps x and [a; b], d + 2mr
    numbers per token, as eager autograd does (counted with saved_tensors_hooks), while
    the compiled Llama MLP of as many hidden units (m·r) keeps more."""
    torch.manual_seed(7)
    d, m, n = 16, 24, 37             # n shares no length with a weight
    layer = cls(d, m, rank=rank)
    x = torch.randn(n, d, requires_grad=True)
    eager = saved_bytes(lambda: layer(x), list(layer.parameters())) // (4 * n)
    compiled = _per_token(compiled_saved_tensors(layer, x), n)
    assert eager == d + 2 * m * rank
    assert compiled == eager
    llama = LlamaMLP(d, m * rank)
    llama_compiled = _per_token(compiled_saved_tensors(llama, x), n)
    assert llama_compiled > compiled
    # the hooks see the compiled graph's saved tensors too (what the bench reports)
    c = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert saved_bytes(lambda: c(x), list(layer.parameters())) == 4 * n * eager


def test_compiled_bf16_inference_runs_the_compiled_llama_sequence_and_training_the_eager_one():
    """What the layers docstring says each mode runs, in bfloat16 with inductor: inference
    fuses σ and the product into one float32 kernel rounded once, bit-equal to a compiled
    Llama MLP and to that one-rounding formula; with a gradient wanted the compiled layer
    runs the eager op sequence (σ(a) rounded, then the product), bit-equal to eager."""
    torch.manual_seed(9)
    d, m = 32, 48
    llama = LlamaMLP(d, m, dtype=torch.bfloat16)
    gated = GatedMLP.from_linear(llama.gate_proj, llama.up_proj, llama.down_proj, activation="silu")
    x = torch.randn(64, d, dtype=torch.bfloat16) * 2
    compiled = torch.compile(gated, fullgraph=True, backend="inductor")
    with torch.no_grad():
        eager, inference = gated(x), compiled(x)
        llama_inference = torch.compile(llama, fullgraph=True, backend="inductor")(x)
        a, b = x @ gated.query_weight.T, x @ gated.key_weight.T
        once = torch.nn.functional.linear((torch.nn.functional.silu(a.float()) * b.float()).to(torch.bfloat16),
                                          gated.value.T.contiguous())
    assert torch.equal(eager, llama(x))
    assert torch.equal(inference, llama_inference) and torch.equal(inference, once)
    rel = ((inference.float() - eager.float()).norm() / eager.float().norm()).item()
    print(f"compiled bf16 inference vs eager: {rel:.2%} relative")
    assert 0 < rel < 1e-2, rel                 # a rounding apart
    training = compiled(x.clone().requires_grad_())
    assert torch.equal(training, eager)
