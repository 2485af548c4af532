"""The chapter's analysis of a gated language model, stored as JSON with provenance.

``python -m qkmlp.pretrained --out book/data/pretrained/smollm2.json`` runs :func:`run`
on SmolLM2-135M (any other local checkpoint with ``--model``):

1. greedy generations of a few prompts, by the original model and with every MLP
   replaced by :class:`~qkmlp.GatedMLP`, and the largest logit difference between the
   two in float32 and in float64 (:func:`model_part`);
2. the weights: the pair geometry of every layer, the weight-space probes of the gate's
   bias and the up/down gauge (:mod:`~qkmlp.pretrained.probes`), and the 4-bit grid;
3. on each held-out text (:mod:`~qkmlp.pretrained.texts`, each pinned by the SHA-256 of
   its characters), the jobs of :mod:`~qkmlp.pretrained.textrun`: the statistics of every
   MLP's real inputs with position 0 kept apart, the size of every intervention, its
   held-out loss per layer and in all layers at once, and the per-unit exchange.

Every loss is stored per window, so means and standard errors can be recomputed
(:mod:`qkmlp.pretrained.report`). The jobs are independent; ``jobs`` > 1 runs them in
that many worker processes (one torch thread each), each loading the model itself.
"""
from __future__ import annotations

import hashlib
import sys
import time
from typing import Mapping, Optional, Sequence, Union

import torch

from .. import __version__
from ..runbase.provenance import run_machine, versions
from ..runbase.records import load_record, save_record
from .anatomy import cos_histogram, pair_geometry, shuffled_pairs, summarise
from .heldout import heldout_windows
from .probes import gauge_statistics, weight_probes
from .surgery import (Q4_BLOCK, declared_activation, decoder_layers, gated_mlps, mlps_replaced, q4_steps,
                      with_q4_noise)
from .textrun import expand, key, layer_part, merge, prepare, spearman, unit_part

__all__ = ["PROMPTS", "TEXTS", "ALPHAS_ALL", "ALPHAS_LAYER", "TOWARD_SWAP", "LAYER_KINDS", "ALL_KINDS", "OTHER_PLAN",
           "run", "model_part", "generations", "logit_check", "spearman", "key", "default_unit_layers", "q4_grid"]

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Water boils at a temperature of")
#: The held-out texts of the stored analysis (names of :data:`qkmlp.pretrained.texts.TEXTS`):
#: Python's documentation, Shakespeare's test plays, Python source. The first is the main one.
TEXTS = ("pydoc_topics", "shakespeare_test", "python_test")
#: α of the inverse scaling q → αq, k → k/α applied to all layers at once.
ALPHAS_ALL = tuple(sorted(s * 2.0 ** (k / 2) for s in (-1.0, 1.0) for k in range(-4, 5)))
#: α applied to one layer at a time.
ALPHAS_LAYER = (-2.0, -1.0, -0.5, 0.5, 2.0)
#: t of the path (1 − t)·layer + t·exchange (t = ½ is the symmetrised layer, 1 the exchange).
TOWARD_SWAP = (0.25,)
#: Interventions applied to one layer at a time (main text; ``rescale`` once per α of
#: ALPHAS_LAYER, ``toward_swap`` once per t of TOWARD_SWAP) and to every layer at once.
LAYER_KINDS = ("none", "swap", "toward_swap", "symmetrized", "symmetric", "rescale")
ALL_KINDS = ("none", "swap", "toward_swap", "symmetrized", "symmetric", "identity", "linear", "rescale")
#: The smaller plan of the other texts (to fit a shared CPU): per layer the removal, the
#: exchange and α = −1, 2; in all layers every form and α = ±½, ±1, ±2.
OTHER_PLAN = {"layer_kinds": ["none", "swap", "rescale"], "alphas_layer": [-1.0, 2.0],
              "toward_swap": [], "all_kinds": ["none", "swap", "symmetrized", "symmetric", "identity", "linear",
                                               "rescale"],
              "alphas_all": [-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], "unit_groups": 0, "unit_singles": 0}


def default_unit_layers(n_layers: int) -> list[int]:
    """The layers of the per-unit analysis: a quarter, half and three quarters deep."""
    return sorted({n_layers // 4, n_layers // 2, (3 * n_layers) // 4})


@torch.no_grad()
def generations(model, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> list[dict]:
    """Greedy continuations: ``[{"prompt", "ids", "text"}]`` (new tokens only)."""
    from .heldout import input_device

    out = []
    for p in prompts:
        enc = {k: v.to(input_device(model)) for k, v in tokenizer(p, return_tensors="pt").items()}
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
    from .heldout import input_device

    ids = ids.to(input_device(model))
    ref = model(input_ids=ids, use_cache=False).logits
    with mlps_replaced(model, dict(enumerate(gated_mlps(model)))):
        new = model(input_ids=ids, use_cache=False).logits
    return {"dtype": str(ref.dtype).replace("torch.", ""),
            "max_abs_diff": float((new - ref).abs().max()), "max_abs_logit": float(ref.abs().max()),
            "argmax_agree": bool((new.argmax(-1) == ref.argmax(-1)).all())}


def _weights(g, gen) -> list[dict]:
    out = []
    for layer in g:
        geo = pair_geometry(layer)
        sh = shuffled_pairs(layer, gen)
        out.append({
            "cos": summarise(geo["cos"]), "cos_hist": cos_histogram(geo["cos"]),
            "shuffled_cos": summarise(sh["cos"]), "shuffled_cos_hist": cos_histogram(sh["cos"]),
            "shuffled_balance": summarise(sh["balance"]),
            "frac_abs_cos_above": {str(t): float((geo["cos"].abs() > t).double().mean()) for t in (0.2, 0.5)},
            "shuffled_frac_abs_cos_above": {str(t): float((sh["cos"].abs() > t).double().mean())
                                            for t in (0.2, 0.5)},
            "probes": weight_probes(layer), "gauge": gauge_statistics(layer, gen),
        })
    return out


@torch.no_grad()
def model_part(model, tokenizer, ids: torch.Tensor, *, prompts: Sequence[str], max_new_tokens: int,
               seed: int = 0) -> dict:
    """Generations, the logit check in float32 and float64 on ``ids`` (one window), the
    weight anatomy of every layer and the 4-bit grid of the MLP weights."""
    original = generations(model, tokenizer, prompts, max_new_tokens)
    with mlps_replaced(model, dict(enumerate(gated_mlps(model)))):
        swapped_in = generations(model, tokenizer, prompts, max_new_tokens)
    out = {"generation": [{"prompt": o["prompt"], "original": o["text"], "gated": s["text"],
                           "same_ids": o["ids"] == s["ids"]} for o, s in zip(original, swapped_in)]}
    out["logits"] = {"float32": logit_check(model, ids)}
    dtype = next(model.parameters()).dtype
    model.double()
    try:
        out["logits"]["float64"] = logit_check(model, ids)
    finally:
        model.to(dtype)
    gen = torch.Generator().manual_seed(seed)
    g = gated_mlps(model)
    out["weights"] = _weights(g, gen)
    distinct, step_rel = 0, []
    for layer in g:
        for w in (layer.query[:, 0], layer.key[:, 0], layer.value.T):
            if w.shape[1] % 32:
                distinct = None
                break
            step, nd = q4_steps(w)
            distinct = max(distinct, int(nd.max()))
            step_rel.append(float(step.mean() / w.pow(2).mean().sqrt()))
        if distinct is None:
            break
    q = {"max_distinct_per_block": distinct}
    if distinct is not None and distinct <= 16:            # the weights sit on a 4-bit grid
        noise_rel, dcos = [], []
        for layer in g:
            noisy = with_q4_noise(layer, gen)
            noise_rel.append(float((noisy.query - layer.query).norm() / layer.query.norm()))
            dcos.append(pair_geometry(noisy)["cos"] - pair_geometry(layer)["cos"])
        q.update({"mean_step_over_rms": sum(step_rel) / len(step_rel),
                  "noise_rel_norm_query": sum(noise_rel) / len(noise_rel), "cos_change": summarise(torch.cat(dcos))})
    out["quantisation"] = q
    return out


def _versions() -> dict:
    from .loading import PACKAGE

    return versions("transformers", "gguf", "accelerate", "safetensors", "tokenizers", PACKAGE)


def _text_of(name: str, texts: Mapping[str, str]) -> tuple[str, dict]:
    from . import texts as T

    if name in texts:
        s = texts[name]
        if name in T.TEXTS and T.sha256_of(s) == T.text_sha256(name):
            return s, T.describe(name)
        return s, {"name": name, "role": "custom", "genre": "custom", "description": "a text given to run()",
                   "sha256": T.sha256_of(s), "n_chars": len(s)}
    return T.text(name), T.describe(name)


def _windows_sha256(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int64).numpy().tobytes()).hexdigest()


# --- jobs --------------------------------------------------------------------------------------

class _JobCache:
    """Finished jobs as JSON files in a folder, keyed by the job, the model's source, the
    texts given as strings and the code's commit (a job of other code is not reused)."""

    def __init__(self, folder, source, commit, custom, placed=None):
        from pathlib import Path

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.salt = {"source": source, "commit": commit,
                     "custom": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in custom.items()}}
        if placed:                          # another dtype or device: other numbers (float32 on CPU keeps its keys)
            self.salt["placed"] = placed

    def _path(self, job):
        import json

        blob = json.dumps({"job": job, "salt": self.salt}, sort_keys=True, default=str)
        name = f"{job['kind']}-{job.get('text') or 'model'}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}.json"
        return self.folder / name

    def get(self, job):
        p = self._path(job)
        if not p.is_file():
            return None
        d = load_record(p)
        if d["kind"] in ("layers",):          # JSON turned the layer indices into strings
            d["result"]["layer"] = {k: {int(l): v for l, v in rows.items()} for k, rows in d["result"]["layer"].items()}
        if "layers" in d["result"] and d["kind"] == "units":
            d["result"]["layers"] = {int(l): v for l, v in d["result"]["layers"].items()}
        return d["result"], d["timing"]

    def put(self, job, output):
        result, timing = output
        save_record(self._path(job), {"kind": job["kind"], "result": result, "timing": timing,
                                      "machine": run_machine()})


_WORKER: dict = {}


def _worker_model(model_path, dtype, device=None, device_map=None):
    k = (str(model_path), str(dtype), str(device), str(device_map))
    if _WORKER.get("key") != k:
        from .loading import load_model

        _WORKER.clear()
        _WORKER["key"] = k
        _WORKER["model"], _WORKER["tokenizer"] = load_model(model_path, dtype=dtype, device=device,
                                                            device_map=device_map)[:2]
    return _WORKER["model"], _WORKER["tokenizer"]


def _do(job: dict, model, tokenizer, custom: Mapping[str, str]) -> dict:
    c = job["config"]
    start, start_cpu = time.perf_counter(), time.process_time()
    if job["kind"] == "model":
        s, _ = _text_of(c["texts"][0], custom)
        ids = heldout_windows(tokenizer, 1, c["length"], s, bos=c["bos"])
        res = model_part(model, tokenizer, ids, prompts=c["prompts"], max_new_tokens=c["max_new_tokens"],
                         seed=c["seed"])
    else:
        s, _ = _text_of(job["text"], custom)
        ids = heldout_windows(tokenizer, c["n_windows"], c["length"], s, bos=c["bos"])
        plan = c["plans"]["main" if job["text"] == c["main_text"] else "other"]
        layer_kinds = expand(plan["layer_kinds"], {"rescale": plan["alphas_layer"], "toward_swap": plan["toward_swap"]})
        if job["kind"] == "prepare":
            all_kinds = expand(plan["all_kinds"], {"rescale": plan["alphas_all"], "toward_swap": plan["toward_swap"]})
            full = c["plans"]["main"]           # sizes are cheap: every text gets the main plan's
            local = expand(full["layer_kinds"], {"rescale": full["alphas_layer"] + full["alphas_all"],
                                                 "toward_swap": full["toward_swap"]})
            local = list(dict.fromkeys(local + all_kinds))
            res = prepare(model, ids, batch_size=c["batch_size"], local_kinds=local, all_kinds=all_kinds,
                          gen_seed=c["seed"], q4_noise=job.get("q4_noise", False))
        elif job["kind"] == "layers":
            res = layer_part(model, ids, job["layers"], layer_kinds, batch_size=c["batch_size"])
        elif job["kind"] == "units":
            res = unit_part(model, ids, c["unit_layers"], batch_size=c["batch_size"], seed=c["seed"],
                            n_groups=plan["unit_groups"], n_single=plan["unit_singles"])
        else:
            raise ValueError(f"unknown job kind {job['kind']!r}")
    timing = {"kind": job["kind"], "text": job.get("text"), "layers": job.get("layers"),
              "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - start_cpu}
    print(f"[{time.strftime('%H:%M:%S')}] done {job['kind']} {job.get('text', '')} "
          f"{job.get('layers', '')} in {timing['wall_s']:.0f} s", file=sys.stderr, flush=True)
    return res, timing


def q4_grid(*widths) -> bool:
    """Whether every width (d_model, d_hidden; an int or a per-layer list) is a multiple of
    :data:`~qkmlp.pretrained.surgery.Q4_BLOCK`, as the 4-bit (Q4_1) noise and grid check need."""
    flat = [w for v in widths for w in (v if isinstance(v, (list, tuple)) else [v])]
    return all(isinstance(w, int) and w % Q4_BLOCK == 0 for w in flat)


class _Progress:
    """One line per finished job: how many are done and left, and an estimate of the time
    left (the mean wall time of the jobs done so far, times the jobs left, over the workers)."""

    def __init__(self, total: int, workers: int, show: bool):
        self.total, self.workers, self.show = total, max(1, workers), show
        self.start, self.n = time.perf_counter(), 0

    def done(self, job: dict) -> None:
        self.n += 1
        if not self.show:
            return
        spent = time.perf_counter() - self.start
        left = self.total - self.n
        eta = spent / self.n * left
        what = " ".join(str(v) for v in (job["kind"], job.get("text") or "", job.get("layers") or "") if v != "")
        finish = time.strftime("%H:%M", time.localtime(time.time() + eta))
        print(f"[{time.strftime('%H:%M:%S')}] {self.n}/{self.total} jobs done ({what}), {left} left; "
              f"{_duration(spent)} so far, about {_duration(eta)} to go (~{finish})", file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _pool_job(job: dict, model_path, dtype_name: str, threads: int, custom: Mapping[str, str],
              device=None, device_map=None) -> dict:
    torch.set_num_threads(threads)
    model, tok = _worker_model(model_path, getattr(torch, dtype_name), device, device_map)
    return _do(job, model, tok, custom)


@torch.no_grad()
def run(*, model=None, tokenizer=None, model_path=None, texts: Union[Sequence[str], Mapping[str, str]] = TEXTS,
        n_windows: int = 8, length: int = 128, batch_size: int = 4, bos: Optional[bool] = None,
        alphas_all: Sequence[float] = ALPHAS_ALL, alphas_layer: Sequence[float] = ALPHAS_LAYER,
        toward_swap: Sequence[float] = TOWARD_SWAP, layer_kinds: Sequence[str] = LAYER_KINDS,
        all_kinds: Sequence[str] = ALL_KINDS, layers: Optional[Sequence[int]] = None,
        unit_layers: Optional[Sequence[int]] = None, prompts: Sequence[str] = PROMPTS,
        max_new_tokens: int = 16, seed: int = 0, jobs: int = 1, layer_parts: Optional[int] = None,
        other_plan: Optional[dict] = None, cache=None, progress: bool = True,
        command: Optional[str] = None, dtype: torch.dtype = torch.float32, device=None, device_map=None) -> dict:
    """Run the whole analysis and return it as a JSON-ready dict.

    The model is ``model`` and ``tokenizer`` if given (the tests pass a tiny random one;
    ``source`` is then ``None``), else :func:`~qkmlp.pretrained.loading.load_model` of
    ``model_path`` (``None``: SmolLM2-135M). ``texts`` are names of
    :data:`qkmlp.pretrained.texts.TEXTS` or a mapping name -> string (pinned by the
    SHA-256 of its characters in the result). ``bos`` (default: when the tokenizer has a
    beginning-of-sequence token) starts every window with it. ``layers`` restricts the
    per-layer interventions (default: all); ``unit_layers`` are the layers of the per-unit
    analysis (default :func:`default_unit_layers`, ``[]`` for none). The first text gets
    the full plan (the arguments), the others ``other_plan`` (default :data:`OTHER_PLAN`;
    pass ``{}`` for the full plan on every text). ``jobs`` > 1 runs the jobs in worker
    processes, which needs ``model_path`` (not ``model``); ``layer_parts`` splits each
    text's per-layer interventions into that many jobs (default 3·``jobs``). ``cache``, a
    folder, keeps each finished job's result (keyed by the job, the model's source and
    the code's commit), so that a rerun after an interruption only does what is missing.

    ``dtype``, ``device`` and ``device_map`` go to :func:`~qkmlp.pretrained.loading.load_model`
    (a model given as ``model`` stays where it is): the weights' dtype (float32, bfloat16,
    float16), one device ("cpu", "cuda", "cuda:N", "mps"; checked before anything loads),
    or accelerate's placement over several devices ("auto", ...). The token ids go to the
    device of the model's input embedding; the checks and the JSON are the same, with
    ``meta.dtype``, ``meta.device`` (and ``meta.device_map``) saying where it ran. The
    float64 logit check casts the model to float64 on its device(s) and back.
    """
    from ..bench import machine_info
    from .heldout import input_device
    from .loading import check_device, load_model

    start_time, start_cpu = time.perf_counter(), time.process_time()
    check_device(device)
    machine = machine_info("cpu")         # commit and date as the run starts
    if jobs > 1 and model is not None:
        raise ValueError("jobs > 1 loads the model in each worker: pass model_path, not model")
    source = None
    if model is None:
        model, tokenizer, source = load_model(model_path, dtype=dtype, device=device, device_map=device_map)
    model.eval()
    custom = dict(texts) if isinstance(texts, Mapping) else {}
    names = list(texts)
    if not names:
        raise ValueError("run needs at least one text")
    n_layers = len(decoder_layers(model))
    layers = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    unit_layers = default_unit_layers(n_layers) if unit_layers is None else [int(i) for i in unit_layers]
    if bos is None:
        bos = getattr(tokenizer, "bos_token_id", None) is not None
    cfg = model.config
    main_plan = {"layer_kinds": list(layer_kinds), "alphas_layer": [float(a) for a in alphas_layer],
                 "toward_swap": [float(t) for t in toward_swap], "all_kinds": list(all_kinds),
                 "alphas_all": [float(a) for a in alphas_all], "unit_groups": 10, "unit_singles": 5}
    other = dict(OTHER_PLAN if other_plan is None else other_plan)
    unknown = set(other) - set(main_plan)
    if unknown:
        raise ValueError(f"other_plan has unknown keys {sorted(unknown)}; expected some of {sorted(main_plan)}")
    other = main_plan | other
    config = {
        "texts": names, "main_text": names[0], "n_windows": n_windows, "length": length, "batch_size": batch_size,
        "bos": bool(bos), "plans": {"main": main_plan, "other": other}, "layers": layers,
        "unit_layers": unit_layers, "prompts": list(prompts), "max_new_tokens": max_new_tokens, "seed": seed}
    result = {"meta": {}, "config": config}
    result["model"] = {"architecture": type(model).__name__, "n_layers": n_layers, "d_model": cfg.hidden_size,
                       "d_hidden": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
                       "hidden_act": declared_activation(model)[1], "n_parameters": sum(p.numel() for p in model.parameters())}

    parts = max(1, layer_parts if layer_parts is not None else 3 * jobs)
    job_list = []
    for name in names:
        for i in range(parts):
            chunk = layers[i::parts]
            if chunk:
                job_list.append({"kind": "layers", "text": name, "layers": chunk, "config": config})
    for name in names:
        job_list.append({"kind": "prepare", "text": name, "config": config, "q4_noise": name == names[0]})
        if unit_layers:
            job_list.append({"kind": "units", "text": name, "config": config})
    job_list.append({"kind": "model", "config": config})
    if not q4_grid(cfg.hidden_size, cfg.intermediate_size):
        for j in job_list:                 # the Q4_1 noise needs whole blocks of 32 weights
            j.pop("q4_noise", None)
        if progress:
            print(f"d_model {cfg.hidden_size}, d_hidden {cfg.intermediate_size}: not all multiples of "
                  f"{Q4_BLOCK}, so no 4-bit (Q4_1) noise job and no 4-bit grid check (they need whole "
                  f"blocks of {Q4_BLOCK} weights)", file=sys.stderr, flush=True)
    where = {"dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
             "device": str(input_device(model))}
    if device_map is not None:              # where accelerate put each part (the request, if it says none)
        placed_map = getattr(model, "hf_device_map", None)
        where["device_map"] = {k: str(v) for k, v in placed_map.items()} if placed_map else str(device_map)
    placed = where if (where["dtype"], where["device"]) != ("float32", "cpu") or "device_map" in where else {}
    store = (_JobCache(cache, source, machine.get("git_commit"), custom, placed)
             if cache is not None else None)
    outputs = [store.get(j) if store else None for j in job_list]
    todo = [i for i, o in enumerate(outputs) if o is None]
    if progress:
        print(f"{len(job_list)} jobs ({len(job_list) - len(todo)} cached) on {jobs} process(es)",
              file=sys.stderr, flush=True)
    clock = _Progress(len(todo), jobs, progress)
    if jobs <= 1:
        for i in todo:
            outputs[i] = _do(job_list[i], model, tokenizer, custom)
            clock.done(job_list[i])
            if store:
                store.put(job_list[i], outputs[i])
    elif todo:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        dtype_name = str(next(model.parameters()).dtype).replace("torch.", "")
        del model
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            futures = {ex.submit(_pool_job, job_list[i], model_path, dtype_name, 1, custom, device, device_map): i
                       for i in todo}
            for f in as_completed(futures):
                i = futures[f]
                outputs[i] = f.result()
                clock.done(job_list[i])
                if store:
                    store.put(job_list[i], outputs[i])

    by_text = {name: [] for name in names}
    timings = [t for _, t in outputs]
    for j, (o, _) in zip(job_list, outputs):
        if j["kind"] == "model":
            result.update(o)
        else:
            by_text[j["text"]].append(o)
    result["texts"] = {}
    for name in names:
        s, info = _text_of(name, custom)
        ids = heldout_windows(tokenizer, n_windows, length, s, bos=bos)
        t = merge(n_layers, by_text[name])
        t["text"] = info | {"n_tokens": len(tokenizer(s, add_special_tokens=False)["input_ids"]),
                            "windows_sha256": _windows_sha256(ids)}
        result["texts"][name] = t

    result["meta"] = {
        "command": command, "qkmlp_version": __version__, "source": source, "versions": _versions(), **where,
        "machine": machine, "jobs": jobs, "wall_s": time.perf_counter() - start_time,
        "cpu_s": time.process_time() - start_cpu + (sum(t["cpu_s"] for t in timings) if jobs > 1 else 0.0),
        "job_timings": timings,
    }
    return result
