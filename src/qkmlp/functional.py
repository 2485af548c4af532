"""Fast paths of the factored layers: two GEMMs, a fused elementwise middle, lean memory.

Both factored forms compute, for a batch x of shape (N, d)::

    a, b = x @ Qᵀ, x @ Kᵀ          W_qk = [Q; K] packed as (2·m·r, d); [a; b] is one
                                   (2, N, mr) buffer, a and b viewed as (N, m, r)
    h = Σ_s σ(a_s) b_s             gated        (N, m)
    h = σ(Σ_s a_s b_s)             symmetric    (N, m)
    y = h @ V                      one GEMM, V is (m, d_out)

The autograd functions :class:`GatedFn` and :class:`SymmetricFn` save only x, the
pre-activations ``ab`` and the weights for backward, and recompute σ(a) (or σ(p)) and h
there, as Liger-Kernel does for SwiGLU (Hsu et al., 2024). A Llama-style MLP written with
three ``nn.Linear`` saves x, gate(x), σ(gate(x)), up(x) and the product: d + 4m numbers per
token against d + 2mr here.

For float16 and bfloat16 the GEMMs run in the input dtype and the elementwise math in
float32 (``compute_dtype``). The activation's derivative is PyTorch's own fused backward
kernel (``silu_backward``, ``gelu_backward``, ...) for every registered activation
(``FUSED_ACTIVATIONS``); a layer with any other callable uses the
plain autograd path (:func:`gated_reference`, :func:`symmetric_reference`), which is also
what the tests compare against. With :mod:`qkmlp.cpu_kernels` enabled, the rank-1
elementwise middle on CPU runs as one fused C++ pass instead (forward and backward; the
choice is made at forward time and recorded on ``ctx``).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from . import cpu_kernels
from .activations import ACTIVATIONS, Activation

__all__ = [
    "FUSED_ACTIVATIONS",
    "compute_dtype",
    "activation_backward",
    "supports_fused",
    "gated",
    "symmetric",
    "gated_reference",
    "symmetric_reference",
    "symmetrized_reference",
    "GatedFn",
    "SymmetricFn",
    "GatedJvpFn",
    "SymmetricJvpFn",
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
    "softplus": lambda grad, z, s: _aten.softplus_backward(grad, z, 1, 20),
    "relu2": _relu2_backward,
}

def _relu2_backward_into(grad, z, s, out):
    return out.mul_(2.0 * F.relu(z))


# The same, written into ``out`` (which may alias ``grad``): eager mode only, since
# Dynamo does not trace ``out=`` into non-contiguous views.
_BACKWARD_INTO: dict[str, Callable] = {
    "identity": lambda grad, z, s, out: out if out is grad else out.copy_(grad),
    "relu": lambda grad, z, s, out: _aten.threshold_backward.grad_input(grad, z, 0, grad_input=out),
    "leaky_relu": lambda grad, z, s, out: _aten.leaky_relu_backward.grad_input(grad, z, 0.01, False, grad_input=out),
    "gelu": lambda grad, z, s, out: _aten.gelu_backward.grad_input(grad, z, approximate="none", grad_input=out),
    "gelu_tanh": lambda grad, z, s, out: _aten.gelu_backward.grad_input(grad, z, approximate="tanh", grad_input=out),
    "silu": lambda grad, z, s, out: _aten.silu_backward.grad_input(grad, z, grad_input=out),
    "tanh": lambda grad, z, s, out: _aten.tanh_backward.grad_input(grad, s, grad_input=out),
    "sigmoid": lambda grad, z, s, out: _aten.sigmoid_backward.grad_input(grad, s, grad_input=out),
    "softplus": lambda grad, z, s, out: _aten.softplus_backward.grad_input(grad, z, 1, 20, grad_input=out),
    "relu2": _relu2_backward_into,
}

#: The activation names with a fused path: every registered one of :mod:`qkmlp.activations`.
FUSED_ACTIVATIONS: tuple[str, ...] = tuple(_BACKWARD)


def supports_fused(activation: Activation) -> bool:
    """Whether ``activation`` is a registered one (the same object), so its derivative is known."""
    return ACTIVATIONS.get(activation.name) is activation and activation.name in _BACKWARD


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
    """The dtype of the elementwise math: float32 for float16/bfloat16, else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _out_ok(*ts) -> bool:
    """Whether ``out=`` into views of a fresh buffer is allowed: eager, and nothing here is
    recorded by autograd (grad mode off, as in a Function's forward, or no input needs it)."""
    return _eager() and (not torch.is_grad_enabled() or not any(t.requires_grad for t in ts))


def _project(x: torch.Tensor, w_qk: torch.Tensor) -> torch.Tensor:
    """[a; b] = (x·Qᵀ, x·Kᵀ) as one (2, N, mr) tensor, W_qk = [Q; K] of shape (2mr, d).

    Two GEMMs, each writing one contiguous half. On this CPU they beat one GEMM into an
    (N, 2mr) block, whose halves are row-strided for everything that follows (about 1 %
    of a forward + backward step at d = 512, m = 1376, N = 2048), and torch.matmul with a
    batch of two (bmm), which was 10 % slower there.
    """
    mr = w_qk.shape[0] // 2
    q, k = w_qk[:mr], w_qk[mr:]
    if not _out_ok(x, w_qk):
        return torch.stack([x @ q.T, x @ k.T])
    ab = torch.empty(2, x.shape[0], mr, dtype=x.dtype, device=x.device)
    torch.mm(x, q.T, out=ab[0])
    torch.mm(x, k.T, out=ab[1])
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


def _kernel(name: str, r: int, *ts: torch.Tensor) -> bool:
    """Whether the opt-in C++ kernels (:mod:`qkmlp.cpu_kernels`) take this elementwise middle."""
    return r == 1 and cpu_kernels.applies(name, *ts) and _eager()


def _gated_hidden(name: str, ab: torch.Tensor, m: int, r: int, cdt, *, scratch: bool) -> torch.Tensor:
    """h = Σ_s σ(a_s) b_s, (N, m); overwrites ab when ``scratch`` (inference)."""
    if _kernel(name, r, ab):
        return cpu_kernels.gated_forward(ab[0], ab[1], name, out=ab[0] if scratch else None)
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
    if _kernel(name, r, ab):
        return cpu_kernels.symmetric_forward(ab[0], ab[1], name, out=ab[0] if scratch else None)
    a, b = _split(ab, m, r, cdt, upcast_b=False)
    if r == 1:
        p = a.mul_(b) if (scratch or ab.dtype != cdt) else a * b
        p = p.squeeze(-1)
    else:
        p = (a * b).sum(-1)
    return _act_into(name, p)


def _weight_grads(ctx, gab, x, w_qk, h, grad_y, value):
    """The backward GEMMs: dV = hᵀ·dy, dW_qk = [daᵀ·x; dbᵀ·x], dx = da·Q + db·K.

    ``gab`` is d[a; b] of shape (2, N, mr); dx accumulates its second GEMM in place
    (no separate sum of two (N, d) halves)."""
    mr = gab.shape[-1]
    grad_x = grad_w = grad_v = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.mm(gab[0], w_qk[:mr])
        # in place in eager mode; functorch has no batching rule for addmm_
        grad_x = grad_x.addmm_(gab[1], w_qk[mr:]) if _eager() else torch.addmm(grad_x, gab[1], w_qk[mr:])
    if ctx.needs_input_grad[1]:
        if _out_ok(gab, x):
            grad_w = torch.empty_like(w_qk)
            torch.mm(gab[0].T, x, out=grad_w[:mr])
            torch.mm(gab[1].T, x, out=grad_w[mr:])
        else:
            grad_w = torch.cat([gab[0].T @ x, gab[1].T @ x])
    if ctx.needs_input_grad[2]:
        grad_v = h.T @ grad_y
    return grad_x, grad_w, grad_v


def _tangent_ab(x, w_qk, dx, dw):
    """d[a; b] (2, N, mr) from the tangents of x and W_qk (either may be None)."""
    parts = []
    if dx is not None:
        parts.append(_project(dx, w_qk))
    if dw is not None:
        parts.append(_project(x, dw))
    return sum(parts[1:], parts[0]) if parts else torch.zeros(2, x.shape[0], w_qk.shape[0] // 2, dtype=x.dtype, device=x.device)


def _eager() -> bool:
    """Plain eager autograd: not compiling, and no torch.func transform active."""
    if torch.compiler.is_compiling():
        return False
    active = getattr(torch._C, "_are_functorch_transforms_active", None)   # private: be conservative
    return active is not None and not active()


def _records_backward() -> bool:
    """Whether autograd is recording this backward (``create_graph=True``) in eager mode."""
    return torch.is_grad_enabled() and _eager()


def _grad_buffer(n: int, m: int, r: int, like: torch.Tensor):
    """A (2, N, mr) buffer for d[a; b] and its two halves viewed as (N, m, r)."""
    gab = torch.empty(2, n, m * r, dtype=like.dtype, device=like.device)
    return gab, gab[0].view(n, m, r), gab[1].view(n, m, r)


def _plain_backward(ctx, reference, grad_y):
    """Backward by differentiating the plain formula again (recomputes the forward).

    Used when autograd records the backward itself (``create_graph=True``, double
    backward): the gradients then depend on x, W_qk and V through ordinary autograd ops.
    """
    x, w_qk, value, _ = ctx.saved_tensors
    with torch.enable_grad():
        y = reference(x, w_qk, value, ACTIVATIONS[ctx.name], ctx.m, ctx.r)
        wanted = [t for t, need in zip((x, w_qk, value), ctx.needs_input_grad[:3]) if need]
        grads = iter(torch.autograd.grad(y, wanted, grad_y, create_graph=True, allow_unused=True))
    return (*(next(grads) if need else None for need in ctx.needs_input_grad[:3]), None, None, None)


_NO_GRADS = (None,) * 6   # backward's answer when y did not reach the loss


def _fused_forward(hidden, x, w_qk, value, name, m, r, scratch=False):
    """(y, [a; b]) with [a; b] (2, N, mr) from :func:`_project` and y = hidden([a; b])·V:
    both fused forwards.

    ``hidden`` is :func:`_gated_hidden` or :func:`_symmetric_hidden`; with ``scratch`` it
    may overwrite [a; b] (inference)."""
    ab = _project(x, w_qk)
    h = hidden(name, ab, m, r, compute_dtype(x.dtype), scratch=scratch)
    return h.to(x.dtype) @ value, ab


def _backward_without_fusion(ctx, grad_y, reference):
    """The backward answers that need no fused rule, else None: no gradients when y did not
    reach the loss; the plain formula differentiated again under ``create_graph=True``."""
    if grad_y is None:
        return _NO_GRADS
    if _records_backward():
        return _plain_backward(ctx, reference, grad_y)
    return None


def _kernel_backward(ctx, kernel, grad_y, x, w_qk, value, a, b):
    """The rank-1 backward through a fused C++ kernel: dh = dy·Vᵀ into the b half of d[a; b],
    then one pass writes d[a; b] and h. None when the kernels do not apply."""
    if not (ctx.kernel and a.dtype == grad_y.dtype and _out_ok(grad_y, a, b)):
        return None
    n, m = x.shape[0], ctx.m
    gab, grad_a, grad_b = _grad_buffer(n, m, 1, a)
    torch.mm(grad_y, value.T, out=gab[1])                                # dh
    h = torch.empty(n, m, dtype=a.dtype, device=a.device)
    kernel(a, b, grad_b, grad_a, h, ctx.name)
    return (*_weight_grads(ctx, gab, x, w_qk, h, grad_y, value), None, None, None)


def _backward(ctx, grad_y, reference, kernel, rule):
    """The backward of a fused function: the answers that need no fused rule, else the
    C++ ``kernel`` where it was chosen at forward time, else ``rule`` in PyTorch ops,
    called with ``(ctx, grad_y, *_unpack_saved(ctx))``."""
    done = _backward_without_fusion(ctx, grad_y, reference)
    if done is not None:
        return done
    saved = _unpack_saved(ctx)                  # x, w_qk, value, a, b, m, r, dt, cdt
    done = _kernel_backward(ctx, kernel, grad_y, *saved[:5])
    return done if done is not None else rule(ctx, grad_y, *saved)


def _unpack_saved(ctx):
    """The saved x, W_qk, V and the pre-activations a, b (N, m, r) in the compute dtype,
    with m, r, the input dtype and the compute dtype: what every backward/jvp starts from."""
    x, w_qk, value, ab = ctx.saved_tensors
    m, r, dt = ctx.m, ctx.r, x.dtype
    cdt = compute_dtype(dt)
    a, b = _split(ab, m, r, cdt)
    return x, w_qk, value, a, b, m, r, dt, cdt


class _FusedBase(torch.autograd.Function):
    """Shared plumbing: forward returns (y, ab); ab is saved, not differentiable.

    In the style that ``torch.func`` transforms need (``setup_context``), with an
    automatic vmap rule; the ``*JvpFn`` subclasses add a forward-mode rule.
    """

    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w_qk, value, name, m, r = inputs
        _, ab = output
        ctx.mark_non_differentiable(ab)
        ctx.set_materialize_grads(False)   # no (N, 2mr) zero gradient for ab in backward
        ctx.save_for_backward(x, w_qk, value, ab)
        ctx.save_for_forward(x, w_qk, value, ab)
        ctx.name, ctx.m, ctx.r = name, m, r
        ctx.kernel = _kernel(name, r, x)   # decided at forward time: backward follows it


class GatedFn(_FusedBase):
    """y = (Σ_s σ(a_s) b_s) @ V with [a; b] = x @ W_qkᵀ. Saves x and [a; b] only.

    Inputs: x (N, d), w_qk (2mr, d), value (m, d_out), all of one dtype; name of a
    registered activation; m; r. Outputs (y (N, d_out), [a; b] (2, N, mr)); use
    :func:`gated`, which returns y.
    """

    @staticmethod
    def forward(x, w_qk, value, name: str, m: int, r: int):
        return _fused_forward(_gated_hidden, x, w_qk, value, name, m, r)

    @staticmethod
    def backward(ctx, grad_y, _grad_ab):
        return _backward(ctx, grad_y, gated_reference, cpu_kernels.gated_backward, _gated_backward)


def _gated_backward(ctx, grad_y, x, w_qk, value, a, b, m, r, dt, cdt):
    """GatedFn's backward in PyTorch ops (see :func:`_backward`)."""
    n = x.shape[0]
    s = ACTIVATIONS[ctx.name](a)                            # σ(a), recomputed
    if r == 1 and dt == cdt and _out_ok(grad_y, a, b):
        # Rank 1, no upcast: dh = dy·Vᵀ goes straight into the b half of d[a; b]
        # and everything else happens in place, one fresh (2, N, m) buffer besides σ(a).
        gab, grad_a, grad_b = _grad_buffer(n, m, r, s)
        torch.mm(grad_y, value.T, out=gab[1])                       # dh
        _BACKWARD_INTO[ctx.name](torch.mul(grad_b, b, out=grad_a), a, s, grad_a)
        grad_b.mul_(s)                                           # dh·σ(a)
        h = (s * b if ctx.name == "identity" else s.mul_(b)).squeeze(-1)
        return (*_weight_grads(ctx, gab, x, w_qk, h, grad_y, value), None, None, None)
    grad_h = (grad_y @ value.T).to(cdt).unsqueeze(-1)      # (N, m, 1)
    if not _out_ok(grad_h, a, b):
        grad_b = grad_h * s                                     # d/db of σ(a)·b
        grad_a = activation_backward(ctx.name, grad_h * b, a, s)  # d/da of σ(a)·b
        gab = torch.stack([grad_a.reshape(n, m * r), grad_b.reshape(n, m * r)])
    else:   # the same, written straight into the two halves of d[a; b]
        gab, grad_a, grad_b = _grad_buffer(n, m, r, s)
        torch.mul(grad_h, s, out=grad_b)
        _BACKWARD_INTO[ctx.name](torch.mul(grad_h, b, out=grad_a), a, s, grad_a)
    h = _sum_rank(s * b if ctx.name == "identity" else s.mul_(b)).to(dt)   # h, recomputed
    gab = gab.to(dt)
    gx, gw, gv = _weight_grads(ctx, gab, x, w_qk, h, grad_y, value)
    return gx, gw, gv, None, None, None


class SymmetricFn(_FusedBase):
    """y = σ(Σ_s a_s b_s) @ V with [a; b] = x @ W_qkᵀ. Saves x and [a; b] only.

    Inputs and outputs as :class:`GatedFn`; use :func:`symmetric`, which returns y.
    """

    @staticmethod
    def forward(x, w_qk, value, name: str, m: int, r: int):
        return _fused_forward(_symmetric_hidden, x, w_qk, value, name, m, r)

    @staticmethod
    def backward(ctx, grad_y, _grad_ab):
        return _backward(ctx, grad_y, symmetric_reference, cpu_kernels.symmetric_backward, _symmetric_backward)


def _symmetric_backward(ctx, grad_y, x, w_qk, value, a, b, m, r, dt, cdt):
    """SymmetricFn's backward in PyTorch ops (see :func:`_backward`)."""
    n = x.shape[0]
    if r == 1 and dt == cdt and _out_ok(grad_y, a, b):
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
        h = s.squeeze(-1)
        return (*_weight_grads(ctx, gab, x, w_qk, h, grad_y, value), None, None, None)
    p = _sum_rank(a * b)                                   # score, recomputed (N, m)
    s = ACTIVATIONS[ctx.name](p)                           # h = σ(p), recomputed
    grad_h = (grad_y @ value.T).to(cdt)
    grad_p = activation_backward(ctx.name, grad_h, p, s).unsqueeze(-1)
    if not _out_ok(grad_p, a, b):
        gab = torch.stack([(grad_p * b).reshape(n, m * r), (grad_p * a).reshape(n, m * r)])
    else:   # the same, written straight into the two halves of d[a; b]
        gab, grad_a, grad_b = _grad_buffer(n, m, r, grad_p)
        torch.mul(grad_p, b, out=grad_a)
        torch.mul(grad_p, a, out=grad_b)
    gab = gab.to(dt)
    h = s.to(dt)
    gx, gw, gv = _weight_grads(ctx, gab, x, w_qk, h, grad_y, value)
    return gx, gw, gv, None, None, None


class GatedJvpFn(GatedFn):
    """:class:`GatedFn` with a forward-mode rule, for eager ``torch.func.jvp`` / ``forward_ad``.

    (Dynamo cannot trace an autograd.Function with a custom ``jvp``, so compiled code uses
    :class:`GatedFn`.)
    """

    @staticmethod
    def jvp(ctx, dx, dw, dv, *_):
        x, w_qk, value, a, b, m, r, dt, cdt = _unpack_saved(ctx)
        da, db = _split(_tangent_ab(x, w_qk, dx, dw), m, r, cdt)
        s = ACTIVATIONS[ctx.name](a)
        dh = _sum_rank(activation_backward(ctx.name, da, a, s) * b + s * db).to(dt)
        dy = dh @ value
        if dv is not None:
            dy = dy + _sum_rank(s * b).to(dt) @ dv
        return dy, None


class SymmetricJvpFn(SymmetricFn):
    """:class:`SymmetricFn` with a forward-mode rule (see :class:`GatedJvpFn`)."""

    @staticmethod
    def jvp(ctx, dx, dw, dv, *_):
        x, w_qk, value, a, b, m, r, dt, cdt = _unpack_saved(ctx)
        da, db = _split(_tangent_ab(x, w_qk, dx, dw), m, r, cdt)
        p = _sum_rank(a * b)
        s = ACTIVATIONS[ctx.name](p)
        dy = activation_backward(ctx.name, _sum_rank(da * b + a * db), p, s).to(dt) @ value
        if dv is not None:
            dy = dy + s.to(dt) @ dv
        return dy, None


def _check_args(x, w_qk, value, m, r):
    if x.dim() != 2 or w_qk.dim() != 2 or value.dim() != 2:
        raise ValueError(
            f"expected x (N, d), w_qk (2·m·r, d), value (m, d_out); got {tuple(x.shape)}, "
            f"{tuple(w_qk.shape)}, {tuple(value.shape)}"
        )
    if w_qk.shape != (2 * m * r, x.shape[1]) or value.shape[0] != m:
        raise ValueError(
            f"expected w_qk of shape (2·m·r, d)=({2 * m * r}, {x.shape[1]}) and value with "
            f"m={m} rows; got {tuple(w_qk.shape)} and {tuple(value.shape)}"
        )


def _needs_grad(*ts) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def _apply(fn, jvp_fn, hidden, x, w_qk, value, activation, m, r):
    """y of a fused layer: through the autograd function ``fn`` (``jvp_fn`` in eager mode,
    which adds forward-mode AD) when a gradient is wanted, else straight through."""
    _check_args(x, w_qk, value, m, r)
    compiling = torch.compiler.is_compiling()
    if _needs_grad(x, w_qk, value):
        return (fn if compiling else jvp_fn).apply(x, w_qk, value, activation, m, r)[0]
    # in place on the GEMM's output in eager mode; out of place when compiling, where
    # functionalising the in-place ops on views would write the whole buffer back
    return _fused_forward(hidden, x, w_qk, value, activation, m, r, scratch=not compiling)[0]


def gated(x: torch.Tensor, w_qk: torch.Tensor, value: torch.Tensor, activation: str, m: int, r: int) -> torch.Tensor:
    """Fused gated rank-r MLP on a 2-D batch: (N, d) -> (N, d_out). See :class:`GatedFn`."""
    return _apply(GatedFn, GatedJvpFn, _gated_hidden, x, w_qk, value, activation, m, r)


def symmetric(x: torch.Tensor, w_qk: torch.Tensor, value: torch.Tensor, activation: str, m: int, r: int) -> torch.Tensor:
    """Fused symmetric rank-r MLP on a 2-D batch: (N, d) -> (N, d_out). See :class:`SymmetricFn`."""
    return _apply(SymmetricFn, SymmetricJvpFn, _symmetric_hidden, x, w_qk, value, activation, m, r)


def gated_reference(x, w_qk, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Plain-autograd gated path (any callable σ; elementwise math in float32 for halves)."""
    cdt = compute_dtype(x.dtype)
    a, b = _split(_project(x, w_qk), m, r, cdt)
    return _sum_rank(activation(a) * b).to(x.dtype) @ value


def symmetric_reference(x, w_qk, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Plain-autograd symmetric path (any callable σ; elementwise math in float32 for halves)."""
    cdt = compute_dtype(x.dtype)
    a, b = _split(_project(x, w_qk), m, r, cdt)
    return activation(_sum_rank(a * b)).to(x.dtype) @ value


def symmetrized_reference(x, w_qk, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Plain-autograd symmetrised gated path: Σ_s ½[σ(a_s) b_s + σ(b_s) a_s] per slot
    (any callable σ; elementwise math in float32 for halves)."""
    cdt = compute_dtype(x.dtype)
    a, b = _split(_project(x, w_qk), m, r, cdt)
    return (0.5 * _sum_rank(activation(a) * b + activation(b) * a)).to(x.dtype) @ value
