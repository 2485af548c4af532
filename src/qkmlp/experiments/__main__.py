"""Command line: ``python -m qkmlp.experiments --task all --device cpu``.

Writes one JSON file per task into ``--out`` (default book/data/experiments/).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from .runner import run_grid, save_results
from .tasks import TASKS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.experiments", description=__doc__)
    p.add_argument("--task", default="all", choices=["all", *TASKS], help="which task's grid to run")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:0, ...)")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds per cell (0 .. n-1)")
    p.add_argument("--out", default="book/data/experiments", help="folder for the JSON results")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    p.add_argument("--quick", action="store_true", help="tiny configs (for smoke tests)")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    torch.set_num_threads(args.threads)
    tasks = list(TASKS) if args.task == "all" else [args.task]
    t0 = time.perf_counter()
    for name in tasks:
        res = run_grid(name, seeds=range(args.seeds), device=args.device, quick=args.quick)
        res["meta"]["command"] = " ".join(["python -m qkmlp.experiments", *(argv if argv is not None else sys.argv[1:])])
        path = save_results(res, Path(args.out) / f"{name}.json")
        print(f"{name}: {len(res['runs'])} runs in {res['meta']['wall_s']:.1f} s -> {path}", flush=True)
    print(f"total wall time {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
