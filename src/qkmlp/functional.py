"""Fast paths of the factored layers: two GEMMs, a fused elementwise middle, lean memory.

Both factored forms compute, for a batch x of shape (N, d), query and key weights Q, K of
shape (m·r, d) (row j·r + s holds :math:`q_{j,s}`, :math:`k_{j,s}`: ``nn.Linear``'s layout) and values V
of shape (m, d_out)::

    a, b = x @ Qᵀ, x @ Kᵀ          [a; b] is one (2, N, mr) buffer, a and b viewed as (N, m, r)
    h = Σ_s σ(a_s) b_s             gated        (N, m)
    h = σ(Σ_s a_s b_s)             symmetric    (N, m)
    y = h @ V                      one GEMM, V is (m, d_out)

The autograd functions :class:`GatedFn` and :class:`SymmetricFn` save only x, the
pre-activations ``ab`` and the weights for backward, and recompute σ(a) (or σ(p)) and h
there, as Liger-Kernel does for SwiGLU (Hsu et al., 2024). A Llama-style MLP written with
three ``nn.Linear`` saves x, gate(x), σ(gate(x)), up(x) and the product: d + 4m numbers per
token against d + 2mr here.

Every dtype runs the elementwise middle in the input dtype, with the op sequence of a
Llama MLP written with ``nn.Linear`` (σ(a) rounded to the dtype, then the product rounded
to it): in bfloat16 and float16 the rank-1 gated layer computes bit for bit what
``down(silu(gate(x)) * up(x))`` computes, with no float32 conversion passes, and its
error against float64 is Llama's own. (The other layers of :mod:`qkmlp.layers` apply σ
in float32 for halves, ``compute_dtype``.) The activation's derivative is PyTorch's own fused backward
kernel (``silu_backward``, ``gelu_backward``, ...) for every registered activation
(``FUSED_ACTIVATIONS``); a layer, or :func:`gated` / :func:`symmetric`, given any other
callable uses the plain autograd path (:func:`gated_reference`, :func:`symmetric_reference`,
:func:`symmetrized_reference`).

**When the fast path steps aside.** Its in-place and ``out=`` tricks, and a backward that
is only a first derivative, are right in plain eager autograd only. :func:`gated` and
:func:`symmetric` therefore evaluate the plain formula with ordinary autograd ops, which
every torch API differentiates to every order, whenever (:func:`fast_path_applies`)

- a ``torch.func`` transform is active (``grad``, ``vjp``, ``jacrev``, ``jacfwd``,
  ``hessian``, ``vmap``, ``jvp``), in eager mode or inside ``torch.compile``, or
- a forward-mode AD level is open (``torch.autograd.forward_ad.dual_level``, which
  ``gradcheck(check_forward_ad=True)`` uses), or
- ``torch.jit.trace`` is tracing (the trace then records the plain formula, the same in
  every grad mode, so it runs with and without grad), or
- an input is a tensor subclass or a batched tensor.

A backward recorded by autograd (``create_graph=True``: double backward, gradient
penalties) recomputes the plain formula and differentiates it; a backward over batched
gradients (``autograd.grad(is_grads_batched=True)``, vectorised jacobians, ``vmap`` over
a vjp) runs the same hand-written rule out of place.

**Under torch.compile** a wanted gradient goes through the ``torch.library`` custom op
``qkmlp::fused_forward_v1`` (:data:`FUSED_OP_NAME`; returns y and [a; b]; runs the eager code above), whose
backward is written in torch ops and traced: the compiled layer saves what eager saves
(the compiler's partitioner would otherwise choose, and keeps d + 3m), and the compiler
fuses the backward's elementwise middle. ``create_graph=True`` through a compiled layer
raises (AOTAutograd has no double backward). Inference (no gradient) is traced out of place.

**Under torch.export** (any grad mode) the layers trace the plain formula: an exported
program holds ATen ops only, computes bit for bit what eager computes in float32 and
float64, and loads (``torch.export.load``) with torch alone, qkmlp not installed.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad as _forward_ad

from .activations import ACTIVATIONS, Activation, get_activation, without_overwrite

__all__ = [
    "FUSED_ACTIVATIONS",
    "compute_dtype",
    "activation_backward",
    "supports_fused",
    "fast_path_applies",
    "gated",
    "symmetric",
    "gated_reference",
    "symmetric_reference",
    "symmetrized_reference",
    "GatedFn",
    "SymmetricFn",
    "FUSED_OP_NAME",
    "FUSED_OP_VERSION",
]

_aten = torch.ops.aten


def _relu2_backward(grad, z, s):
    return grad * (2.0 * F.relu(z))


# name -> (grad, z, σ(z)) ↦ grad·σ'(z), one fused ATen op where PyTorch has one (the same
# kernels that autograd uses for these activations).
_BACKWARD: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "identity": lambda grad, z, s: grad,
    "relu": lambda grad, z, s: _aten.threshold_backward(grad, z, 0),
    "leaky_relu": lambda grad, z, s: _aten.leaky_relu_backward(grad, z, 0.01, False),
    "gelu": lambda grad, z, s: _aten.gelu_backward(grad, z, approximate="none"),
    "gelu_tanh": lambda grad, z, s: _aten.gelu_backward(grad, z, approximate="tanh"),
    "silu": lambda grad, z, s: _aten.silu_backward(grad, z),
    "tanh": lambda grad, z, s: _aten.tanh_backward(grad, s),
    "sigmoid": lambda grad, z, s: _aten.sigmoid_backward(grad, s),
    "softplus": lambda grad, z, s: grad * torch.sigmoid(z),      # no threshold (activations._softplus)
    "relu2": _relu2_backward,
}

def _relu2_backward_into(grad, z, s, out):
    return out.mul_(2.0 * F.relu(z))


# The same, written into ``out`` (which may alias ``grad``): plain eager mode only.
_BACKWARD_INTO: dict[str, Callable] = {
    "identity": lambda grad, z, s, out: out if out is grad else out.copy_(grad),
    "relu": lambda grad, z, s, out: _aten.threshold_backward.grad_input(grad, z, 0, grad_input=out),
    "leaky_relu": lambda grad, z, s, out: _aten.leaky_relu_backward.grad_input(grad, z, 0.01, False, grad_input=out),
    "gelu": lambda grad, z, s, out: _aten.gelu_backward.grad_input(grad, z, approximate="none", grad_input=out),
    "gelu_tanh": lambda grad, z, s, out: _aten.gelu_backward.grad_input(grad, z, approximate="tanh", grad_input=out),
    "silu": lambda grad, z, s, out: _aten.silu_backward.grad_input(grad, z, grad_input=out),
    "tanh": lambda grad, z, s, out: _aten.tanh_backward.grad_input(grad, s, grad_input=out),
    "sigmoid": lambda grad, z, s, out: _aten.sigmoid_backward.grad_input(grad, s, grad_input=out),
    "softplus": lambda grad, z, s, out: torch.mul(grad, torch.sigmoid(z), out=out),
    "relu2": _relu2_backward_into,
}

#: The activation names with a fused path: every registered one of :mod:`qkmlp.activations`.
FUSED_ACTIVATIONS: tuple[str, ...] = tuple(_BACKWARD)


def supports_fused(activation: Activation) -> bool:
    """Whether ``activation`` is a registered one, so its derivative is known.

    A registered activation, a copy of one (deepcopy and pickle return the registry's own
    object), or an :class:`Activation` with a registered name wrapping the registered
    function with the same declared properties."""
    reg = ACTIVATIONS.get(activation.name)
    if reg is None or activation.name not in _BACKWARD:
        return False
    return activation is reg or (activation.fn is reg.fn and activation == reg)


def activation_backward(name: str, grad: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """grad·σ'(z) for a registered activation, given z and s = σ(z) (elementwise)."""
    try:
        fn = _BACKWARD[name]
    except KeyError:
        raise ValueError(
            f"no fused derivative for activation {name!r}; expected one of {', '.join(_BACKWARD)}"
        ) from None
    return fn(grad, z, s)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which :class:`~qkmlp.KeyValueMLP`, :class:`~qkmlp.StaticQueryMLP` and
    :class:`~qkmlp.BilinearAttentionMLP` apply σ: float32 for float16/bfloat16, else ``dtype``.
    (The rank-r layers' fused middle runs in the input dtype itself.)"""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# --- when the fast path may run --------------------------------------------------------

_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
_is_legacy_batched = getattr(getattr(torch._C, "_functorch", None), "is_legacy_batchedtensor", None)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _transform_free() -> bool:
    """No torch.func transform active and no forward-mode AD level open (also while
    torch.compile traces, which evaluates both). Private torch probes: if one is missing,
    say no."""
    if _transforms_active is None or _transforms_active():
        return False
    return getattr(_forward_ad, "_current_level", 0) < 0


def _plain_mode() -> bool:
    """Plain eager autograd: not compiling, not tracing (``torch.jit.trace``), no torch.func
    transform, no forward-AD level."""
    return not torch.compiler.is_compiling() and not torch.jit.is_tracing() and _transform_free()


def _plain_tensors(*ts: torch.Tensor) -> bool:
    """Every tensor a plain dense tensor or parameter: no subclass, no legacy-batched tensor."""
    if _is_legacy_batched is None:
        return False
    return all(type(t) in _PLAIN_TYPES and not _is_legacy_batched(t) for t in ts)


def fast_path_applies(*tensors: torch.Tensor) -> bool:
    """Whether the fused autograd functions may run on ``tensors`` now: plain eager mode
    (no ``torch.func`` transform, no forward-AD level, not compiling, not tracing) and plain
    tensors. Where this is false, :func:`gated` and :func:`symmetric` evaluate the plain formula."""
    return _plain_mode() and _plain_tensors(*tensors)


def _out_ok(*ts) -> bool:
    """Whether ``out=`` into views of a fresh buffer is allowed: plain eager mode and plain
    tensors, and nothing here is recorded by autograd (grad mode off, as in a Function's
    forward and backward, or no input needs a gradient)."""
    return fast_path_applies(*ts) and (not torch.is_grad_enabled() or not any(t.requires_grad for t in ts))


# --- the two GEMMs and the elementwise middle -------------------------------------------

def _project(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """[a; b] = (x·Qᵀ, x·Kᵀ) as one (2, N, mr) tensor; Q, K are (mr, d).

    Two GEMMs, each writing one contiguous half. On this CPU they beat one GEMM into an
    (N, 2mr) block, whose halves are row-strided for everything that follows (about 1 %
    of a forward + backward step at d = 512, m = 1376, N = 2048), and torch.matmul with a
    batch of two (bmm), which was 10 % slower there.
    """
    if not _out_ok(x, query, key):
        return torch.stack([x @ query.T, x @ key.T])
    ab = torch.empty(2, x.shape[0], query.shape[0], dtype=x.dtype, device=x.device)
    torch.mm(x, query.T, out=ab[0])
    torch.mm(x, key.T, out=ab[1])
    return ab


def _split(ab: torch.Tensor, m: int, r: int, dtype: torch.dtype, *, upcast_b: bool = True):
    """(2, N, mr) -> a, b views of shape (N, m, r), upcast to ``dtype`` (a copy only then).

    With ``upcast_b=False`` b keeps ab's dtype: a product with the upcast a then promotes
    b elementwise inside the kernel, without a float32 copy of b.
    """
    n = ab.shape[1]
    a, b = ab[0].reshape(n, m, r), ab[1].reshape(n, m, r)
    return a.to(dtype), (b.to(dtype) if upcast_b else b)


def _sum_rank(t: torch.Tensor) -> torch.Tensor:
    """(N, m, r) -> (N, m); no extra pass when r = 1."""
    return t.squeeze(-1) if t.shape[-1] == 1 else t.sum(-1)


# In-place σ for the activations that have one (used only on scratch buffers).
_INPLACE = {
    "identity": lambda z: z,
    "relu": torch.relu_,
    "leaky_relu": lambda z: F.leaky_relu(z, inplace=True),
    "silu": lambda z: F.silu(z, inplace=True),
    "tanh": torch.tanh_,
    "sigmoid": torch.sigmoid_,
}


def _act_into(name: str, z: torch.Tensor) -> torch.Tensor:
    """σ(z), overwriting z when σ has an in-place form (z must be a scratch buffer)."""
    f = _INPLACE.get(name)
    return f(z) if f is not None else ACTIVATIONS[name](z)


def _gated_hidden(name: str, ab: torch.Tensor, m: int, r: int, cdt, *, scratch: bool) -> torch.Tensor:
    """h = Σ_s σ(a_s) b_s, (N, m); overwrites ab when ``scratch`` (inference)."""
    a, b = _split(ab, m, r, cdt, upcast_b=False)
    own = scratch or ab.dtype != cdt   # may overwrite a: ab is scratch, or a is an upcast copy
    if own:
        s = _act_into(name, a)
    else:
        s = ACTIVATIONS[name](a)       # ab is saved for backward: σ(a) goes to a fresh buffer
        own = name != "identity"       # ... except for the identity, which returns a itself
    if r == 1 and own:
        return s.mul_(b).squeeze(-1)
    return _sum_rank(s * b)


def _symmetric_hidden(name: str, ab: torch.Tensor, m: int, r: int, cdt, *, scratch: bool) -> torch.Tensor:
    """h = σ(Σ_s a_s b_s), (N, m); overwrites ab when ``scratch`` (inference)."""
    a, b = _split(ab, m, r, cdt, upcast_b=False)
    if r == 1:
        p = a.mul_(b) if (scratch or ab.dtype != cdt) else a * b
        p = p.squeeze(-1)
    else:
        p = (a * b).sum(-1)
    return _act_into(name, p)


def _weight_grads(ctx, gab, x, query, key, h, grad_y, value, fast: bool):
    """The backward GEMMs: dV = hᵀ·dy, dQ = daᵀ·x, dK = dbᵀ·x, dx = da·Q + db·K.

    ``gab`` is d[a; b] of shape (2, N, mr); with ``fast`` dx accumulates its second GEMM
    in place (no separate sum of two (N, d) halves)."""
    grad_x = grad_q = grad_k = grad_v = None
    needs = ctx.needs_input_grad
    if needs[0]:
        grad_x = torch.mm(gab[0], query)
        grad_x = grad_x.addmm_(gab[1], key) if fast else torch.addmm(grad_x, gab[1], key)
    if needs[1]:
        grad_q = gab[0].T @ x
    if needs[2]:
        grad_k = gab[1].T @ x
    if needs[3]:
        grad_v = h.T @ grad_y
    return grad_x, grad_q, grad_k, grad_v, None, None, None


def _grad_buffer(n: int, m: int, r: int, like: torch.Tensor):
    """A (2, N, mr) buffer for d[a; b] and its two halves viewed as (N, m, r)."""
    gab = torch.empty(2, n, m * r, dtype=like.dtype, device=like.device)
    return gab, gab[0].view(n, m, r), gab[1].view(n, m, r)


_NO_GRADS = (None,) * 7   # backward's answer when y did not reach the loss


def _plain_backward(ctx, reference, grad_y):
    """Backward by differentiating the plain formula again (recomputes the forward).

    Used when autograd records the backward itself (``create_graph=True``, double
    backward): the gradients then depend on x, Q, K and V through ordinary autograd ops.
    """
    x, query, key, value, _ = ctx.saved_tensors
    inputs = (x, query, key, value)
    with torch.enable_grad():
        y = reference(x, query, key, value, ACTIVATIONS[ctx.name], ctx.m, ctx.r)
        wanted = [t for t, need in zip(inputs, ctx.needs_input_grad[:4]) if need]
        grads = iter(torch.autograd.grad(y, wanted, grad_y, create_graph=True, allow_unused=True))
    return (*(next(grads) if need else None for need in ctx.needs_input_grad[:4]), None, None, None)


def _times_value(h: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """y = h @ V, V of shape (m, d_out).

    On CPU in bfloat16 and float16, PyTorch's GEMM is many times slower when its second
    operand is row-major (m, d_out) than when it is the transpose of a row-major
    (d_out, m) matrix, the layout of ``nn.Linear``'s weight. There V is copied into that
    layout first (m·d_out numbers, against N·m·d_out multiply-adds for the GEMM); the
    product is the same matrix product, in the order ``F.linear`` computes it."""
    if value.device.type == "cpu" and value.dtype in (torch.bfloat16, torch.float16):
        return F.linear(h, value.T.contiguous())
    return h @ value


def _fused_forward(hidden, x, query, key, value, name, m, r, scratch=False):
    """(y, [a; b]) with [a; b] (2, N, mr) from :func:`_project` and y = hidden([a; b])·V:
    both fused forwards.

    ``hidden`` is :func:`_gated_hidden` or :func:`_symmetric_hidden`; with ``scratch`` it
    may overwrite [a; b] (inference)."""
    ab = _project(x, query, key)
    h = hidden(name, ab, m, r, x.dtype, scratch=scratch)   # the middle in x's own dtype
    return _times_value(h, value), ab


def _backward(ctx, grad_y, reference, rule):
    """The backward of a fused function: no gradients when y did not reach the loss; the
    plain formula differentiated again when autograd records the backward
    (``create_graph=True``); else ``rule(ctx, grad_y, *saved, fast)``, with ``fast`` true
    when grad_y is a plain tensor in plain eager mode (then ``out=`` and in-place ops)."""
    if grad_y is None:
        return _NO_GRADS
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        return _plain_backward(ctx, reference, grad_y)
    return rule(ctx, grad_y, *_unpack_saved(ctx), fast_path_applies(grad_y))


def _unpack_saved(ctx):
    """The saved x, Q, K, V and the pre-activations a, b (N, m, r) in the compute dtype,
    with m, r, the input dtype and the compute dtype: what every backward starts from."""
    x, query, key, value, ab = ctx.saved_tensors
    m, r, dt = ctx.m, ctx.r, x.dtype
    cdt = dt                                   # the middle runs in the input dtype
    a, b = _split(ab, m, r, cdt)
    return x, query, key, value, a, b, m, r, dt, cdt


def _refuse_transforms(fn_name: str) -> None:
    if not torch.compiler.is_compiling() and (_transforms_active is None or _transforms_active()):
        raise RuntimeError(
            f"{fn_name} gives only first derivatives under torch.func transforms; call "
            "qkmlp.functional.gated / symmetric (or the layer), which use the plain formula there"
        )


class _FusedBase(torch.autograd.Function):
    """Shared plumbing: forward returns (y, ab); ab is saved, not differentiable.
    ``apply`` refuses to run under ``torch.func`` transforms (its backward is a first
    derivative only); :func:`gated` and :func:`symmetric` step aside there."""

    @classmethod
    def apply(cls, *args, **kwargs):
        _refuse_transforms(cls.__name__)
        return super().apply(*args, **kwargs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, query, key, value, name, m, r = inputs
        _, ab = output
        ctx.mark_non_differentiable(ab)
        ctx.set_materialize_grads(False)   # no (N, 2mr) zero gradient for ab in backward
        ctx.save_for_backward(x, query, key, value, ab)
        ctx.name, ctx.m, ctx.r = name, m, r


class GatedFn(_FusedBase):
    """y = (Σ_s σ(a_s) b_s) @ V with [a; b] = (x Qᵀ, x Kᵀ). Saves x and [a; b] only.

    Inputs: x (N, d), query and key (m·r, d), value (m, d_out), all of one dtype; name of a
    registered activation; m; r. Outputs (y (N, d_out), [a; b] (2, N, mr)). Call
    :func:`gated`, which returns y and steps aside where this function would be wrong
    (it refuses to run under ``torch.func`` transforms).
    """

    @staticmethod
    def forward(x, query, key, value, name: str, m: int, r: int):
        return _fused_forward(_gated_hidden, x, query, key, value, name, m, r)

    @staticmethod
    def backward(ctx, grad_y, _grad_ab):
        return _backward(ctx, grad_y, gated_reference, _gated_backward)


def _gated_backward(ctx, grad_y, x, query, key, value, a, b, m, r, dt, cdt, fast):
    """GatedFn's backward in PyTorch ops (see :func:`_backward`)."""
    n = x.shape[0]
    s = ACTIVATIONS[ctx.name](a)                            # σ(a), recomputed
    if fast and r == 1 and dt == cdt:
        # Rank 1, no upcast: dh = dy·Vᵀ goes straight into the b half of d[a; b]
        # and everything else happens in place, one fresh (2, N, m) buffer besides σ(a).
        gab, grad_a, grad_b = _grad_buffer(n, m, r, s)
        torch.mm(grad_y, value.T, out=gab[1])                       # dh
        _BACKWARD_INTO[ctx.name](torch.mul(grad_b, b, out=grad_a), a, s, grad_a)
        grad_b.mul_(s)                                           # dh·σ(a)
        h = (s * b if ctx.name == "identity" else s.mul_(b)).squeeze(-1)
        return _weight_grads(ctx, gab, x, query, key, h, grad_y, value, fast)
    grad_h = (grad_y @ value.T).to(cdt).unsqueeze(-1)      # (N, m, 1)
    if not fast:
        grad_b = grad_h * s                                     # d/db of σ(a)·b
        grad_a = activation_backward(ctx.name, grad_h * b, a, s)  # d/da of σ(a)·b
        gab = torch.stack([grad_a.reshape(n, m * r), grad_b.reshape(n, m * r)])
        h = _sum_rank(s * b).to(dt)                             # h, recomputed
    else:   # the same, written straight into the two halves of d[a; b]
        gab, grad_a, grad_b = _grad_buffer(n, m, r, s)
        torch.mul(grad_h, s, out=grad_b)
        _BACKWARD_INTO[ctx.name](torch.mul(grad_h, b, out=grad_a), a, s, grad_a)
        h = _sum_rank(s * b if ctx.name == "identity" else s.mul_(b)).to(dt)   # h, recomputed
    return _weight_grads(ctx, gab.to(dt), x, query, key, h, grad_y, value, fast)


class SymmetricFn(_FusedBase):
    """y = σ(Σ_s a_s b_s) @ V with [a; b] = (x Qᵀ, x Kᵀ). Saves x and [a; b] only.

    Inputs and outputs as :class:`GatedFn`; call :func:`symmetric`, which returns y.
    """

    @staticmethod
    def forward(x, query, key, value, name: str, m: int, r: int):
        return _fused_forward(_symmetric_hidden, x, query, key, value, name, m, r)

    @staticmethod
    def backward(ctx, grad_y, _grad_ab):
        return _backward(ctx, grad_y, symmetric_reference, _symmetric_backward)


def _symmetric_backward(ctx, grad_y, x, query, key, value, a, b, m, r, dt, cdt, fast):
    """SymmetricFn's backward in PyTorch ops (see :func:`_backward`)."""
    n = x.shape[0]
    if fast and r == 1 and dt == cdt:
        # Rank 1, no upcast: p = a·b goes into the a half of d[a; b] and dh = dy·Vᵀ
        # into the b half; dp = dh·σ'(p) in place over dh, then da = dp·b over p and
        # db = dp·a over dp. One fresh (2, N, m) buffer besides h = σ(p).
        gab, grad_a, grad_b = _grad_buffer(n, m, r, a)
        p = torch.mul(a, b, out=grad_a)                         # score, recomputed
        s = ACTIVATIONS[ctx.name](p)                            # h = σ(p), recomputed
        s = p.clone() if s is p else s                          # identity: p is overwritten below
        torch.mm(grad_y, value.T, out=gab[1])                   # dh
        _BACKWARD_INTO[ctx.name](grad_b, p, s, grad_b)         # dp
        torch.mul(grad_b, b, out=grad_a)
        grad_b.mul_(a)
        return _weight_grads(ctx, gab, x, query, key, s.squeeze(-1), grad_y, value, fast)
    p = _sum_rank(a * b)                                   # score, recomputed (N, m)
    s = ACTIVATIONS[ctx.name](p)                           # h = σ(p), recomputed
    grad_h = (grad_y @ value.T).to(cdt)
    grad_p = activation_backward(ctx.name, grad_h, p, s).unsqueeze(-1)
    if not fast:
        gab = torch.stack([(grad_p * b).reshape(n, m * r), (grad_p * a).reshape(n, m * r)])
    else:   # the same, written straight into the two halves of d[a; b]
        gab, grad_a, grad_b = _grad_buffer(n, m, r, grad_p)
        torch.mul(grad_p, b, out=grad_a)
        torch.mul(grad_p, a, out=grad_b)
    return _weight_grads(ctx, gab.to(dt), x, query, key, s.to(dt), grad_y, value, fast)


# --- the public functions ----------------------------------------------------------------

def _check_args(x, query, key, value) -> tuple[int, int]:
    """(m, r) from the shapes, after checking them; TypeError for mixed dtypes or devices."""
    ts = {"x": x, "query": query, "key": key, "value": value}
    for name, t in ts.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or query.dim() != 2 or key.dim() != 2 or value.dim() != 2:
        raise ValueError(
            "expected x (N, d), query and key (m·r, d), value (m, d_out); got "
            + ", ".join(f"{n} {tuple(t.shape)}" for n, t in ts.items())
        )
    m, mr, d = value.shape[0], query.shape[0], x.shape[1]
    if m == 0 or mr % m or key.shape != query.shape or query.shape[1] != d:
        raise ValueError(
            f"expected query and key of one shape (m·r, d) with d = {d} and m = value.shape[0] = {m} "
            f"dividing m·r; got query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if len({t.dtype for t in ts.values()}) != 1 or len({t.device for t in ts.values()}) != 1:
        raise TypeError(
            "x, query, key and value must share one dtype and device; got "
            + ", ".join(f"{n} {t.dtype} on {t.device}" for n, t in ts.items())
        )
    return m, mr // m


def _activation(activation) -> Activation:
    """``activation`` as an :class:`Activation`: what a layer's ``activation=`` accepts (a
    name, an alias, an Activation or a callable instance; a class raises TypeError)."""
    return get_activation(activation)


def _needs_grad(*ts) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def _apply(fn, kind, hidden, reference, x, query, key, value, activation):
    """y of a fused layer: the autograd function ``fn`` when a gradient is wanted, straight
    through the fused forward when not, and the plain formula ``reference`` where the fast
    path does not apply (:func:`fast_path_applies`)."""
    m, r = _check_args(x, query, key, value)
    act = _activation(activation)
    if not supports_fused(act):         # a callable with no known derivative: as the layers do
        return reference(x, query, key, value, act, m, r)
    name = act.name
    if not _transform_free():
        return reference(x, query, key, value, ACTIVATIONS[name], m, r)
    if _exporting():
        # torch.export: the plain formula, so an exported program holds only ATen ops and
        # loads with torch alone, in every grad mode (bit-equal to eager in float32/64)
        return reference(x, query, key, value, ACTIVATIONS[name], m, r)
    if torch.compiler.is_compiling():
        if _needs_grad(x, query, key, value):
            # one opaque op: the compiler's partitioner cannot change what it saves
            return _op_forward(x, query, key, value, kind, name, m, r, _SOURCE_TAG)[0]
        # inference: traced out of place (functionalising in-place ops on views would
        # write whole buffers back), so the compiler may fuse the middle itself
        return _fused_forward(hidden, x, query, key, value, name, m, r)[0]
    if not fast_path_applies(x, query, key, value):
        return reference(x, query, key, value, ACTIVATIONS[name], m, r)
    if _needs_grad(x, query, key, value):
        return fn.apply(x, query, key, value, name, m, r)[0]
    return _fused_forward(hidden, x, query, key, value, name, m, r, scratch=True)[0]


# --- under torch.compile: the forward as an opaque library op ---------------------------
#
# Traced by AOTAutograd, GatedFn and SymmetricFn become ordinary graph ops, and the
# compiler's partitioner (inductor's min-cut) decides afresh what to keep for backward:
# d + 3m numbers per token for every layer, the fused layers' saving halved. Selective
# activation checkpointing only marks ops of that traced graph to save or recompute; σ(a)
# and h would still exist in the forward graph for the partitioner to weigh. Instead the
# forward is one custom op returning (y, [a; b]): σ(a) and h never appear in the forward
# graph, so the backward can only recompute them from what the op returns, and the
# cheapest cut is x and [a; b], what eager saves (tests/test_compile.py reads the saved
# set off the partitioned graph). The op runs the eager fused forward (in place on its own
# buffers), so a half-precision rank-1 gated layer keeps the Llama MLP's output bit for
# bit. Its backward (:func:`_traced_backward`) is written in differentiable torch ops and
# traced, so the compiler fuses its elementwise middle as it does the Llama MLP's.
# (An opaque backward op, commit 3402ce9, saved the same; its three stored runs are in
# chapter 10.) Double backward through a compiled layer: AOTAutograd raises.

_HIDDEN = {"gated": _gated_hidden, "symmetric": _symmetric_hidden}


def _exporting() -> bool:
    """Whether ``torch.export`` is tracing (False where torch cannot say)."""
    probe = getattr(torch.compiler, "is_exporting", None)
    return bool(probe is not None and probe())


def _source_tag() -> str:
    """8 hex digits of a hash of this module's and the activations' source. torch's
    compile caches (AOTAutograd's, on disk) key a custom op by its name and the graph's
    constant arguments, not by its autograd formula: with nothing but a fixed name, a
    cached compiled backward would outlive a change to :func:`_traced_backward`. Every
    call of the op passes this tag as its last argument, so the cache key changes with
    the source while the op's name stays :data:`FUSED_OP_NAME`."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    try:
        for f in (__file__, Path(__file__).with_name("activations.py")):
            h.update(Path(f).read_bytes())
    except OSError:                         # no source files (a frozen install)
        h.update(repr(sorted(FUSED_ACTIVATIONS)).encode())
    return h.hexdigest()[:8]


#: The version of the custom op's semantics (its arguments, outputs, forward and backward
#: formulas): bumped when any of them changes, never for an edit that computes the same.
FUSED_OP_VERSION = 1
#: The custom op's name, ``qkmlp::fused_forward_v<FUSED_OP_VERSION>``, stable across source
#: edits (compile caches see the source through its ``tag`` argument). Only torch.compile
#: with a gradient wanted calls it (an exported program holds ATen ops only).
FUSED_OP_NAME = f"qkmlp::fused_forward_v{FUSED_OP_VERSION}"
_SOURCE_TAG = _source_tag()


@torch.library.custom_op(FUSED_OP_NAME, mutates_args=())
def _op_forward(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kind: str, name: str, m: int, r: int, tag: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(y, [a; b]) of the fused ``kind`` ("gated" or "symmetric") layer: GatedFn.forward.
    ``tag`` (the source hash, :func:`_source_tag`) does not enter the computation: it keys
    torch's compile caches to the source."""
    with torch.no_grad():
        return _fused_forward(_HIDDEN[kind], x, query, key, value, name, m, r)


@_op_forward.register_fake
def _(x, query, key, value, kind, name, m, r, tag=""):
    n = x.shape[0]
    return x.new_empty(n, value.shape[1]), x.new_empty(2, n, query.shape[0])


def _op_setup_context(ctx, inputs, output):
    x, query, key, value, kind, name, m, r, _tag = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, query, key, value, output[1])
    ctx.kind, ctx.name, ctx.m, ctx.r = kind, name, m, r


def _traced_backward(ctx, grad_y):
    """The backward of ``fused_forward`` in differentiable torch ops: traced by the
    compiler, which may fuse its elementwise middle; reads x, the weights and [a; b]."""
    x, query, key, value, ab = ctx.saved_tensors
    name, m, r = ctx.name, ctx.m, ctx.r
    n = x.shape[0]
    a, b = _split(ab, m, r, x.dtype)
    grad_h = grad_y @ value.T                              # (N, m)
    if ctx.kind == "gated":
        s = ACTIVATIONS[name](a)                           # σ(a), recomputed
        gh = grad_h.unsqueeze(-1)
        grad_a = activation_backward(name, gh * b, a, s)
        grad_b = gh * s
        h = _sum_rank(s * b)
    else:
        p = _sum_rank(a * b)                               # score, recomputed
        h = ACTIVATIONS[name](p)
        grad_p = activation_backward(name, grad_h, p, h).unsqueeze(-1)
        grad_a, grad_b = grad_p * b, grad_p * a
    grad_a, grad_b = grad_a.reshape(n, m * r), grad_b.reshape(n, m * r)
    needs = ctx.needs_input_grad
    return (torch.addmm(grad_a @ query, grad_b, key) if needs[0] else None,   # as eager
            grad_a.T @ x if needs[1] else None,
            grad_b.T @ x if needs[2] else None,
            h.T @ grad_y if needs[3] else None)


def _op_autograd(ctx, grad_y, _grad_ab):
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # create_graph=True on the op called in eager mode: [a; b] carries no graph of its
        # own, so differentiate the plain formula, as GatedFn does
        ref = gated_reference if ctx.kind == "gated" else symmetric_reference
        return _plain_backward(ctx, ref, grad_y)[:4] + (None,) * 5
    return (*_traced_backward(ctx, grad_y), None, None, None, None, None)


_op_forward.register_autograd(_op_autograd, setup_context=_op_setup_context)


def gated(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, activation) -> torch.Tensor:
    """Fused gated rank-r MLP on a 2-D batch: x (N, d), query and key (m·r, d), value
    (m, d_out) -> (N, d_out). ``activation`` is anything a layer's ``activation=`` takes
    and is fused as there: a registered name or alias, an :class:`Activation`, or a callable
    (``F.silu`` is the registered silu; any other callable runs :func:`gated_reference`).
    See :class:`GatedFn`."""
    return _apply(GatedFn, "gated", _gated_hidden, gated_reference, x, query, key, value, activation)


def symmetric(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, activation) -> torch.Tensor:
    """Fused symmetric rank-r MLP on a 2-D batch, arguments as :func:`gated`. See :class:`SymmetricFn`."""
    return _apply(SymmetricFn, "symmetric", _symmetric_hidden, symmetric_reference, x, query, key, value, activation)


def gated_reference(x, query, key, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Plain-autograd gated path (any callable σ; elementwise math in x's dtype)."""
    cdt = x.dtype
    a, b = _split(_project(x, query, key), m, r, cdt)
    return _times_value(_sum_rank(activation(a) * b).to(x.dtype), value)


def symmetric_reference(x, query, key, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Plain-autograd symmetric path (any callable σ; elementwise math in x's dtype)."""
    cdt = x.dtype
    a, b = _split(_project(x, query, key), m, r, cdt)
    return _times_value(activation(_sum_rank(a * b)).to(x.dtype), value)


def symmetrized_reference(x, query, key, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Plain-autograd symmetrised gated path: Σ_s ½[σ(a_s) b_s + σ(b_s) a_s] per slot (any
    callable σ, an in-place one on a copy: a and b are read again after σ; math in x's dtype)."""
    a, b = _split(_project(x, query, key), m, r, x.dtype)
    act = without_overwrite(activation)
    return _times_value((0.5 * _sum_rank(act(a) * b + act(b) * a)).to(x.dtype), value)
