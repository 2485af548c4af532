"""Layers whose weights FSDP2's ``fully_shard`` has sharded (private helpers of
:mod:`qkmlp.layers`): what needs the full weights says so and names the fix."""
from __future__ import annotations

import sys
from typing import Optional

from torch import nn


def sharded(layer: nn.Module) -> list[str]:
    """Names of ``layer``'s own parameters that are DTensors (sharded by FSDP2's
    ``fully_shard``). Without torch.distributed.tensor imported there can be none."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None:
        return []
    return [n for n, p in layer.named_parameters(recurse=False) if isinstance(p, dtensor.DTensor)]


def need_full_weights(layer: nn.Module, what: str, cause: Optional[BaseException] = None) -> None:
    """RuntimeError naming the fix when ``layer``'s parameters are FSDP2 shards."""
    names = sharded(layer)
    if names:
        raise RuntimeError(
            f"{what} needs the full weights, but {', '.join(names)} are shards (DTensors) of FSDP2's "
            f"fully_shard; unshard first (.unshard() on the fully_shard-ed module that holds this "
            f"layer, .reshard() after) or gather a full state dict (torch.distributed.checkpoint."
            f"state_dict.get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))) "
            f"and load it into an unsharded copy"
        ) from cause
