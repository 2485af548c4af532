"""The fused path of the rank-r layers (private; :mod:`qkmlp.functional` chooses when it runs).

For x (N, d), query and key weights Q, K (m·r, d) and values V (m, d_out)::

    [a; b] = (x Qᵀ, x Kᵀ)          one (2, N, mr) buffer, a and b viewed as (N, m, r)
    h = Σ_s σ(a_s) b_s             gated        (:func:`gated_hidden`)
    h = σ(Σ_s a_s b_s)             symmetric    (:func:`symmetric_hidden`)
    y = h V

:class:`GatedFn` and :class:`SymmetricFn` save x, [a; b] and the weights and recompute
σ(a) (or σ(p)) and h in backward (:func:`gated_backward`, :func:`symmetric_backward`), as
Liger-Kernel does for SwiGLU. Each form's middle is written once for the forward and once
for the backward; with ``fast`` (plain eager mode, :func:`fast_path_applies`) the same ops
write into preallocated buffers (``out=``) and overwrite what is no longer read.
The elementwise middle runs in the input dtype with a Llama MLP's op sequence (σ(a)
rounded to the dtype, then the product), and σ' is PyTorch's own fused backward kernel.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad as _forward_ad

from .activations import ACTIVATIONS, Activation

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


# The same, written into ``out``, which is ``grad`` itself (plain eager mode only).
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
    object), or an :class:`~qkmlp.activations.Activation` with a registered name wrapping
    the registered function with the same declared properties."""
    reg = ACTIVATIONS.get(activation.name)
    if reg is None or activation.name not in _BACKWARD:
        return False
    return activation is reg or (activation.fn is reg.fn and activation == reg)


def activation_backward(name: str, grad: torch.Tensor, z: torch.Tensor, s: torch.Tensor,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """grad·σ'(z) for a registered activation, given z and s = σ(z) (elementwise); with
    ``out`` (which must be ``grad`` itself) written over grad."""
    try:
        fn = _BACKWARD[name]
    except KeyError:
        raise ValueError(
            f"no fused derivative for activation {name!r}; expected one of {', '.join(_BACKWARD)}"
        ) from None
    return fn(grad, z, s) if out is None else _BACKWARD_INTO[name](grad, z, s, out)


# --- when the fast path may run --------------------------------------------------------

_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
_is_legacy_batched = getattr(getattr(torch._C, "_functorch", None), "is_legacy_batchedtensor", None)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def transform_free() -> bool:
    """No torch.func transform active and no forward-mode AD level open (also while
    torch.compile traces, which evaluates both). Private torch probes: if one is missing,
    say no."""
    if _transforms_active is None or _transforms_active():
        return False
    return getattr(_forward_ad, "_current_level", 0) < 0


def exporting() -> bool:
    """Whether ``torch.export`` is tracing (False where torch cannot say)."""
    probe = getattr(torch.compiler, "is_exporting", None)
    return bool(probe is not None and probe())


def _plain_mode() -> bool:
    """Plain eager autograd: not compiling, not tracing (``torch.jit.trace``), no torch.func
    transform, no forward-AD level."""
    return not torch.compiler.is_compiling() and not torch.jit.is_tracing() and transform_free()


def _plain_tensors(*ts: torch.Tensor) -> bool:
    """Every tensor a plain dense tensor or parameter: no subclass, no legacy-batched tensor."""
    if _is_legacy_batched is None:
        return False
    return all(type(t) in _PLAIN_TYPES and not _is_legacy_batched(t) for t in ts)


def fast_path_applies(*tensors: torch.Tensor) -> bool:
    """Whether the fused autograd functions may run on ``tensors`` now: plain eager mode
    (no ``torch.func`` transform, no forward-AD level, not compiling, not tracing) and plain
    tensors. Where this is false, :func:`~qkmlp.functional.gated` and
    :func:`~qkmlp.functional.symmetric` evaluate the plain formula."""
    return _plain_mode() and _plain_tensors(*tensors)


def wants_grad(*ts: torch.Tensor) -> bool:
    """Whether autograd records an op on ``ts`` now."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


# --- the two GEMMs, the elementwise middle, the value GEMM -------------------------------

def _project(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """[a; b] = (x·Qᵀ, x·Kᵀ) as one (2, N, mr) tensor; Q, K are (mr, d).

    Two GEMMs, each writing one contiguous half. On this CPU they beat one GEMM into an
    (N, 2mr) block, whose halves are row-strided for everything that follows (about 1 %
    of a forward + backward step at d = 512, m = 1376, N = 2048), and torch.matmul with a
    batch of two (bmm), which was 10 % slower there. Outside plain eager mode, or where
    autograd records the products, the two are stacked instead.
    """
    if not fast_path_applies(x, query, key) or wants_grad(x, query, key):
        return torch.stack([x @ query.T, x @ key.T])
    ab = torch.empty(2, x.shape[0], query.shape[0], dtype=x.dtype, device=x.device)
    torch.mm(x, query.T, out=ab[0])
    torch.mm(x, key.T, out=ab[1])
    return ab


def _split(ab: torch.Tensor, m: int, r: int):
    """(2, N, mr) -> a, b views of shape (N, m, r)."""
    n = ab.shape[1]
    return ab[0].reshape(n, m, r), ab[1].reshape(n, m, r)


def _sum_rank(t: torch.Tensor) -> torch.Tensor:
    """(N, m, r) -> (N, m); no extra pass when r = 1."""
    return t.squeeze(-1) if t.shape[-1] == 1 else t.sum(-1)


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


def gated_hidden(name: str, ab: torch.Tensor, m: int, r: int, *, scratch: bool) -> torch.Tensor:
    """h = Σ_s σ(a_s) b_s, (N, m); overwrites ab when ``scratch`` (inference)."""
    a, b = _split(ab, m, r)
    s = _act_into(name, a) if scratch else ACTIVATIONS[name](a)   # else ab is saved for backward
    if r == 1 and (scratch or s is not a):         # σ(a) is a buffer of our own
        return s.mul_(b).squeeze(-1)
    return _sum_rank(s * b)


def symmetric_hidden(name: str, ab: torch.Tensor, m: int, r: int, *, scratch: bool) -> torch.Tensor:
    """h = σ(Σ_s a_s b_s), (N, m); overwrites ab when ``scratch`` (inference)."""
    a, b = _split(ab, m, r)
    if r == 1:
        p = (a.mul_(b) if scratch else a * b).squeeze(-1)
    else:
        p = (a * b).sum(-1)
    return _act_into(name, p)                      # p is a buffer of our own


HIDDEN = {"gated": gated_hidden, "symmetric": symmetric_hidden}


def fused_forward(kind: str, x, query, key, value, name: str, m: int, r: int, scratch: bool = False):
    """(y, [a; b]) of the fused ``kind`` ("gated" or "symmetric"): y = h([a; b]) V, the
    middle in x's own dtype. With ``scratch`` it may overwrite [a; b] (inference)."""
    ab = _project(x, query, key)
    return _times_value(HIDDEN[kind](name, ab, m, r, scratch=scratch), value), ab


# --- the backward: one rule per form ------------------------------------------------------

def _grad_buffer(n: int, m: int, r: int, like: torch.Tensor):
    """A (2, N, mr) buffer for d[a; b] and its two halves viewed as (N, m, r)."""
    gab = torch.empty(2, n, m * r, dtype=like.dtype, device=like.device)
    return gab, gab[0].view(n, m, r), gab[1].view(n, m, r)


def _weight_grads(needs, grad_a, grad_b, x, query, key, h, grad_y, value, fast: bool):
    """The backward GEMMs: dx = da·Q + db·K, dQ = daᵀ·x, dK = dbᵀ·x, dV = hᵀ·dy, for the
    inputs in ``needs`` (``ctx.needs_input_grad``); da, db are (N, mr). With ``fast`` dx
    accumulates its second GEMM in place."""
    grad_x = grad_q = grad_k = grad_v = None
    if needs[0]:
        grad_x = torch.mm(grad_a, query)
        grad_x = grad_x.addmm_(grad_b, key) if fast else torch.addmm(grad_x, grad_b, key)
    if needs[1]:
        grad_q = grad_a.T @ x
    if needs[2]:
        grad_k = grad_b.T @ x
    if needs[3]:
        grad_v = h.T @ grad_y
    return grad_x, grad_q, grad_k, grad_v


def gated_backward(name, needs, grad_y, x, query, key, value, ab, m, r, fast: bool):
    """(dx, dQ, dK, dV) of y = (Σ_s σ(a_s) b_s) V from x, the weights and [a; b]:
    dh = dy Vᵀ, da = dh·b·σ'(a), db = dh·σ(a), h recomputed. With ``fast`` the same ops
    write into one fresh (2, N, mr) buffer (at rank 1 dh goes straight into its b half)."""
    n = x.shape[0]
    a, b = _split(ab, m, r)
    s = ACTIVATIONS[name](a)                                      # σ(a), recomputed
    gab, out_a, out_b = _grad_buffer(n, m, r, s) if fast else (None, None, None)
    if fast and r == 1:
        grad_h = torch.mm(grad_y, value.T, out=gab[1]).unsqueeze(-1)    # dh, in the b half
    else:
        grad_h = (grad_y @ value.T).unsqueeze(-1)                  # dh (N, m, 1)
    grad_a = torch.mul(grad_h, b, out=out_a)                       # dh·b
    grad_a = activation_backward(name, grad_a, a, s, out=out_a)    # dh·b·σ'(a)
    grad_b = torch.mul(grad_h, s, out=out_b)                       # dh·σ(a)
    h = _sum_rank(s.mul_(b) if fast and s is not a else s * b)    # h, recomputed
    return _weight_grads(needs, grad_a.reshape(n, m * r), grad_b.reshape(n, m * r),
                         x, query, key, h, grad_y, value, fast)


def symmetric_backward(name, needs, grad_y, x, query, key, value, ab, m, r, fast: bool):
    """(dx, dQ, dK, dV) of y = σ(Σ_s a_s b_s) V from x, the weights and [a; b]:
    dp = dy Vᵀ·σ'(p), da = dp·b, db = dp·a, p and h = σ(p) recomputed. With ``fast`` the
    same ops write into one fresh (2, N, mr) buffer (at rank 1 p goes into its a half and
    dh into its b half)."""
    n = x.shape[0]
    a, b = _split(ab, m, r)
    gab, out_a, out_b = _grad_buffer(n, m, r, a) if fast else (None, None, None)
    r1 = fast and r == 1
    p = _sum_rank(torch.mul(a, b, out=out_a) if r1 else a * b)    # score, recomputed (N, m)
    s = ACTIVATIONS[name](p)                                      # h = σ(p), recomputed
    if r1:
        s = p.clone() if s is p else s                            # identity: p is overwritten below
        grad_h = torch.mm(grad_y, value.T, out=gab[1])             # dh, in the b half
        grad_p = activation_backward(name, grad_h, p, s, out=grad_h)
    else:
        grad_p = activation_backward(name, grad_y @ value.T, p, s)
    grad_p = grad_p.unsqueeze(-1)                                 # dp (N, m, 1)
    grad_a = torch.mul(grad_p, b, out=out_a)                       # dp·b
    grad_b = torch.mul(grad_p, a, out=out_b)                       # dp·a
    return _weight_grads(needs, grad_a.reshape(n, m * r), grad_b.reshape(n, m * r),
                         x, query, key, s, grad_y, value, fast)


BACKWARD = {"gated": gated_backward, "symmetric": symmetric_backward}

#: The plain formula of each fused form, differentiated again when autograd records a
#: backward (``create_graph=True``). :mod:`qkmlp.functional` fills it with its
#: ``gated_reference`` and ``symmetric_reference``.
PLAIN_FORMULAS: dict[str, Callable] = {}


def plain_backward(kind, saved, needs, name, m, r, grad_y):
    """(dx, dQ, dK, dV) by differentiating the plain formula again (recomputes the forward).

    Used when autograd records the backward itself (``create_graph=True``, double
    backward): the gradients then depend on x, Q, K and V through ordinary autograd ops.
    """
    inputs = saved[:4]
    with torch.enable_grad():
        y = PLAIN_FORMULAS[kind](*inputs, ACTIVATIONS[name], m, r)
        wanted = [t for t, need in zip(inputs, needs[:4]) if need]
        grads = iter(torch.autograd.grad(y, wanted, grad_y, create_graph=True, allow_unused=True))
    return tuple(next(grads) if need else None for need in needs[:4])


# --- the autograd functions ---------------------------------------------------------------

class _FusedBase(torch.autograd.Function):
    """Shared plumbing: forward returns (y, ab); ab is saved, not differentiable.
    ``apply`` refuses to run under ``torch.func`` transforms (its backward is a first
    derivative only); :func:`~qkmlp.functional.gated` and :func:`~qkmlp.functional.symmetric`
    step aside there."""

    @classmethod
    def apply(cls, *args, **kwargs):
        if not torch.compiler.is_compiling() and (_transforms_active is None or _transforms_active()):
            raise RuntimeError(
                f"{cls.__name__} gives only first derivatives under torch.func transforms; call "
                "qkmlp.functional.gated / symmetric (or the layer), which use the plain formula there"
            )
        return super().apply(*args, **kwargs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, query, key, value, name, m, r = inputs
        _, ab = output
        ctx.mark_non_differentiable(ab)
        ctx.set_materialize_grads(False)   # no (N, 2mr) zero gradient for ab in backward
        ctx.save_for_backward(x, query, key, value, ab)
        ctx.name, ctx.m, ctx.r = name, m, r


def _backward(kind, ctx, grad_y):
    """The backward of a fused function: no gradients when y did not reach the loss; the
    plain formula differentiated again when autograd records the backward
    (``create_graph=True``); else the form's rule, ``fast`` when grad_y is a plain tensor
    in plain eager mode."""
    if grad_y is None:
        return (None,) * 7
    saved, needs = ctx.saved_tensors, ctx.needs_input_grad
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        grads = plain_backward(kind, saved, needs, ctx.name, ctx.m, ctx.r, grad_y)
    else:
        grads = BACKWARD[kind](ctx.name, needs, grad_y, *saved, ctx.m, ctx.r, fast_path_applies(grad_y))
    return (*grads, None, None, None)


class GatedFn(_FusedBase):
    """y = (Σ_s σ(a_s) b_s) @ V with [a; b] = (x Qᵀ, x Kᵀ). Saves x and [a; b] only.

    Inputs: x (N, d), query and key (m·r, d), value (m, d_out), all of one dtype; name of a
    registered activation; m; r. Outputs (y (N, d_out), [a; b] (2, N, mr)). Call
    :func:`qkmlp.functional.gated`, which returns y and steps aside where this function
    would be wrong (it refuses to run under ``torch.func`` transforms).
    """

    @staticmethod
    def forward(x, query, key, value, name: str, m: int, r: int):
        return fused_forward("gated", x, query, key, value, name, m, r)

    @staticmethod
    def backward(ctx, grad_y, _grad_ab):
        return _backward("gated", ctx, grad_y)


class SymmetricFn(_FusedBase):
    """y = σ(Σ_s a_s b_s) @ V with [a; b] = (x Qᵀ, x Kᵀ). Saves x and [a; b] only.

    Inputs and outputs as :class:`GatedFn`; call :func:`qkmlp.functional.symmetric`,
    which returns y.
    """

    @staticmethod
    def forward(x, query, key, value, name: str, m: int, r: int):
        return fused_forward("symmetric", x, query, key, value, name, m, r)

    @staticmethod
    def backward(ctx, grad_y, _grad_ab):
        return _backward("symmetric", ctx, grad_y)


FUNCTIONS = {"gated": GatedFn, "symmetric": SymmetricFn}
