"""Correctness of the fast paths (qkmlp.functional): the fused functions and the layers
that use them against the plain formulas, in every dtype, mode and input layout.

Speeds are never asserted here; see ``python -m qkmlp.bench`` (tests/test_bench.py).
"""
import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import FUSED, LAYERS, RANK_R
from qkmlp import functional as fn
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    activation_names,
    get_activation,
)
from qkmlp.bench import LlamaMLP, saved_bytes

import reference as R

FACTORED = [(cls, {GatedMLP: R.gated, SymmetricBilinearMLP: R.symmetric}[cls]) for cls in FUSED]
ALL = LAYERS


def _grads(layer, x, gy):
    y = layer(x)
    return (y, *torch.autograd.grad(y, [x, *layer.parameters()], gy))


def _pair(cls, act, rank, d=7, m=5, d_out=3, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    fast = cls(d, m, d_out, rank=rank, activation=act, dtype=dtype)
    plain = copy.deepcopy(fast)
    plain.fused = False
    return fast, plain


@pytest.mark.parametrize("cls,ref", FACTORED)
@pytest.mark.parametrize("act", activation_names())
@pytest.mark.parametrize("rank", [1, 3])
def test_fused_matches_plain_autograd_float64(cls, ref, act, rank):
    fast, plain = _pair(cls, act, rank)
    assert fn.supports_fused(fast.activation)
    x = torch.randn(2, 4, 7, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(2, 4, 3, dtype=torch.float64)
    got, want = _grads(fast, x, gy), _grads(plain, x, gy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    # and the formula itself, slot by slot
    torch.testing.assert_close(got[0], ref(x, fast.query, fast.key, fast.value, get_activation(act)))


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "tanh", "softplus", "sigmoid"])
def test_fused_backward_gradcheck(cls, act):
    """The hand-written backward against finite differences (smooth activations)."""
    torch.manual_seed(1)
    m, r, d, o = 3, 2, 4, 5
    x = torch.randn(6, d, dtype=torch.float64, requires_grad=True)
    q = torch.randn(m * r, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(m * r, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(m, o, dtype=torch.float64, requires_grad=True)
    f = fn.gated if cls is GatedMLP else fn.symmetric
    assert torch.autograd.gradcheck(lambda x, q, k, v: f(x, q, k, v, act), (x, q, k, v))


@pytest.mark.parametrize("cls,ref", FACTORED)
@pytest.mark.parametrize("lead", [(), (5,), (2, 3), (1, 2, 2)])
def test_any_leading_shape_and_inference_path(cls, ref, lead):
    torch.manual_seed(2)
    layer = cls(6, 4, 9, rank=2, dtype=torch.float64)
    x = torch.randn(*lead, 6, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)                       # the in-place inference path
    assert y.shape == (*lead, 9)
    torch.testing.assert_close(y, ref(x, layer.query, layer.key, layer.value, layer.activation))
    torch.testing.assert_close(y, layer(x.requires_grad_()).detach())   # the autograd path


@pytest.mark.parametrize("cls,ref", FACTORED)
@pytest.mark.parametrize("act", ["identity", "silu", "relu", "tanh", "gelu"])
def test_inference_path_leaves_weights_and_input_alone(cls, ref, act):
    torch.manual_seed(3)
    layer = cls(5, 4, rank=1, activation=act)
    x = torch.randn(8, 5)
    before = [p.clone() for p in layer.parameters()], x.clone()
    with torch.no_grad():
        y1, y2 = layer(x), layer(x)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    for p, q in zip(layer.parameters(), before[0]):
        assert torch.equal(p, q)
    assert torch.equal(x, before[1])


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("rank", [1, 4])
def test_float32_gradients_close_to_float64(cls, rank):
    fast, _ = _pair(cls, "silu", rank, d=16, m=12, d_out=10, dtype=torch.float32)
    exact = copy.deepcopy(fast).double()
    x = torch.randn(3, 11, 16)
    gy = torch.randn(3, 11, 10)
    got = _grads(fast, x.clone().requires_grad_(), gy)
    want = _grads(exact, x.double().requires_grad_(), gy.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rank", [1, 2])
def test_half_dtypes_run_the_middle_in_their_own_dtype(cls, dtype, rank):
    torch.manual_seed(4)
    layer = cls(16, 12, 8, rank=rank, dtype=dtype)
    x = torch.randn(5, 16, dtype=dtype, requires_grad=True)
    y = layer(x)
    assert y.dtype == dtype
    # expected: GEMMs, σ and the product all in the half dtype (Llama's op sequence)
    mr = 12 * rank
    ab = x @ torch.cat([layer.query_weight, layer.key_weight]).T
    a, b = ab[:, :mr].reshape(5, 12, rank), ab[:, mr:].reshape(5, 12, rank)
    act = layer.activation
    h = (act(a) * b).sum(-1) if cls is GatedMLP else act((a * b).sum(-1))
    assert h.dtype == dtype
    want = F.linear(h, layer.value.T.contiguous())   # V in nn.Linear's layout on CPU
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    # gradients: in dtype, and close to the float64 gradients of the same weights
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *layer.parameters()], gy)
    exact = copy.deepcopy(layer).double()
    xd = x.detach().double().requires_grad_()
    want_g = torch.autograd.grad(exact(xd), [xd, *exact.parameters()], gy.double())
    for g, w in zip(got, want_g):
        assert g.dtype == dtype
        err = (g.double() - w).norm() / w.norm()
        assert err < 3e-2, err


@pytest.mark.parametrize("cls", FUSED)
def test_autocast_bfloat16(cls):
    torch.manual_seed(5)
    layer = cls(16, 12, 8, rank=2)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.query_weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    ref = layer(x.detach())
    assert ((y.float() - ref).norm() / ref.norm()) < 3e-2


@pytest.mark.parametrize("cls", ALL)
def test_torch_compile_fullgraph(cls):
    torch.manual_seed(6)
    kw = {"rank": 2} if cls in RANK_R else {}
    layer = cls(8, 6, 5, **kw)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 4, 8, requires_grad=True)
    gy = torch.randn(3, 4, 5)
    got = _grads(compiled, x, gy)
    want = _grads(layer, x, gy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_torch_compile_under_autocast():
    layer = GatedMLP(8, 6)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, want = compiled(x), layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, want)
    torch._dynamo.reset()


def test_custom_callable_uses_plain_path_and_is_right():
    def cube(z):
        return z ** 3

    torch.manual_seed(7)
    layer = GatedMLP(5, 4, 3, rank=2, activation=cube, dtype=torch.float64)
    assert not fn.supports_fused(layer.activation)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    torch.testing.assert_close(y, R.gated(x, layer.query, layer.key, layer.value, cube))
    assert torch.autograd.gradcheck(lambda x: layer(x), (x,))


def _activation_bytes(layer, x):
    return saved_bytes(lambda: layer(x), list(layer.parameters()))


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("rank", [1, 2, 8])
def test_saves_only_input_and_preactivations(cls, rank):
    n, d, m = 32, 16, 24
    layer = cls(d, m, rank=rank)
    x = torch.randn(n, d, requires_grad=True)
    assert _activation_bytes(layer, x) == 4 * (n * d + n * 2 * m * rank)
    plain = copy.deepcopy(layer)
    plain.fused = False
    assert _activation_bytes(layer, x) < _activation_bytes(plain, x)


def test_saved_bytes_at_most_three_quarters_of_llama():
    n, d, m = 64, 32, 86
    x = torch.randn(n, d, requires_grad=True)
    llama = LlamaMLP(d, m)
    gated = GatedMLP(d, m)
    sym = SymmetricBilinearMLP(d, m)
    base = _activation_bytes(llama, x)
    assert base == 4 * n * (d + 4 * m)   # x, gate(x), silu(gate(x)), up(x), product
    assert _activation_bytes(gated, x) <= 0.75 * base
    assert _activation_bytes(sym, x) <= 0.75 * base


def test_from_linear_matches_llama_mlp_with_gradients():
    torch.manual_seed(8)
    llama = LlamaMLP(12, 20).double()
    layer = GatedMLP.from_linear(llama.gate_proj, llama.up_proj, llama.down_proj, activation="silu")
    x = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(2, 5, 12, dtype=torch.float64)
    y, gx, gq, gk, gv = _grads(layer, x, gy)
    y2 = llama(x)
    gx2, gg, gu, gd = torch.autograd.grad(y2, [x, *llama.parameters()], gy)
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(gx, gx2)
    torch.testing.assert_close(gq, gg)
    torch.testing.assert_close(gk, gu)
    torch.testing.assert_close(gv, gd.T)


@pytest.mark.parametrize("cls", RANK_R)
def test_views_write_through_and_deepcopy(cls):
    layer = cls(4, 3, rank=2)
    assert [n for n, _ in layer.named_parameters()] == ["query_weight", "key_weight", "value"]
    assert layer.query_weight.shape == layer.key_weight.shape == (6, 4)
    assert layer.query.shape == layer.key.shape == (3, 2, 4)
    with torch.no_grad():
        layer.query.mul_(2.0)
        layer.key.copy_(torch.arange(24.0).reshape(3, 2, 4))
    assert torch.equal(layer.key_weight, torch.arange(24.0).reshape(6, 4))   # row j·r + s is k_{j,s}
    assert torch.equal(layer.key_weight[2 * 1 + 1], layer.key[1, 1])
    clone = copy.deepcopy(layer)
    with torch.no_grad():
        clone.query.zero_()
    assert not torch.equal(layer.query, clone.query)


def test_rank_r_equals_its_dense_form_without_materialising():
    """Rank 8 (2r < d) stores 2mrd + m·d_out numbers and saves N(d + 2mr) for backward;
    the dense layer it equals stores m·d² for A_j alone."""
    torch.manual_seed(9)
    n, d, m, r = 10, 32, 6, 8
    layer = SymmetricBilinearMLP(d, m, rank=r, dtype=torch.float64)
    x = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(layer(x), layer.to_dense()(x))
    assert sum(p.numel() for p in layer.parameters()) == 2 * m * r * d + m * d
    assert max(p.numel() for p in layer.parameters()) < m * d * d
    assert _activation_bytes(layer, x) == 8 * n * (d + 2 * m * r)


def test_fused_function_rejects_bad_input():
    x, w, v = torch.randn(3, 4), torch.randn(4, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match="query and key"):
        fn.gated(x, torch.randn(5, 4), torch.randn(5, 4), v, "silu")
    with pytest.raises(ValueError, match="query and key"):
        fn.gated(x, w, torch.randn(4, 3), v, "silu")
    with pytest.raises(ValueError, match="unknown activation 'nope'; expected one of identity"):
        fn.gated(x, w, w, v, "nope")
    with pytest.raises(TypeError, match="got the class SiLU"):      # callables are taken (test_interop)
        fn.symmetric(x, w, w, v, torch.nn.SiLU)
    with pytest.raises(TypeError, match="one dtype and device"):
        fn.gated(x, w.double(), w, v, "silu")
    assert torch.equal(fn.gated(x, w, w, v, "swish"), fn.gated(x, w, w, v, "silu"))   # aliases
    with pytest.raises(ValueError, match="no fused derivative"):
        fn.activation_backward("nope", torch.zeros(1), torch.zeros(1), torch.zeros(1))


@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("act", ["silu", "relu", "tanh", "identity"])
def test_torch_func_transforms_and_forward_mode(cls, act):
    """torch.func.grad / vmap / jacrev and forward-mode AD agree with the plain path."""
    from torch.autograd import forward_ad as fwAD

    fast, plain = _pair(cls, act, 2, d=5, m=4, d_out=3)
    x = torch.randn(6, 5, dtype=torch.float64)

    def loss(layer):
        return lambda p: torch.func.functional_call(layer, p, (x,)).pow(2).sum()

    params = {n: p.detach() for n, p in fast.named_parameters()}
    g_fast, g_plain = torch.func.grad(loss(fast))(params), torch.func.grad(loss(plain))(params)
    for n in params:
        torch.testing.assert_close(g_fast[n], g_plain[n])
    xb = torch.randn(2, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(fast)(xb), plain(xb))
    torch.testing.assert_close(torch.func.jacrev(fast)(x), torch.func.jacrev(plain)(x))
    tangent = torch.randn_like(x)
    jvps = []
    for layer in (fast, plain):
        with fwAD.dual_level():
            y = layer(fwAD.make_dual(x.clone().requires_grad_(), tangent))
            jvps.append(fwAD.unpack_dual(y).tangent)
    torch.testing.assert_close(*jvps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_layers_apply_sigma_in_float32(dtype):
    torch.manual_seed(10)
    x = torch.randn(6, 8, dtype=dtype)
    kv = KeyValueMLP(8, 12, activation="gelu", dtype=dtype)
    want = F.gelu((x @ kv.key.T).float()).to(dtype) @ kv.value
    torch.testing.assert_close(kv(x), want, rtol=0, atol=0)
    sq = StaticQueryMLP(8, 12, activation="silu", dtype=dtype)
    want = F.silu(((x @ sq.query) @ sq.key.T).float()).to(dtype) @ sq.value
    torch.testing.assert_close(sq(x), want, rtol=0, atol=0)
    dense = BilinearAttentionMLP(8, 5, dtype=dtype)
    want = F.silu(dense.scores(x).float()).to(dtype) @ dense.value
    torch.testing.assert_close(dense(x), want, rtol=0, atol=0)


@pytest.mark.parametrize("f", [fn.gated, fn.symmetric])
def test_double_backward(f):
    """create_graph=True goes through the out=-free branch of backward, so it is differentiable."""
    torch.manual_seed(11)
    m, r, d, o = 3, 2, 4, 2
    x = torch.randn(5, d, dtype=torch.float64, requires_grad=True)
    q = torch.randn(m * r, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(m * r, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(m, o, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, q, k, v: f(x, q, k, v, "silu"), (x, q, k, v))


@pytest.mark.parametrize("cls", FUSED)
def test_compiled_inference_path_matches_eager(cls):
    """Without autograd the compiled layer takes the out-of-place path; same numbers."""
    torch.manual_seed(3)
    layer = cls(12, 20, rank=2)
    x = torch.randn(5, 12)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x))


# --- property tests: fast path against the plain path over shapes, layouts and dtypes ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LAYOUTS = ("contiguous", "empty", "one_row", "one_token", "transposed", "expanded", "strided", "3d_permuted")
PROP_TOL = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-5, 1e-6), torch.bfloat16: (2e-2, 2e-2)}


def _input(layout, n, d, dtype, gen):
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype)
    return {
        "contiguous": lambda: r(n, d),
        "empty": lambda: r(0, d),
        "one_row": lambda: r(1, d),
        "one_token": lambda: r(d),
        "transposed": lambda: r(d, n).T,
        "expanded": lambda: r(1, d).expand(n, d),
        "strided": lambda: r(n, 2 * d)[:, ::2],
        "3d_permuted": lambda: r(n, 2, d).transpose(0, 1),
    }[layout]()


@st.composite
def fast_cases(draw):
    cls = draw(st.sampled_from(RANK_R))
    sizes = [draw(st.integers(1, n)) for n in (6, 5, 3, 4, 5)]   # d, m, r, d_out, N
    return (cls, *sizes, draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16])),
            draw(st.sampled_from(activation_names())), draw(st.sampled_from(LAYOUTS)),
            draw(st.booleans()), draw(st.integers(0, 2**16)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fast_cases())
def test_property_fast_path_equals_plain_path(case):
    cls, d, m, r, o, n, dtype, act, layout, grad, seed = case
    torch.manual_seed(seed)
    fast = cls(d, m, o, rank=r, activation=act, dtype=dtype)
    plain = copy.deepcopy(fast)
    plain.fused = False
    gen = torch.Generator().manual_seed(seed)
    x = _input(layout, n, d, dtype, gen)
    x_before = x.clone()
    rtol, atol = PROP_TOL[dtype]
    if not grad:
        with torch.no_grad():
            y, want = fast(x), plain(x)
        torch.testing.assert_close(y, want, rtol=rtol, atol=atol)
        assert y.shape == (*x.shape[:-1], o) and y._base is None
        assert torch.equal(x, x_before)                          # the scratch path leaves x alone
        return
    outs = []
    for layer in (fast, plain):
        xg = x.detach().clone().requires_grad_() if layout != "expanded" else x.detach().requires_grad_()
        y = layer(xg)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
        outs.append((y, *torch.autograd.grad(y, [xg, *layer.parameters()], gy)))
    for g, w in zip(*outs):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol * max(1.0, w.abs().max().item() if w.numel() else 1.0))
    assert torch.equal(x, x_before)


# --- numerics are pinned: the float32 fast path is this sequence of torch ops -----------------

@pytest.mark.parametrize("cls", FUSED)
def test_float32_rank1_fast_path_is_the_documented_op_sequence(cls):
    """Bit for bit: forward a = xQᵀ, b = xKᵀ, h = σ(a)·b (gated) or σ(a·b), y = hV; backward
    dh = dy·Vᵀ, torch's own σ-backward kernel, dx = da·Q then += db·K (one addmm_),
    dQ = daᵀx, dK = dbᵀx, dV = hᵀdy. Rounding changes here would move stored results."""
    aten = torch.ops.aten
    torch.manual_seed(12)
    layer = cls(24, 40, 16)
    x = torch.randn(33, 24, requires_grad=True)
    gy = torch.randn(33, 16)
    y = layer(x)
    got = (y, *torch.autograd.grad(y, [x, *layer.parameters()], gy))
    with torch.no_grad():
        Q, K, V = layer.query_weight, layer.key_weight, layer.value
        a, b = x @ Q.T, x @ K.T
        dh = gy @ V.T
        if cls is GatedMLP:
            s = F.silu(a)
            h = s * b
            da, db = aten.silu_backward(dh * b, a), dh * s
        else:
            p = a * b
            h = F.silu(p)
            dp = aten.silu_backward(dh, p)
            da, db = dp * b, dp * a
        want = (h @ V, (da @ Q).addmm_(db, K), da.T @ x, db.T @ x, h.T @ gy)
        assert torch.equal(layer(x), want[0])                     # the inference path too
    for g, w in zip(got, want):
        assert torch.equal(g, w)
