"""Command line: ``python -m qkmlp.experiments --task all`` (or one task, e.g. ``--task lm``).

Writes one JSON file per task into ``--out`` (default book/data/experiments/; a size other
than the default adds it to the name: ``lm_excerpt.json``). Long grids: ``--cache DIR``
keeps one record per finished run, so an interrupted grid resumes where it stopped, and
``--part k/n`` runs the k-th of n interleaved shares of the jobs (start n processes with
the same ``--cache``; part 1 waits for the others and writes the file). Under torchrun
(``torchrun --nproc_per_node N -m qkmlp.experiments ...``) the ranks share the jobs and
rank 0 writes the file (:mod:`.dist`).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

from . import dist as _dist
from .runner import run_grid, save_results
from .tasks import TASKS

_PART = re.compile(r"^(\d+)/(\d+)$")


def results_name(task: str, size: str) -> str:
    return f"{task}.json" if size == "default" else f"{task}_{size}.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.experiments", description=__doc__.split("\n")[0])
    p.add_argument("--task", default="all", help=f"all, or one or more (comma-separated) of {', '.join(TASKS)}")
    p.add_argument("--size", default=None,
                   help="a task's config: default (the stored grid), quick (a smoke test), and for lm also "
                        "excerpt (the committed excerpt), long (a ten-times budget check), long_all (every family at "
                        "that length, tuned), replicate (SwiGLU against its symmetrised control at that "
                        "length, ten new seeds), compute_1500 / compute_6000 / compute_24000 (four families at "
                        "three step budgets, the gap against compute), compute_24000_twenty (the 24,000-step grid on "
                        "twenty seeds, 20-39), stdlib_6000 (SwiGLU, its symmetrised control and the key-value ReLU MLP at "
                        "6,000 steps on the second corpus, Python's standard-library source), compute_24000_p1_look1 / "
                        "compute_24000_p1_look2 (SwiGLU against its symmetrised control at 24,000 steps on fresh "
                        "seeds 40-59 / 40-79, the group-sequential test's two looks) and gpu (a larger model)")
    p.add_argument("--quick", action="store_true", help="the same as --size quick")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:0, ...)")
    p.add_argument("--seeds", type=int, default=None, help="number of evaluation seeds (default: the config's)")
    p.add_argument("--out", default="book/data/experiments", help="folder for the JSON results")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    p.add_argument("--cache", default=None, help="folder of per-run records (resume; shared by --part)")
    p.add_argument("--part", default=None, help="k/n: run the k-th of n shares of the jobs (needs --cache)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)

    tasks = list(TASKS) if args.task == "all" else args.task.split(",")
    for name in tasks:
        if name not in TASKS:
            p.error(f"unknown task {name!r}; expected all or one of {', '.join(TASKS)}")
    if args.seeds is not None and args.seeds < 1:
        p.error(f"--seeds must be >= 1 (the number of evaluation seeds), got {args.seeds}")
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    size = "quick" if args.quick else args.size
    if size is not None:
        for name in tasks:
            if size not in TASKS[name].sizes:
                p.error(f"task {name!r} has sizes {', '.join(TASKS[name].sizes)}; got --size {size}")
    rank, world = 0, 1
    if args.part is not None:
        m = _PART.match(args.part)
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            p.error(f"--part must be k/n with 1 <= k <= n, got {args.part!r}")
        if args.cache is None:
            p.error("--part needs --cache (the folder the parts share)")
        if _dist.launched_by_torchrun():
            p.error("--part and torchrun are two ways to shard a grid; use one")
        rank, world = int(m.group(1)) - 1, int(m.group(2))
    torch.set_num_threads(args.threads)
    group = None
    device = args.device
    if args.part is None:
        rank, world, group, device = _dist.init(args.device)

    from .corpus import CorpusMissingError

    t0 = time.perf_counter()
    try:
        for name in tasks:
            seeds = None if args.seeds is None else range(args.seeds)
            res = run_grid(name, seeds=seeds, device=device, size=size, progress=not args.no_progress,
                           cache=Path(args.cache) if args.cache else None, rank=rank, world=world, dist_group=group)
            if res is None:
                print(f"{name}: share {rank + 1}/{world} done", flush=True)
                continue
            argv_used = argv if argv is not None else sys.argv[1:]
            res["meta"]["command"] = " ".join(["python -m qkmlp.experiments", *argv_used])
            if group is not None:
                res["meta"]["command"] = f"torchrun --nproc_per_node ... (world {world}) -m qkmlp.experiments " \
                                         + " ".join(argv_used)
            path = save_results(res, Path(args.out) / results_name(name, res["meta"]["size"]))
            print(f"{name}: {len(res['runs'])} runs (+{len(res['tune_runs'])} tuning) in "
                  f"{res['meta']['wall_s']:.1f} s -> {path}", flush=True)
    except CorpusMissingError as e:
        print(f"python -m qkmlp.experiments: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if group is not None:
            _dist.finish()
    if rank == 0:
        print(f"total wall time {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
