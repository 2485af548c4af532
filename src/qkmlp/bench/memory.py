"""Memory: bytes saved for backward, the allocator's thresholds, and stack peaks.

- :func:`saved_bytes` (autograd's saved-tensor hooks) and :func:`compiled_saved_tensors`
  (read from the backward graph ``torch.compile`` partitions): what a layer keeps for
  backward.
- :func:`set_allocator` / :func:`allocator_settings`: glibc malloc's thresholds fixed and
  recorded, so that big buffers are reused rather than fetched fresh from the OS.
- :func:`stack_step_peak`, :func:`bench_stack`, :func:`stack_ratios`: the peak resident
  memory of a residual stack's training step, one fresh process per point.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Callable

import torch
from torch import nn

from .references import ResidualBlock, make_mlp

__all__ = ["saved_bytes", "compiled_saved_tensors", "set_allocator", "allocator_settings",
           "stack_step_peak", "bench_stack", "stack_ratios"]


def saved_bytes(fn: Callable[[], torch.Tensor], params) -> int:
    """Bytes of distinct non-parameter storages that autograd saves while ``fn()`` runs.

    Parameters (and views of them) are excluded: every candidate keeps its weights anyway.
    The input x is counted when saved. ``fn``: a zero-argument callable running one forward
    pass (its output is discarded); ``params``: the module's parameters. Returns an int.
    """
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in param_storages:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn()
    del y
    return sum(seen.values())


def compiled_saved_tensors(module: nn.Module, x: torch.Tensor) -> list:
    """What ``torch.compile`` keeps for backward of ``module(x)``, read from the graph.

    Compiles ``module`` with AOTAutograd and the partitioner inductor uses
    (``min_cut_rematerialization_partition``), graphs run uncompiled (no C++ compiler
    needed), runs one forward, and returns the tensors the backward graph takes from the
    forward: one ``(shape, dtype)`` per saved value, parameters included (filter by shape).
    A check of :func:`saved_bytes` that does not go through autograd's hooks.
    """
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    found: list = []

    def partition(joint, inputs, **kw):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, **kw)
        found.clear()
        for node in bw.graph.nodes:
            val = node.meta.get("val")
            if node.op == "placeholder" and not node.name.startswith("tangents") \
                    and isinstance(val, torch.Tensor):
                found.append((tuple(val.shape), val.dtype))
        return fw, bw

    def boxed(gm, _example_inputs):
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=boxed, bw_compiler=boxed, partition_fn=partition)
    torch._dynamo.reset()
    try:
        torch.compile(module, fullgraph=True, backend=backend)(x)
    finally:
        torch._dynamo.reset()
    return list(found)


#: glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


_ALLOCATOR: dict = {"mode": "default"}


def set_allocator(mode: str = "tuned") -> dict:
    """Fix glibc malloc's thresholds in this process so that big buffers are reused.

    With glibc's defaults a freed buffer above the (dynamic) mmap threshold goes back to
    the OS and the next allocation of it is fresh memory, zeroed page by page on first
    touch (minor page faults): whether that happens depends on the order of earlier
    allocations, which made some runs bimodal. ``"tuned"`` sets M_MMAP_THRESHOLD to its
    maximum (32 MiB on 64-bit) and M_TRIM_THRESHOLD to 1 GiB, so buffers below 32 MiB
    stay in the heap; ``"default"`` changes nothing. Returns what was applied (recorded
    in :func:`machine_info`); ``applied`` is False where there is no glibc.
    """
    if mode not in ("tuned", "default"):
        raise ValueError(f"allocator mode must be 'tuned' or 'default', got {mode!r}")
    info = {"mode": mode, "applied": False}
    if mode == "tuned":
        try:
            import ctypes
            libc = ctypes.CDLL("libc.so.6")
            ok = (libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) == 1
                  and libc.mallopt(_M_TRIM_THRESHOLD, 2**30) == 1)
            info.update(applied=ok, mmap_threshold=32 * 2**20, trim_threshold=2**30)
        except OSError:
            pass
    _ALLOCATOR.clear()
    _ALLOCATOR.update(info)
    return info


def allocator_settings() -> dict:
    """The allocator and threading settings of this process: :func:`set_allocator`'s
    record, the ``MALLOC_*`` / ``OMP_NUM_THREADS`` environment, torch's thread counts and
    the CPUs the process may run on."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "OMP_", "MKL_", "GOMP_"))}
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = None
    return {"malloc": dict(_ALLOCATOR), "env": env, "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(), "affinity": cpus}


def stack_step_peak(kind: str, blocks: int, *, d: int = 512, m: int = 1376, n: int = 2048,
                    dtype=torch.float32, seed: int = 0) -> dict:
    """Peak resident memory of one training step of ``blocks`` residual blocks.

    Meant for a fresh process (see :func:`bench_stack`): builds the stack and its input,
    records the resident high-water mark (``ru_maxrss``) before the step, runs
    forward, ``loss.backward()`` with the gradients of every parameter, and records it
    after. Returns bytes: ``before`` and ``after`` high-water marks and ``step`` =
    after - before, the memory the step itself added on top of weights and input.
    """
    import resource

    torch.manual_seed(seed)
    fk = {"dtype": dtype}
    model = nn.Sequential(*[ResidualBlock(make_mlp(kind, d, m, **fk), d, **fk) for _ in range(blocks)])
    x = torch.randn(n, d, dtype=dtype)
    for p in model.parameters():              # gradient buffers exist before the step
        p.grad = torch.zeros_like(p)
    kib = 1024 if sys.platform != "darwin" else 1
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib
    loss = model(x).float().square().mean()
    loss.backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib
    return {"kind": kind, "blocks": blocks, "dtype": str(dtype).replace("torch.", ""),
            "before": before, "after": after, "step": after - before}


def bench_stack(kinds=("llama_mlp", "gated_mlp"), blocks=(1, 2, 4, 8), dtypes=("float32", "bfloat16"),
                *, d: int = 512, m: int = 1376, n: int = 2048, repeats: int = 1) -> dict:
    """:func:`stack_step_peak` for every kind × depth × dtype, each in a fresh process
    (``python -m qkmlp.bench --stack-child``), the same allocator settings in each,
    ``repeats`` times, in an interleaved order. Returns the config and every record."""
    import random

    jobs = [(k, b, dt) for _ in range(repeats) for dt in dtypes for b in blocks for k in kinds]
    random.Random(0).shuffle(jobs)
    recs = []
    for k, b, dt in jobs:
        cmd = [sys.executable, "-m", "qkmlp.bench", "--stack-child", f"{k},{b},{dt},{d},{m},{n}",
               "--allocator", _ALLOCATOR.get("mode", "default")]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
        recs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"config": {"kinds": list(kinds), "blocks": list(blocks), "dtypes": list(dtypes), "d": d,
                       "m": m, "n": n, "repeats": repeats}, "records": recs}


def stack_ratios(stack: dict) -> list:
    """Per dtype and depth: the median step peak (MiB) of the Llama-style and gated stacks
    over the repeats of :func:`bench_stack`, and their ratio."""
    rows = []
    c = stack["config"]
    for dt in c["dtypes"]:
        for b in c["blocks"]:
            med = {k: statistics.median(r["step"] for r in stack["records"]
                                        if r["kind"] == k and r["blocks"] == b and r["dtype"] == dt)
                   for k in ("llama_mlp", "gated_mlp")}
            rows.append({"dtype": dt, "blocks": b, "llama_mib": med["llama_mlp"] / 2**20,
                         "gated_mib": med["gated_mlp"] / 2**20,
                         "ratio": med["gated_mlp"] / med["llama_mlp"]})
    return rows
