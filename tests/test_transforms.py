"""The rank-r layers under every torch transform, against the plain-autograd formula.

For each rank-r layer × every registered activation × rank 1 and 2 × float32/float64,
each derivative a torch API can take (torch.func hessian, jacrev of jacrev, grad of a
gradient penalty through functional_call, eager double backward, forward-mode AD with and
without no_grad, vmap over inputs and over parameters, vectorised jacobians and hessians,
gradcheck/gradgradcheck with batched gradients and forward AD) is compared with the same
API applied to the layer's formula written slot by slot in ``tests/reference.py`` on the
same parameters. Copies of a layer (deepcopy, pickle, torch.save/load, the symmetry
transforms, AveragedModel) must keep the fast path: the same bytes saved for backward.
"""
import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.autograd import forward_ad as fwAD

import reference as R
from conftest import FUSED, RANK_R
from qkmlp import GatedMLP, SymmetricBilinearMLP, SymmetrizedGatedMLP, activation_names
from qkmlp import functional as fn
from qkmlp.symmetry import rescaled, swapped

FORMULA = {GatedMLP: R.gated, SymmetricBilinearMLP: R.symmetric, SymmetrizedGatedMLP: R.symmetrized}
D, M, O, N = 3, 2, 2, 2
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}

MATRIX = [
    pytest.param(cls, act, rank, dtype, id=f"{cls.__name__}-{act}-r{rank}-{str(dtype)[6:]}")
    for cls in RANK_R for act in activation_names() for rank in (1, 2)
    for dtype in (torch.float32, torch.float64)
]
MATRIX64 = [p for p in MATRIX if p.values[3] is torch.float64]


class Formula(nn.Module):
    """The layer's formula from tests/reference.py on the layer's own parameters (read
    through the documented views ``query``, ``key``, ``value``), so that functional_call
    can swap them."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        L = self.layer
        return FORMULA[type(L)](x, L.query, L.key, L.value, L.activation)


def _setup(cls, act, rank, dtype, seed=0):
    """A layer with order-one weights (every σ bends), its formula, an input and the parameters."""
    torch.manual_seed(seed)
    layer = cls(D, M, O, rank=rank, activation=act, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    assert fn.supports_fused(layer.activation) or cls is SymmetrizedGatedMLP
    x = torch.randn(N, D, dtype=dtype)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    return layer, Formula(layer), x, params


def _call(module, params, x):
    """functional_call on the layer or on its Formula (whose parameters sit under 'layer.')."""
    if isinstance(module, Formula):
        params = {"layer." + n: p for n, p in params.items()}
    return torch.func.functional_call(module, params, (x,))


def _close(got, want, dtype):
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _close(got[k], want[k], dtype)
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w, dtype)
    else:
        torch.testing.assert_close(got, want, **TOL[dtype])


def _both(cls, act, rank, dtype, f):
    """f(module, x, params) for the layer and for its formula; assert equal."""
    layer, formula, x, params = _setup(cls, act, rank, dtype)
    _close(f(layer, x, params), f(formula, x, params), dtype)


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_func_hessian(cls, act, rank, dtype):
    _both(cls, act, rank, dtype, lambda mod, x, p: torch.func.hessian(lambda z: mod(z).sum())(x))


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_jacrev_of_jacrev(cls, act, rank, dtype):
    _both(cls, act, rank, dtype, lambda mod, x, p: torch.func.jacrev(torch.func.jacrev(mod))(x))


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_func_grad_of_gradient_penalty(cls, act, rank, dtype):
    """grad over the parameters of ‖∂f/∂x‖², both through torch.func and functional_call."""

    def f(mod, x, params):
        def penalty(ps):
            gx = torch.func.grad(lambda z: _call(mod, ps, z).sum())(x)
            return gx.pow(2).sum()
        return torch.func.grad(penalty)(params)

    _both(cls, act, rank, dtype, f)


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_eager_double_backward(cls, act, rank, dtype):
    def f(mod, x, params):
        ps = {n: p.clone().requires_grad_() for n, p in params.items()}
        z = x.clone().requires_grad_()
        gx, = torch.autograd.grad(_call(mod, ps, z).square().sum(), z, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), [z, *ps.values()])

    _both(cls, act, rank, dtype, f)


@pytest.mark.parametrize("no_grad", [False, True], ids=["grad", "no_grad"])
@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_forward_mode_ad(cls, act, rank, dtype, no_grad):
    """A jvp in the input and all parameters at once, with and without torch.no_grad()."""
    gen = torch.Generator().manual_seed(5)

    def f(mod, x, params):
        tx = torch.randn(x.shape, generator=gen, dtype=dtype)
        tps = {n: torch.randn(p.shape, generator=gen, dtype=dtype) for n, p in params.items()}
        with torch.set_grad_enabled(not no_grad), fwAD.dual_level():
            ps = {n: fwAD.make_dual(p, tps[n]) for n, p in params.items()}
            y = _call(mod, ps, fwAD.make_dual(x, tx))
            primal, tangent = fwAD.unpack_dual(y)
            return primal.clone(), tangent.clone()

    layer, formula, x, params = _setup(cls, act, rank, dtype)
    got = f(layer, x, params)
    gen.manual_seed(5)                       # the same tangents for the formula
    _close(got, f(formula, x, params), dtype)


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_func_jvp_and_vmap_over_inputs_and_parameters(cls, act, rank, dtype):
    def f(mod, x, params):
        xb = torch.stack([x, 2 * x, -x])
        over_x = torch.func.vmap(mod)(xb)
        stacked = {n: torch.stack([p, 0.5 * p, -p]) for n, p in params.items()}
        over_p = torch.func.vmap(lambda ps: _call(mod, ps, x))(stacked)
        _, jvp = torch.func.jvp(mod, (x,), (torch.ones_like(x),))
        return over_x, over_p, jvp

    _both(cls, act, rank, dtype, f)


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX)
def test_vectorized_jacobians_and_hessians(cls, act, rank, dtype):
    AF = torch.autograd.functional

    def f(mod, x, params):
        names = list(params)
        jx = AF.jacobian(mod, x, vectorize=True)
        jp = AF.jacobian(lambda *ps: _call(mod, dict(zip(names, ps)), x), tuple(params.values()), vectorize=True)
        hx = AF.hessian(lambda z: mod(z).sum(), x, vectorize=True)
        jf = AF.jacobian(mod, x, vectorize=True, strategy="forward-mode")
        return jx, jp, hx, jf

    _both(cls, act, rank, dtype, f)


def _gradchecks(cls, act, rank, fast_mode):
    layer, _, x, params = _setup(cls, act, rank, torch.float64)
    names = list(params)
    inputs = (x.requires_grad_(), *(p.clone().requires_grad_() for p in params.values()))

    def f(x, *ps):
        return _call(layer, dict(zip(names, ps)), x)

    assert torch.autograd.gradcheck(f, inputs, check_batched_grad=True, check_forward_ad=True,
                                    check_batched_forward_grad=True, fast_mode=fast_mode)
    assert torch.autograd.gradgradcheck(f, inputs, check_batched_grad=True, check_fwd_over_rev=True,
                                        fast_mode=fast_mode)


@pytest.mark.parametrize("cls,act,rank,dtype", MATRIX64)
def test_gradcheck_batched_and_forward_ad(cls, act, rank, dtype):
    """Finite differences, batched gradients, forward AD and forward-over-reverse, in the
    input and every parameter (fast mode: along random directions)."""
    _gradchecks(cls, act, rank, fast_mode=True)


@pytest.mark.parametrize("cls", FUSED)
def test_gradcheck_full_jacobians(cls):
    """The same checks entry by entry (slow mode), for one activation."""
    _gradchecks(cls, "gelu", 2, fast_mode=False)


@pytest.mark.parametrize("cls", RANK_R)
def test_gradient_through_a_plain_eager_graph_then_batched(cls):
    """A graph built in plain eager mode (the fused path), then differentiated with batched
    gradient outputs (autograd.grad(is_grads_batched=True) and torch.func.vmap of a vjp)."""
    layer, formula, x, _ = _setup(cls, "silu", 2, torch.float64)
    xg = x.clone().requires_grad_()
    y, y_ref = layer(xg), formula(xg)
    eye = torch.eye(N * O, dtype=torch.float64).reshape(N * O, N, O)
    got = torch.autograd.grad(y, [xg, *layer.parameters()], eye, is_grads_batched=True, retain_graph=True)
    want = torch.autograd.grad(y_ref, [xg, *layer.parameters()], eye, is_grads_batched=True, retain_graph=True)
    _close(got, want, torch.float64)
    got = torch.func.vmap(lambda g: torch.autograd.grad(y, xg, g, retain_graph=True)[0])(eye)
    _close(got, want[0], torch.float64)


# --- copies keep the fast path --------------------------------------------------------

def _saved_bytes(layer, x):
    """Bytes of distinct non-parameter storages autograd saves for one forward pass."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(seen.values())


def _torch_save_load(layer):
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


COPIES = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda L: pickle.loads(pickle.dumps(L)),
    "torch.save/load": _torch_save_load,
    "symmetry.swapped": swapped,
    "symmetry.rescaled": lambda L: rescaled(L, 2.0),
    "AveragedModel": lambda L: torch.optim.swa_utils.AveragedModel(L).module,
}


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("cls", FUSED)
@pytest.mark.parametrize("act", ["silu", "identity"])
def test_copies_save_the_same_bytes_for_backward(cls, act, how):
    torch.manual_seed(0)
    layer = cls(8, 12, rank=2, activation=act)
    x = torch.randn(16, 8, requires_grad=True)
    twin = COPIES[how](layer)
    assert twin.activation is layer.activation
    assert fn.supports_fused(twin.activation)
    assert _saved_bytes(twin, x) == _saved_bytes(layer, x) == 4 * 16 * (8 + 2 * 12 * 2)
    if how in ("deepcopy", "pickle", "torch.save/load", "AveragedModel"):
        torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)


def test_an_activation_wrapping_a_registered_function_is_fused():
    """get_activation(F.silu) wraps torch's own silu under the registered name: same function."""
    from qkmlp import get_activation
    assert fn.supports_fused(get_activation(torch.nn.functional.silu))
    assert not fn.supports_fused(get_activation(lambda z: torch.nn.functional.silu(z)))


@pytest.mark.parametrize("cls", FUSED)
def test_torch_func_inside_torch_compile(cls):
    """torch.compile of a gradient penalty taken with torch.func (the fast path must step
    aside while compiling too), and torch.func.hessian of a compiled layer."""
    layer, formula, x, params = _setup(cls, "gelu", 2, torch.float64)

    def penalty_grad(mod):
        def f(ps):
            gx = torch.func.grad(lambda z: _call(mod, ps, z).sum())(x)
            return gx.pow(2).sum()
        return torch.compile(torch.func.grad(f), backend="aot_eager")(params)

    try:
        _close(penalty_grad(layer), penalty_grad(formula), torch.float64)
        compiled = torch.compile(layer, backend="aot_eager")
        _close(torch.func.hessian(lambda z: compiled(z).sum())(x),
               torch.func.hessian(lambda z: formula(z).sum())(x), torch.float64)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("Fn", [fn.GatedFn, fn.SymmetricFn])
def test_the_autograd_functions_refuse_torch_func(Fn):
    """Called directly under a torch.func transform the fused function would give wrong
    second derivatives; it refuses instead (gated()/symmetric() step aside)."""
    x, q, v = torch.randn(3, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="only first derivatives under torch.func"):
        torch.func.grad(lambda z: Fn.apply(z, q, q, v, "silu", 2, 1)[0].sum())(x)
    f = fn.gated if Fn is fn.GatedFn else fn.symmetric
    want = torch.func.grad(lambda z: f(z, q, q, v, "silu").sum())(x)
    xg = x.clone().requires_grad_()
    torch.testing.assert_close(torch.autograd.grad(Fn.apply(xg, q, q, v, "silu", 2, 1)[0].sum(), xg)[0], want)
