"""The timing harness: candidates run interleaved, round by round.

:func:`time_interleaved` runs one repetition of every candidate per round, in an order
shuffled per round, so that load from other processes hits every candidate alike, and
records every per-call time (CUDA: synchronised) with the minor page faults of each call.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

__all__ = ["time_interleaved"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(cands: dict[str, Callable[[], object]], device, *, reps: int = 15, warmup: int = 2,
                     seed: int = 0) -> dict:
    """Median, min and all per-call times (seconds) of each candidate, run interleaved.

    Each round runs every candidate once, in an order shuffled per round (fixed seed), so
    that neither load bursts nor a fixed position in the round favour one candidate.
    ``cands`` maps a name to a zero-argument callable; the first ``warmup`` rounds are not
    timed. Returns {name: {"median_s", "min_s", "times_s", "page_faults"}}, the last the
    median count of minor page faults per call (fresh memory from the OS touched for the
    first time; None where ``resource`` is unavailable), which explains much of the
    run-to-run movement of CPU times.
    """
    import random

    device = torch.device(device)
    rng = random.Random(seed)
    times = {k: [] for k in cands}
    faults = {k: [] for k in cands}
    names = list(cands)
    for i in range(warmup + reps):
        rng.shuffle(names)
        for name in names:
            fn = cands[name]
            _sync(device)
            f0 = _minor_faults()
            t0 = time.perf_counter()
            fn()
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
                if f0 is not None:
                    faults[name].append(_minor_faults() - f0)
    return {k: {"median_s": statistics.median(v), "min_s": min(v), "times_s": v,
                "page_faults": statistics.median(faults[k]) if faults[k] else None}
            for k, v in times.items()}


def _minor_faults() -> Optional[int]:
    try:
        import resource
    except ImportError:        # not on Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fwd_bwd(module_fn, x, params, gy):
    def f():
        y = module_fn(x)
        torch.autograd.grad(y, [x, *params], gy)
    return f


def at_threads(fn: Callable[[], object], threads: int) -> Callable[[], object]:
    """``fn`` run with ``torch.set_num_threads(threads)`` (for interleaving thread counts)."""
    def g():
        torch.set_num_threads(threads)
        return fn()
    return g
