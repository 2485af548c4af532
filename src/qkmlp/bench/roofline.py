"""The roofline suite (CPU): the machine's measured GEMM rate and bandwidth, and where
each layer sits against them.

:func:`machine_peak` measures ``torch.mm``'s rate and the elementwise bandwidth of
``torch.add`` and a copy; :func:`roofline_point` each layer's achieved GEMM GFLOP/s, time
ratio to the Llama-style MLP and elementwise share at one size; :func:`bench_roofline`
runs both over tokens N and width m, at every thread count interleaved.
"""
from __future__ import annotations

from typing import Optional

import torch

from .machine import loadavg
from .references import floor_gemms, make_mlp
from .timing import at_threads, fwd_bwd, time_interleaved

__all__ = ["ROOFLINE_KINDS", "gemm_flops", "forward_bytes", "machine_peak", "roofline_point",
           "bench_roofline", "roofline_rows"]


#: candidates of the roofline suite, in the order they are reported
ROOFLINE_KINDS = ("floor_gemms", "llama_mlp", "gated_mlp", "symmetric_mlp")


def gemm_flops(n: int, d: int, m: int, *, backward: bool = False) -> int:
    """FLOPs of the GEMMs of one rank-1 MLP (gated, symmetric or Llama-style) on n tokens.

    A multiply-add counts 2, as in :mod:`qkmlp.costs`. Forward: x·Qᵀ and x·Kᵀ (n×d by
    d×m) and H·V (n×m by m×d), 6·n·d·m. Backward adds dH = dY·Vᵀ, dV = Hᵀ·dY, dQ, dK
    (two m×n by n×d) and dX (two n×m by m×d), 12·n·d·m: forward + backward is 18·n·d·m.
    The elementwise middle (2m per token forward) is left out: this counts the work a
    GEMM unit does.
    """
    for name, v in (("n", n), ("d", d), ("m", m)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return (18 if backward else 6) * n * d * m


def forward_bytes(kind: str, n: int, d: int, m: int, itemsize: int = 4) -> int:
    """Bytes a forward pass must move to and from memory if each GEMM is a separate call.

    Each of the three GEMMs reads its two operands and writes its result once:
    x and W_q, x and W_k (n·d + m·d each, writing A, B of n·m), H and V (n·m + m·d,
    writing n·d): 3·n·d + 3·m·d + 3·n·m elements for ``floor_gemms``. A layer adds
    one elementwise pass that reads A and B and writes H (3·n·m more), the least any
    unfused implementation moves; ``llama_mlp``, ``gated_mlp`` and ``symmetric_mlp``
    all count 3·n·d + 3·m·d + 6·n·m. ``itemsize``: bytes per element (4 for float32).
    """
    base = 3 * n * d + 3 * m * d + 3 * n * m
    if kind == "floor_gemms":
        return itemsize * base
    if kind in ("llama_mlp", "gated_mlp", "symmetric_mlp"):
        return itemsize * (base + 3 * n * m)
    raise ValueError(f"kind must be one of {ROOFLINE_KINDS}, got {kind!r}")


def machine_peak(*, size: int = 2048, elems: int = 2**25, threads=(1, 2), reps: int = 9,
                 dtype=torch.float32, seed: int = 0) -> dict:
    """The machine's measured float GEMM rate and elementwise memory bandwidth.

    Interleaved reps (median) of: ``torch.mm`` of two size×size matrices (2·size³ FLOPs),
    ``torch.add(a, b, out=c)`` over ``elems`` elements (reads 2, writes 1: 3·elems·itemsize
    bytes) and ``c.copy_(a)`` (2·elems·itemsize bytes), into preallocated outputs, each at
    every thread count in ``threads`` (the thread counts interleaved too, so that load from
    other processes hits them alike; the torch thread count is restored afterwards).
    Returns {str(threads): {"gemm_gflops", "add_gbps", "copy_gbps", "median_s", sizes}}.
    """
    old = torch.get_num_threads()
    try:
        g = torch.Generator().manual_seed(seed)
        a_mm, b_mm = torch.randn(2, size, size, generator=g, dtype=dtype)
        c_mm = torch.empty(size, size, dtype=dtype)
        a, b = torch.randn(2, elems, generator=g, dtype=dtype)
        c = torch.empty(elems, dtype=dtype)
        ops = {"mm": lambda: torch.mm(a_mm, b_mm, out=c_mm),
               "add": lambda: torch.add(a, b, out=c), "copy": lambda: c.copy_(a)}
        t = time_interleaved({f"{k}@{th}": at_threads(f, th) for k, f in ops.items() for th in threads},
                             "cpu", reps=reps, warmup=1, seed=seed)
    finally:
        torch.set_num_threads(old)
    item = torch.empty((), dtype=dtype).element_size()
    out = {}
    for th in threads:
        med = {k: t[f"{k}@{th}"]["median_s"] for k in ops}
        out[str(th)] = {"threads": th, "dtype": str(dtype).replace("torch.", ""), "size": size,
                        "elems": elems, "reps": reps, "median_s": med,
                        "gemm_gflops": 2 * size**3 / med["mm"] / 1e9,
                        "add_gbps": 3 * elems * item / med["add"] / 1e9,
                        "copy_gbps": 2 * elems * item / med["copy"] / 1e9}
    return out


def roofline_point(d: int = 512, m: int = 1376, n: int = 2048, *, threads=(1, 2), reps: int = 7,
                   dtype=torch.float32, seed: int = 0) -> list:
    """Achieved GFLOP/s of the bare GEMMs and of each rank-1 layer at one size.

    Times forward (no grad) and forward + backward of ``ROOFLINE_KINDS`` on x of shape
    (n, d) at every thread count in ``threads``, all interleaved, ``reps`` rounds.
    GFLOP/s counts only GEMM FLOPs (:func:`gemm_flops`, the same for every candidate), so
    the rates compare directly. ``elementwise_share`` = 1 − t(bare GEMMs) / t(layer): the
    part of a layer's time spent outside the GEMMs the floor runs. ``vs_llama``: median
    time ratio to the Llama-style MLP. ``intensity``: GEMM FLOPs per byte of
    :func:`forward_bytes` (forward only). Returns one dict per thread count.
    """
    old = torch.get_num_threads()
    try:
        g = torch.Generator().manual_seed(seed)
        fk = {"dtype": dtype}
        torch.manual_seed(seed)
        mods = {k: make_mlp(k, d, m, **fk) for k in ROOFLINE_KINDS[1:]}
        gated = mods["gated_mlp"]
        x, gy = torch.randn(2, n, d, generator=g).to(**fk)
        h = torch.randn(n, m, generator=g).to(**fk)
        ga, gb = torch.randn(2, n, m, generator=g).to(**fk)
        w_q, w_k = gated.query_weight.detach(), gated.key_weight.detach()
        v = gated.value.detach()

        floor, floor_fwd_bwd = floor_gemms(x, gy, h, ga, gb, w_q, w_k, v)

        fwd = {"floor_gemms": floor}
        fwd.update({k: (lambda mod=mod: mod(x)) for k, mod in mods.items()})
        with torch.no_grad():
            t_f = time_interleaved({f"{k}@{th}": at_threads(f, th) for k, f in fwd.items()
                                    for th in threads}, "cpu", reps=reps, warmup=1, seed=seed)
        xg = x.detach().requires_grad_(True)
        fb = {"floor_gemms": floor_fwd_bwd}
        fb.update({k: fwd_bwd(mod, xg, list(mod.parameters()), gy) for k, mod in mods.items()})
        t_b = time_interleaved({f"{k}@{th}": at_threads(f, th) for k, f in fb.items()
                                for th in threads}, "cpu", reps=reps, warmup=1, seed=seed)
    finally:
        torch.set_num_threads(old)
    item = torch.empty((), dtype=dtype).element_size()
    flops = {"forward": gemm_flops(n, d, m), "forward_backward": gemm_flops(n, d, m, backward=True)}
    byts = {k: forward_bytes(k, n, d, m, item) for k in ROOFLINE_KINDS}
    outs = []
    for th in threads:
        tt = {"forward": {k: t_f[f"{k}@{th}"] for k in ROOFLINE_KINDS},
              "forward_backward": {k: t_b[f"{k}@{th}"] for k in ROOFLINE_KINDS}}
        med = {p: {k: v["median_s"] for k, v in tab.items()} for p, tab in tt.items()}
        out = {"d": d, "m": m, "n": n, "threads": th, "reps": reps,
               "dtype": str(dtype).replace("torch.", ""), "flops": flops, "median_s": med,
               "times_s": {p: {k: v["times_s"] for k, v in tab.items()} for p, tab in tt.items()},
               "bytes_forward": byts,
               "intensity": {k: flops["forward"] / b for k, b in byts.items()},
               "gflops": {p: {k: flops[p] / s / 1e9 for k, s in med[p].items()} for p in med},
               "elementwise_share": {p: {k: 1 - med[p]["floor_gemms"] / med[p][k]
                                         for k in ROOFLINE_KINDS[1:]} for p in med},
               "vs_llama": {p: {k: med[p][k] / med[p]["llama_mlp"] for k in ROOFLINE_KINDS
                                if k != "llama_mlp"} for p in med},
               "loadavg": loadavg()}
        outs.append(out)
    return outs


def bench_roofline(d: int = 512, m: int = 1376, n: int = 2048, *, ns=(256, 512, 1024, 2048, 4096),
                   ms=(344, 688, 1376, 2752), threads=(1, 2), reps: int = 7, peak_reps: int = 9,
                   peak_size: int = 2048, peak_elems: int = 2**25, dtype=torch.float32) -> dict:
    """The roofline suite: :func:`machine_peak` before and after :func:`roofline_point`
    over tokens ``ns`` at width m and over widths ``ms`` at n tokens (the headline point
    (d, m, n) is measured once and belongs to both curves), every thread count in
    ``threads`` interleaved within each measurement.

    Returns {"config", "peak_runs": [before, after], "peak", "points": [...]}, where
    "peak" holds, per thread count, the higher of the two runs' rates for each of mm,
    add and copy (a peak is the best the machine was seen to do; both runs are kept), and
    "points" one :func:`roofline_point` record per size and thread count.
    """
    if n not in ns or m not in ms:
        raise ValueError(f"the headline n={n} must be in ns and m={m} in ms")
    pk = dict(size=peak_size, elems=peak_elems, threads=tuple(threads), reps=peak_reps, dtype=dtype)
    before = machine_peak(**pk)
    pts = []
    for mm, nn in [(m, nn) for nn in ns] + [(mm, n) for mm in ms if mm != m]:
        pts += roofline_point(d, mm, nn, threads=tuple(threads), reps=reps, dtype=dtype)
    after = machine_peak(**pk)
    peak = {}
    for th in before:
        peak[th] = {k: max(before[th][k], after[th][k]) for k in ("gemm_gflops", "add_gbps", "copy_gbps")}
        peak[th].update(threads=int(th), size=peak_size, elems=peak_elems)
    return {"config": {"d": d, "m": m, "n": n, "ns": list(ns), "ms": list(ms), "threads": list(threads),
                       "reps": reps, "peak_reps": peak_reps, "peak_size": peak_size,
                       "peak_elems": peak_elems, "dtype": str(dtype).replace("torch.", "")},
            "peak_runs": [before, after], "peak": peak, "points": pts, "loadavg_end": loadavg()}


def roofline_rows(roof: dict, *, threads: Optional[int] = None, n: Optional[int] = None,
                  m: Optional[int] = None) -> list:
    """The points of a :func:`bench_roofline` result matching the given threads, n, m."""
    return [p for p in roof["points"]
            if (threads is None or p["threads"] == threads) and (n is None or p["n"] == n)
            and (m is None or p["m"] == m)]
