"""The layers where a user's code meets them: torch.jit.trace, jagged nested tensors,
loading an MLP module (from_mlp / from_linear without a guessed σ), qkmlp.functional with
the callables the layers take, refused dtypes (mixed-dtype weights too), in-place writes into
the weight views, assigning a view under a parametrization (as ``nn.Linear.weight = t``), and
the documented float16 rank-sum rounding. Each against an independent computation or what
``nn.Linear`` / ``LlamaMLP`` do.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.nn.utils import parametrize

from conftest import LAYERS as ALL_LAYERS, RANK_R, layer_cases
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
    get_activation,
)
from qkmlp import functional as fn
from qkmlp.activations import activation_of_mlp

import reference as R

F64 = torch.float64
D, M, O = 8, 5, 3
LAYERS = layer_cases((1, 2))
IDS = [f"{c.__name__}-r{r}" for c, r in LAYERS]


def _make(cls, rank, dtype=F64, **kw):
    torch.manual_seed(0)
    if rank:
        kw["rank"] = rank
    return cls(D, M, O, dtype=dtype, **kw)


def _formula(layer, x):
    """The layer's formula, slot by slot (tests/reference.py)."""
    return R.layer_formula(layer, x)


# --- torch.jit.trace -------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                            "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("cls,rank", LAYERS, ids=IDS)
@pytest.mark.parametrize("traced_with_grad", [True, False])
def test_jit_trace_equals_eager_on_new_inputs_with_and_without_grad(cls, rank, traced_with_grad):
    layer = _make(cls, rank, activation="gelu")
    with torch.set_grad_enabled(traced_with_grad):
        traced = torch.jit.trace(layer, torch.randn(4, D, dtype=F64))   # check_trace on: reruns and compares
    x = torch.randn(7, D, dtype=F64, requires_grad=True)                 # another batch size
    gy = torch.randn(7, O, dtype=F64)
    want = _formula(layer, x)
    y = traced(x)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    got_g = torch.autograd.grad(y, [x, *layer.parameters()], gy)
    want_g = torch.autograd.grad(layer(x), [x, *layer.parameters()], gy)
    for g, w in zip(got_g, want_g):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("cls", ALL_LAYERS)
def test_jit_script_is_unsupported_as_documented(cls):
    """The docs say torch.jit.script is unsupported; if it ever compiles, they must change."""
    with pytest.raises(Exception):
        torch.jit.script(cls(D, M))


# --- jagged nested tensors -------------------------------------------------------------

def _seqs(lengths, *, requires_grad=False):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(n, D, generator=g, dtype=F64).requires_grad_(requires_grad) for n in lengths]


@pytest.mark.parametrize("cls,rank", LAYERS, ids=IDS)
def test_jagged_nested_input_gives_each_sequence_what_it_gets_alone(cls, rank):
    layer = _make(cls, rank, activation="silu")
    xs = _seqs((3, 1, 6), requires_grad=True)
    nt = torch.nested.as_nested_tensor(xs, layout=torch.jagged)
    y = layer(nt)
    assert y.is_nested and y.layout == torch.jagged
    for yi, xi in zip(y.unbind(), xs):
        torch.testing.assert_close(yi, _formula(layer, xi), rtol=1e-12, atol=1e-12)
    # gradients through the nested tensor = the sum of the per-sequence gradients
    gys = [torch.randn(n, O, dtype=F64) for n in (3, 1, 6)]
    loss = (y.values() * torch.cat(gys)).sum()
    got = torch.autograd.grad(loss, [*xs, *layer.parameters()])
    alone = sum((layer(xi) * gy).sum() for xi, gy in zip(xs, gys))
    want = torch.autograd.grad(alone, [*xs, *layer.parameters()])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        for yi, xi in zip(layer(nt).unbind(), xs):
            torch.testing.assert_close(yi, _formula(layer, xi), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls,rank", [(BilinearAttentionMLP, None), (GatedMLP, 2)])
def test_jagged_with_extra_dims_transposed_and_narrowed(cls, rank):
    layer = _make(cls, rank)
    g = torch.Generator().manual_seed(4)
    four = torch.nested.nested_tensor([torch.randn(n, 2, D, generator=g, dtype=F64) for n in (3, 5)],
                                      layout=torch.jagged)                  # (B, j, 2, d)
    narrowed = torch.nested.narrow(torch.randn(2, 9, D, generator=g, dtype=F64), 1,
                                   torch.tensor([0, 2]), torch.tensor([3, 5]), layout=torch.jagged)
    for nt in (four, four.transpose(1, 2), narrowed):
        y = layer(nt)
        for yi, xi in zip(y.unbind(), nt.unbind()):
            torch.testing.assert_close(yi, _formula(layer, xi), rtol=1e-12, atol=1e-12)


def test_jagged_nested_scores_projections_and_coefficients():
    xs = _seqs((2, 4))
    nt = torch.nested.nested_tensor(xs, layout=torch.jagged)
    bi = _make(BilinearAttentionMLP, None)
    for s, xi in zip(bi.scores(nt).unbind(), xs):
        torch.testing.assert_close(s, bi.scores(xi))
    g = _make(GatedMLP, 2)
    qa, kb = g.projections(nt)
    for a, b, xi in zip(qa.unbind(), kb.unbind(), xs):
        a0, b0 = g.projections(xi)
        torch.testing.assert_close(a, a0)
        torch.testing.assert_close(b, b0)
        torch.testing.assert_close(a, torch.einsum("nd,jsd->njs", xi, g.query))   # x·q_{j,s}
    kv = _make(KeyValueMLP, None)
    for c, xi in zip(kv.coefficients(nt).unbind(), xs):
        torch.testing.assert_close(c, F.relu(xi @ kv.key.T))


# every other (layer, rank) case: the refusal is the input check all layers share
@pytest.mark.parametrize("cls,rank", LAYERS[::2], ids=IDS[::2])
def test_a_strided_nested_tensor_is_refused_naming_the_jagged_layout(cls, rank):
    layer = _make(cls, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nt = torch.nested.nested_tensor(_seqs((2, 3)), layout=torch.strided)
    with pytest.raises(TypeError, match=r"jagged nested tensor \(layout=torch.jagged\), got a nested "
                                        r"tensor of layout torch.strided"):
        layer(nt)


# --- from_linear's checks; from_mlp reads σ -----------------------------------------------

def test_from_linear_without_activation_is_refused():
    lin = [nn.Linear(D, M, bias=False), nn.Linear(D, M, bias=False), nn.Linear(M, O, bias=False)]
    with pytest.raises(TypeError, match=r"from_linear needs activation=.*GatedMLP.from_mlp\(mlp\)"):
        GatedMLP.from_linear(*lin)


def test_from_linear_rejects_biases_and_mismatched_shapes():
    gate, up, down = nn.Linear(D, M), nn.Linear(D, M, bias=False), nn.Linear(M, O, bias=False)
    with pytest.raises(ValueError, match="bias"):
        GatedMLP.from_linear(gate, up, down, activation="silu")
    gate = nn.Linear(D, M, bias=False)
    with pytest.raises(ValueError, match="up_proj"):
        GatedMLP.from_linear(gate, nn.Linear(D, M + 1, bias=False), down, activation="silu")
    with pytest.raises(ValueError, match="down_proj"):
        GatedMLP.from_linear(gate, up, nn.Linear(M + 1, O, bias=False), activation="silu")
    with pytest.raises(TypeError, match="nn.Linear"):
        GatedMLP.from_linear(gate, up, lambda x: x, activation="silu")


def test_from_linear_rejects_mixed_dtypes_and_devices_without_casting():
    lin = lambda a, b, **kw: nn.Linear(a, b, bias=False, **kw)
    gate, up, down = lin(D, M), lin(D, M), lin(M, O)
    before = [t.weight.detach().clone() for t in (gate, up, down)]
    with pytest.raises(TypeError, match=r"one dtype and device.*down_proj torch.float64"):
        GatedMLP.from_linear(gate, up, lin(M, O, dtype=torch.float64), activation="silu")
    with pytest.raises(TypeError, match=r"one dtype and device.*up_proj torch.float32 on meta"):
        GatedMLP.from_linear(gate, lin(D, M, device="meta"), down, activation="silu")
    with pytest.raises(TypeError, match=r"down_proj torch.float32 on meta"):
        GatedMLP.from_linear(gate, up, lin(M, O, device="meta"), activation="silu")
    assert all(torch.equal(t.weight, b) for t, b in zip((gate, up, down), before))
    meta = GatedMLP.from_linear(lin(D, M, device="meta"), lin(D, M, device="meta"), lin(M, O, device="meta"),
                                activation="silu")
    assert meta.query_weight.device.type == "meta"


class _PlainMLP(nn.Module):
    def __init__(self, act_fn=None):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, M, bias=False), nn.Linear(D, M, bias=False)
        self.down_proj = nn.Linear(M, O, bias=False)
        if act_fn is not None:
            self.act_fn = act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("act_fn,name", [
    (nn.SiLU(), "silu"), (nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"),
    (nn.ReLU(), "relu"), (nn.Tanh(), "tanh"), (nn.Sigmoid(), "sigmoid"), (nn.Identity(), "identity"),
    (nn.LeakyReLU(), "leaky_relu"), (nn.Softplus(), "softplus"), (F.silu, "silu"),
])
def test_from_mlp_reads_torch_nn_activation_modules(act_fn, name):
    mlp = _PlainMLP(act_fn).double()
    layer = GatedMLP.from_mlp(mlp)
    assert layer.activation is get_activation(name) and fn.supports_fused(layer.activation)
    x = torch.randn(6, D, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mlp(x), rtol=1e-12, atol=1e-12)


def test_from_mlp_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match=r"no act_fn; no config.hidden_act\); pass activation="):
        GatedMLP.from_mlp(_PlainMLP())
    for act_fn in (nn.LeakyReLU(0.2), nn.Softplus(beta=2.0), nn.Hardswish()):
        mlp = _PlainMLP()
        mlp.act_fn = act_fn
        with pytest.raises(ValueError, match="cannot read the activation"):
            activation_of_mlp(mlp)
    with pytest.raises(TypeError, match="has no nn.Linear gate_proj, up_proj, down_proj"):
        GatedMLP.from_mlp(nn.Linear(2, 2))


# --- qkmlp.functional takes what the layers take -------------------------------------------

def _weights(r, dtype=F64):
    g = torch.Generator().manual_seed(6)
    return [torch.randn(*s, generator=g, dtype=dtype, requires_grad=True)
            for s in ((9, D), (M * r, D), (M * r, D), (M, O))]


@pytest.mark.parametrize("f,kind", [(fn.gated, "gated"), (fn.symmetric, "symmetric")])
def test_functional_takes_F_silu_and_fuses_it_as_the_layers_do(f, kind):
    x, q, k, v = _weights(2, torch.float32)
    gy = torch.randn(9, O)
    y_fn = f(x, q, k, v, F.silu)
    y_name = f(x, q, k, v, "silu")
    assert type(y_fn.grad_fn) is type(y_name.grad_fn)          # the same fused autograd function
    assert "Fn" in type(y_name.grad_fn).__name__
    assert torch.equal(y_fn, y_name)
    for a, b in zip(torch.autograd.grad(y_fn, [x, q, k, v], gy), torch.autograd.grad(y_name, [x, q, k, v], gy)):
        assert torch.equal(a, b)
    layer = (GatedMLP if kind == "gated" else SymmetricBilinearMLP)(D, M, O, rank=2, activation=F.silu)
    assert fn.supports_fused(layer.activation)                 # the layer fuses F.silu too


@pytest.mark.parametrize("f,ref", [(fn.gated, R.gated), (fn.symmetric, R.symmetric)])
@pytest.mark.parametrize("act", [torch.sin, nn.SiLU(), lambda z: z ** 3])
def test_functional_runs_any_other_callable_as_the_plain_formula(f, ref, act):
    x, q, k, v = _weights(3)
    y = f(x, q, k, v, act)
    torch.testing.assert_close(y, ref(x, q.view(M, 3, D), k.view(M, 3, D), v, act), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: f(*t, act), (x, q, k, v))
    with pytest.raises(TypeError, match=r"class SiLU; pass an instance"):
        f(x, q, k, v, nn.SiLU)


# --- refused dtypes ----------------------------------------------------------------------

# every other (layer, rank) case: the refusal is the input check all layers share
@pytest.mark.parametrize("cls,rank", LAYERS[::2], ids=IDS[::2])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.int64, torch.bool])
def test_complex_and_integer_dtypes_are_refused_at_construction(cls, rank, dtype):
    with pytest.raises(TypeError, match=r"dtype must be a real floating dtype \(torch.float16, torch.bfloat16, "
                                        r"torch.float32 or torch.float64\) or None, got torch."):
        _make(cls, rank, dtype=dtype)


def test_a_layer_moved_to_complex_names_the_problem():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = GatedMLP(D, M).to(torch.complex64)
    with pytest.raises(TypeError, match=r"weights are torch.complex64, but the layers are real-valued"):
        layer(torch.randn(2, D))


# --- in-place writes into the views behave as nn.Linear's weight -----------------------------

@pytest.mark.parametrize("cls", RANK_R)
def test_in_place_writes_into_views_need_no_grad_as_for_nn_linear(cls):
    lin = nn.Linear(D, M)
    layer = cls(D, M, rank=2)
    row = torch.ones(2, D)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        lin.weight[0] = row[0]
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        layer.query[0] = row
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        layer.key.copy_(torch.zeros(M, 2, D))
    with torch.no_grad():
        lin.weight[0] = row[0]
        layer.query[0] = row
        layer.key[1, 1] = 2 * row[0]
    assert torch.equal(lin.weight[0], row[0])
    assert torch.equal(layer.query_weight[:2], row) and torch.equal(layer.key_weight[3], 2 * row[0])
    layer.query = torch.zeros(M, 2, D)          # assignment copies under no_grad itself
    assert not layer.query_weight.any()


# --- float16 rank sum (documented, not changed) -----------------------------------------------

def test_float16_rank_sum_rounds_h_before_the_value_gemm_as_documented():
    """At rank 2 in float16, each σ(a_s)·b_s is finite (40000) but h_j = 80000 is not;
    y = h·v with v = 1e-3 is 80 in exact arithmetic. The layer rounds h_j to float16
    (inf), to_linear()'s Llama MLP adds the products in its down GEMM's float32
    accumulator and gets 80: what the layers module docstring says."""
    d, m, r = 2, 1, 2
    layer = GatedMLP(d, m, 1, rank=r, activation="identity", dtype=torch.float16)
    with torch.no_grad():
        layer.query_weight.copy_(torch.tensor([[200.0, 0.0], [200.0, 0.0]]))
        layer.key_weight.copy_(torch.tensor([[0.0, 200.0], [0.0, 200.0]]))
        layer.value.fill_(1e-3)
    x = torch.ones(1, d, dtype=torch.float16)
    exact = GatedMLP(d, m, 1, rank=r, activation="identity", dtype=F64)
    exact.load_state_dict({k: t.double() for k, t in layer.state_dict().items()})
    y64 = exact(x.double())
    gate, up, down = layer.to_linear()
    with torch.no_grad():
        y_layer, y_llama = layer(x), down(gate(x) * up(x))
    assert torch.isfinite(y64).all() and abs(y64.item() - 80.0) < 0.1
    assert torch.isinf(y_layer).all()                       # h_j = 80000 > 65504 in float16
    assert torch.isfinite(y_llama).all() and abs(y_llama.item() - y64.item()) < 0.1
    with torch.no_grad():                                   # the formula with h in float16
        a, b = x @ layer.query_weight.T, x @ layer.key_weight.T
        assert torch.isinf((a * b).sum(-1, keepdim=True)).all()


def _layer(cls, d=8, m=6, o=5, dtype=F64, **kw):
    torch.manual_seed(0)
    if cls in RANK_R:
        kw.setdefault("rank", 2)
    return cls(d, m, o, dtype=dtype, **kw)



# --- assigning a view under a parametrization ---------------------------------------------

class _Double(nn.Module):
    """A custom parametrization with a right inverse."""

    def forward(self, w):
        return 2.0 * w

    def right_inverse(self, w):
        return w / 2.0


class _Square(nn.Module):
    """A custom parametrization without one (nn.Linear's assignment raises)."""

    def forward(self, w):
        return w * w


PARAMETRIZATIONS = {
    "weight_norm": lambda mod, name: P.weight_norm(mod, name=name),
    "spectral_norm": lambda mod, name: P.spectral_norm(mod, name=name),
    "orthogonal": lambda mod, name: P.orthogonal(mod, name=name),
    "custom": lambda mod, name: parametrize.register_parametrization(mod, name, _Double()),
}


def _originals(mod, name):
    return {k: v.clone() for k, v in mod.parametrizations[name].state_dict().items()}


@pytest.mark.parametrize("view", ["query", "key"])
@pytest.mark.parametrize("kind", list(PARAMETRIZATIONS))
def test_assigning_a_view_under_a_parametrization_acts_as_on_nn_linear(kind, view):
    m, d = 12, 16
    g = PARAMETRIZATIONS[kind](_layer(GatedMLP, d, m, rank=1), view + "_weight")
    torch.manual_seed(1)
    lin = PARAMETRIZATIONS[kind](nn.Linear(d, m, bias=False, dtype=F64), "weight")
    g.eval()                                               # spectral_norm: no power iteration per read
    lin.eval()
    t = torch.randn(m, d, dtype=F64, generator=torch.Generator().manual_seed(2))
    if kind == "orthogonal":                               # orthogonal admits orthonormal rows only
        t = torch.linalg.qr(t.T)[0].T.contiguous()
    before = getattr(g, view + "_weight").clone()
    setattr(g, view, t.unsqueeze(1))
    lin.weight = t
    now = getattr(g, view + "_weight")
    assert not torch.equal(now, before)                    # the assignment took effect
    got, want = _originals(g, view + "_weight"), _originals(lin, "weight")
    assert got.keys() == want.keys()
    for k in want:
        if k.startswith("original") and kind != "orthogonal":   # orthogonal keeps a base of its own
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    if kind != "spectral_norm":                            # its power-iteration state is per module
        torch.testing.assert_close(now, lin.weight, rtol=0, atol=0)
        torch.testing.assert_close(now, t, rtol=1e-12, atol=1e-12)
    # and the layer computes with the new weight: y equals the formula with t in place
    x = torch.randn(3, d, dtype=F64)
    q, k = g.query_weight, g.key_weight
    torch.testing.assert_close(g(x), (torch.nn.functional.silu(x @ q.T) * (x @ k.T)) @ g.value)


def test_assigning_under_a_parametrization_without_right_inverse_raises_as_nn_linear():
    g = parametrize.register_parametrization(_layer(GatedMLP, rank=1), "query_weight", _Square())
    lin = parametrize.register_parametrization(nn.Linear(8, 6, bias=False, dtype=F64), "weight", _Square())
    t = torch.randn(6, 8, dtype=F64)
    with pytest.raises(RuntimeError, match="right_inverse") as want:
        lin.weight = t
    with pytest.raises(RuntimeError, match="right_inverse") as got:
        g.query = t.unsqueeze(1)
    assert str(got.value) == str(want.value)



# --- mixed dtypes -------------------------------------------------------------------------

@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cls", RANK_R)
def test_mixed_dtype_weights_get_the_library_error_on_every_rank_r_layer(cls, fused):
    layer = _layer(cls, dtype=torch.float32)
    layer.fused = fused
    layer.query_weight = nn.Parameter(layer.query_weight.detach().double())
    with pytest.raises(TypeError, match="must share one dtype and device; got .*query torch.float64"):
        layer(torch.randn(3, 8))
