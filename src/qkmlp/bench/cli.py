"""The command line, ``python -m qkmlp.bench``, and where it stores its runs."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys

import torch

from .memory import set_allocator, stack_step_peak
from .report import format_report
from .suites import headline_sizes, run

__all__ = ["main", "store_path"]


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


def main(argv=None) -> dict:
    """``python -m qkmlp.bench [options]`` (``--help`` lists them): run the suites, print
    :func:`~qkmlp.bench.report.format_report` and, with ``--json`` or ``--store``, write
    the result with its provenance. ``argv``: the arguments (default ``sys.argv[1:]``).
    Returns the result dict (with ``--stack-child``, the one record of that child)."""
    p = argparse.ArgumentParser(prog="python -m qkmlp.bench",
                                description="Benchmarks of the factored layers against the GEMM floor "
                                            "and a Llama-style MLP.")
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
