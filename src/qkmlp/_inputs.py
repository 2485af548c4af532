"""What every layer does to its input before the formula and to the output after it
(private helpers of :mod:`qkmlp.layers`): input checks that name what was expected,
``torch.autocast``'s casts, jagged nested tensors, and an output that is not a view."""
from __future__ import annotations

from typing import Optional

import torch

from . import _interop


def check_input(layer, x) -> None:
    """TypeError or ValueError naming what was expected unless ``x`` is a floating tensor of
    shape (..., d_model) (or a jagged nested tensor of such tokens) on the layer's device,
    in its dtype (or one autocast casts to it)."""
    if isinstance(x, torch.fx.Proxy):
        raise TypeError(_interop.fx_method_message(layer))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor of shape (..., {layer.d_model}), got {type(x).__name__}")
    if x.is_nested and x.layout != torch.jagged:
        raise TypeError(
            f"expected a dense tensor or a jagged nested tensor (layout=torch.jagged), got a nested "
            f"tensor of layout {x.layout}; build it with torch.nested.nested_tensor(seqs, layout=torch.jagged)"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point input (float16, bfloat16, float32 or float64), got {x.dtype}"
        )
    if x.dim() == 0 or x.shape[-1] != layer.d_model:
        raise ValueError(
            f"expected input of shape (..., d_model={layer.d_model}), got {tuple(x.shape)}"
        )
    dtype, device = layer.value.dtype, layer.value.device     # every layer keeps all weights on one of each
    if x.device != device:
        raise ValueError(
            f"input is on {x.device} but the layer's weights are on {device}; move one of them "
            f"(x.to({str(device)!r}) or layer.to({str(x.device)!r}))"
        )
    if x.dtype != dtype:
        check_dtypes_meet(x.dtype, dtype, x.device.type)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype when ``torch.autocast`` is on for ``device_type``, else None."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(x, *weights) cast as autocast casts them for ``nn.Linear``: every floating dtype but
    float64 to the autocast dtype (:func:`check_input` refused float64 mixed with another
    dtype); unchanged outside autocast. The GEMMs and the elementwise middle then run in
    that dtype, as in a Llama MLP."""
    ac = autocast_dtype(x.device.type)
    if ac is None or x.dtype == torch.float64:
        return (x, *weights)
    return tuple(t.to(ac) for t in (x, *weights))


def check_dtypes_meet(x_dtype: torch.dtype, dtype: torch.dtype, device_type: str) -> None:
    """TypeError unless an input of ``x_dtype`` may meet weights of ``dtype`` (they differ).

    Outside autocast they never may. Under ``torch.autocast`` they may when autocast
    casts both to one dtype: in the ops it runs in low precision (``linear``, ``matmul``,
    ``mm``) it casts every floating dtype but float64 to its dtype and leaves float64 alone,
    so float64 meets only float64, as for ``nn.Linear`` (tests/test_autocast.py)."""
    if not dtype.is_floating_point:
        raise TypeError(f"the layer's weights are {dtype}, but the layers are real-valued; convert "
                        f"the layer to a floating dtype (layer.to(torch.float32))")
    ac = autocast_dtype(device_type)
    if ac is None:
        raise TypeError(
            f"input dtype {x_dtype} does not match the layer's dtype {dtype}; convert the input "
            f"(x.to({dtype})) or the layer (layer.to({x_dtype}))"
        )
    if torch.float64 in (x_dtype, dtype):
        raise TypeError(
            f"under torch.autocast({device_type!r}, dtype={ac}) an input of {x_dtype} does not meet "
            f"weights of {dtype}: autocast casts every floating dtype but float64 to {ac} and never "
            f"casts float64 (nn.Linear raises here too); convert the input (x.to({dtype})) or the "
            f"layer (layer.to({x_dtype}))"
        )


def on_jagged(x: torch.Tensor, f):
    """``f`` on the tokens of a jagged nested tensor ``x`` (``x.values()``, every sequence's
    tokens stacked), rewrapped with x's offsets: each sequence gets what ``f`` gives it alone
    (every layer acts on each token by itself). ``f`` may return a tuple."""
    def wrap(v):
        return torch.nested.nested_tensor_from_jagged(
            v, offsets=x.offsets(), lengths=x.lengths(), jagged_dim=x._ragged_idx)
    out = f(x.values())
    return tuple(map(wrap, out)) if isinstance(out, tuple) else wrap(out)


def fresh_reshape(y: torch.Tensor, shape) -> torch.Tensor:
    """y reshaped to ``shape`` as a tensor of its own, not a view (as ``nn.Linear`` returns):
    an in-place op on the output (``y += x``) then needs no view bookkeeping, which FSDP2's
    hooks cannot follow. ``aten._unsafe_view`` is what ``torch.matmul`` itself returns.

    Under ``torch.jit.trace`` the sizes in ``shape`` are traced values, but a call through
    ``torch.ops`` records them as constants: the trace would then reshape every later
    input to the traced shape (or fail). There the reshape is ``Tensor.reshape``, which
    records the sizes as read from the input, followed by a copy (a tensor of its own)."""
    if y.shape == shape:
        return y
    if torch.jit.is_tracing():
        return y.reshape(shape).clone()
    return torch.ops.aten._unsafe_view(y, shape)
