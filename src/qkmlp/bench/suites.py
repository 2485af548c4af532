"""The suites: headline, rank and size, and :func:`run`, which runs the chosen ones
(the stack suite is :func:`~qkmlp.bench.memory.bench_stack`, the roofline
:func:`~qkmlp.bench.roofline.bench_roofline`)."""
from __future__ import annotations

from typing import Optional

import torch

from ..layers import BilinearAttentionMLP, GatedMLP, SymmetricBilinearMLP
from .machine import loadavg, machine_info
from .memory import bench_stack, saved_bytes
from .ops import counts_only
from .references import LlamaMLP, floor_gemms, liger_swiglu
from .roofline import bench_roofline
from .stats import TARGETS, paired_ratio, verdict
from .timing import fwd_bwd, time_interleaved

__all__ = ["bench_headline", "bench_rank", "bench_size", "headline_sizes", "run"]


LAYERS = ("gated_mlp", "symmetric_mlp")


def bench_headline(d: int = 512, m: int = 1376, n: int = 2048, *, dtype=torch.float32, device="cpu",
                   reps: int = 21, seed: int = 0, compile_backend: Optional[str] = None) -> dict:
    """Floor, Llama-style MLP, (Liger), GatedMLP and SymmetricBilinearMLP at rank 1.

    With ``compile_backend`` (e.g. "inductor") every module candidate runs as
    ``torch.compile(module, fullgraph=True, backend=compile_backend)``, compiled before the
    timing starts; the bare-GEMM floor stays eager.
    """
    device = torch.device(device)
    load_start = loadavg()
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

    floor, floor_fwd_bwd = floor_gemms(x, gy, h, ga, gb, w_q, w_k, v)

    mods = {"llama_mlp": (llama, list(llama.parameters())),
            "llama_mlp_copy": (llama_copy, list(llama_copy.parameters())),
            "gated_mlp": (gated, list(gated.parameters())),
            "symmetric_mlp": (sym, list(sym.parameters()))}
    layers = [k for k in LAYERS if k in mods]
    fwd = {"floor_gemms": floor}
    liger = liger_swiglu(llama) if device.type == "cuda" else None
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
    fb.update({k: fwd_bwd(mod, xg, ps, gy) for k, (mod, ps) in mods.items()})
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
            counts[k] = {"forward": counts_only(lambda mod=mod: mod(x), no_grad=True),
                         "forward_backward": counts_only(fwd_bwd(mod, xg, ps, gy))}
            if n * m > m * d:          # passes over activations only (larger than any weight)
                counts[k]["forward_activations"] = counts_only(lambda mod=mod: mod(x), True, n * m)
                counts[k]["forward_backward_activations"] = counts_only(fwd_bwd(mod, xg, ps, gy),
                                                                         min_numel=n * m)
    return {
        "op_counts": counts,
        "config": {"d": d, "m": m, "n": n, "dtype": str(dtype).replace("torch.", ""), "device": str(device),
                   "reps_fwd": reps, "reps_fwd_bwd": reps, "compile_backend": compile_backend},
        "forward": t_fwd, "forward_backward": t_fb, "saved_bytes": mem, "ratios": ratios,
        "ratios_of_minima": ratios_of_minima, "paired_ratios": paired, "verdicts": verdicts,
        "loadavg_start": load_start, "loadavg_end": loadavg(),
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


def headline_sizes(device_type: str = "cpu") -> dict:
    """Default headline sizes and dtype: CPU d = 512, m = 1376, N = 2048 in float32; CUDA
    the Llama-7B MLP, d = 4096, m = 11008, N in (1, 128, 2048, 8192), bfloat16."""
    if device_type == "cuda":
        return {"d": 4096, "m": 11008, "ns": (1, 128, 2048, 8192), "dtype": torch.bfloat16}
    if device_type == "cpu":
        return {"d": 512, "m": 1376, "ns": (2048,), "dtype": torch.float32}
    raise ValueError(f"device type must be cpu or cuda, got {device_type!r}")


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
