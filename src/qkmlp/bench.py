"""Benchmarks of the factored layers against the GEMM floor and a Llama-style MLP.

Run ``python -m qkmlp.bench`` (or ``make bench``): it prints tables of medians and ratios
with the machine and versions, and ``--json PATH`` stores everything with provenance.

Three suites, each timing its candidates *interleaved* (one repetition of every
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

Times are wall-clock seconds per call (CUDA: synchronised). No speed is asserted
anywhere: these are measurements, not tests.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
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

from .layers import BilinearAttentionMLP, GatedMLP, SymmetricBilinearMLP

__all__ = [
    "LlamaMLP",
    "saved_bytes",
    "time_interleaved",
    "median_interval",
    "paired_ratio",
    "pooled_paired_ratio",
    "format_paired",
    "verdict",
    "TARGETS",
    "bench_headline",
    "bench_rank",
    "bench_size",
    "run",
    "format_report",
    "machine_info",
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


#: The headline targets: (ratio key, goal), a ratio at most the goal meets it.
TARGETS = {"fwd_vs_floor": 1.10, "fwd_vs_llama": 1.0, "fwd_bwd_vs_llama": 1.0, "saved_bytes_vs_llama": 0.75}


def verdict(lo: float, hi: float, goal: float) -> str:
    """'met' if the whole interval [lo, hi] is at most ``goal``, 'not met' if all of it
    is above, else 'parity' (the measurement cannot tell the ratio from the goal)."""
    if lo > hi:
        raise ValueError(f"expected lo <= hi, got {lo} > {hi}")
    return "met" if hi <= goal else ("not met" if lo > goal else "parity")


def _fwd_bwd(module_fn, x, params, gy):
    def f():
        y = module_fn(x)
        torch.autograd.grad(y, [x, *params], gy)
    return f


LAYERS = ("gated_mlp", "symmetric_mlp")


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

    ga, gb = torch.randn(2, n, m, generator=g).to(**fk)

    def floor():                 # the forward GEMMs of (ch09-eq-two-gemms): [A B] by halves, H·V
        x @ w_q.T
        x @ w_k.T
        h @ v

    def floor_fwd_bwd():         # ... and those of backward: dH, dW_qk by halves, dX, dV
        floor()
        gy @ v.T
        ga.T @ x
        gb.T @ x
        (ga @ w_q).addmm_(gb, w_k)
        h.T @ gy

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
        # compiled graphs need not report their saved tensors to the hooks
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
    return {
        "config": {"d": d, "m": m, "n": n, "dtype": str(dtype).replace("torch.", ""), "device": str(device),
                   "reps_fwd": reps, "reps_fwd_bwd": reps, "compile_backend": compile_backend},
        "forward": t_fwd, "forward_backward": t_fb, "saved_bytes": mem, "ratios": ratios,
        "ratios_of_minima": ratios_of_minima, "paired_ratios": paired, "verdicts": verdicts,
        "loadavg_start": load_start, "loadavg_end": _loadavg(),
    }


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
        here = os.path.dirname(os.path.abspath(__file__))
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
    cuda = dev.type == "cuda"
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    sizes = dict(sizes or {})
    res = {"machine": machine_info(dev), "suites": {}}
    kw = {"device": dev, "dtype": dtype}
    if reps:
        kw["reps"] = reps
    if "headline" in suites:
        d, m, ns = (4096, 11008, (1, 128, 2048, 8192)) if cuda else (512, 1376, (2048,))
        res["suites"]["headline"] = [
            bench_headline(sizes.get("d", d), sizes.get("m", m), n, compile_backend=compile_backend, **kw)
            for n in sizes.get("ns", ns)]
    if "rank" in suites:
        res["suites"]["rank"] = bench_rank(sizes.get("rank_d", 512), sizes.get("rank_m", 344),
                                           sizes.get("rank_n", 256), **kw)
    if "size" in suites:
        res["suites"]["size"] = bench_size(tuple(sizes.get("size_ds", (64, 128, 256, 512))),
                                           sizes.get("size_m", 344), sizes.get("size_n", 256), **kw)
    return res


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
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m qkmlp.bench", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", default=None, choices=["float32", "float64", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--suite", action="append", choices=["headline", "rank", "size"],
                   help="suites to run (repeatable; default all)")
    p.add_argument("--d", type=int, help="headline d_model (CPU 512, CUDA 4096)")
    p.add_argument("--m", type=int, help="headline d_hidden (CPU 1376, CUDA 11008)")
    p.add_argument("--n", type=int, action="append", help="headline token counts (repeatable)")
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="headline suite: torch.compile every module (backend, default inductor)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: checks the code runs, measures nothing useful")
    p.add_argument("--json", default=None, help="write the results with provenance to this JSON file")
    a = p.parse_args(argv)
    sizes = {}
    if a.tiny:
        sizes = {"d": 32, "m": 86, "ns": (64,), "rank_d": 32, "rank_m": 16, "rank_n": 16,
                 "size_ds": (16, 32), "size_m": 16, "size_n": 16}
    if a.d:
        sizes["d"] = a.d
    if a.m:
        sizes["m"] = a.m
    if a.n:
        sizes["ns"] = tuple(a.n)
    dtype = getattr(torch, a.dtype) if a.dtype else None
    res = run(tuple(a.suite or ("headline", "rank", "size")), device=a.device, dtype=dtype, sizes=sizes,
              reps=a.reps or (3 if a.tiny else None), compile_backend=a.compile)
    res["command"] = "python -m qkmlp.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    print(format_report(res))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {a.json}")
    return res


if __name__ == "__main__":
    main()
