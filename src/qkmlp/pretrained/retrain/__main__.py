"""``python -m qkmlp.pretrained.retrain``: run (or resume) the retraining grid, write its results.

Each finished run is written at once as its own record file (``--records``); the
results file (``--out``) is assembled from the records at the end, or at any time with
``--assemble`` (nothing is trained then; ``--allow-missing`` writes a partial file).
``--match ARM ...`` trains nothing either: it finds, on the validation texts, the fraction of
swapped units whose control starts as far away as each symmetric arm and writes it to
``book/data/pretrained/retrain_matching.json`` (chapter 11's distance-matched controls, then
run as ``--arms swapped-f0.xxx``). ``--unit-search`` trains nothing: it finds the units whose
exchange alone moves the validation start most (``retrain_unit_search.json``); ``--match ARM
--units-from that file`` matches a control that exchanges them as well
(``swapped-f0.xxx+L<layer>U<unit>``). ``--distances ARM ...`` trains nothing: every arm's start
on each text and the per-layer change of its MLP outputs (``retrain_distances.json``).
``--dry-run`` lists the jobs (stored or to run) and trains nothing.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import torch

_BOOK = Path("book/data/pretrained")


def _parse_part(s: str) -> tuple:
    try:
        k, n = (int(v) for v in s.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part must look like k/n (e.g. 1/2), got {s!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--part k/n needs 1 <= k <= n, got {s!r}")
    return k, n


def smollm2_grid(cfg: dict, records: Path, checkpoints, part, progress: bool, log, device=None):
    """A :class:`~qkmlp.pretrained.retrain.grid.Grid` over SmolLM2-135M and the pinned texts,
    on ``device`` (default CPU; another device is part of the model's id, so its runs get
    records of their own)."""
    from ..loading import GGUF_NAME, PACKAGE, file_sha256, gguf_path, load_smollm2
    from ..texts import sha256_of, text
    from .grid import Grid

    names = cfg["train_texts"] + cfg["validation_texts"] + cfg["heldout_texts"]
    texts = {n: text(n) for n in names}                     # checked against the pins
    dtype = getattr(torch, cfg["dtype"])
    model_id = f"{PACKAGE}/{GGUF_NAME}@sha256:{file_sha256(gguf_path())}/{cfg['dtype']}"
    if device is not None and torch.device(device).type != "cpu":
        model_id += f"@{torch.device(device).type}"
    return Grid(cfg, lambda: load_smollm2(dtype, device=device), texts, model_id=model_id,
                texts_sha={n: sha256_of(s) for n, s in texts.items()}, records=records,
                checkpoints=checkpoints, part=part, progress=progress, log=log)


def main(argv=None) -> int:
    from ..loading import DTYPES, cache_root, check_device
    from .grid import SIZES, assemble, config, save

    p = argparse.ArgumentParser(prog="python -m qkmlp.pretrained.retrain", description=__doc__.split("\n")[0])
    p.add_argument("--size", default="default", choices=sorted(SIZES), help="the configuration (default: the book's)")
    p.add_argument("--out", type=Path, help="results file (default: book/data/pretrained/retrain.json for the "
                   "default size, else the cache folder)")
    p.add_argument("--records", type=Path, help="folder of per-run records (default: "
                   "book/data/pretrained/retrain_runs for the default size, else the cache folder)")
    p.add_argument("--checkpoints", type=Path, help="folder for checkpoints of runs in progress "
                   "(default: ~/.cache/qkmlp/retrain/checkpoints)")
    p.add_argument("--arms", nargs="+", help="run only these arms (the control is always kept); swapped-f0.xxx is "
                   "the control with q and k exchanged in that fraction of its units")
    p.add_argument("--match", nargs="+", metavar="ARM", help="train nothing: find the fraction f of swapped "
                   "units whose start matches each ARM's on the validation texts, write --matching")
    p.add_argument("--matching", type=Path, default=_BOOK / "retrain_matching.json",
                   help="where --match writes (default: %(default)s)")
    p.add_argument("--units-from", type=Path, metavar="SEARCH", help="with --match: exchange, in every run of the "
                   "control, the units selected by this --unit-search file")
    p.add_argument("--refine", type=int, default=0, metavar="N", help="with --match: when the closest start is more "
                   "than --refine-above nats from the target, also evaluate the N thousandths either side")
    p.add_argument("--refine-above", type=float, default=0.05, help="see --refine (default: %(default)s nats)")
    p.add_argument("--unit-search", action="store_true", help="train nothing: find the units whose exchange moves "
                   "the validation start most, write --unit-search-out")
    p.add_argument("--unit-search-out", type=Path, default=_BOOK / "retrain_unit_search.json",
                   help="where --unit-search writes (default: %(default)s)")
    p.add_argument("--restore-in", metavar="ARM", help="with --unit-search: search instead, in ARM's model "
                   "(symmetric: sigma(ab)), for the units whose return to the gated form lowers its start most")
    p.add_argument("--next-to", metavar="CONTROL", help="with --unit-search: search instead, in CONTROL's model "
                   "(swapped-f0.xxx), for the units it leaves gated whose exchange as well moves its start most")
    p.add_argument("--top", type=int, default=12, help="--unit-search: units of each screening ranking priced "
                   "exactly (default: %(default)s)")
    p.add_argument("--distances", nargs="+", metavar="ARM", help="train nothing: each ARM's start on every text "
                   "and per-layer MLP output change, write --distances-out")
    p.add_argument("--distances-out", type=Path, default=_BOOK / "retrain_distances.json",
                   help="where --distances writes (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="list this grid's jobs (stored or not) and train nothing")
    p.add_argument("--seeds", nargs="+", type=int, help="evaluation seeds (default: the config's)")
    p.add_argument("--part", type=_parse_part, default=(1, 1), help="k/n: this process's share of each phase")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--assemble", action="store_true", help="only assemble the results file from the records")
    p.add_argument("--allow-missing", action="store_true", help="assemble even if some main runs are missing")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="the weights' dtype (default: the config's, float32; "
                   "another dtype is another configuration, with records of its own)")
    p.add_argument("--device", help="cpu (default), cuda, cuda:N or mps: where the model trains (checked at once)")
    args = p.parse_args(argv)
    try:
        check_device(args.device)
    except (ValueError, RuntimeError) as e:
        p.error(f"--device: {e}")

    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    overrides = {}
    if args.seeds:
        overrides["seeds"] = args.seeds
    if args.dtype:
        overrides["dtype"] = args.dtype
    cfg = config(args.size, **overrides)
    if args.arms:
        keep = set(args.arms) | {"gated"}
        cfg["arm_blocks"] = [[a for a in b if a in keep] for b in cfg["arm_blocks"]]
        listed = {a for b in cfg["arm_blocks"] for a in b}
        cfg["arm_blocks"] = [b for b in cfg["arm_blocks"] if b] + [[a for a in args.arms if a not in listed]]
        cfg["arm_blocks"] = [b for b in cfg["arm_blocks"] if b]
        cfg = config(args.size, **{**overrides, "arm_blocks": cfg["arm_blocks"]})
    here = cache_root() / "retrain"
    records = args.records or (_BOOK / "retrain_runs" if args.size == "default" else here / f"{args.size}_runs")
    out = args.out or (_BOOK / "retrain.json" if args.size == "default" else here / f"{args.size}.json")
    checkpoints = args.checkpoints or here / "checkpoints"

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    command = "python -m qkmlp.pretrained.retrain " + shlex.join(sys.argv[1:] if argv is None else argv)
    grid = smollm2_grid(cfg, records, checkpoints, args.part, not args.no_progress, log, device=args.device)
    log(f"threads {torch.get_num_threads()}, {cfg['dtype']} on {args.device or 'cpu'}, run key {grid.key}, "
        f"records in {records}")
    if args.unit_search:
        from .unitsearch import write_unit_search
        log(f"wrote {write_unit_search(grid, args.unit_search_out, top=args.top, restore_in=args.restore_in, next_to=args.next_to, command=command, log=log)}")
        return 0
    if args.match:
        from .matching import write_matching
        units = ()
        if args.units_from is not None:
            import json
            units = [tuple(u) for u in json.loads(args.units_from.read_text())["search"]["selected"]]
            log(f"the control exchanges as well: {units} (from {args.units_from})")
        log(f"wrote {write_matching(grid, args.match, args.matching, units=units, units_from=args.units_from, refine=args.refine, refine_above=args.refine_above, command=command, log=log)}")
        return 0
    if args.distances:
        from .distance import write_distances
        log(f"wrote {write_distances(grid, args.distances, args.distances_out, command=command, log=log)}")
        return 0
    if args.dry_run:
        choice, _ = grid.tune(read_only=True)
        jobs = grid.main_jobs(choice["lr"])
        k, n = args.part
        log(f"dry run: rate {choice['lr']:g} (tuned), part {k}/{n}, {len(jobs)} main jobs:")
        for i, job in enumerate(jobs):
            path = grid.path(*job)
            state = "stored" if path.exists() else ("to run, this part" if i % n == k - 1 else "to run, another part")
            log(f"  {path.name}: {state}")
        return 0
    if not args.assemble:
        grid.run()
        if grid.computed:
            log("new record files (commit them):\n  git add " + " \\\n    ".join(grid.computed))
    if args.part[0] == 1 or args.assemble:
        results = assemble(grid, command=command, allow_missing=args.allow_missing)
        log(f"wrote {save(results, out)} ({len(results['runs'])} runs, {len(results['meta']['missing'])} missing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
