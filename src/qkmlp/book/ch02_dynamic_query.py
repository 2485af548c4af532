"""Chapter 2, dynamic queries: the static-query MLP against the key-value MLP it equals.

:func:`static_versus_key_value` trains both from the same function, seed by seed;
:func:`static_query_task` is the chapter's regression task (labels from a fixed
key-value teacher, :func:`teacher_data`) and :func:`static_query_study` the stored
experiment (``python -m qkmlp.book static-query --out FILE``).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .._checks import float_tensor, positive_int
from ..activations import get_activation
from ..layers import KeyValueMLP

__all__ = ["teacher_data", "static_versus_key_value", "STATIC_QUERY_SETTINGS", "static_query_task",
           "static_query_study"]


@torch.no_grad()
def teacher_data(teacher: nn.Module, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x ~ N(0, I_d) (n, d) and labels teacher(x), from a generator seeded with seed."""
    positive_int(n, "n"), positive_int(d, "d")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    return x, teacher(x)


def static_versus_key_value(
    x: torch.Tensor,
    y: torch.Tensor,
    width: int,
    seeds: Sequence[int],
    *,
    activation="relu",
    steps: int = 600,
    lr: float = 1e-2,
) -> dict[str, torch.Tensor]:
    """Train key-value and static-query MLPs that start as the same function, per seed.

    For each seed: ``torch.manual_seed(seed)`` and a ``KeyValueMLP(d, width, d_out)``;
    its twin is the ``StaticQueryMLP`` with W_Q = I and the same keys and values, so
    the two compute the same function at step 0. Both are trained full batch with Adam
    on the mean squared error, exactly as :func:`qkmlp.training.fit` would train each
    one alone; all seeds and both layers run in one batched loop (Adam acts entry by
    entry, so summing the independent losses changes nothing). Returns the training
    loss before every step, ``{"key_value": (S, steps), "static_query": (S, steps)}``
    for S seeds. x: (N, d); y: (N, d_out).
    """
    positive_int(width, "width")
    positive_int(steps, "steps")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    float_tensor(x, "x")
    float_tensor(y, "y")
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have shapes (N, d) and (N, d_out), got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    act = get_activation(activation)
    d, d_out = x.shape[1], y.shape[1]
    keys, values = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        kv = KeyValueMLP(d, width, d_out, activation=act, dtype=x.dtype)
        keys.append(kv.key.detach())
        values.append(kv.value.detach())
    S = len(seeds)
    K1, V1 = torch.stack(keys), torch.stack(values)         # (S, m, d), (S, m, d_out)
    W = torch.eye(d, dtype=x.dtype).expand(S, d, d).clone()  # the query maps, W_Q = I
    params = [t.clone().requires_grad_() for t in (K1, V1, W, K1, V1)]
    K1, V1, W, K2, V2 = params
    opt = torch.optim.Adam(params, lr=lr)
    history = torch.empty(2, S, steps, dtype=x.dtype)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        out1 = act(x @ K1.transpose(1, 2)) @ V1                 # σ(xKᵀ)V, (S, N, d_out)
        out2 = act((x @ W) @ K2.transpose(1, 2)) @ V2           # σ(x W_Q Kᵀ)V
        loss = torch.stack([((out - y) ** 2).mean(dim=(1, 2)) for out in (out1, out2)])
        loss.sum().backward()
        opt.step()
        history[:, :, step] = loss.detach()
    return {"key_value": history[0], "static_query": history[1]}


#: Settings of chapter 2's comparison (also stored with its results).
STATIC_QUERY_SETTINGS = {"d": 8, "teacher_width": 16, "teacher_seed": 100,
                         "teacher_value_scale": 3.0, "d_out": 2, "n": 1024,
                         "data_seed": 0, "width": 8, "activation": "relu",
                         "lr": 1e-2}


def static_query_task() -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 2's regression task: x (1024, 8) ~ N(0, I), y (1024, 2) from a fixed
    random ReLU key-value teacher of width 16 (seed 100, values scaled by 3)."""
    c = STATIC_QUERY_SETTINGS
    torch.manual_seed(c["teacher_seed"])
    teacher = KeyValueMLP(c["d"], c["teacher_width"], c["d_out"])
    with torch.no_grad():
        teacher.value.mul_(c["teacher_value_scale"])
    return teacher_data(teacher, c["n"], c["d"], seed=c["data_seed"])


def static_query_study(seeds: Sequence[int] = range(20), steps: int = 3000,
                       record: Sequence[int] = range(0, 3000, 25)) -> dict:
    """Chapter 2's experiment: :func:`static_versus_key_value` on
    :func:`static_query_task`; returns a JSON-ready dict with the settings, the final
    losses per seed and the losses at the steps in ``record`` (plus the last)."""
    x, y = static_query_task()
    c = STATIC_QUERY_SETTINGS
    res = static_versus_key_value(x, y, c["width"], seeds, activation=c["activation"],
                                  steps=steps, lr=c["lr"])
    marks = sorted({s for s in record if s < steps} | {steps - 1})
    return {
        "settings": {**c, "steps": steps, "seeds": list(seeds)},
        "label_variance": float(y.var()),
        "record_steps": marks,
        "key_value": res["key_value"][:, marks].tolist(),
        "static_query": res["static_query"][:, marks].tolist(),
    }
