"""Benchmarks of the factored layers against the GEMM floor and a Llama-style MLP.

Run ``python -m qkmlp.bench`` (or ``make bench``): it prints tables of medians and ratios
with the machine and versions, and ``--json PATH`` stores everything with provenance.

Suites, each timing its candidates *interleaved* (one repetition of every
candidate, then the next round) and reporting medians, so that load from other
processes hits every candidate alike:

- ``headline``: at one size (default d = 512, m = 1376, N = 2048, float32 on CPU),
  the bare GEMMs x·Qᵀ, x·Kᵀ and h·V (the floor; for forward + backward, those and the
  GEMMs of backward: dh, dW_qk by halves, dx, dV), a Llama-style MLP of three ``nn.Linear``
  ``down(silu(gate(x)) * up(x))``, Liger-Kernel's SwiGLU when importable, and the rank-1
  ``GatedMLP`` and ``SymmetricBilinearMLP``: forward, forward + backward, and the bytes
  saved for backward (measured with ``torch.autograd.graph.saved_tensors_hooks``).
  A second, independently initialised Llama-style MLP (``llama_mlp_copy``) runs as an
  A/A control: its ratio to the first shows how far two identical workloads drift apart
  in the same run. Ratios are also taken *paired*, round by round, with a distribution-
  free 95 % interval for their median (:func:`median_interval`), and each target gets a
  :func:`verdict`: met, parity (the interval contains the goal) or not met.
- ``rank``: rank-r layers against the dense ``BilinearAttentionMLP`` they equal.
- ``size``: forward time against d for the dense form and the rank-1 / rank-8 forms
  (the dense form's d² wall).
- ``stack``: peak memory of a training step of residual blocks, one fresh process each.
- ``roofline`` (CPU): the measured GEMM rate (``torch.mm``) and elementwise bandwidth
  (``torch.add``, copy) at 1 and 2 threads, and each layer's achieved GEMM GFLOP/s, time
  ratio to the Llama-style MLP and elementwise share, over tokens N and width m
  (:func:`bench_roofline`).

Times are wall-clock seconds per call (CUDA: synchronised). No speed is asserted
anywhere: these are measurements, not tests.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import BilinearAttentionMLP, GatedMLP, SymmetricBilinearMLP

__all__ = [
    "LlamaMLP",
    "SiLUMul",
    "liger_style_mlp",
    "ratio_panels",
    "RATIO_CANDIDATES",
    "saved_bytes",
    "compiled_saved_tensors",
    "time_interleaved",
    "median_interval",
    "paired_ratio",
    "pooled_paired_ratio",
    "format_paired",
    "verdict",
    "aa_spread",
    "control_verdict",
    "TARGETS",
    "bench_headline",
    "bench_rank",
    "bench_size",
    "run",
    "format_report",
    "machine_info",
    "set_allocator",
    "allocator_settings",
    "op_counts",
    "ELEMENTWISE_OPS",
    "CONVERSION_OPS",
    "ResidualBlock",
    "make_mlp",
    "stack_step_peak",
    "bench_stack",
    "stack_ratios",
    "headline_sizes",
    "store_path",
    "ROOFLINE_KINDS",
    "gemm_flops",
    "forward_bytes",
    "machine_peak",
    "roofline_point",
    "bench_roofline",
    "roofline_rows",
    "main",
]


class LlamaMLP(nn.Module):
    """What a user would otherwise write (HF ``LlamaMLP``): down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, d_hidden: int, *, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype, "bias": False}
        self.gate_proj = nn.Linear(d_model, d_hidden, **fk)
        self.up_proj = nn.Linear(d_model, d_hidden, **fk)
        self.down_proj = nn.Linear(d_hidden, d_model, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SiLUMul(torch.autograd.Function):
    """Liger-Kernel's SwiGLU memory rule in PyTorch ops: silu(a)·b that saves a and b only
    and recomputes silu(a) in backward (Hsu et al., 2024), so a Llama MLP built on it
    keeps x, a, b and the product for backward, d + 3m numbers per token against the
    plain MLP's d + 4m. ``SiLUMul.apply(a, b)``: a, b of one shape -> silu(a)·b."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        if torch.is_grad_enabled():        # create_graph: the derivative in autograd ops
            sig = torch.sigmoid(a)
            return grad * b * sig * (1 + a * (1 - sig)), grad * F.silu(a)
        return torch.ops.aten.silu_backward(grad * b, a), grad * F.silu(a)


def liger_style_mlp(llama: LlamaMLP) -> Callable[[torch.Tensor], torch.Tensor]:
    """x ↦ down(SiLUMul(gate(x), up(x))) with ``llama``'s three linears: the Llama MLP's
    function with Liger-Kernel's saved set (:class:`SiLUMul`), in plain PyTorch."""

    def f(x):
        return llama.down_proj(SiLUMul.apply(llama.gate_proj(x), llama.up_proj(x)))

    return f


def _liger_swiglu(llama: LlamaMLP) -> Optional[Callable]:
    """Liger-Kernel's fused SiLU·mul between the same three linears, if importable (CUDA only)."""
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction  # type: ignore
    except Exception:
        return None

    def f(x):
        return llama.down_proj(LigerSiLUMulFunction.apply(llama.gate_proj(x), llama.up_proj(x)))

    return f


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


def median_interval(values, level: float = 0.95) -> dict:
    """Median of ``values`` with a distribution-free confidence interval for it.

    The interval is [x_(k), x_(n+1-k)] of the sorted values, k the largest rank whose
    binomial tail P(Bin(n, ½) < k) is at most (1 - level)/2; it holds the population
    median with probability ``coverage`` ≥ level whatever the distribution (independent
    draws assumed). With fewer than 6 values no 95 % interval exists: then k = 1 (the
    range) and ``coverage`` says what it is worth. Returns {median, lo, hi, n, coverage}.
    """
    from math import comb

    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    alpha = (1.0 - level) / 2
    tail = lambda k: sum(comb(n, i) for i in range(k)) / 2**n   # P(Bin(n, 1/2) < k)
    k = 1
    while k + 1 <= (n + 1) // 2 and tail(k + 1) <= alpha:
        k += 1
    return {"median": statistics.median(xs), "lo": xs[k - 1], "hi": xs[n - k], "n": n,
            "coverage": 1.0 - 2 * tail(k)}


def paired_ratio(num: list, den: list, level: float = 0.95) -> dict:
    """:func:`median_interval` of the round-by-round ratios num[i] / den[i].

    ``num`` and ``den`` are the ``times_s`` lists of two candidates from one
    :func:`time_interleaved` call, so entry i of each was measured in the same round.
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"expected two equally long, non-empty lists of times, got {len(num)} and {len(den)}")
    return median_interval([a / b for a, b in zip(num, den)], level)


def pooled_paired_ratio(headlines: list, candidate: str, table: str = "forward_backward",
                        other: str = "llama_mlp", level: float = 0.95) -> dict:
    """:func:`median_interval` of the round-by-round ratios candidate / other pooled over
    several headline results (e.g. the same command run in separate processes).

    ``table`` is "forward" or "forward_backward". Pooling treats every round as independent;
    a shift between processes widens the truth beyond the interval.
    """
    ratios = []
    for hl in headlines:
        t = hl[table]
        ratios += [a / b for a, b in zip(t[candidate]["times_s"], t[other]["times_s"])]
    return median_interval(ratios, level)


def aa_spread(headlines: list, key: str = "fwd_bwd_vs_llama", control: str = "llama_mlp_copy") -> tuple:
    """(lo, hi): the union of the A/A control's paired 95 % intervals for ``key`` over
    several headline results, widened to contain 1. Two identical workloads drift this
    far apart on the machine, so a smaller effect is no evidence."""
    if not headlines:
        raise ValueError("aa_spread needs at least one headline result")
    ps = [h["paired_ratios"][control][key] for h in headlines]
    return (min(1.0, *(p["lo"] for p in ps)), max(1.0, *(p["hi"] for p in ps)))


def control_verdict(p: dict, spread: tuple) -> str:
    """'faster' if the interval [p['lo'], p['hi']] of a ratio to the Llama MLP lies wholly
    below the A/A ``spread``, 'slower' if wholly above, else 'parity'."""
    lo, hi = spread
    if lo > hi or p["lo"] > p["hi"]:
        raise ValueError(f"expected ordered intervals, got {p['lo']}, {p['hi']} and {spread}")
    return "faster" if p["hi"] < lo else ("slower" if p["lo"] > hi else "parity")


#: (candidate, colour index in figures.COLORS, marker, label) drawn by :func:`ratio_panels`.
RATIO_CANDIDATES = (("gated_mlp", 0, "o", "gated_mlp"), ("symmetric_mlp", 1, "s", "symmetric_mlp"),
                    ("llama_mlp_copy", 7, "^", "A/A control"))


def ratio_panels(headlines: list, tables=(("fwd_vs_llama", "forward"),
                                          ("fwd_bwd_vs_llama", "forward + backward")),
                 candidates=RATIO_CANDIDATES, xlabel: str = "stored run") -> list:
    """One panel per ``(ratio key, title)`` of ``tables``: for each headline result (one
    per stored run, in order) the paired ratio to the Llama MLP of every candidate
    (median, error bar the 95 % interval), the A/A spread (:func:`aa_spread`) shaded and
    1 drawn. ``headlines``: headline dicts of :func:`bench_headline`. Returns the
    matplotlib figures (show them with ``figures.show``)."""
    from .. import figures

    if not headlines:
        raise ValueError("ratio_panels needs at least one headline result")
    out = []
    for key, title in tables:
        fig, ax = figures.panel(height=3.4)
        spread = aa_spread(headlines, key)
        ax.axhspan(spread[0], spread[1], color="0.85", label="A/A spread")
        for j, (k, col, mk, lab) in enumerate(candidates):
            p = [h["paired_ratios"][k][key] for h in headlines]
            xs = [i + 1 + 0.2 * (j - 1) for i in range(len(headlines))]
            med = [q["median"] for q in p]
            err = [[q["median"] - q["lo"] for q in p], [q["hi"] - q["median"] for q in p]]
            ax.errorbar(xs, med, yerr=err, fmt=mk, color=figures.COLORS[col], capsize=2, label=lab)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(range(1, len(headlines) + 1))
        ax.set(xlabel=xlabel, ylabel="time / Llama MLP", title=title)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
        out.append(fig)
    return out


#: The headline targets: (ratio key, goal), a ratio at most the goal meets it.
TARGETS = {"fwd_vs_floor": 1.10, "fwd_vs_llama": 1.0, "fwd_bwd_vs_llama": 1.0, "saved_bytes_vs_llama": 0.75}


def verdict(lo: float, hi: float, goal: float) -> str:
    """'met' if the whole interval [lo, hi] is at most ``goal``, 'not met' if all of it
    is above, else 'parity' (the measurement cannot tell the ratio from the goal)."""
    if lo > hi:
        raise ValueError(f"expected lo <= hi, got {lo} > {hi}")
    return "met" if hi <= goal else ("not met" if lo > goal else "parity")


def _counts_only(fn, no_grad: bool = False, min_numel: int = 0) -> dict:
    """:func:`op_counts` without the per-op table (for stored results)."""
    if no_grad:
        with torch.no_grad():
            c = op_counts(fn, min_numel)
    else:
        c = op_counts(fn, min_numel)
    return {"conversions": c["conversions"], "elementwise": c["elementwise"]}


def _fwd_bwd(module_fn, x, params, gy):
    def f():
        y = module_fn(x)
        torch.autograd.grad(y, [x, *params], gy)
    return f


LAYERS = ("gated_mlp", "symmetric_mlp")


def _floor_gemms(x, gy, h, ga, gb, w_q, w_k, v):
    """The bare GEMMs of (ch10-eq-two-gemms) as two closures: forward (x·Qᵀ and x·Kᵀ by
    halves, H·V) and forward + backward (also dH, dW_qk by halves, dX, dV). Shapes: x, gy
    (N, d); h, ga, gb (N, m); w_q, w_k (m, d); v (m, d)."""
    def floor():
        x @ w_q.T
        x @ w_k.T
        h @ v

    def floor_fwd_bwd():
        floor()
        gy @ v.T
        ga.T @ x
        gb.T @ x
        (ga @ w_q).addmm_(gb, w_k)
        h.T @ gy

    return floor, floor_fwd_bwd


def bench_headline(d: int = 512, m: int = 1376, n: int = 2048, *, dtype=torch.float32, device="cpu",
                   reps: int = 21, seed: int = 0, compile_backend: Optional[str] = None) -> dict:
    """Floor, Llama-style MLP, (Liger), GatedMLP and SymmetricBilinearMLP at rank 1.

    With ``compile_backend`` (e.g. "inductor") every module candidate runs as
    ``torch.compile(module, fullgraph=True, backend=compile_backend)``, compiled before the
    timing starts; the bare-GEMM floor stays eager.
    """
    device = torch.device(device)
    load_start = _loadavg()
    g = torch.Generator(device="cpu").manual_seed(seed)
    fk = {"device": device, "dtype": dtype}
    torch.manual_seed(seed)
    gated = GatedMLP(d, m, **fk)
    sym = SymmetricBilinearMLP(d, m, **fk)
    llama = LlamaMLP(d, m, **fk)
    llama_copy = LlamaMLP(d, m, **fk)      # the A/A control: same work, other weights
    x = torch.randn(n, d, generator=g).to(**fk)
    gy = torch.randn(n, d, generator=g).to(**fk)
    h = torch.randn(n, m, generator=g).to(**fk)
    w_q, w_k = gated.query_weight.detach(), gated.key_weight.detach()
    v = gated.value.detach()
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        # the layout nn.Linear and the layers multiply by (half GEMMs on CPU are many
        # times slower with a row-major (m, d_out) second operand)
        v = v.T.contiguous().T

    ga, gb = torch.randn(2, n, m, generator=g).to(**fk)

    floor, floor_fwd_bwd = _floor_gemms(x, gy, h, ga, gb, w_q, w_k, v)

    mods = {"llama_mlp": (llama, list(llama.parameters())),
            "llama_mlp_copy": (llama_copy, list(llama_copy.parameters())),
            "gated_mlp": (gated, list(gated.parameters())),
            "symmetric_mlp": (sym, list(sym.parameters()))}
    layers = [k for k in LAYERS if k in mods]
    fwd = {"floor_gemms": floor}
    liger = _liger_swiglu(llama) if device.type == "cuda" else None
    if liger is not None:
        mods["liger_swiglu"] = (liger, list(llama.parameters()))
    if compile_backend:
        mods = {k: (torch.compile(mod, fullgraph=True, backend=compile_backend), ps)
                for k, (mod, ps) in mods.items()}
    for k, (mod, _) in mods.items():
        fwd[k] = (lambda mod=mod: mod(x))

    with torch.no_grad():
        t_fwd = time_interleaved(fwd, device, reps=reps)
    xg = x.detach().requires_grad_(True)
    fb = {"floor_gemms": floor_fwd_bwd}
    fb.update({k: _fwd_bwd(mod, xg, ps, gy) for k, (mod, ps) in mods.items()})
    t_fb = time_interleaved(fb, device, reps=reps)
    mins_f = {k: t["min_s"] for k, t in t_fwd.items()}
    mins_b = {k: t["min_s"] for k, t in t_fb.items()}
    mem = {k: saved_bytes(lambda mod=mod: mod(xg), ps) for k, (mod, ps) in mods.items()
           if k != "llama_mlp_copy"}
    if compile_backend and not all(mem.values()):
        # AOTAutograd's compiled function saves its tensors with ctx.save_for_backward, so
        # the hooks see them (tests/test_compile.py checks them against the partitioned
        # graph, compiled_saved_tensors); a backend that hid them would stop here
        raise RuntimeError(f"saved_tensors_hooks saw nothing under backend {compile_backend!r}: {mem}")

    med_f = {k: t["median_s"] for k, t in t_fwd.items()}
    med_b = {k: t["median_s"] for k, t in t_fb.items()}
    ratios, ratios_of_minima = {}, {}
    for k in layers:
        ratios[k] = {
            "fwd_vs_floor": med_f[k] / med_f["floor_gemms"],
            "fwd_vs_llama": med_f[k] / med_f["llama_mlp"],
            "fwd_bwd_vs_llama": med_b[k] / med_b["llama_mlp"],
            "saved_bytes_vs_llama": mem[k] / mem["llama_mlp"],
        }
        ratios_of_minima[k] = {
            "fwd_vs_floor": mins_f[k] / mins_f["floor_gemms"],
            "fwd_vs_llama": mins_f[k] / mins_f["llama_mlp"],
            "fwd_bwd_vs_llama": mins_b[k] / mins_b["llama_mlp"],
        }
        if "liger_swiglu" in med_f:
            ratios[k]["fwd_vs_liger"] = med_f[k] / med_f["liger_swiglu"]
            ratios[k]["fwd_bwd_vs_liger"] = med_b[k] / med_b["liger_swiglu"]

    def pr(k, other, table):
        return paired_ratio(table[k]["times_s"], table[other]["times_s"])

    paired = {}
    for k in (*layers, "llama_mlp_copy", "llama_mlp"):
        paired[k] = {"fwd_vs_floor": pr(k, "floor_gemms", t_fwd),
                     "fwd_bwd_vs_floor": pr(k, "floor_gemms", t_fb)}
        if k != "llama_mlp":
            paired[k]["fwd_vs_llama"] = pr(k, "llama_mlp", t_fwd)
            paired[k]["fwd_bwd_vs_llama"] = pr(k, "llama_mlp", t_fb)
        if "liger_swiglu" in t_fwd and k in layers:
            paired[k]["fwd_vs_liger"] = pr(k, "liger_swiglu", t_fwd)
            paired[k]["fwd_bwd_vs_liger"] = pr(k, "liger_swiglu", t_fb)
    verdicts = {}
    for k in layers:
        verdicts[k] = {key: verdict(p["lo"], p["hi"], TARGETS[key])
                       for key, p in paired[k].items() if key in TARGETS}
        sb = ratios[k]["saved_bytes_vs_llama"]          # exact, so lo = hi
        verdicts[k]["saved_bytes_vs_llama"] = verdict(sb, sb, TARGETS["saved_bytes_vs_llama"])
    counts = {}
    if not compile_backend:
        for k in ("llama_mlp", *layers):
            mod, ps = mods[k]
            counts[k] = {"forward": _counts_only(lambda mod=mod: mod(x), no_grad=True),
                         "forward_backward": _counts_only(_fwd_bwd(mod, xg, ps, gy))}
            if n * m > m * d:          # passes over activations only (larger than any weight)
                counts[k]["forward_activations"] = _counts_only(lambda mod=mod: mod(x), True, n * m)
                counts[k]["forward_backward_activations"] = _counts_only(_fwd_bwd(mod, xg, ps, gy),
                                                                         min_numel=n * m)
    return {
        "op_counts": counts,
        "config": {"d": d, "m": m, "n": n, "dtype": str(dtype).replace("torch.", ""), "device": str(device),
                   "reps_fwd": reps, "reps_fwd_bwd": reps, "compile_backend": compile_backend},
        "forward": t_fwd, "forward_backward": t_fb, "saved_bytes": mem, "ratios": ratios,
        "ratios_of_minima": ratios_of_minima, "paired_ratios": paired, "verdicts": verdicts,
        "loadavg_start": load_start, "loadavg_end": _loadavg(),
    }


# --- allocator control ------------------------------------------------------------------

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


# --- op counts ----------------------------------------------------------------------------

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


def _has_ancestor(e, ids) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.id in ids:
            return True
        p = p.cpu_parent
    return False


# --- peak memory of a residual stack's training step -----------------------------------

class ResidualBlock(nn.Module):
    """x + mlp(RMSNorm(x)): one pre-norm residual block without attention."""

    def __init__(self, mlp: nn.Module, d: int, **fk):
        super().__init__()
        self.norm = nn.RMSNorm(d, **fk)
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def make_mlp(kind: str, d: int, m: int, **fk) -> nn.Module:
    """A ``LlamaMLP``, rank-1 ``GatedMLP`` or ``SymmetricBilinearMLP`` of widths d, m by name."""
    if kind == "llama_mlp":
        return LlamaMLP(d, m, **fk)
    if kind == "gated_mlp":
        return GatedMLP(d, m, **fk)
    if kind == "symmetric_mlp":
        return SymmetricBilinearMLP(d, m, **fk)
    raise ValueError(f"kind must be llama_mlp, gated_mlp or symmetric_mlp, got {kind!r}")


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


def bench_rank(d: int = 512, m: int = 344, n: int = 256, ranks=(1, 2, 4, 8, 16), *, dtype=torch.float32,
               device="cpu", reps: int = 11, seed: int = 0, dense: bool = True) -> dict:
    """Rank-r gated and symmetric layers against the dense layer (A_j materialised).

    Forward times on x of shape (n, d), bytes saved for backward and parameter counts.
    ``dense=False`` skips the dense layer (its m·d² weights may not fit).
    """
    device = torch.device(device)
    fk = {"device": device, "dtype": dtype}
    torch.manual_seed(seed)
    x = torch.randn(n, d, **fk)
    cands, layers = {}, {}
    for r in ranks:
        layers[f"gated_r{r}"] = GatedMLP(d, m, rank=r, **fk)
        layers[f"symmetric_r{r}"] = SymmetricBilinearMLP(d, m, rank=r, **fk)
    if dense:
        with torch.no_grad():
            layers["dense"] = layers[f"symmetric_r{max(ranks)}"].to_dense()
    for k, mod in layers.items():
        cands[k] = (lambda mod=mod: mod(x))
    with torch.no_grad():
        t = time_interleaved(cands, device, reps=reps)
    xg = x.detach().requires_grad_(True)
    mem = {k: saved_bytes(lambda mod=mod: mod(xg), list(mod.parameters())) for k, mod in layers.items()}
    params = {k: sum(p.numel() for p in mod.parameters()) for k, mod in layers.items()}
    out = {"config": {"d": d, "m": m, "n": n, "ranks": list(ranks), "dtype": str(dtype).replace("torch.", ""),
                      "device": str(device), "reps": reps},
           "forward": t, "saved_bytes": mem, "parameters": params}
    if dense:
        out["dense_vs_rank"] = {k: t["dense"]["median_s"] / t[k]["median_s"] for k in t if k != "dense"}
    return out


def bench_size(ds=(64, 128, 256, 512), m: int = 344, n: int = 256, *, dtype=torch.float32, device="cpu",
               reps: int = 9, seed: int = 0) -> dict:
    """Forward time against d: dense (m·d² per token), rank 1 and rank 8 (m·r·d).

    One input x of shape (n, d) per d in ``ds``; medians of ``reps`` interleaved rounds.
    """
    device = torch.device(device)
    fk = {"device": device, "dtype": dtype}
    torch.manual_seed(seed)
    rows = {}
    for d in ds:
        x = torch.randn(n, d, **fk)
        layers = {"dense": BilinearAttentionMLP(d, m, **fk), "gated_r1": GatedMLP(d, m, **fk),
                  "gated_r8": GatedMLP(d, m, rank=8, **fk)}
        with torch.no_grad():
            t = time_interleaved({k: (lambda mod=mod: mod(x)) for k, mod in layers.items()}, device, reps=reps)
        rows[str(d)] = {k: v["median_s"] for k, v in t.items()}
        del layers
    return {"config": {"ds": list(ds), "m": m, "n": n, "dtype": str(dtype).replace("torch.", ""),
                       "device": str(device), "reps": reps},
            "forward_median_s": rows}


# --- roofline ---------------------------------------------------------------------------

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


def _at_threads(fn: Callable[[], object], threads: int) -> Callable[[], object]:
    """``fn`` run with ``torch.set_num_threads(threads)`` (for interleaving thread counts)."""
    def g():
        torch.set_num_threads(threads)
        return fn()
    return g


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
        t = time_interleaved({f"{k}@{th}": _at_threads(f, th) for k, f in ops.items() for th in threads},
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

        floor, floor_fwd_bwd = _floor_gemms(x, gy, h, ga, gb, w_q, w_k, v)

        fwd = {"floor_gemms": floor}
        fwd.update({k: (lambda mod=mod: mod(x)) for k, mod in mods.items()})
        with torch.no_grad():
            t_f = time_interleaved({f"{k}@{th}": _at_threads(f, th) for k, f in fwd.items()
                                    for th in threads}, "cpu", reps=reps, warmup=1, seed=seed)
        xg = x.detach().requires_grad_(True)
        fb = {"floor_gemms": floor_fwd_bwd}
        fb.update({k: _fwd_bwd(mod, xg, list(mod.parameters()), gy) for k, mod in mods.items()})
        t_b = time_interleaved({f"{k}@{th}": _at_threads(f, th) for k, f in fb.items()
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
               "loadavg": _loadavg()}
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
            "peak_runs": [before, after], "peak": peak, "points": pts, "loadavg_end": _loadavg()}


def roofline_rows(roof: dict, *, threads: Optional[int] = None, n: Optional[int] = None,
                  m: Optional[int] = None) -> list:
    """The points of a :func:`bench_roofline` result matching the given threads, n, m."""
    return [p for p in roof["points"]
            if (threads is None or p["threads"] == threads) and (n is None or p["n"] == n)
            and (m is None or p["m"] == m)]


def _loadavg() -> Optional[list]:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> Optional[str]:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except Exception:
        return None


def _library_changed() -> Optional[bool]:
    """Whether the library's own files differ from the commit (uncommitted changes), if known."""
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # src/qkmlp
        out = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "."], capture_output=True,
                             text=True, timeout=5)
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except Exception:
        return None


def machine_info(device="cpu") -> dict:
    """Machine, versions and date, for the provenance of stored results."""
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "git_commit": _git_commit(),
        "library_uncommitted_changes": _library_changed(),
        "allocator": allocator_settings(),
    }
    if _loadavg() is not None:
        info["loadavg"] = _loadavg()
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def run(suites=("headline", "rank", "size"), *, device="cpu", dtype=None, sizes: Optional[dict] = None,
        reps: Optional[int] = None, compile_backend: Optional[str] = None) -> dict:
    """Run the chosen suites. CUDA defaults to the Llama-7B sizes in bfloat16.

    ``compile_backend`` applies to the headline suite only (see
    :func:`bench_headline`).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch.cuda.is_available() is False here (no GPU or a "
                           "CPU-only torch build); nothing was measured")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    cuda = dev.type == "cuda"
    dtype = dtype or headline_sizes(dev.type)["dtype"]
    sizes = dict(sizes or {})
    res = {"machine": machine_info(dev), "suites": {}}
    kw = {"device": dev, "dtype": dtype}
    if reps:
        kw["reps"] = reps
    if "headline" in suites:
        hs = headline_sizes(dev.type)
        d, m, ns = hs["d"], hs["m"], hs["ns"]
        res["suites"]["headline"] = [
            bench_headline(sizes.get("d", d), sizes.get("m", m), n, compile_backend=compile_backend, **kw)
            for n in sizes.get("ns", ns)]
    if "rank" in suites:
        res["suites"]["rank"] = bench_rank(sizes.get("rank_d", 512), sizes.get("rank_m", 344),
                                           sizes.get("rank_n", 256), **kw)
    if "size" in suites:
        res["suites"]["size"] = bench_size(tuple(sizes.get("size_ds", (64, 128, 256, 512))),
                                           sizes.get("size_m", 344), sizes.get("size_n", 256), **kw)
    if "stack" in suites:
        res["suites"]["stack"] = bench_stack(
            blocks=tuple(sizes.get("stack_blocks", (1, 2, 4, 8))),
            dtypes=tuple(sizes.get("stack_dtypes", ("float32", "bfloat16"))),
            d=sizes.get("d", 512), m=sizes.get("m", 1376), n=sizes.get("stack_n", 2048),
            repeats=sizes.get("stack_repeats", 1))
    if "roofline" in suites:
        if cuda:
            raise ValueError("the roofline suite measures the CPU (threads 1 and 2); run it with --device cpu")
        rk = {k: sizes[f"roofline_{k}"] for k in ("ns", "ms", "threads", "peak_size", "peak_elems")
              if f"roofline_{k}" in sizes}
        res["suites"]["roofline"] = bench_roofline(
            sizes.get("d", 512), sizes.get("m", 1376), sizes.get("roofline_n", 2048), dtype=dtype,
            **({"reps": reps, "peak_reps": reps} if reps else {}), **rk)
    return res


def headline_sizes(device_type: str = "cpu") -> dict:
    """Default headline sizes and dtype: CPU d = 512, m = 1376, N = 2048 in float32; CUDA
    the Llama-7B MLP, d = 4096, m = 11008, N in (1, 128, 2048, 8192), bfloat16."""
    if device_type == "cuda":
        return {"d": 4096, "m": 11008, "ns": (1, 128, 2048, 8192), "dtype": torch.bfloat16}
    if device_type == "cpu":
        return {"d": 512, "m": 1376, "ns": (2048,), "dtype": torch.float32}
    raise ValueError(f"device type must be cpu or cuda, got {device_type!r}")


def store_path(directory: str, tag: str) -> str:
    """A new file name ``DIRECTORY/TAG_<UTC date and time>.json`` that does not exist yet:
    stored runs are kept, never overwritten."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(directory, f"{tag}_{stamp}.json")
    i = 1
    while os.path.exists(path):
        path = os.path.join(directory, f"{tag}_{stamp}_{i}.json")
        i += 1
    return path


def _ms(s: float) -> str:
    return f"{1e3 * s:9.3f}"


def format_paired(hl: dict, candidates=None, keys=None) -> list:
    """Lines "  candidate: key median [lo, hi] verdict, ..." of a headline's paired ratios,
    for the given candidates and ratio keys (default: all)."""
    lines = []
    for k, r in hl["paired_ratios"].items():
        if candidates is not None and k not in candidates:
            continue
        vs = hl.get("verdicts", {}).get(k, {})
        lines.append(f"  {k}: " + ", ".join(
            f"{n} {p['median']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]" + (f" {vs[n]}" if n in vs else "")
            for n, p in r.items() if keys is None or n in keys))
    return lines


def format_report(res: dict) -> str:
    """Plain-text tables of a :func:`run` result."""
    mi = res["machine"]
    lines = [f"qkmlp.bench  {mi['date_utc']}  torch {mi['torch']}  python {mi['python']}",
             f"machine: {mi['cpu']} ({mi['cpu_count']} CPUs, {mi['torch_threads']} torch threads, "
             f"{mi['cpu_capability']})" + (f", GPU {mi['gpu']}" if "gpu" in mi else "")
             + (f", load avg {mi['loadavg'][0]:.2f}" if "loadavg" in mi else "")]
    if "command" in res:
        lines.append(f"command: {res['command']}")
    for hl in res["suites"].get("headline", []):
        c = hl["config"]
        la = (f", load avg {hl['loadavg_start'][0]:.2f} -> {hl['loadavg_end'][0]:.2f}"
              if hl.get("loadavg_start") and hl.get("loadavg_end") else "")
        comp = f", torch.compile backend {c['compile_backend']}" if c.get("compile_backend") else ""
        lines += ["", f"headline: d={c['d']} m={c['m']} N={c['n']} {c['dtype']} on {c['device']}{comp} "
                      f"(medians of {c['reps_fwd']} / {c['reps_fwd_bwd']} interleaved reps{la})",
                  f"{'candidate':21s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'saved MiB':>10s} "
                  f"{'page faults fwd, fwd+bwd':>25s}"]
        for k, t in hl["forward"].items():
            fb = hl["forward_backward"].get(k)
            sb = hl["saved_bytes"].get(k)
            pf = [x.get("page_faults") for x in (t, fb or {})]
            pf_s = ", ".join("-" if x is None else f"{x:.0f}" for x in pf)
            lines.append(f"{k:21s} {_ms(t['median_s'])} {(_ms(fb['median_s']) if fb else '-'):>11s} "
                         f"{(f'{sb / 2**20:10.1f}' if sb is not None else '-'):>10s} {pf_s:>25s}")
        for k, r in hl["ratios"].items():
            lines.append(f"{k}: " + ", ".join(f"{n} {v:.3f}" for n, v in r.items()))
        for k, r in hl.get("ratios_of_minima", {}).items():
            lines.append(f"{k} (ratios of minima): " + ", ".join(f"{n} {v:.3f}" for n, v in r.items()))
        if "paired_ratios" in hl:
            lines.append("paired ratios, median of per-round ratios [95% interval of the median]"
                         " -> verdict; llama_mlp_copy is the A/A control:")
            lines += format_paired(hl)
    if "rank" in res["suites"]:
        rk = res["suites"]["rank"]
        c = rk["config"]
        lines += ["", f"rank: d={c['d']} m={c['m']} N={c['n']} {c['dtype']} (forward medians of {c['reps']})",
                  f"{'layer':16s} {'fwd ms':>9s} {'saved MiB':>10s} {'params':>12s} {'dense/this':>11s}"]
        for k, t in rk["forward"].items():
            ratio = rk.get("dense_vs_rank", {}).get(k)
            lines.append(f"{k:16s} {_ms(t['median_s'])} {rk['saved_bytes'][k] / 2**20:10.2f} "
                         f"{rk['parameters'][k]:12d} {(f'{ratio:11.1f}' if ratio else '-'):>11s}")
    if "size" in res["suites"]:
        sz = res["suites"]["size"]
        c = sz["config"]
        lines += ["", f"size: m={c['m']} N={c['n']} {c['dtype']} (forward medians of {c['reps']}, ms)",
                  f"{'d':>6s} " + " ".join(f"{k:>10s}" for k in next(iter(sz['forward_median_s'].values())))]
        for d, row in sz["forward_median_s"].items():
            lines.append(f"{d:>6s} " + " ".join(f"{1e3 * v:10.3f}" for v in row.values()))
    if "stack" in res["suites"]:
        st = res["suites"]["stack"]
        c = st["config"]
        lines += ["", f"stack: residual blocks RMSNorm + MLP, d={c['d']} m={c['m']} N={c['n']}, "
                      "peak RSS added by one training step (MiB, fresh process each)"]
        for row in stack_ratios(st):
            lines.append(f"  {row['dtype']:9s} blocks {row['blocks']:2d}: llama {row['llama_mib']:8.1f}  "
                         f"gated {row['gated_mib']:8.1f}  ratio {row['ratio']:.3f}")
    if "roofline" in res["suites"]:
        ro = res["suites"]["roofline"]
        for th, pk in ro["peak"].items():
            lines += ["", f"roofline, {th} thread(s): mm {pk['gemm_gflops']:.1f} GFLOP/s "
                          f"(size {pk['size']}), add {pk['add_gbps']:.1f} GB/s, copy {pk['copy_gbps']:.1f} GB/s",
                      f"{'n':>6s} {'m':>6s} " + " ".join(f"{k:>14s}" for k in ROOFLINE_KINDS)
                      + "   GFLOP/s fwd | fwd+bwd"]
            for pt in roofline_rows(ro, threads=int(th)):
                lines.append(f"{pt['n']:6d} {pt['m']:6d} " + " ".join(
                    f"{pt['gflops']['forward'][k]:6.1f}|{pt['gflops']['forward_backward'][k]:6.1f} "
                    for k in ROOFLINE_KINDS))
    return "\n".join(lines)


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


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m qkmlp.bench", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", default=None, choices=["float32", "float64", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--suite", action="append", choices=["headline", "rank", "size", "stack", "roofline"],
                   help="suites to run (repeatable; default all)")
    p.add_argument("--d", type=int, help="headline d_model (CPU 512, CUDA 4096)")
    p.add_argument("--m", type=int, help="headline d_hidden (CPU 1376, CUDA 11008)")
    p.add_argument("--n", type=int, action="append", help="headline token counts (repeatable)")
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="headline suite: torch.compile every module (backend, default inductor)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: checks the code runs, measures nothing useful")
    p.add_argument("--json", default=None, help="write the results with provenance to this JSON file "
                   "(refuses to overwrite one)")
    p.add_argument("--store", default=None, metavar="DIR",
                   help="write the results to a new DIR/<tag>_<UTC time>.json (never overwrites)")
    p.add_argument("--tag", default=None, help="file name prefix for --store (default: device_dtype)")
    p.add_argument("--allocator", default="tuned", choices=["tuned", "default"],
                   help="glibc malloc thresholds (see set_allocator; default tuned)")
    p.add_argument("--stack-repeats", type=int, default=None, help="stack suite: processes per point (1)")
    p.add_argument("--stack-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    set_allocator(a.allocator)
    if a.stack_child:                       # one record of bench_stack, in a fresh process
        k, b, dt, d, m, n = a.stack_child.split(",")
        rec = stack_step_peak(k, int(b), d=int(d), m=int(m), n=int(n), dtype=getattr(torch, dt))
        print(json.dumps(rec))
        return rec
    if a.json and os.path.exists(a.json):
        p.error(f"--json {a.json} exists; stored runs are kept (use --store DIR for a new file)")
    sizes = {}
    if a.tiny:
        sizes = {"d": 32, "m": 86, "ns": (64,), "rank_d": 32, "rank_m": 16, "rank_n": 16,
                 "size_ds": (16, 32), "size_m": 16, "size_n": 16, "stack_blocks": (1, 2),
                 "stack_n": 16, "stack_repeats": 1, "roofline_n": 32, "roofline_ns": (16, 32),
                 "roofline_ms": (48, 86), "roofline_peak_size": 64, "roofline_peak_elems": 4096}
    if a.d:
        sizes["d"] = a.d
    if a.m:
        sizes["m"] = a.m
    if a.n:
        sizes["ns"] = tuple(a.n)
    if a.stack_repeats:
        sizes["stack_repeats"] = a.stack_repeats
    dtype = getattr(torch, a.dtype) if a.dtype else None
    res = run(tuple(a.suite or ("headline", "rank", "size")), device=a.device, dtype=dtype, sizes=sizes,
              reps=a.reps or (3 if a.tiny else None), compile_backend=a.compile)
    res["command"] = "python -m qkmlp.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    print(format_report(res))
    out = a.json
    if a.store:
        tag = a.tag or f"{a.device}_{a.dtype or str(headline_sizes(torch.device(a.device).type)['dtype'])[6:]}"
        os.makedirs(a.store, exist_ok=True)
        out = store_path(a.store, tag)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "x") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
