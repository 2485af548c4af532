"""Chapter 3, bilinear attention: constructed layers and the product study.

- :func:`product_layer` (a two-slot layer that computes x₁x₂ exactly),
  :func:`symmetric_part`, :func:`antisymmetric_part`, :func:`matrix_of_quadratic_form`
  (recover S from the values x S xᵀ), :func:`bilinear_from_key_value` (the key-value MLP
  as bilinear attention whose query is the constant coordinate).
- The product study: :func:`product_data` (y = x₁x₂), :func:`relative_mse`,
  :func:`compare_on_product` (train a key-value and a bilinear MLP on x₁x₂, side by side
  with :func:`fit_stacked`), :func:`product_study` (the stored experiment,
  ``python -m qkmlp.book product --out FILE``).
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from .. import lowrank
from .._checks import float_tensor, positive_int
from ..layers import BilinearAttentionMLP, KeyValueMLP
from .ch01_key_value import BiasCoordinate

__all__ = ["product_layer", "symmetric_part", "antisymmetric_part", "matrix_of_quadratic_form",
           "bilinear_from_key_value", "product_data", "relative_mse", "compare_on_product", "fit_stacked",
           "PRODUCT_WIDTHS", "PRODUCT_SEEDS", "product_study"]


@torch.no_grad()
def product_layer(d: int, i: int = 0, k: int = 1, dtype=None) -> BilinearAttentionMLP:
    """A two-slot SiLU :class:`BilinearAttentionMLP` (d_out = 1) that computes x_i·x_k exactly.

    Slot 1 has A = S, slot 2 has A = −S with S = (e_iᵀe_k + e_kᵀe_i)/2, values +1 and −1:
    silu(s) − silu(−s) = s·sigmoid(s) + s·sigmoid(−s) = s, with s = x S xᵀ = x_i x_k.
    """
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    if not (0 <= i < d and 0 <= k < d) or i == k:
        raise ValueError(f"i and k must be two different coordinates in [0, {d}), got {i} and {k}")
    layer = BilinearAttentionMLP(d, 2, 1, activation="silu", dtype=dtype)
    s = torch.zeros(d, d, dtype=layer.value.dtype)
    s[i, k] = s[k, i] = 0.5
    layer.interaction.copy_(torch.stack([s, -s]))
    layer.value.copy_(torch.tensor([[1.0], [-1.0]]))
    return layer


@torch.no_grad()
def symmetric_part(layer: BilinearAttentionMLP) -> BilinearAttentionMLP:
    """A copy of ``layer`` with every A_j replaced by (A_j + A_jᵀ)/2; same function.

    (The layer-level twin of :func:`qkmlp.lowrank.symmetric_part`, which takes matrices.)"""
    lowrank.check_dense(layer)
    out = copy.deepcopy(layer)
    out.interaction.copy_(lowrank.symmetric_part(layer.interaction))
    return out


@torch.no_grad()
def antisymmetric_part(layer: BilinearAttentionMLP) -> BilinearAttentionMLP:
    """A copy of ``layer`` with every A_j replaced by (A_j − A_jᵀ)/2; all its scores are 0."""
    lowrank.check_dense(layer)
    out = copy.deepcopy(layer)
    out.interaction.copy_((layer.interaction - layer.interaction.transpose(1, 2)) / 2)
    return out


@torch.no_grad()
def matrix_of_quadratic_form(score, d: int, dtype=torch.float64) -> torch.Tensor:
    """The symmetric S with score(x) = x S xᵀ, from d(d+1)/2 evaluations (polarisation).

    ``score`` maps a batch (n, d) to (n,) or (n, k) (k forms at once); the result has
    shape (d, d) or (k, d, d). S_ii = score(e_i) and
    S_ik = (score(e_i + e_k) − score(e_i) − score(e_k)) / 2. Correct whenever score is a
    quadratic form; no check is made that it is one.
    """
    positive_int(d, "d")
    eye = torch.eye(d, dtype=dtype)
    i, k = torch.triu_indices(d, d, offset=1)
    diag = score(eye)  # (d,) or (d, k)
    pairs = score(eye[i] + eye[k])  # (p,) or (p, k)
    if diag.dim() not in (1, 2) or diag.shape[0] != d:
        raise ValueError(f"score must map (n, {d}) to (n,) or (n, k), got shape {tuple(diag.shape)}")
    S = torch.zeros(d, d, *diag.shape[1:], dtype=diag.dtype)
    S[torch.arange(d), torch.arange(d)] = diag
    off = (pairs - diag[i] - diag[k]) / 2
    S[i, k] = off
    S[k, i] = off
    return S if diag.dim() == 1 else S.permute(2, 0, 1)


@torch.no_grad()
def bilinear_from_key_value(kv: KeyValueMLP) -> BilinearAttentionMLP:
    """The key-value MLP as a bilinear attention MLP with rank-1 A_j = eᵀk_j.

    e is the last standard basis vector: on an input x̃ whose last coordinate is 1 (the
    bias coordinate, :func:`with_bias_coordinate`), x̃ A_j x̃ᵀ = (x̃·e)(x̃·k_j) = x̃·k_j, so
    the returned layer equals ``kv`` there (same σ, same values). On other inputs the
    two differ: every bilinear attention MLP is even, f(−x) = f(x).
    Shapes: ``interaction`` (m, d, d) with d = kv.d_model, ``value`` = kv.value.
    """
    if not isinstance(kv, KeyValueMLP):
        raise TypeError(f"kv must be a KeyValueMLP, got {type(kv).__name__}")
    w = kv.key
    out = BilinearAttentionMLP(kv.d_model, kv.d_hidden, kv.d_out, activation=kv.activation,
                               device=w.device, dtype=w.dtype)
    out.interaction.zero_()
    out.interaction[:, -1, :] = kv.key          # row e of A_j is k_j: A_j = eᵀ k_j
    out.value.copy_(kv.value)
    return out


def product_data(n: int, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x uniform on [−1, 1]ᵈ, shape (n, d), and y = x₁x₂, shape (n, 1)."""
    positive_int(n, "n")
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"d must be an integer >= 2 (the target uses x₁ and x₂), got {d!r}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen) * 2 - 1
    return x, (x[:, 0] * x[:, 1]).unsqueeze(-1)


@torch.no_grad()
def relative_mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean squared error divided by the variance of y (0 = perfect, 1 = predicting the mean).

    x: (n, d); y: (n, d_out) or (n,), the shape of ``model(x)``; y must not be constant.
    """
    float_tensor(y, "y")
    pred = model(x)
    if pred.shape != y.shape:
        raise ValueError(f"model(x) has shape {tuple(pred.shape)} but y has shape {tuple(y.shape)}")
    var = y.var(unbiased=False)
    if not var > 0:
        raise ValueError("y is constant (zero variance): the relative MSE is undefined")
    return float(((pred - y) ** 2).mean() / var)


def compare_on_product(
    width: int,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    d: int = 4,
    n_train: int = 512,
    n_test: int = 2048,
    steps: int = 800,
    lr: float = 1e-2,
) -> dict[str, list[float]]:
    """Train a key-value MLP and a bilinear attention MLP of equal width on y = x₁x₂.

    The key-value MLP is ReLU with a bias coordinate (``BiasCoordinate`` then
    ``KeyValueMLP(d + 1, width, 1)``), the bilinear one SiLU without biases. For each seed
    both start from ``torch.manual_seed(seed)`` and train full batch with Adam
    (:func:`qkmlp.training.fit`). Returns the relative test MSE of each, per seed:
    ``{"key_value": [...], "bilinear": [...]}``; also the parameter counts under
    ``"key_value_params"`` and ``"bilinear_params"`` (one number each, in a list).
    """
    positive_int(width, "width")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    x, y = product_data(n_train, d, seed=10_000)
    x_test, y_test = product_data(n_test, d, seed=10_001)
    kvs, bis = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        kvs.append(nn.Sequential(BiasCoordinate(), KeyValueMLP(d + 1, width, 1, activation="relu")))
        torch.manual_seed(seed)
        bis.append(BilinearAttentionMLP(d, width, 1, activation="silu"))
    for models in (kvs, bis):        # the same as fit(model, x, y, ...) on each model
        fit_stacked(models, x, y, steps=steps, lr=lr)
    result: dict[str, list[float]] = {
        "key_value": [relative_mse(kv, x_test, y_test) for kv in kvs],
        "bilinear": [relative_mse(bi, x_test, y_test) for bi in bis],
    }
    kv, bi = kvs[0], bis[0]
    result["key_value_params"] = [sum(p.numel() for p in kv.parameters())]
    result["bilinear_params"] = [sum(p.numel() for p in bi.parameters())]
    return result


def fit_stacked(models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, *,
                steps: int = 500, lr: float = 1e-2) -> torch.Tensor:
    """Train same-shaped ``models`` side by side; the same result as calling
    ``qkmlp.training.fit(model, x, y, steps=steps, lr=lr)`` on each (full batch Adam,
    mean squared error), in one vectorised loop (``torch.func.vmap``).

    Adam acts entry by entry, so minimising the sum of the independent losses trains
    every model exactly as alone. The trained weights are copied back into ``models``.
    Returns the loss before every step, shape (len(models), steps). x: (N, d);
    y: (N, d_out).
    """
    from torch.func import functional_call, stack_module_state, vmap

    models = list(models)
    if not models:
        raise ValueError("models must hold at least one model")
    positive_int(steps, "steps")
    float_tensor(x, "x")
    float_tensor(y, "y")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {x.shape[0]} and {y.shape[0]}")
    params, buffers = stack_module_state(models)
    names = list(params)
    base = copy.deepcopy(models[0]).to("meta")

    def loss_one(p, b):
        out = functional_call(base, (p, b), (x,))
        return ((out - y) ** 2).mean()

    losses = vmap(loss_one)
    leaves = [params[n].detach().clone().requires_grad_() for n in names]
    opt = torch.optim.Adam(leaves, lr=lr)
    history = torch.empty(len(models), steps, dtype=x.dtype)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        value = losses(dict(zip(names, leaves)), buffers)
        value.sum().backward()
        opt.step()
        history[:, step] = value.detach()
    with torch.no_grad():
        for i, model in enumerate(models):
            for n, leaf in zip(names, leaves):
                model.get_parameter(n).copy_(leaf[i])
    return history


#: Widths and seeds of chapter 3's product study.
PRODUCT_WIDTHS = (1, 2, 4, 8, 32)
PRODUCT_SEEDS = tuple(range(10))


def product_study(widths: Sequence[int] = PRODUCT_WIDTHS,
                  seeds: Sequence[int] = PRODUCT_SEEDS) -> dict:
    """Chapter 3's experiment: :func:`compare_on_product` at every width and seed;
    a JSON-ready dict ``{"widths", "seeds", "results": {width: compare_on_product(...)}}``."""
    return {"widths": list(widths), "seeds": list(seeds),
            "results": {str(w): compare_on_product(w, seeds=seeds) for w in widths}}
