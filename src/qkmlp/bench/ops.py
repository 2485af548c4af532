"""Profiler op counts: how many dtype conversions and elementwise passes a call runs."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from typing import Callable

import torch

__all__ = ["CONVERSION_OPS", "ELEMENTWISE_OPS", "op_counts"]


#: aten ops that convert between dtypes (one full pass over their input each).
CONVERSION_OPS = frozenset({"aten::_to_copy"})


#: aten elementwise kernels of the MLP middle and its backward (each one full pass).
ELEMENTWISE_OPS = frozenset({
    "aten::silu", "aten::silu_", "aten::silu_backward", "aten::mul", "aten::mul_",
    "aten::add", "aten::add_", "aten::sigmoid", "aten::sigmoid_", "aten::gelu",
    "aten::gelu_backward", "aten::sum", "aten::copy_", "aten::clone", "aten::stack",
    "aten::cat",
})


def op_counts(fn: Callable[[], object], min_numel: int = 0) -> dict:
    """How many times each aten op runs in ``fn()``, from ``torch.profiler`` (CPU).

    Returns {"conversions": n, "elementwise": n, "ops": {name: count}}; ``conversions``
    and ``elementwise`` count the ops of :data:`CONVERSION_OPS` and
    :data:`ELEMENTWISE_OPS` (``aten::copy_`` only outside a conversion, where it is the
    conversion's own pass) whose largest input has at least ``min_numel`` elements: with
    ``min_numel`` above the size of every weight, only the passes over activations count
    (on CPU the half-precision layers copy V, (m, d_out), into ``nn.Linear``'s layout).
    """
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    with _without_kineto_usdt_lines():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn()
    events = prof.events()
    ops = Counter(e.name for e in events)

    def big(e):
        sizes = [math.prod(s) for s in (e.input_shapes or []) if isinstance(s, (list, tuple)) and s]
        return max(sizes, default=0) >= min_numel

    conv_ids = {e.id for e in events if e.name in CONVERSION_OPS}
    conv = sum(1 for e in events if e.name in CONVERSION_OPS and big(e))
    elem = sum(1 for e in events if e.name in ELEMENTWISE_OPS and big(e)
               and not (e.name == "aten::copy_" and _has_ancestor(e, conv_ids)))
    return {"conversions": conv, "elementwise": elem, "ops": dict(ops)}


def _is_kineto_usdt_line(line: str) -> bool:
    """Kineto's trace markers, e.g. ``USDT:2026-12-01 15:55:34 19645:19645
    SyncActivityProfilerHandler.cpp:52] profiler_start`` (and ``profiler_stop``)."""
    return line.startswith("USDT:") and ("profiler_start" in line or "profiler_stop" in line)


@contextlib.contextmanager
def _without_kineto_usdt_lines():
    """Drop kineto's two ``USDT: ... profiler_start/stop`` lines from the C-level stderr.

    libkineto writes them to std::cerr at every profile's start and stop, with the date,
    PID and source line, at a severity above ERROR: its own threshold (``KINETO_LOG_LEVEL``)
    can hide them only by hiding its errors too. So file descriptor 2 is pointed at a
    temporary file for the duration of the profile, and everything written there except
    those two lines is written back to ``sys.stderr`` afterwards: kineto's warnings and
    errors still reach the user, one block later. Without a usable file descriptor 2 it
    does nothing.
    """
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as capture:
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError):
            pass
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            kept = [ln for ln in text.splitlines(keepends=True) if not _is_kineto_usdt_line(ln)]
            if kept:
                sys.stderr.write("".join(kept))


def _has_ancestor(e, ids) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.id in ids:
            return True
        p = p.cpu_parent
    return False


def counts_only(fn, no_grad: bool = False, min_numel: int = 0) -> dict:
    """:func:`op_counts` without the per-op table (for stored results)."""
    if no_grad:
        with torch.no_grad():
            c = op_counts(fn, min_numel)
    else:
        c = op_counts(fn, min_numel)
    return {"conversions": c["conversions"], "elementwise": c["elementwise"]}
