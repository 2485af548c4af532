"""Swap a Llama-style model's MLPs for qkmlp layers, and build the chapter's interventions.

A decoder layer of a ``transformers`` Llama model has ``.mlp``, a ``LlamaMLP`` computing
``down(σ(gate(x)) * up(x))``: a rank-1 :class:`~qkmlp.GatedMLP` with query = gate,
key = up, value = downᵀ. :func:`gated_mlps` converts every one (copies of the weights);
:func:`replace_mlps` puts any modules in their place, in the model, and returns the
ones it took out, so that :func:`mlps_replaced` can put them back.

:func:`variant` turns one converted layer into the layers the chapter compares with it
(each maps (..., d) to (..., d), with the same weights unless said otherwise):

=========== ===================================================================
kind        per hidden unit j, with a = x·q_j and b = x·k_j
=========== ===================================================================
gated       σ(a)·b (the layer itself)
none        0 (the MLP removed: the scale of every other change)
swap        σ(b)·a (query and key exchanged)
rescale     σ(αa)·b/α (inverse scaling by ``alpha``; α < 0 allowed)
identity    a·b (σ replaced by the identity: the bilinear layer)
linear      σ'(0)·a·b (σ replaced by its tangent at 0: a·b/2 for SiLU)
symmetrized ½[σ(a)·b + σ(b)·a] (:class:`~qkmlp.SymmetrizedGatedMLP`)
symmetric   σ(a·b) (:class:`~qkmlp.SymmetricBilinearMLP`, σ outside the product)
=========== ===================================================================
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Mapping, Optional

import torch
from torch import nn

from .. import symmetry
from ..activations import get_activation
from ..layers import GatedMLP, SymmetricBilinearMLP, SymmetrizedGatedMLP

__all__ = ["VARIANTS", "NoMLP", "decoder_layers", "gated_mlps", "replace_mlps", "mlps_replaced",
           "use_gated_mlps", "tangent_slope", "variant",
           "Q4_BLOCK", "q4_steps", "with_q4_noise"]

#: The kinds :func:`variant` builds, in the order the chapter shows them.
VARIANTS = ("gated", "none", "swap", "rescale", "identity", "linear", "symmetrized", "symmetric")


class NoMLP(nn.Module):
    """The MLP removed: returns zeros of the input's shape, (..., d) -> (..., d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def decoder_layers(model) -> nn.ModuleList:
    """The decoder layers of a Llama-style ``transformers`` model (``model.model.layers``),
    each of which must have an ``mlp`` with ``gate_proj``, ``up_proj`` and ``down_proj``."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise TypeError("expected a Llama-style transformers model with decoder layers at "
                        f"model.model.layers; got {type(model).__name__}")
    return layers


def _hidden_act(model) -> str:
    act = getattr(getattr(model, "config", None), "hidden_act", None)
    if not isinstance(act, str):
        raise ValueError("model.config.hidden_act is missing: pass activation= explicitly")
    return get_activation(act).name


def gated_mlps(model, *, activation: Optional[str] = None) -> list[GatedMLP]:
    """One :class:`~qkmlp.GatedMLP` per decoder layer, converted from its MLP with
    :meth:`GatedMLP.from_linear` (copies; the model is not changed).

    ``activation`` defaults to ``model.config.hidden_act`` (``silu`` for SmolLM2).
    A layer whose MLP is not a gate/up/down MLP raises ``TypeError``.
    """
    act = activation if activation is not None else _hidden_act(model)
    out = []
    for i, layer in enumerate(decoder_layers(model)):
        mlp = layer.mlp
        if not all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            raise TypeError(f"layer {i}: mlp is a {type(mlp).__name__}, not a gate_proj/up_proj/down_proj MLP")
        g = GatedMLP.from_linear(mlp.gate_proj, mlp.up_proj, mlp.down_proj, activation=act)
        out.append(g.eval().requires_grad_(False))
    return out


def replace_mlps(model, mlps: Mapping[int, nn.Module]) -> dict[int, nn.Module]:
    """Set ``model.model.layers[i].mlp = mlps[i]`` for every i given, in place.

    Returns the modules taken out, ``{i: old}``, so ``replace_mlps(model, old)`` undoes it.
    """
    layers = decoder_layers(model)
    for i, m in mlps.items():
        if not isinstance(i, int) or not 0 <= i < len(layers):
            raise IndexError(f"layer index must be an int in [0, {len(layers)}), got {i!r}")
        if not isinstance(m, nn.Module):
            raise TypeError(f"layer {i}: expected an nn.Module, got {type(m).__name__}")
    old = {}
    for i, m in mlps.items():
        old[i] = layers[i].mlp
        layers[i].mlp = m
    return old


@contextmanager
def mlps_replaced(model, mlps: Mapping[int, nn.Module]):
    """Context manager: :func:`replace_mlps` on entry, the old MLPs put back on exit."""
    old = replace_mlps(model, mlps)
    try:
        yield model
    finally:
        replace_mlps(model, old)


def use_gated_mlps(model, *, activation: Optional[str] = None) -> dict[int, nn.Module]:
    """Replace every MLP of ``model`` by its :class:`~qkmlp.GatedMLP`, in place.

    Returns the original MLPs (``replace_mlps(model, returned)`` restores the model).
    """
    return replace_mlps(model, dict(enumerate(gated_mlps(model, activation=activation))))


@torch.no_grad()
def _with_weights(cls, g: GatedMLP, activation, value_scale: float = 1.0):
    new = cls(g.d_model, g.d_hidden, g.d_out, rank=g.rank, activation=activation,
              device=g.value.device, dtype=g.value.dtype)
    new.query.copy_(g.query)
    new.key.copy_(g.key)
    new.value.copy_(g.value * value_scale)
    return new.eval().requires_grad_(False)


def tangent_slope(activation) -> float:
    """σ'(0), for σ with σ(0) = 0 (then σ(z) ≈ σ'(0)·z near 0), by autograd in float64."""
    act = get_activation(activation)
    with torch.enable_grad():
        z = torch.zeros((), dtype=torch.float64, requires_grad=True)
        y = act(z)
        if y.item() != 0.0:
            raise ValueError(f"the tangent at 0 of {act.name} is not linear: σ(0) = {y.item()} ≠ 0")
        (slope,) = torch.autograd.grad(y, z)
    return float(slope)


def variant(g: GatedMLP, kind: str, alpha: Optional[float] = None) -> nn.Module:
    """The layer of ``kind`` (see :data:`VARIANTS` and the module's table) built from
    ``g``'s weights; ``alpha`` is required for ``rescale`` and refused otherwise.
    ``g`` is left untouched ("gated" returns ``g`` itself)."""
    if not isinstance(g, GatedMLP):
        raise TypeError(f"variant needs a GatedMLP, got {type(g).__name__}")
    if kind not in VARIANTS:
        raise ValueError(f"unknown variant {kind!r}; expected one of {', '.join(VARIANTS)}")
    if (alpha is not None) != (kind == "rescale"):
        raise ValueError("alpha is required for kind='rescale' and only for it")
    if kind == "gated":
        return g
    if kind == "none":
        return NoMLP()
    if kind == "swap":
        return symmetry.swapped(g).eval().requires_grad_(False)
    if kind == "rescale":
        return symmetry.rescaled(g, alpha).eval().requires_grad_(False)
    if kind == "identity":
        return _with_weights(GatedMLP, g, "identity")
    if kind == "linear":
        return _with_weights(GatedMLP, g, "identity", tangent_slope(g.activation))
    if kind == "symmetrized":
        return _with_weights(SymmetrizedGatedMLP, g, g.activation)
    return _with_weights(SymmetricBilinearMLP, g, g.activation)


#: Block length of the Q4_1 format: 32 consecutive weights of a stored row share one
#: step d and offset (``ggml``'s ``QK4_1``).
Q4_BLOCK = 32


def q4_steps(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of :data:`Q4_BLOCK` along the last dimension of ``weight`` (as stored in
    the ``.gguf``: a row of an ``nn.Linear`` weight): the Q4_1 step d = (max − min)/15
    and the number of distinct values. Two tensors of shape (rows, cols // 32).

    A Q4_1 block holds min + d·i with i ∈ {0, …, 15}: at most 16 distinct values.
    """
    rows, cols = weight.shape
    if cols % Q4_BLOCK:
        raise ValueError(f"the last dimension ({cols}) is not a multiple of {Q4_BLOCK}")
    blocks = weight.detach().reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15
    srt = blocks.sort(-1).values
    distinct = 1 + (srt[..., 1:] != srt[..., :-1]).sum(-1)
    return step, distinct


@torch.no_grad()
def with_q4_noise(g: GatedMLP, generator: Optional[torch.Generator] = None) -> GatedMLP:
    """A copy of ``g`` with every weight moved by uniform noise in [−d/2, d/2], d the
    Q4_1 step of its block: one more rounding error of the size the 4-bit file already
    carries. Blocks run along the stored rows: gate and up rows (over d), down rows
    (over m, i.e. along ``value``'s first dimension)."""
    if not isinstance(g, GatedMLP) or g.rank != 1:
        raise TypeError("with_q4_noise needs a rank-1 GatedMLP")
    out = _with_weights(GatedMLP, g, g.activation)

    def noisy(w):                                # w as stored: (rows, cols), blocks along cols
        step, _ = q4_steps(w)
        u = torch.rand(w.shape, generator=generator, dtype=torch.float64) - 0.5
        return w + (u * step.double().repeat_interleave(Q4_BLOCK, dim=1)).to(w.dtype)

    out.query.copy_(noisy(g.query[:, 0]).unsqueeze(1))
    out.key.copy_(noisy(g.key[:, 0]).unsqueeze(1))
    out.value.copy_(noisy(g.value.T).T)
    return out
