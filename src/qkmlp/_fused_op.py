"""The fused forward as an opaque ``torch.library`` custom op, for ``torch.compile`` with a
gradient wanted (private; :func:`qkmlp.functional.gated` and ``symmetric`` call it).

Traced by AOTAutograd, :class:`~qkmlp.functional.GatedFn` and
:class:`~qkmlp.functional.SymmetricFn` would become ordinary graph ops, and the compiler's
partitioner (inductor's min-cut) would decide afresh what to keep for backward: d + 3m
numbers per token for every layer, the fused layers' saving halved. Selective activation
checkpointing only marks ops of that traced graph to save or recompute; σ(a) and h would
still exist in the forward graph for the partitioner to weigh. Instead the forward is one
custom op returning (y, [a; b]): σ(a) and h never appear in the forward graph, so the
backward can only recompute them from what the op returns, and the cheapest cut is x and
[a; b], what eager saves (tests/test_compile.py reads the saved set off the partitioned
graph). The op runs the eager fused forward (in place on its own buffers), so a
half-precision rank-1 gated layer keeps the Llama MLP's output bit for bit. Its backward
is the eager rule (:func:`qkmlp._fused.gated_backward`, ``symmetric_backward``) without
``out=``, in differentiable torch ops, traced, so the compiler fuses its elementwise middle
as it does the Llama MLP's. (An opaque backward op, commit 3402ce9, saved the same; its
three stored runs are in chapter 10.) Double backward through a compiled layer:
AOTAutograd raises.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from . import _fused

_HERE = Path(__file__).parent


def source_tag() -> str:
    """8 hex digits of a hash of the fused path's and the activations' source. torch's
    compile caches (AOTAutograd's, on disk) key a custom op by its name and the graph's
    constant arguments, not by its autograd formula: with nothing but a fixed name, a
    cached compiled backward would outlive a change to the backward rules. Every call of
    the op passes this tag as its last argument, so the cache key changes with the source
    while the op's name stays :data:`FUSED_OP_NAME`."""
    h = hashlib.sha256()
    try:
        for name in ("functional.py", "_fused.py", "_fused_op.py", "activations.py"):
            h.update((_HERE / name).read_bytes())
    except OSError:                         # no source files (a frozen install)
        h.update(repr(sorted(_fused.FUSED_ACTIVATIONS)).encode())
    return h.hexdigest()[:8]


#: The version of the custom op's semantics (its arguments, outputs, forward and backward
#: formulas): bumped when any of them changes, never for an edit that computes the same.
FUSED_OP_VERSION = 1
#: The custom op's name, ``qkmlp::fused_forward_v<FUSED_OP_VERSION>``, stable across source
#: edits (compile caches see the source through its ``tag`` argument). Only torch.compile
#: with a gradient wanted calls it (an exported program holds ATen ops only).
FUSED_OP_NAME = f"qkmlp::fused_forward_v{FUSED_OP_VERSION}"
SOURCE_TAG = source_tag()


@torch.library.custom_op(FUSED_OP_NAME, mutates_args=())
def op_forward(x: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               kind: str, name: str, m: int, r: int, tag: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(y, [a; b]) of the fused ``kind`` ("gated" or "symmetric") layer: GatedFn.forward.
    ``tag`` (the source hash, :func:`source_tag`) does not enter the computation: it keys
    torch's compile caches to the source."""
    with torch.no_grad():
        return _fused.fused_forward(kind, x, query, key, value, name, m, r)


@op_forward.register_fake
def _(x, query, key, value, kind, name, m, r, tag=""):
    n = x.shape[0]
    return x.new_empty(n, value.shape[1]), x.new_empty(2, n, query.shape[0])


def _setup_context(ctx, inputs, output):
    x, query, key, value, kind, name, m, r, _tag = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, query, key, value, output[1])
    ctx.kind, ctx.name, ctx.m, ctx.r = kind, name, m, r


def _backward(ctx, grad_y, _grad_ab):
    saved, needs = ctx.saved_tensors, ctx.needs_input_grad
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # create_graph=True on the op called in eager mode: [a; b] carries no graph of its
        # own, so differentiate the plain formula, as GatedFn does
        grads = _fused.plain_backward(ctx.kind, saved, needs, ctx.name, ctx.m, ctx.r, grad_y)
    else:
        grads = _fused.BACKWARD[ctx.kind](ctx.name, needs, grad_y, *saved, ctx.m, ctx.r, False)
    return (*grads, None, None, None, None, None)


op_forward.register_autograd(_backward, setup_context=_setup_context)
