"""The rank-r layers' formulas, and the one place that chooses how to compute them.

For a batch x (N, d), query and key weights Q, K of shape (m·r, d) (row j·r + s holds
:math:`q_{j,s}`, :math:`k_{j,s}`: ``nn.Linear``'s layout) and values V (m, d_out), with
a = x Qᵀ and b = x Kᵀ viewed as (N, m, r)::

    gated          y = (Σ_s σ(a_s) b_s) V                      gated_reference
    symmetric      y = σ(Σ_s a_s b_s) V                        symmetric_reference
    symmetrised    y = (Σ_s ½[σ(a_s) b_s + σ(b_s) a_s]) V      symmetrized_reference

The ``*_reference`` functions below are those formulas in plain torch ops. :func:`gated`
and :func:`symmetric` compute the same with the fused path (``qkmlp._fused``): two
GEMMs, the elementwise middle fused, and only x and the pre-activations [a; b] saved for
backward, σ(a) and h recomputed there (as Liger-Kernel does for SwiGLU, Hsu et al., 2024):
d + 2mr numbers per token against a three-``nn.Linear`` Llama MLP's d + 4m. The middle
runs in the input dtype with a Llama MLP's op sequence (σ(a) rounded to the dtype, then
the product), so in bfloat16 and float16 the rank-1 gated layer computes bit for bit what
``down(silu(gate(x)) * up(x))`` computes; σ' is PyTorch's own fused backward kernel for
every registered activation (:data:`FUSED_ACTIVATIONS`).

**Which path runs** (``_run``, the one place that chooses):

- a callable σ that is not a registered activation: the plain formula;
- a ``torch.func`` transform (``grad``, ``vjp``, ``jacrev``, ``jacfwd``, ``hessian``,
  ``vmap``, ``jvp``) or a forward-mode AD level (``gradcheck(check_forward_ad=True)``):
  the plain formula, which every torch API differentiates to every order;
- ``torch.export``: the plain formula, so an exported program holds ATen ops only,
  computes bit for bit what eager computes in float32 and float64, and loads
  (``torch.export.load``) with torch alone;
- ``torch.compile`` with a gradient wanted: the custom op :data:`FUSED_OP_NAME`
  (``qkmlp._fused_op``), so the compiled layer saves what eager saves; inference is the
  fused forward traced out of place. ``create_graph=True`` through a compiled layer raises
  (AOTAutograd has no double backward);
- ``torch.jit.trace``, a tensor subclass or a batched tensor: the plain formula (a trace
  then records the same ops in every grad mode);
- plain eager mode: :class:`GatedFn` / :class:`SymmetricFn` when a gradient is wanted, the
  fused forward in place on its own buffers when not. A backward recorded by autograd
  (``create_graph=True``) differentiates the plain formula again; a backward over batched
  gradients (``is_grads_batched=True``) runs the hand-written rule out of place.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import _fused, _fused_op
from ._checks import rank_r_args
from ._fused import GatedFn, SymmetricFn, activation_backward, fast_path_applies, supports_fused
from .activations import ACTIVATIONS, get_activation, without_overwrite

#: The activation names with a fused path: every registered one of :mod:`qkmlp.activations`.
FUSED_ACTIVATIONS: tuple[str, ...] = _fused.FUSED_ACTIVATIONS
#: The version of the custom op's semantics (its arguments, outputs, forward and backward
#: formulas): bumped when any of them changes, never for an edit that computes the same.
FUSED_OP_VERSION: int = _fused_op.FUSED_OP_VERSION
#: The custom op's name, ``qkmlp::fused_forward_v<FUSED_OP_VERSION>``, stable across source
#: edits (compile caches see the source through its ``tag`` argument). Only torch.compile
#: with a gradient wanted calls it (an exported program holds ATen ops only).
FUSED_OP_NAME: str = _fused_op.FUSED_OP_NAME

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


# --- the formulas, in plain torch ------------------------------------------------------

def _a_b(x, query, key, m: int, r: int):
    """a = x Qᵀ and b = x Kᵀ, each (N, m, r): halves of one stacked (2, N, m, r) tensor, the
    layout of the fused path's [a; b] (under ``vmap`` the layout decides which kernels run,
    so this keeps torch.func's results those of the fused path's own layout)."""
    ab = torch.stack([x @ query.T, x @ key.T]).reshape(2, -1, m, r)
    return ab[0], ab[1]


def gated_reference(x, query, key, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Gated rank-r MLP: y = (Σ_s σ(a_s) b_s) V. At rank 1 SwiGLU, ``down(σ(gate(x)) * up(x))``."""
    a, b = _a_b(x, query, key, m, r)
    return (activation(a) * b).sum(-1) @ value


def symmetric_reference(x, query, key, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Symmetric rank-r bilinear MLP: y = σ(Σ_s a_s b_s) V."""
    a, b = _a_b(x, query, key, m, r)
    return activation((a * b).sum(-1)) @ value


def symmetrized_reference(x, query, key, value, activation: Callable, m: int, r: int) -> torch.Tensor:
    """Symmetrised gated MLP: y = (Σ_s ½[σ(a_s) b_s + σ(b_s) a_s]) V (an in-place σ runs
    on a copy: a and b are read again after it)."""
    a, b = _a_b(x, query, key, m, r)
    act = without_overwrite(activation)
    return (0.5 * (act(a) * b + act(b) * a).sum(-1)) @ value


_fused.PLAIN_FORMULAS.update(gated=gated_reference, symmetric=symmetric_reference)


# --- the fused forms, and the choice of path ----------------------------------------------

def gated(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, activation) -> torch.Tensor:
    """Fused gated rank-r MLP on a 2-D batch: x (N, d), query and key (m·r, d), value
    (m, d_out) -> (N, d_out), equal to :func:`gated_reference`. ``activation`` is anything
    a layer's ``activation=`` takes and is fused as there: a registered name or alias, an
    :class:`~qkmlp.activations.Activation`, or a callable (``F.silu`` is the registered silu;
    any other callable runs :func:`gated_reference`). See :class:`GatedFn`."""
    return _run("gated", x, query, key, value, activation)


def symmetric(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, activation) -> torch.Tensor:
    """Fused symmetric rank-r MLP on a 2-D batch, arguments as :func:`gated`, equal to
    :func:`symmetric_reference`. See :class:`SymmetricFn`."""
    return _run("symmetric", x, query, key, value, activation)


_PLAIN = {"gated": gated_reference, "symmetric": symmetric_reference}


def _run(kind: str, x, query, key, value, activation) -> torch.Tensor:
    """y of the fused form ``kind``: the plain formula, the custom op, the autograd function
    or the in-place forward, as the module docstring lists."""
    m, r = rank_r_args(x, query, key, value)
    act = get_activation(activation)
    if not supports_fused(act):                  # a callable with no known derivative
        return _PLAIN[kind](x, query, key, value, act, m, r)
    name, act = act.name, ACTIVATIONS[act.name]
    if not _fused.transform_free() or _fused.exporting():
        return _PLAIN[kind](x, query, key, value, act, m, r)       # torch.func, forward AD, export
    wants_grad = _fused.wants_grad(x, query, key, value)
    if torch.compiler.is_compiling():
        if wants_grad:       # one opaque op: the compiler's partitioner cannot change what it saves
            return _fused_op.op_forward(x, query, key, value, kind, name, m, r, _fused_op.SOURCE_TAG)[0]
        # inference: traced out of place (functionalising in-place ops on views would
        # write whole buffers back), so the compiler may fuse the middle itself
        return _fused.fused_forward(kind, x, query, key, value, name, m, r)[0]
    if not fast_path_applies(x, query, key, value):                 # jit.trace, subclasses
        return _PLAIN[kind](x, query, key, value, act, m, r)
    if wants_grad:
        return _fused.FUNCTIONS[kind].apply(x, query, key, value, name, m, r)[0]
    return _fused.fused_forward(kind, x, query, key, value, name, m, r, scratch=True)[0]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which :class:`~qkmlp.KeyValueMLP`, :class:`~qkmlp.StaticQueryMLP` and
    :class:`~qkmlp.BilinearAttentionMLP` apply σ: float32 for float16/bfloat16, else ``dtype``.
    (The rank-r layers' fused middle runs in the input dtype itself.)"""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
