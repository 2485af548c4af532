"""Argument checks shared by the library's modules (clear errors naming what was expected)."""
from __future__ import annotations

import math
import operator
from numbers import Real

import torch


def integer(value, name: str) -> int:
    """``value`` as a Python int if it is an integer (int, numpy or 0-d torch integer; bool
    excluded, as are floats such as 2.0), else TypeError naming ``name``."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def positive_int(value, name: str) -> int:
    """``value`` as an int if it is an integer >= 1 (as :func:`integer` accepts it), else
    ValueError naming ``name``."""
    try:
        v = integer(value, name)
    except TypeError:
        v = None
    if v is None or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return v


def tolerance(value, name: str) -> float:
    """``value`` as a float if it is a finite real number >= 0 (bool and str excluded),
    else ValueError (TypeError for a non-number) naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number >= 0, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def float_tensor(x, name: str = "x") -> torch.Tensor:
    """``x`` if it is a floating-point ``torch.Tensor`` with at least one dimension (shape
    (..., d)), else TypeError (not a tensor, not floating point) or ValueError (a scalar)
    naming ``name``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have shape (..., d), got a scalar")
    return x


#: The dtypes a layer may hold: real floating point.
REAL_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def real_float_dtype(dtype, name: str = "dtype"):
    """``dtype`` if it is None or one of :data:`REAL_FLOAT_DTYPES`, else TypeError naming
    ``name`` (a complex or integer dtype is refused here, not at the first forward)."""
    if dtype is not None and dtype not in REAL_FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a real floating dtype (torch.float16, torch.bfloat16, torch.float32 "
            f"or torch.float64) or None, got {dtype!r}"
        )
    return dtype


def rank_r_args(x, query, key, value) -> tuple[int, int]:
    """(m, r) of the rank-r formulas' arguments x (N, d), query and key (m·r, d), value
    (m, d_out), after checking them: ValueError for shapes, TypeError for a non-tensor or
    mixed dtypes or devices."""
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
