"""Reading results: plain-text tables of a run (chapter 10 draws the figures: :mod:`qkmlp.book.ch10_cost`)."""
from __future__ import annotations

from .memory import stack_ratios
from .roofline import ROOFLINE_KINDS, roofline_rows

__all__ = ["format_report", "format_paired"]


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
    """Plain-text tables of a :func:`~qkmlp.bench.suites.run` result."""
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
