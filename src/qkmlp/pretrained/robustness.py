"""Two readings of chapter 9 that its stored analysis leaves open, measured.

1. **Context length** (:func:`context_costs`). Changing every MLP at once (removing them,
   exchanging q and k, α = −1) costs about the same on 128-token windows; is that a
   property of the model, or of short windows? Each long window of a text is scored three
   ways: its first ``short`` tokens, its last ``short`` tokens (with ``long − short``
   tokens of context before them), and the same last tokens as a fresh window (the BOS
   token, then those tokens).
2. **Random sets** (:func:`random_sets`). The units closest to q_j = k_j were compared
   with *one* random set of the same size; here with ``draws`` random sets, so the
   comparison's spread over the random draw is known.

``python -m qkmlp.pretrained.robustness --out book/data/pretrained/robustness.json`` runs
both on SmolLM2-135M (the stored file took 400 s of wall time, one torch thread on a
two-core AMD EPYC).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..runbase.provenance import IMPORT_GIT, machine, versions
from ..runbase.records import save_record
from .heldout import heldout_windows, window_losses
from .surgery import gated_mlps, mlps_replaced, variant
from .units import pair_distance, partially_swapped

__all__ = ["KINDS", "token_losses", "context_costs", "random_sets", "run", "main"]

#: The changes made in every layer at once: (results key, variant kind, α).
KINDS = (("none", "none", None), ("swap", "swap", None), ("rescale:-1", "rescale", -1.0))


@torch.no_grad()
def token_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """Next-token NLL at every position: (n, L) ids -> (n, L − 1) float64 (entry t scores
    token t + 1)."""
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    return nll.reshape(ids.shape[0], -1).double()


def _scores(model, long_ids: torch.Tensor, short: int, bos: int) -> dict:
    """Mean NLL per window of the first ``short`` targets, the last ``short`` targets in
    context, and the same last targets as a fresh window."""
    per = token_losses(model, long_ids)                     # (n, L − 1): targets 1 … L − 1
    fresh_ids = torch.cat([torch.full((long_ids.shape[0], 1), bos), long_ids[:, -short:]], dim=1)
    fresh = token_losses(model, fresh_ids)                  # targets: the last ``short`` tokens
    return {"first": per[:, :short].mean(1).tolist(), "last_in_context": per[:, -short:].mean(1).tolist(),
            "last_fresh": fresh.mean(1).tolist()}


@torch.no_grad()
def context_costs(model, tokenizer, text: str, *, n_windows: int = 4, long: int = 512, short: int = 128) -> dict:
    """Per window, the three scores of the unchanged model and of every change of
    :data:`KINDS` made in all layers at once (``{"base": scores, "kinds": {key: scores}}``)."""
    if not 2 <= short < long:
        raise ValueError(f"need 2 <= short < long, got short={short}, long={long}")
    bos = tokenizer.bos_token_id
    ids = heldout_windows(tokenizer, n_windows, long, text, bos=True)
    g = gated_mlps(model)
    out = {"n_windows": n_windows, "long": long, "short": short, "bos_token": tokenizer.convert_ids_to_tokens(bos)}
    with mlps_replaced(model, dict(enumerate(g))):
        out["base"] = _scores(model, ids, short, bos)
    out["kinds"] = {}
    for name, kind, alpha in KINDS:
        with mlps_replaced(model, {l: variant(layer, kind, alpha) for l, layer in enumerate(g)}):
            out["kinds"][name] = _scores(model, ids, short, bos)
    return out


@torch.no_grad()
def random_sets(model, ids: torch.Tensor, layers: Sequence[int], *, share: float = 0.05, draws: int = 8,
                seed: int = 0, batch_size: int = 4) -> dict:
    """Per layer: window losses with the exchange q_j ↔ k_j in the ``share`` of units with
    the smallest pair distance d_j, and in ``draws`` random sets of the same size (drawn
    from a generator seeded with ``seed``), beside the unchanged model's."""
    g = gated_mlps(model)
    gen = torch.Generator().manual_seed(seed)
    out = {"share": share, "draws": draws, "seed": seed, "layers": {}}
    with mlps_replaced(model, dict(enumerate(g))):
        out["base"] = window_losses(model, ids, batch_size=batch_size).tolist()
        for l in layers:
            m = g[l].d_hidden
            n = max(1, round(share * m))
            sets = {"closest": pair_distance(g[l]).argsort()[:n]}
            sets.update({f"random_{i}": torch.randperm(m, generator=gen)[:n] for i in range(draws)})
            row = {}
            for name, units in sets.items():
                with mlps_replaced(model, {l: partially_swapped(g[l], units)}):
                    row[name] = window_losses(model, ids, batch_size=batch_size).tolist()
            out["layers"][int(l)] = row
    return out


def run(model, tokenizer, texts: dict, *, main_text: str, unit_layers: Sequence[int], n_windows: int = 8,
        length: int = 128, context_windows: int = 4, long: int = 512, draws: int = 8, command=None) -> dict:
    """Both checks; ``texts`` maps names to characters (the first check runs on each, the
    second on ``main_text``'s ``n_windows`` windows of ``length`` tokens, as the stored
    analysis did)."""
    t0 = time.perf_counter()
    out = {"context": {}, "meta": {"command": command, **IMPORT_GIT, "versions": versions("transformers"),
                                   "machine": machine()}}
    for name, s in texts.items():
        out["context"][name] = context_costs(model, tokenizer, s, n_windows=context_windows, long=long,
                                             short=length)
    ids = heldout_windows(tokenizer, n_windows, length, texts[main_text], bos=True)
    out["random_sets"] = {"text": main_text, **random_sets(model, ids, unit_layers, draws=draws)}
    out["meta"]["wall_s"] = time.perf_counter() - t0
    out["meta"]["date_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.pretrained.robustness", description=__doc__.split("\n\n")[0],
                                epilog="Example: python -m qkmlp.pretrained.robustness "
                                       "--out book/data/pretrained/robustness.json")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--draws", type=int, default=8, help="random sets per layer (default 8)")
    p.add_argument("--long", type=int, default=512, help="tokens of a long window (default 512)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import json

    from .loading import load_smollm2
    from .texts import text

    stored = json.loads(Path("book/data/pretrained/smollm2.json").read_text())["config"]
    model, tok = load_smollm2()
    names = list(stored["texts"])
    command = "python -m qkmlp.pretrained.robustness " + shlex.join(sys.argv[1:] if argv is None else argv)
    res = run(model, tok, {n: text(n) for n in names}, main_text=stored["main_text"],
              unit_layers=stored["unit_layers"], n_windows=stored["n_windows"], length=stored["length"],
              long=args.long, draws=args.draws, command=command)
    save_record(args.out, res, indent=1)
    print(f"wrote {args.out} ({res['meta']['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
