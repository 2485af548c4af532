"""How far each arm starts from the trained model, measured more than one way.

Chapter 11 matches its controls on one number: the start (before any step) on the
validation texts, averaged. This module measures every arm's start so that a match can
be checked on others:

- ``start``: the mean window loss on *each* evaluation text (the held-out texts played no
  part in the matching), and the validation mean;
- ``mlp_change``: per layer, the relative RMS change of the MLP's output on the validation
  windows, ‖f_arm − f‖ / ‖f‖ over every position of every window (Frobenius norms, f the
  trained MLP's output), two ways: ``local`` (the arm's layer and the trained one on the
  *same* input, what the trained model feeds that layer: the change the arm makes in that
  layer alone) and ``in_model`` (each model run as it is, so a layer's input carries the
  changes of the layers below it).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import torch

__all__ = ["mlp_outputs", "arm_distance", "distances", "write_distances"]


@torch.no_grad()
def mlp_outputs(model, ids: torch.Tensor, *, batch_size: int = 8) -> tuple[list, list, torch.Tensor]:
    """``(inputs, outputs, losses)``: what each decoder layer's MLP receives and returns on
    the windows ``ids`` (lists over layers of (n, L, d) tensors) and each window's mean NLL (n,)."""
    from ..heldout import check_ids, nll_from_hidden
    from ..surgery import decoder_layers

    check_ids(ids)
    layers = decoder_layers(model)
    ins = [[] for _ in layers]
    outs = [[] for _ in layers]

    def keep(i):
        def hook(module, args, output):
            ins[i].append(args[0].detach().clone())
            outs[i].append(output.detach().clone())
        return hook

    was = model.training
    model.eval()
    hooks = [layer.mlp.register_forward_hook(keep(i)) for i, layer in enumerate(layers)]
    losses = []
    try:
        for chunk in ids.split(batch_size):
            hidden = model.model(input_ids=chunk, use_cache=False).last_hidden_state
            losses.append(nll_from_hidden(model, hidden, chunk))
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    return [torch.cat(v) for v in ins], [torch.cat(v) for v in outs], torch.cat(losses)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ over all entries, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@torch.no_grad()
def arm_distance(model, data, arm: str, *, reference=None, eval_batch: int = 8) -> dict:
    """One arm's distance from ``model`` (the trained model, left untouched): ``start``
    (per text, held-out and validation, and ``validation_mean``), ``start_windows`` (per
    text, per window) and ``mlp_change`` (``local`` and ``in_model``, per layer).
    ``reference``: the trained model's :func:`mlp_outputs` per validation text (computed
    when not given)."""
    from .core import build_arm, evaluate

    if reference is None:
        reference = {n: mlp_outputs(model, ids, batch_size=eval_batch) for n, ids in data.validation.items()}
    m = copy.deepcopy(model)
    layers = build_arm(m, arm)
    for layer in layers:
        layer.requires_grad_(False)
    windows = evaluate(m, data.heldout, eval_batch)
    n_layers = len(layers)
    num_local, num_model = [0.0] * n_layers, [0.0] * n_layers
    den = [0.0] * n_layers
    for n, ids in data.validation.items():
        ins, outs, _ = reference[n]
        _, outs_m, losses = mlp_outputs(m, ids, batch_size=eval_batch)
        windows[n] = losses.tolist()
        for l, layer in enumerate(layers):
            local = layer(ins[l].to(next(layer.parameters()).dtype))
            num_local[l] += float((local.double() - outs[l].double()).pow(2).sum())
            num_model[l] += float((outs_m[l].double() - outs[l].double()).pow(2).sum())
            den[l] += float(outs[l].double().pow(2).sum())
    start = {n: sum(v) / len(v) for n, v in windows.items()}
    val = [start[n] for n in data.validation]
    return {"arm": arm, "start": start, "validation_mean": sum(val) / len(val), "start_windows": windows,
            "mlp_change": {"local": [(a / d) ** 0.5 for a, d in zip(num_local, den)],
                           "in_model": [(a / d) ** 0.5 for a, d in zip(num_model, den)]}}


def distances(model, data, arms, *, eval_batch: int = 8, log=None) -> dict:
    """{arm: :func:`arm_distance`} for each of ``arms``, sharing one reference pass."""
    t0 = time.perf_counter()
    reference = {n: mlp_outputs(model, ids, batch_size=eval_batch) for n, ids in data.validation.items()}
    out = {}
    for arm in arms:
        t = time.perf_counter()
        out[arm] = arm_distance(model, data, arm, reference=reference, eval_batch=eval_batch)
        if log:
            d = out[arm]
            log(f"{arm}: validation start {d['validation_mean']:.4f}, held-out "
                + ", ".join(f"{n} {d['start'][n]:.3f}" for n in data.heldout)
                + f"; MLP change (local) max {max(d['mlp_change']['local']):.3f} ({time.perf_counter() - t:.0f} s)")
    if log:
        log(f"distances of {len(out)} arms in {time.perf_counter() - t0:.0f} s")
    return out


def write_distances(grid, arms, path, *, command=None, log=None) -> Path:
    """:func:`distances` of ``arms`` on ``grid``'s model and windows, written with provenance
    to ``path`` (``{"meta", "arms": {arm: ...}}``)."""
    from ...runbase.provenance import IMPORT_GIT, machine, versions

    model, _, data = grid._base()
    c = grid.cfg
    t0 = time.perf_counter()
    found = distances(model, data, arms, eval_batch=c["eval_batch"], log=log)
    meta = {"command": command, **IMPORT_GIT, "run_key": grid.key, "model": grid.model_id,
            "validation_texts": list(c["validation_texts"]), "heldout_texts": list(c["heldout_texts"]),
            "n_windows": c["n_windows"], "seq_len": c["seq_len"], "versions": versions("transformers"),
            "machine": machine(), "wall_s": time.perf_counter() - t0,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "arms": found}, indent=1) + "\n")
    return path
