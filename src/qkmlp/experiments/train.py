"""One training run of the experiments: early stopping on a validation split, best weights kept.

:func:`train` is the loop every task uses. It draws a batch, takes an optimiser step
(learning rate from a schedule), evaluates the validation loss every ``eval_every``
steps and keeps a copy of the weights with the lowest validation loss so far. It stops
when the validation loss has not improved for ``patience`` evaluations (a *plateau*) or
at ``max_steps`` (the *budget*), whichever comes first, and restores the best weights.
The test set is not seen here: the caller evaluates it once, on the restored model.

With ``lr_drops=k`` a plateau first lowers the learning rate (times ``drop_factor``) and
training goes on from the current weights, up to k times; the run stops on the plateau
after the k-th drop. This is ReduceLROnPlateau: it lowers the noise floor a constant rate
leaves (on fact recall twentyfold, though there the floor still falls with the rate: see
the recall config). The drops depend on the validation curve only, never on
``max_steps``, so with the constant schedule a run that stops before its budget is the
same run under any larger budget; the cosine schedule reads ``max_steps`` at every step,
so there a larger budget changes the run.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Optional

import torch
from torch import nn

__all__ = ["train", "lr_at"]

_SCHEDULES = ("constant", "cosine")


def lr_at(step: int, lr: float, schedule: str, max_steps: int, warmup: int = 0, final_frac: float = 0.1) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up over ``warmup`` steps, then constant
    or a cosine from ``lr`` down to ``final_frac·lr`` at ``max_steps``."""
    if schedule not in _SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(_SCHEDULES)}, got {schedule!r}")
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    t = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def train(
    model: nn.Module,
    batch: Callable[[int, torch.Generator], tuple],
    loss_fn: Callable[[nn.Module, tuple], torch.Tensor],
    validate: Callable[[nn.Module], float],
    *,
    lr: float,
    max_steps: int,
    eval_every: int,
    patience: int,
    seed: int,
    optimizer: str = "adam",
    weight_decay: float = 0.0,
    schedule: str = "constant",
    warmup: int = 0,
    lr_drops: int = 0,
    drop_factor: float = 0.1,
    grad_clip: Optional[float] = None,
    n_curve: int = 25,
    progress: Optional[str] = None,
) -> dict:
    """Train ``model`` in place; returns the run's record (see the module docstring).

    ``batch(step, gen)`` returns the step's batch (a tuple), drawn with ``gen`` (seeded
    with ``seed``); ``loss_fn(model, batch)`` its scalar training loss; ``validate(model)``
    the validation loss (lower is better; called under ``torch.no_grad``). ``progress``:
    a description for a tqdm bar over the steps, or None for no bar.

    The record: ``best_step`` and ``best_val_loss`` (of the restored weights), ``stopped``
    ("plateau" or "budget"), ``steps`` run, ``train_loss`` (mean of the last 5 % of
    steps), ``curve`` (validation loss at every evaluation; training loss subsampled) and
    ``diverged`` (a non-finite training loss stopped the run); with ``lr_drops`` also
    ``lr_drop_steps``, the steps after which the rate was lowered.
    """
    for v, name in ((max_steps, "max_steps"), (eval_every, "eval_every"), (patience, "patience")):
        if not (isinstance(v, int) and v >= 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not (isinstance(lr_drops, int) and lr_drops >= 0):
        raise ValueError(f"lr_drops must be a non-negative integer, got {lr_drops!r}")
    if not (isinstance(drop_factor, (int, float)) and 0 < drop_factor < 1):
        raise ValueError(f"drop_factor must be in (0, 1), got {drop_factor!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    opts = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if optimizer not in opts:
        raise ValueError(f"optimizer must be one of {', '.join(opts)}, got {optimizer!r}")
    opt = opts[optimizer](params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)

    def evaluate():
        model.eval()
        with torch.no_grad():
            v = float(validate(model))
        model.train()
        return v if math.isfinite(v) else math.inf

    bar = None
    if progress is not None:
        from tqdm.auto import tqdm
        bar = tqdm(total=max_steps, desc=progress, unit="step", leave=False, mininterval=2.0)
    best_val, best_step, best_state = evaluate(), 0, copy.deepcopy(model.state_dict())
    val_steps, val_losses = [0], [best_val]
    history: list[float] = []
    since_best, stopped, diverged = 0, "budget", False
    scale, drop_steps = 1.0, []                 # the rate is lr_at(...) * scale
    model.train()
    for step in range(max_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr, schedule, max_steps, warmup) * scale
        b = batch(step, gen)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, b)
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        value = float(loss.detach())
        history.append(value)
        if bar is not None:
            bar.update(1)
        if not math.isfinite(value):
            diverged, stopped = True, "diverged"
            break
        if (step + 1) % eval_every == 0 or step + 1 == max_steps:
            v = evaluate()
            val_steps.append(step + 1)
            val_losses.append(v)
            if bar is not None:
                bar.set_postfix_str(f"val {v:.4f}")
            if v < best_val:
                best_val, best_step, since_best = v, step + 1, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                since_best += 1
                if since_best >= patience:
                    if len(drop_steps) < lr_drops:
                        scale *= drop_factor
                        drop_steps.append(step + 1)
                        since_best = 0
                        continue
                    stopped = "plateau"
                    break
    if bar is not None:
        bar.close()
    model.load_state_dict(best_state)
    model.eval()
    tail = history[-max(1, len(history) // 20):]
    idx = sub_index(len(history), n_curve)
    extra = {"lr_drop_steps": drop_steps} if lr_drops else {}
    return {
        **extra,
        "best_step": best_step,
        "best_val_loss": best_val,
        "stopped": stopped,
        "diverged": diverged,
        "steps": len(history),
        "train_loss": sum(tail) / len(tail),
        "curve": {"val_step": val_steps, "val_loss": val_losses,
                  "train_step": [i + 1 for i in idx], "train_loss": [history[i] for i in idx]},
    }


def sub_index(n: int, k: int) -> list[int]:
    """At most k roughly evenly spaced indices of range(n), always keeping the last."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
