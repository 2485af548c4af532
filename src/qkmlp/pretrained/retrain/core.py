"""One retraining run: an arm's MLPs put into a trained model, fine-tuned, evaluated.

:func:`build_arm` replaces every MLP of a Llama-style model by the arm's layer, built
from that MLP's trained weights with :func:`~qkmlp.pretrained.surgery.variant`;
:func:`train_run` fine-tunes it (AdamW, linear warm-up, cosine decay, gradient clipping)
on windows drawn from the training texts and evaluates fixed windows of the held-out
and validation texts along the way. A run is a pure function of its arguments (the
windows are drawn from a generator seeded with the run's seed before the first step),
so it can stop at a checkpoint and resume to the same record.
"""
from __future__ import annotations

import copy
import math
import os
import re
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...experiments.train import lr_at
from ..heldout import heldout_windows, window_losses
from ..surgery import decoder_layers, gated_mlps, replace_mlps, variant

__all__ = ["ARMS", "PARTIAL_SWAP", "is_arm", "partial_swap_arm", "arm_units", "drawn_units", "plain_equivalent", "partially_swapped", "build_arm", "set_trainable", "TextData", "token_ids", "draw_starts", "batch_at", "train_loss",
           "eval_points", "evaluate", "train_run", "Interrupted"]

#: The arms, and the :func:`~qkmlp.pretrained.surgery.variant` each builds from a trained
#: MLP (per hidden unit j, with a = x·q_j (gate), b = x·k_j (up)).
ARMS = {
    "gated": "gated",              # σ(a)·b: the unchanged model (the control)
    "symmetrized": "symmetrized",  # ½[σ(a)·b + σ(b)·a]: exchange-symmetric
    "symmetric": "symmetric",      # σ(a·b): exchange- and scaling-symmetric
    "swapped": "swap",             # σ(b)·a: the roles of gate and up exchanged
    "identity": "identity",        # a·b: the bilinear layer (σ = identity)
}


#: A partially swapped control: ``swapped-f0.230`` is the control's own layer with q and k
#: exchanged in a fraction f = 0.230 of the hidden units of every layer (the units drawn by
#: :func:`partially_swapped`, the same for every run). It is gated, breaks the exchange
#: symmetry as the control does, and can represent the control exactly; f sets how far from
#: the trained model it starts (chapter 11 matches it to a symmetric arm's starting loss).
#: ``swapped-f0.812+L1U83`` exchanges, besides that fraction, unit 83 of layer 1 (any number
#: of ``+L<layer>U<unit>`` terms, in increasing (layer, unit) order): the units a search
#: found to move the start most (:mod:`~qkmlp.pretrained.retrain.unitsearch`).
PARTIAL_SWAP = re.compile(r"^swapped-f(0\.\d{3})((?:\+L\d+U\d+)*)$")
_UNIT = re.compile(r"\+L(\d+)U(\d+)")


def partial_swap_arm(fraction: float, units=()) -> str:
    """The arm name of the control swapped in a fraction ``fraction`` (three decimals, in (0, 1))
    of every layer's units, and also in ``units``, (layer, unit) pairs (sorted, distinct)."""
    name = f"swapped-f{fraction:.3f}"
    if not (0.0 < fraction < 1.0) or not PARTIAL_SWAP.match(name) or float(name[9:]) in (0.0, 1.0):
        raise ValueError(f"fraction must lie in (0, 1) at three decimals, got {fraction!r}")
    pairs = []
    for u in units:
        try:
            layer, unit = (int(v) for v in u)
        except (TypeError, ValueError):
            raise ValueError(f"units must be (layer, unit) pairs of non-negative ints, got {u!r}") from None
        if layer < 0 or unit < 0 or (layer, unit) != tuple(u):
            raise ValueError(f"units must be (layer, unit) pairs of non-negative ints, got {u!r}")
        pairs.append((layer, unit))
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"units must be distinct, got {list(units)!r}")
    return name + "".join(f"+L{l}U{u}" for l, u in sorted(pairs))


def arm_units(arm: str) -> tuple[float, list[tuple[int, int]]]:
    """``(fraction, [(layer, unit), ...])`` of a partially swapped control's name."""
    m = PARTIAL_SWAP.match(arm) if isinstance(arm, str) else None
    if m is None:
        raise ValueError(f"not a partially swapped control: {arm!r}; expected swapped-f0.xxx[+L<layer>U<unit>...]")
    units = [(int(a), int(b)) for a, b in _UNIT.findall(m.group(2))]
    if units != sorted(set(units)):
        raise ValueError(f"{arm!r}: the +L<layer>U<unit> terms must be distinct and in increasing order")
    return float(m.group(1)), units


def drawn_units(fraction: float, layer_index: int, m: int) -> list[int]:
    """The units of layer ``layer_index`` (of ``m``) that :func:`partially_swapped` exchanges
    at ``fraction`` before any named unit: the first round(fraction·m) of its draw, sorted."""
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(int(layer_index)))
    return sorted(perm[:round(fraction * m)].tolist())


def plain_equivalent(arm: str, m: int) -> str:
    """The plain control ``swapped-f0.xxx`` that computes the same function as ``arm`` when
    every unit ``arm`` names lies in its fraction's draw (layers of ``m`` units; a named unit
    already drawn is exchanged once), else ``arm`` itself."""
    fraction, units = arm_units(arm)
    plain = partial_swap_arm(fraction)
    return plain if all(u in drawn_units(fraction, l, m) for l, u in units) else arm


def is_arm(arm: str) -> bool:
    """Whether ``arm`` names an arm: a key of :data:`ARMS` or a partially swapped control
    (:data:`PARTIAL_SWAP`)."""
    if arm in ARMS:
        return True
    try:
        arm_units(arm)
    except ValueError:
        return False
    return True


@torch.no_grad()
def partially_swapped(g, fraction: float, layer_index: int, extra=()):
    """A copy of the rank-1 :class:`~qkmlp.GatedMLP` ``g`` with the query and key rows of
    round(fraction·m) hidden units exchanged (σ(b)·a in those units, σ(a)·b in the rest),
    and also of the units listed in ``extra`` (indices in [0, m); swapped once if drawn too).

    The units are the first round(fraction·m) of a random permutation of the m units drawn
    from a generator seeded with ``layer_index``: fixed for a layer, and nested in the
    fraction (a larger fraction swaps a superset), so the starting loss moves steadily with it.
    """
    if g.rank != 1:
        raise ValueError(f"partially_swapped needs a rank-1 GatedMLP, got rank {g.rank}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction!r}")
    m = g.d_hidden
    extra = [int(u) for u in extra]
    if any(not 0 <= u < m for u in extra):
        raise IndexError(f"layer {layer_index}: extra units must lie in [0, {m}), got {extra}")
    drawn = torch.randperm(m, generator=torch.Generator().manual_seed(int(layer_index)))[:round(fraction * m)]
    units = torch.tensor(sorted(set(drawn.tolist()) | set(extra)), dtype=torch.long)
    new = copy.deepcopy(g)
    q, k = new.query_weight, new.key_weight
    q_sel, k_sel = q[units].clone(), k[units].clone()
    q[units], k[units] = k_sel, q_sel
    return new


class Interrupted(RuntimeError):
    """Raised by :func:`train_run` when ``stop_after`` steps are done (tests of resuming)."""


def build_arm(model, arm: str) -> list[nn.Module]:
    """Replace every MLP of ``model`` (in place) by ``arm``'s layer built from its trained
    weights, make those layers' weights trainable, and return them (in layer order)."""
    if not is_arm(arm):
        raise ValueError(f"unknown arm {arm!r}; expected one of {', '.join(ARMS)}, or swapped-f0.xxx "
                         "(the control swapped in a fraction of its units), optionally +L<layer>U<unit>...")
    if arm not in ARMS:
        fraction, units = arm_units(arm)
        gs = gated_mlps(model)
        if any(l >= len(gs) for l, _ in units):
            raise IndexError(f"arm {arm!r} names a layer beyond the model's {len(gs)}")
        layers = [partially_swapped(g, fraction, i, [u for l, u in units if l == i]) for i, g in enumerate(gs)]
    else:
        layers = [variant(g, ARMS[arm]) for g in gated_mlps(model)]
    replace_mlps(model, dict(enumerate(layers)))
    for layer in layers:
        layer.requires_grad_(True)
    return layers


def set_trainable(model, trainable: str) -> list[nn.Parameter]:
    """Freeze everything but the MLPs (``"mlp"``) or nothing (``"all"``); the trainable
    parameters in ``model.named_parameters()`` order."""
    if trainable not in ("mlp", "all"):
        raise ValueError(f"trainable must be 'mlp' or 'all', got {trainable!r}")
    mlp_ids = {id(p) for layer in decoder_layers(model) for p in layer.mlp.parameters()}
    for p in model.parameters():
        p.requires_grad_(trainable == "all" or id(p) in mlp_ids)
    return [p for p in model.parameters() if p.requires_grad]


def token_ids(tokenizer, text: str) -> torch.Tensor:
    """The text's token ids (no special tokens) as a 1-D int64 tensor."""
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


class TextData:
    """The token streams of the training texts and the fixed windows of the evaluation texts.

    ``train``: {name: 1-D ids}; ``heldout`` and ``validation``: {name: (n, L) ids}, the
    windows of :func:`~qkmlp.pretrained.heldout.heldout_windows` (evenly spread).
    """

    def __init__(self, tokenizer, texts: dict, *, train: Sequence[str], heldout: Sequence[str],
                 validation: Sequence[str], n_windows: int, seq_len: int):
        self.seq_len = seq_len
        self.train = {n: token_ids(tokenizer, texts[n]) for n in train}
        for n, ids in self.train.items():
            if ids.numel() < seq_len:
                raise ValueError(f"training text {n!r} has {ids.numel()} tokens, fewer than one window "
                                 f"of {seq_len}")
        self.heldout = {n: heldout_windows(tokenizer, n_windows, seq_len, texts[n]) for n in heldout}
        self.validation = {n: heldout_windows(tokenizer, n_windows, seq_len, texts[n]) for n in validation}

    def n_tokens(self) -> dict:
        return {n: int(ids.numel()) for n, ids in self.train.items()}


def draw_starts(data: TextData, seed: int, steps: int, batch_size: int) -> torch.Tensor:
    """The windows of every step, drawn before the first: a (steps, batch_size, 2) int64
    tensor of (training text index, start token). Each batch takes ``batch_size / k``
    windows from each of the k training texts (so every batch mixes them equally), each
    start uniform over the text's tokens."""
    names = list(data.train)
    k = len(names)
    if batch_size % k:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of the number of training texts ({k})")
    gen = torch.Generator().manual_seed(seed)
    per = batch_size // k
    out = torch.empty(steps, batch_size, 2, dtype=torch.long)
    for i, n in enumerate(names):
        hi = data.train[n].numel() - data.seq_len + 1
        out[:, i * per:(i + 1) * per, 0] = i
        out[:, i * per:(i + 1) * per, 1] = torch.randint(0, hi, (steps, per), generator=gen)
    return out


def batch_at(data: TextData, starts: torch.Tensor, step: int) -> torch.Tensor:
    """The (batch_size, seq_len) token ids of ``step``."""
    streams = list(data.train.values())
    return torch.stack([streams[int(t)][int(s):int(s) + data.seq_len] for t, s in starts[step]])


def train_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch (every position but the last predicts)."""
    ids = ids.to(model.get_input_embeddings().weight.device)
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def eval_points(steps: int, every: int, early: Sequence[int] = ()) -> list[int]:
    """Steps after which a run is evaluated: 0, the ``early`` ones, every ``every``-th, and the last."""
    if not (isinstance(every, int) and every >= 1):
        raise ValueError(f"eval_every must be a positive int, got {every!r}")
    return sorted({0, steps, *range(every, steps, every), *(e for e in early if 0 < e < steps)})


@torch.no_grad()
def evaluate(model, windows: dict, batch_size: int) -> dict:
    """{text: per-window mean NLL list} on fixed windows (the model in eval mode, then back)."""
    was = model.training
    model.eval()
    try:
        return {n: window_losses(model, ids, batch_size=batch_size).tolist() for n, ids in windows.items()}
    finally:
        model.train(was)


def _mean(v) -> float:
    return sum(v) / len(v)


def _save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_run(model, data: TextData, *, arm: str, seed: int, lr: float, steps: int, batch_size: int,
              warmup_frac: float, final_frac: float, weight_decay: float, betas: Sequence[float],
              grad_clip: float, trainable: str, eval_every: int, eval_early: Sequence[int] = (),
              eval_batch: int = 8, heldout: bool = True, generate: Optional[Callable] = None,
              checkpoint: Optional[Path] = None, checkpoint_every: int = 50, key: str = "",
              stop_after: Optional[int] = None, progress: Optional[str] = None,
              log: Optional[Callable[[str], None]] = None) -> dict:
    """Fine-tune ``model`` (a fresh trained model; changed in place) as ``arm``; its record.

    Evaluated at :func:`eval_points`: the held-out windows (``heldout=True``) and always
    the validation windows at step 0 and at the end (at every point when
    ``heldout=False``, as in tuning runs). ``generate(model)`` (optional) adds the
    greedy generations at the end. ``checkpoint``: a file where the state is saved
    every ``checkpoint_every`` steps and from which a run with the same ``key`` resumes
    (removed when the run ends). ``stop_after``: raise :class:`Interrupted` after that
    many steps, as a kill would (for tests).

    The record: ``train_loss`` and ``grad_norm`` (before clipping) of every step, ``lr``
    of every step, ``curve`` ({"step", "heldout": {text: [mean]}, "validation": ...}),
    ``windows_before`` / ``windows_after`` (per-window losses at step 0 and at the end,
    held-out and validation texts), ``val_loss`` (mean over the validation texts at the
    end), ``wall_s``, ``cpu_s`` and ``resumed_at`` (steps a run resumed from).
    """
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    build_arm(model, arm)
    params = set_trainable(model, trainable)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    warmup = round(warmup_frac * steps)
    starts = draw_starts(data, seed, steps, batch_size)
    points = eval_points(steps, eval_every, eval_early)
    rec = {"train_loss": [], "grad_norm": [], "lr_per_step": [],
           "curve": {"step": [], "heldout": {n: [] for n in data.heldout} if heldout else {},
                     "validation": {n: [] for n in data.validation}},
           "windows_before": {}, "windows_after": {}, "resumed_at": []}
    wall, cpu, start = 0.0, 0.0, 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if state.get("key") == key:
            with torch.no_grad():
                current = dict(model.named_parameters())
                for n in names:
                    current[n].copy_(state["params"][n])
            opt.load_state_dict(state["opt"])
            rec, start, wall, cpu = state["rec"], state["step"], state["wall_s"], state["cpu_s"]
            rec["resumed_at"].append(start)
            if log:
                log(f"{key}: resumed from the checkpoint at step {start}")
    t0, c0 = time.perf_counter(), time.process_time()
    bar = None
    if progress is not None:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=start, desc=progress, unit="step", mininterval=30.0)
    model.train()
    for step in range(start, steps + 1):
        if step in points and (not rec["curve"]["step"] or rec["curve"]["step"][-1] != step):
            last = step in (0, steps)
            ev = evaluate(model, data.heldout, eval_batch) if heldout else {}
            if last or not heldout:
                ev.update(evaluate(model, data.validation, eval_batch))
            rec["curve"]["step"].append(step)
            for group, texts in (("heldout", data.heldout if heldout else {}), ("validation", data.validation)):
                for n in texts:
                    rec["curve"][group][n].append(_mean(ev[n]) if n in ev else None)
            if step == 0:
                rec["windows_before"] = ev
            if step == steps:
                rec["windows_after"] = ev
            if log:
                msg = " ".join(f"{n} {_mean(v):.4f}" for n, v in ev.items())
                recent = rec["train_loss"][-10:]
                train = f" train(last {len(recent)}) {_mean(recent):.4f}" if recent else ""
                log(f"{key} step {step}:{train} {msg}")
        if step == steps:
            break
        if checkpoint is not None and step > start and step % checkpoint_every == 0:
            _save({"key": key, "step": step, "params": {n: p.detach().clone() for n, p in zip(names, params)},
                   "opt": opt.state_dict(), "rec": rec, "wall_s": wall + time.perf_counter() - t0,
                   "cpu_s": cpu + time.process_time() - c0}, checkpoint)
        if stop_after is not None and step - start >= stop_after:
            raise Interrupted(f"stopped after {stop_after} steps, at step {step}")
        rate = lr_at(step, lr, "cosine", steps, warmup, final_frac)
        for g in opt.param_groups:
            g["lr"] = rate
        opt.zero_grad(set_to_none=True)
        loss = train_loss(model, batch_at(data, starts, step))
        loss.backward()
        norm = nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        rec["train_loss"].append(float(loss.detach()))
        rec["grad_norm"].append(float(norm))
        rec["lr_per_step"].append(rate)
        if bar is not None:
            bar.update(1)
        if not math.isfinite(rec["train_loss"][-1]):
            raise FloatingPointError(f"{key}: the training loss is {rec['train_loss'][-1]} at step {step}")
    if bar is not None:
        bar.close()
    rec["val_loss"] = _mean([_mean(rec["windows_after"][n]) for n in data.validation])
    if generate is not None:
        model.eval()
        rec["generations"] = generate(model)
    rec["wall_s"] = wall + time.perf_counter() - t0
    rec["cpu_s"] = cpu + time.process_time() - c0
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    return rec
