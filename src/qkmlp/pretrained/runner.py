"""The chapter's analysis of SmolLM2-135M, stored as JSON with provenance.

``python -m qkmlp.pretrained --out book/data/pretrained/smollm2.json`` runs :func:`run`:

1. greedy generations of a few prompts, by the original model and with every MLP
   replaced by :class:`~qkmlp.GatedMLP` (:func:`~qkmlp.pretrained.surgery.use_gated_mlps`),
   and the largest logit difference between the two in float32 and in float64;
2. the pair geometry of every layer (:mod:`qkmlp.pretrained.anatomy`) and the statistics
   of its real inputs on the held-out windows;
3. the held-out loss of every intervention: per layer (the other layers untouched) and
   in all layers at once, stored per window so that means and standard errors can be
   recomputed (:mod:`qkmlp.pretrained.report`).

The per-layer interventions reuse the residual stream recorded on the unchanged model
(:func:`~qkmlp.pretrained.heldout.tail_losses`): a change in layer l only reruns layers
l and later.
"""
from __future__ import annotations

import math
import os
import platform
import sys
import time
from typing import Optional, Sequence

import torch

from .. import __version__
from ..symmetry import relative_change
from .anatomy import alignment_bins, cos_histogram, input_statistics, pair_geometry, shuffled_pairs, summarise
from .heldout import heldout_windows, layer_inputs, pydoc_topics_text, tail_losses, window_losses
from .loading import GGUF_NAME, PACKAGE, file_sha256, gguf_path, load_smollm2
from .surgery import decoder_layers, gated_mlps, mlps_replaced, q4_steps, replace_mlps, variant, with_q4_noise

__all__ = ["PROMPTS", "ALPHAS_ALL", "ALPHAS_LAYER", "LAYER_KINDS", "ALL_KINDS", "run",
           "generations", "logit_check", "spearman"]

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Water boils at a temperature of")
#: α of the inverse scaling q → αq, k → k/α applied to all layers at once.
ALPHAS_ALL = tuple(sorted(s * 2.0 ** (k / 2) for s in (-1.0, 1.0) for k in range(-4, 5)))
#: α applied to one layer at a time.
ALPHAS_LAYER = (0.5, 2.0)
#: Interventions applied to one layer at a time (``rescale`` once per α of ALPHAS_LAYER).
LAYER_KINDS = ("none", "swap", "rescale", "identity", "linear", "symmetrized", "symmetric")
#: Interventions applied to every layer at once (``rescale`` once per α of ALPHAS_ALL).
ALL_KINDS = ("none", "swap", "rescale", "identity", "linear", "symmetrized", "symmetric")


def _expand(kinds, alphas):
    out = []
    for k in kinds:
        out += [(k, a) for a in alphas] if k == "rescale" else [(k, None)]
    return out


def _key(kind, alpha) -> str:
    return kind if alpha is None else f"rescale:{alpha:g}"


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors (no ties expected)."""
    if x.shape != y.shape or x.dim() != 1 or x.numel() < 3:
        raise ValueError("spearman needs two 1-D tensors of the same length >= 3")
    rx = x.double().argsort().argsort().double()
    ry = y.double().argsort().argsort().double()
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


@torch.no_grad()
def generations(model, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> list[dict]:
    """Greedy continuations: ``[{"prompt", "ids", "text"}]`` (new tokens only)."""
    out = []
    for p in prompts:
        enc = tokenizer(p, return_tensors="pt")
        ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)[0, enc["input_ids"].shape[1]:]
        out.append({"prompt": p, "ids": ids.tolist(), "text": tokenizer.decode(ids)})
    return out


@torch.no_grad()
def logit_check(model, ids: torch.Tensor) -> dict:
    """Logits of ``model`` as it is and with every MLP replaced by its GatedMLP.

    Returns the largest absolute difference, the largest absolute logit and whether the
    greedy (argmax) token agrees at every position; the model is left as it was.
    """
    ref = model(input_ids=ids, use_cache=False).logits
    with mlps_replaced(model, dict(enumerate(gated_mlps(model)))):
        new = model(input_ids=ids, use_cache=False).logits
    return {"dtype": str(ref.dtype).replace("torch.", ""),
            "max_abs_diff": float((new - ref).abs().max()), "max_abs_logit": float(ref.abs().max()),
            "argmax_agree": bool((new.argmax(-1) == ref.argmax(-1)).all())}


def _versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "gguf", "accelerate", "safetensors", "tokenizers", PACKAGE):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, file=sys.stderr, mininterval=5)


@torch.no_grad()
def run(*, n_windows: int = 8, length: int = 128, batch_size: int = 4,
        alphas_all: Sequence[float] = ALPHAS_ALL, alphas_layer: Sequence[float] = ALPHAS_LAYER,
        layer_kinds: Sequence[str] = LAYER_KINDS, all_kinds: Sequence[str] = ALL_KINDS,
        layers: Optional[Sequence[int]] = None, prompts: Sequence[str] = PROMPTS,
        max_new_tokens: int = 16, seed: int = 0, progress: bool = True, model=None,
        tokenizer=None, command: Optional[str] = None) -> dict:
    """Run the whole analysis and return it as a JSON-ready dict.

    ``layers`` restricts the per-layer interventions (default: all). ``model`` and
    ``tokenizer`` default to :func:`load_smollm2` (float32); the tests pass a tiny
    random Llama instead (the ``source`` entry is then ``None``).
    """
    from ..bench import machine_info

    start_time, start_cpu = time.perf_counter(), time.process_time()
    machine = machine_info("cpu")         # commit and date as the run starts
    if model is None:
        model, tokenizer = load_smollm2(torch.float32)
        path = gguf_path()
        source = {"package": PACKAGE, "version": _versions()[PACKAGE], "file": GGUF_NAME,
                  "sha256": file_sha256(path)}
    else:
        source = None
    model.eval()
    n_layers = len(decoder_layers(model))
    layers = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    result = {"meta": {}, "config": {
        "n_windows": n_windows, "length": length, "batch_size": batch_size,
        "alphas_all": list(alphas_all), "alphas_layer": list(alphas_layer),
        "layer_kinds": list(layer_kinds), "all_kinds": list(all_kinds), "layers": layers,
        "prompts": list(prompts), "max_new_tokens": max_new_tokens, "seed": seed}}
    result["model"] = {"n_layers": n_layers, "d_model": cfg.hidden_size, "d_hidden": cfg.intermediate_size,
                       "vocab_size": cfg.vocab_size, "hidden_act": cfg.hidden_act,
                       "n_parameters": sum(p.numel() for p in model.parameters())}

    # 1. the model is the real one, and the swap to GatedMLP changes nothing
    text = pydoc_topics_text()
    ids = heldout_windows(tokenizer, n_windows, length, text)
    from pydoc_data.topics import topics
    result["config"]["text"] = {"source": "pydoc_data.topics", "n_topics": len(topics), "n_chars": len(text),
                                "n_tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"])}
    original = generations(model, tokenizer, prompts, max_new_tokens)
    with mlps_replaced(model, dict(enumerate(gated_mlps(model)))):
        swapped_in = generations(model, tokenizer, prompts, max_new_tokens)
    result["generation"] = [{"prompt": o["prompt"], "original": o["text"], "gated": s["text"],
                             "same_ids": o["ids"] == s["ids"]} for o, s in zip(original, swapped_in)]
    check_ids = ids[:1]
    result["logits"] = {"float32": logit_check(model, check_ids)}
    model.double()
    try:
        result["logits"]["float64"] = logit_check(model, check_ids)
    finally:
        model.float()

    # 2. the anatomy, and the base pass that records every layer's input
    g = gated_mlps(model)
    originals = replace_mlps(model, dict(enumerate(g)))
    try:
        result["losses"] = losses = {"windows": ids.shape[0]}
        hf = []
        with mlps_replaced(model, originals):
            hf = window_losses(model, ids, batch_size=batch_size)
        losses["hf"] = hf.tolist()
        recorded = [layer_inputs(model, c, mlp_inputs=True) for c in ids.split(batch_size)]
        from .heldout import nll_from_hidden
        base = torch.cat([nll_from_hidden(model, h, c) for (h, _, _), c in zip(recorded, ids.split(batch_size))])
        losses["base"] = base.tolist()
        inputs = [[r[1][l] for r in recorded] for l in range(n_layers)]
        mlp_in = [torch.cat([r[2][l].reshape(-1, cfg.hidden_size) for r in recorded]) for l in range(n_layers)]
        del recorded

        anatomy, inp, pooled = [], [], {"cos": [], "corr_ab": [], "rel_peak": []}
        for l in range(n_layers):
            geo = pair_geometry(g[l])
            sh = shuffled_pairs(g[l], gen)
            st = input_statistics(g[l], mlp_in[l])
            rel_peak = st["peak_h"] / st["peak_h"].median()
            for name, v in (("cos", geo["cos"]), ("corr_ab", st["corr_ab"]), ("rel_peak", rel_peak)):
                pooled[name].append(v)
            top = st["peak_h"].argsort(descending=True)[:10]
            anatomy.append({
                "cos": summarise(geo["cos"]), "cos_hist": cos_histogram(geo["cos"]),
                "shuffled_cos": summarise(sh["cos"]), "shuffled_cos_hist": cos_histogram(sh["cos"]),
                "balance": summarise(geo["balance"]), "shuffled_balance": summarise(sh["balance"]),
                "norm_q": summarise(geo["norm_q"]), "norm_k": summarise(geo["norm_k"]),
                "frac_abs_cos_above": {str(t): float((geo["cos"].abs() > t).double().mean()) for t in (0.2, 0.5)},
                "shuffled_frac_abs_cos_above": {str(t): float((sh["cos"].abs() > t).double().mean())
                                                for t in (0.2, 0.5)},
            })
            inp.append({
                "a": st["a"], "b": st["b"], "frac_a_in_band": st["frac_a_in_band"],
                "nonlinear_share": st["nonlinear_share"], "corr_ab": summarise(st["corr_ab"]),
                "frac_abs_corr_ab_above": {str(t): float((st["corr_ab"].abs() > t).double().mean())
                                           for t in (0.5, 0.8)},
                "peak_h": summarise(st["peak_h"]), "rms_h": summarise(st["rms_h"]),
                "spearman_abs_cos_peak_h": spearman(geo["cos"].abs(), st["peak_h"]),
                "spearman_abs_corr_peak_h": spearman(st["corr_ab"].abs(), st["peak_h"]),
                "top_units": [{"unit": int(j), "peak_h": float(st["peak_h"][j]), "rel_peak": float(rel_peak[j]),
                               "cos": float(geo["cos"][j]), "corr_ab": float(st["corr_ab"][j]),
                               "balance": float(geo["balance"][j])} for j in top],
            })
        pooled = {k: torch.cat(v) for k, v in pooled.items()}
        result["alignment_bins"] = {
            "cos": alignment_bins(pooled["cos"].abs(), pooled["rel_peak"]),
            "corr_ab": alignment_bins(pooled["corr_ab"].abs(), pooled["rel_peak"]),
        }
        result["anatomy"], result["inputs"] = anatomy, inp

        # local change of each layer's output on its real inputs (no loss involved)
        local = []
        for l in range(n_layers):
            x = mlp_in[l]
            local.append({_key(k, a): relative_change(g[l], variant(g[l], k, a), x)
                          for k, a in _expand(layer_kinds, alphas_layer) if k != "none"})
        result["local_change"] = local
        del mlp_in

        # 3. interventions: one layer at a time, then all layers at once
        per_layer = _expand(layer_kinds, alphas_layer)
        every = _expand(all_kinds, alphas_all)
        bar = _progress(len(layers) * len(per_layer) + len(every) + 1, progress, "interventions")
        layer_losses = {_key(k, a): [None] * n_layers for k, a in per_layer}
        for l in layers:
            for k, a in per_layer:
                with mlps_replaced(model, {l: variant(g[l], k, a)}):
                    vals = [tail_losses(model, h, l, c) for h, c in zip(inputs[l], ids.split(batch_size))]
                layer_losses[_key(k, a)][l] = torch.cat(vals).tolist()
                bar.update(1)
        losses["layer"] = layer_losses
        all_losses = {}
        for k, a in every:
            with mlps_replaced(model, {l: variant(g[l], k, a) for l in range(n_layers)}):
                all_losses[_key(k, a)] = window_losses(model, ids, batch_size=batch_size).tolist()
            bar.update(1)
        # 4. the 4-bit grid, and one more rounding error of its size in every MLP
        noisy = [with_q4_noise(g[l], gen) for l in range(n_layers)]
        with mlps_replaced(model, dict(enumerate(noisy))):
            all_losses["q4_noise"] = window_losses(model, ids, batch_size=batch_size).tolist()
        bar.update(1)
        bar.close()
        losses["all"] = all_losses
        distinct, step_rel, noise_rel, dcos = 0, [], [], []
        for l in range(n_layers):
            for w in originals[l].gate_proj.weight, originals[l].up_proj.weight, originals[l].down_proj.weight:
                step, nd = q4_steps(w)
                distinct = max(distinct, int(nd.max()))
                step_rel.append(float(step.mean() / w.pow(2).mean().sqrt()))
            noise_rel.append(float((noisy[l].query - g[l].query).norm() / g[l].query.norm()))
            dcos.append(pair_geometry(noisy[l])["cos"] - pair_geometry(g[l])["cos"])
        result["quantisation"] = {
            "max_distinct_per_block": distinct, "mean_step_over_rms": sum(step_rel) / len(step_rel),
            "noise_rel_norm_query": sum(noise_rel) / len(noise_rel), "cos_change": summarise(torch.cat(dcos)),
        }
    finally:
        replace_mlps(model, originals)

    result["meta"] = {
        "command": command, "qkmlp_version": __version__, "source": source, "versions": _versions(),
        "machine": machine, "wall_s": time.perf_counter() - start_time,
        "cpu_s": time.process_time() - start_cpu,
    }
    return result
