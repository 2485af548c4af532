"""``python -m qkmlp.pretrained``: run the SmolLM2 analysis and store it as JSON.

Example (the chapter's stored file; about half an hour on one busy CPU core)::

    nice -n 5 python -m qkmlp.pretrained --out book/data/pretrained/smollm2.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from .runner import ALPHAS_ALL, ALPHAS_LAYER, run


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.pretrained", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--windows", type=int, default=8, help="held-out windows (default 8)")
    p.add_argument("--length", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; at most 2)")
    p.add_argument("--layers", default=None, help="comma-separated layers for the per-layer interventions")
    p.add_argument("--alphas-all", default=",".join(f"{a:g}" for a in ALPHAS_ALL))
    p.add_argument("--alphas-layer", default=",".join(f"{a:g}" for a in ALPHAS_LAYER))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.threads <= 2:
        p.error("--threads must be 1 or 2 (the project's machines are shared)")
    torch.set_num_threads(args.threads)
    layers = None if args.layers is None else [int(v) for v in args.layers.split(",")]
    command = "python -m qkmlp.pretrained " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    from .report import save_results

    result = run(n_windows=args.windows, length=args.length, batch_size=args.batch_size,
                 alphas_all=_floats(args.alphas_all), alphas_layer=_floats(args.alphas_layer),
                 layers=layers, progress=not args.no_progress, command=command)
    save_results(result, Path(args.out))
    print(f"wrote {args.out} ({result['meta']['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
