"""What a wider language model would cost: seconds per training step at two model widths.

The gap-against-compute grids (``lm --size compute_*``) train the ``cpu`` model (d = 64).
Whether the gaps depend on the model's width as well as on its training length needs the
same grid at a second width; this module measures what one training step costs at each
width on this machine, so the chapter can say what that grid would take instead of
guessing. A step is what the training loop does per step (forward, cross-entropy,
backward, gradient clipping, AdamW update) on a batch of the stored configuration, with
random characters (the cost does not depend on the text). Widths are measured in
alternation (round-robin), so a change of load on a shared machine hits both alike; the
median over rounds is reported.

Command: ``python -m qkmlp.experiments.width --out book/data/experiments/width/lm_width_cost.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..costs import parameter_count
from .families import kv_budget, make_layer
from .lm import SIZES, VOCAB_SIZE, CharTransformer

__all__ = ["build_model", "step_timer", "measure", "main"]


def build_model(d: int, family: str = "gated1-silu", size: str = "cpu", seed: int = 0):
    """The ``size`` language model at width ``d`` (the feed-forward budget scaled with it:
    m_kv = 4d, as the stored model's 256 at d = 64) with ``family`` as every feed-forward
    block."""
    cfg = SIZES[size]
    if not (isinstance(d, int) and d > 0 and d % cfg["n_head"] == 0):
        raise ValueError(f"d must be a positive multiple of n_head = {cfg['n_head']}, got {d!r}")
    torch.manual_seed(seed)
    budget = kv_budget(d, d, 4 * d)
    ffns = [make_layer(family, d, d, budget) for _ in range(cfg["n_layer"])]
    return CharTransformer(VOCAB_SIZE, cfg["ctx"], d, cfg["n_head"], ffns)


def step_timer(d: int, family: str = "gated1-silu", size: str = "cpu", seed: int = 0):
    """A function ``run(n) -> seconds per step`` over n training steps of the model at
    width ``d``, and the model (for its parameter count)."""
    cfg = SIZES[size]
    model = build_model(d, family, size, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=cfg["weight_decay"])
    gen = torch.Generator().manual_seed(seed)
    B, ctx = cfg["batch_size"], cfg["ctx"]

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            w = torch.randint(0, VOCAB_SIZE, (B, ctx + 1), generator=gen)
            logits = model(w[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), w[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            opt.step()
        return (time.perf_counter() - t0) / n

    return run, model


def measure(widths: Sequence[int] = (64, 128), family: str = "gated1-silu", rounds: int = 7, steps: int = 40,
            warmup: int = 10, threads: int = 1) -> dict:
    """Median seconds per training step at each width, widths timed in alternation.

    Returns ``{"rows": [{"d", "m_kv", "params", "ffn_params", "s_per_step",
    "s_per_step_rounds"}], "ratio": {d: s_per_step / s_per_step of the first width}, ...}``.
    """
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"expected rounds >= 1, steps >= 1, warmup >= 0; got {rounds}, {steps}, {warmup}")
    torch.set_num_threads(threads)
    timers = {d: step_timer(d, family) for d in widths}
    for run, _ in timers.values():
        if warmup:
            run(warmup)
    per = {d: [] for d in widths}
    for _ in range(rounds):
        for d, (run, _) in timers.items():
            per[d].append(run(steps))
    rows = []
    for d, (_, model) in timers.items():
        rows.append({"d": d, "m_kv": 4 * d, "params": parameter_count(model),
                     "ffn_params": parameter_count(model.blocks[0].ffn), "s_per_step": statistics.median(per[d]),
                     "s_per_step_rounds": per[d]})
    base = rows[0]["s_per_step"]
    return {"family": family, "threads": threads, "rounds": rounds, "steps_per_round": steps, "rows": rows,
            "ratio": {r["d"]: r["s_per_step"] / base for r in rows}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.experiments.width", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="book/data/experiments/width/lm_width_cost.json")
    p.add_argument("--widths", default="64,128", help="comma-separated model widths d")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=40, help="steps per width and round")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from .. import __version__
    from ..runbase.provenance import machine, versions
    from .runner import IMPORT_COMMIT, IMPORT_DIRTY

    widths = [int(w) for w in args.widths.split(",")]
    t0 = time.perf_counter()
    res = measure(widths, rounds=args.rounds, steps=args.steps, threads=args.threads)
    res["meta"] = {"command": " ".join(["python -m qkmlp.experiments.width", *(argv if argv is not None else
                                                                               sys.argv[1:])]),
                   "qkmlp_version": __version__, "git_commit": IMPORT_COMMIT,
                   "git_uncommitted_changes": IMPORT_DIRTY, "versions": versions("scipy", "scikit-learn"),
                   "hardware": machine("cpu"), "python": platform.python_version(),
                   "wall_s": round(time.perf_counter() - t0, 1),
                   "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    for r in res["rows"]:
        print(f"d = {r['d']}: {1000 * r['s_per_step']:.1f} ms per step, {r['params']} parameters")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
