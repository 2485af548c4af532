"""A small, deterministic training loop shared by the chapters and experiments."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

__all__ = ["fit"]

_LOSSES = {"mse": nn.functional.mse_loss, "cross_entropy": nn.functional.cross_entropy}


def fit(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int = 500,
    lr: float = 1e-2,
    loss: str = "mse",
    optimizer: str = "adam",
    weight_decay: float = 0.0,
    batch_size: Optional[int] = None,
    seed: int = 0,
    callback: Optional[Callable[[int, nn.Module, float], None]] = None,
) -> list[float]:
    """Train ``model`` on (x, y) in place; return the training loss of every step.

    x: (N, d_in); y: (N, d_out) for ``loss="mse"`` or (N,) class indices for
    ``loss="cross_entropy"``. ``optimizer`` is "adam", "adamw" or "sgd" (plain gradient
    descent when ``batch_size`` is None: full batch). ``callback(step, model, loss)``
    runs after each step. Minibatches are drawn from a generator seeded with ``seed``.
    """
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {', '.join(_LOSSES)}, got {loss!r}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {x.shape[0]} and {y.shape[0]}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    else:
        raise ValueError(f"optimizer must be one of adam, adamw, sgd, got {optimizer!r}")
    loss_fn = _LOSSES[loss]
    gen = torch.Generator().manual_seed(seed)
    history: list[float] = []
    model.train()
    for step in range(steps):
        if batch_size is None or batch_size >= x.shape[0]:
            xb, yb = x, y
        else:
            idx = torch.randint(0, x.shape[0], (batch_size,), generator=gen).to(x.device)
            xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        value = loss_fn(model(xb), yb)
        value.backward()
        opt.step()
        history.append(float(value.detach()))
        if callback is not None:
            callback(step, model, history[-1])
    model.eval()
    return history
