"""``layer.query`` and ``layer.key`` of the rank-r layers: (m, r, d) views of the
parameters ``query_weight`` and ``key_weight`` (m·r, d) (private helpers of :mod:`qkmlp.layers`)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from ._sharding import need_full_weights


def view(layer, name: str) -> torch.Tensor:
    """``layer.<name>_weight`` viewed as (m, r, d)."""
    w = getattr(layer, name + "_weight")
    try:
        return w.view(layer.d_hidden, layer.rank, layer.d_model)
    except RuntimeError as e:        # an unevenly sharded DTensor cannot be unflattened
        need_full_weights(layer, f"layer.{name}", e)
        raise


@torch.no_grad()
def assign(layer, name: str, t) -> None:
    """``layer.query = t`` copies t's values into the parameter behind the view."""
    target = view(layer, name)
    if isinstance(t, nn.Parameter):
        raise TypeError(
            f"layer.{name} is a view of the parameter {name}_weight; assign "
            f"layer.{name} = tensor to copy values in, or replace the parameter itself "
            f"(layer.{name}_weight = nn.Parameter(...), shape {tuple(getattr(layer, name + '_weight').shape)})"
        )
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"layer.{name} takes a tensor of shape {tuple(target.shape)}, got {type(t).__name__}")
    if t.shape != target.shape:
        raise ValueError(f"layer.{name} has shape {tuple(target.shape)}, got a tensor of shape {tuple(t.shape)}")
    if (t.dtype, t.device) != (target.dtype, target.device):
        raise TypeError(f"layer.{name} is {target.dtype} on {target.device}, got {t.dtype} on {t.device}; "
                        f"convert first (nothing is cast silently)")
    if parametrize.is_parametrized(layer, name + "_weight"):
        # Under torch.nn.utils.parametrize (weight_norm, spectral_norm, orthogonal, a custom
        # one) the view is a view of a freshly computed tensor: a copy into it would be
        # lost. Assign the parameter instead, which runs right_inverse as nn.Linear's
        # ``lin.weight = t`` does under the same parametrization.
        setattr(layer, name + "_weight", t.reshape(layer.d_hidden * layer.rank, layer.d_model))
        return
    target.copy_(t)
