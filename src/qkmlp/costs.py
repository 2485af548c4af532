"""Parameter counts of any module, and forward FLOP counts of the five layer classes of
:data:`LAYER_TYPES` from their sizes (both work on the meta device). ``SymmetrizedGatedMLP``
has a parameter count but no FLOP count here: :func:`flops_per_token` refuses it.

FLOPs count a multiply-add as 2 and ignore the activation's elementwise cost.
"""
from __future__ import annotations

from torch import nn

from .layers import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
)

__all__ = ["parameter_count", "flops_per_token", "LAYER_TYPES", "require_layer"]

#: The layer classes every count (and every symmetry measurement) is defined for.
LAYER_TYPES = (KeyValueMLP, StaticQueryMLP, BilinearAttentionMLP, SymmetricBilinearMLP, GatedMLP)


def require_layer(layer) -> None:
    """TypeError naming the expected classes unless ``layer`` is one of :data:`LAYER_TYPES`."""
    if not isinstance(layer, LAYER_TYPES):
        names = ", ".join(t.__name__ for t in LAYER_TYPES)
        raise TypeError(f"expected one of the qkmlp layers ({names}); got {type(layer).__name__}")


def parameter_count(layer: nn.Module) -> int:
    """Number of scalar parameters; a Parameter shared between submodules (tied weights) is
    counted once. Sharing is by Parameter object: two Parameters viewing one storage count twice."""
    seen, total = set(), 0
    for p in layer.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def flops_per_token(layer: nn.Module) -> int:
    """Forward FLOPs for one token, as the layer computes it.

    KeyValueMLP: 2dm + 2m·d_out. StaticQueryMLP: 2d² + 2dm + 2m·d_out.
    BilinearAttentionMLP: 2md² + 2md + 2m·d_out (x·A_j, then ·xᵀ).
    Symmetric / Gated rank r: 4mrd (two projections) + 2mr (product and rank sum)
    + 2m·d_out.
    """
    if not isinstance(layer, LAYER_TYPES):
        raise TypeError(
            "flops_per_token is defined for KeyValueMLP, StaticQueryMLP, BilinearAttentionMLP, "
            f"SymmetricBilinearMLP and GatedMLP; got {type(layer).__name__}"
        )
    d, m, o = layer.d_model, layer.d_hidden, layer.d_out
    if isinstance(layer, KeyValueMLP):
        return 2 * d * m + 2 * m * o
    if isinstance(layer, StaticQueryMLP):
        return 2 * d * d + 2 * d * m + 2 * m * o
    if isinstance(layer, BilinearAttentionMLP):
        return 2 * m * d * d + 2 * m * d + 2 * m * o
    r = layer.rank
    return 4 * m * r * d + 2 * m * r + 2 * m * o
