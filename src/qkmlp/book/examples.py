"""Small constructed and synthetic examples for the opening chapters (1–4) of the book.

Everything here is deterministic (explicit seeds) and small enough to run in a fraction
of a second on a CPU.

- Biases as a constant coordinate: :func:`with_bias_coordinate`, :class:`BiasCoordinate`,
  :func:`key_value_from_mlp` (an ``nn.Linear → σ → nn.Linear`` MLP with biases as an
  equal :class:`~qkmlp.KeyValueMLP` on ``[x, 1]``).
- A key-value memory of facts (chapter 1): :func:`capital_facts`,
  :func:`fact_memory`, :func:`decode`.
- Regression data: :func:`teacher_data` (labels from a fixed layer),
  :func:`product_data` (the interaction y = x₁x₂), :func:`relative_mse`.
- Bilinear attention (chapter 3): :func:`product_layer` (a two-slot layer that computes
  x₁x₂ exactly), :func:`symmetric_part`, :func:`antisymmetric_part`,
  :func:`matrix_of_quadratic_form` (recover S from the values x S xᵀ),
  :func:`compare_on_product` (train a key-value and a bilinear MLP on x₁x₂),
  :func:`bilinear_from_key_value` (the key-value MLP as bilinear attention whose query
  is the constant coordinate).
- Training the same function class two ways (chapter 2): :func:`static_versus_key_value`.
- Rank one (chapter 4): :class:`LiftedBilinearAttention` and
  :func:`gated_as_bilinear_attention` (a gated MLP as bilinear attention on the token
  followed by its query features), :func:`directional_derivative` (the n-th derivative
  of x ↦ f(x + t u) at t = 0) and :func:`gradient_jump` (the jump of a Jacobian across a
  hyperplane), the two measurements behind the chapter's "the classes differ".
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import nn

from ..activations import get_activation
from .. import lowrank
from .._checks import positive_int
from ..layers import BilinearAttentionMLP, GatedMLP, KeyValueMLP, StaticQueryMLP
from ..training import fit

__all__ = [
    "with_bias_coordinate",
    "BiasCoordinate",
    "key_value_from_mlp",
    "FactTask",
    "capital_facts",
    "fact_memory",
    "decode",
    "teacher_data",
    "product_data",
    "relative_mse",
    "product_layer",
    "symmetric_part",
    "antisymmetric_part",
    "matrix_of_quadratic_form",
    "compare_on_product",
    "PRODUCT_WIDTHS",
    "PRODUCT_SEEDS",
    "product_study",
    "fit_stacked",
    "bilinear_from_key_value",
    "static_versus_key_value",
    "STATIC_QUERY_SETTINGS",
    "static_query_task",
    "static_query_study",
    "LiftedBilinearAttention",
    "gated_as_bilinear_attention",
    "directional_derivative",
    "gradient_jump",
]


def _check_float(x, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have shape (..., d), got a scalar")


# --------------------------------------------------------------------------------------
# Biases are a constant coordinate
# --------------------------------------------------------------------------------------


def with_bias_coordinate(x: torch.Tensor) -> torch.Tensor:
    """Append a constant 1 to every token: (..., d) -> (..., d + 1)."""
    _check_float(x)
    return torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)


class BiasCoordinate(nn.Module):
    """Module form of :func:`with_bias_coordinate`, to put in front of a bias-free layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return with_bias_coordinate(x)


@torch.no_grad()
def key_value_from_mlp(fc1: nn.Linear, fc2: nn.Linear, activation="relu") -> KeyValueMLP:
    """The MLP ``fc2(σ(fc1(x)))`` with biases, as a bias-free :class:`KeyValueMLP`.

    The returned layer has d_model = d + 1 and d_hidden = m + 1 and satisfies
    ``layer(with_bias_coordinate(x)) == fc2(σ(fc1(x)))``:

    - key j = [fc1.weight[j], fc1.bias[j]] (the first bias is the weight of the constant
      coordinate);
    - one extra slot, whose key is the last basis vector, fires with the constant
      coefficient σ(1) and has value fc2.bias / σ(1) (the second bias is a memory that
      is always recalled).

    Needs σ(1) ≠ 0 (true for relu, gelu, silu, tanh, sigmoid, softplus, ...).
    """
    for name, lin in (("fc1", fc1), ("fc2", fc2)):
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"{name} must be an nn.Linear, got {type(lin).__name__}")
    m, d = fc1.weight.shape
    if fc2.weight.shape[1] != m:
        raise ValueError(f"fc2 must take fc1's {m} outputs, got in_features={fc2.weight.shape[1]}")
    act = get_activation(activation)
    w = fc1.weight
    sigma_one = float(act(torch.ones((), dtype=w.dtype)))
    if fc2.bias is not None and sigma_one == 0.0:
        raise ValueError(f"activation {act.name!r} has σ(1) = 0; the output bias cannot be a memory slot")
    d_out = fc2.weight.shape[0]
    kv = KeyValueMLP(d + 1, m + 1, d_out, activation=act, device=w.device, dtype=w.dtype)
    kv.key.zero_()
    kv.key[:m, :d] = fc1.weight
    if fc1.bias is not None:
        kv.key[:m, d] = fc1.bias
    kv.key[m, d] = 1.0
    kv.value.zero_()
    kv.value[:m] = fc2.weight.T
    if fc2.bias is not None:
        kv.value[m] = fc2.bias / sigma_one
    return kv


# --------------------------------------------------------------------------------------
# A key-value memory of facts (chapter 1)
# --------------------------------------------------------------------------------------

_CAPITALS = [
    ("Paris", "France"),
    ("Rome", "Italy"),
    ("Tokyo", "Japan"),
    ("Cairo", "Egypt"),
    ("Lima", "Peru"),
]
_DISTRACTORS = ["cat", "river", "blue"]


@dataclass
class FactTask:
    """A tiny vocabulary with unit-norm random embeddings and facts ``word -> word``.

    words: n names; embeddings: (n, d), rows of norm 1; facts: (f, 2) long tensor of
    (subject index, answer index) pairs.
    """

    words: list
    embeddings: torch.Tensor
    facts: torch.Tensor

    @property
    def subjects(self) -> torch.Tensor:
        return self.facts[:, 0]

    @property
    def answers(self) -> torch.Tensor:
        return self.facts[:, 1]


def capital_facts(d: int = 32, seed: int = 0) -> FactTask:
    """Five capital -> country facts over a 13-word vocabulary embedded in ℝᵈ.

    The embeddings are independent Gaussian vectors normalised to length 1 (for d ≳ 16
    they are nearly orthogonal), drawn from a generator seeded with ``seed``.
    """
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    words = [w for pair in _CAPITALS for w in pair] + list(_DISTRACTORS)
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(len(words), d, generator=gen)
    emb = emb / emb.norm(dim=1, keepdim=True)
    facts = torch.tensor([[words.index(a), words.index(b)] for a, b in _CAPITALS])
    return FactTask(words, emb, facts)


@torch.no_grad()
def fact_memory(task: FactTask, threshold: Union[float, None] = None) -> KeyValueMLP:
    """A ReLU key-value memory that stores each fact in one slot, built by hand.

    Input: ``with_bias_coordinate(e)`` for a word embedding e (width d + 1); output: a
    vector in ℝᵈ, read out with :func:`decode`. Slot j has key [e_a, −τ] and value
    e_b / (1 − τ) for its fact (a, b), so for the subject a its coefficient is 1 − τ and
    the output is exactly e_b; a word whose cosine with every subject is below the
    threshold τ fires no slot. The default τ is halfway between the largest cosine of a subject with another word
    and 1. Needs unit-norm embeddings and distinct subjects (the hypotheses of the
    recall theorem of chapter 1); raises ValueError otherwise.
    """
    emb, subj, ans = task.embeddings, task.subjects, task.answers
    _check_float(emb, "task.embeddings")
    if emb.dim() != 2:
        raise ValueError(f"task.embeddings must have shape (n, d), got {tuple(emb.shape)}")
    n, d = emb.shape
    norms = emb.norm(dim=1)
    if not torch.allclose(norms, torch.ones_like(norms), atol=1e-5):
        raise ValueError("task.embeddings must have rows of norm 1 (cosines are dot products)")
    if len(set(subj.tolist())) != len(subj):
        raise ValueError(f"the subjects of task.facts must be distinct words, got {subj.tolist()}")
    cos = emb[subj] @ emb.T  # (f, n)
    others = torch.ones_like(cos, dtype=torch.bool)
    others[torch.arange(len(subj)), subj] = False
    largest_other = float(cos[others].max())
    if threshold is None:
        threshold = (1.0 + largest_other) / 2
    if not largest_other < threshold < 1.0:
        raise ValueError(
            f"threshold must lie in ({largest_other:.3f}, 1): above every cosine between a "
            f"subject and another word, and below 1; got {threshold}"
        )
    kv = KeyValueMLP(d + 1, len(subj), d, activation="relu", dtype=emb.dtype)
    kv.key.copy_(torch.cat([emb[subj], torch.full((len(subj), 1), -threshold, dtype=emb.dtype)], 1))
    kv.value.copy_(emb[ans] / (1.0 - threshold))
    return kv


def decode(out: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """Nearest word by dot product: (..., d) outputs -> (...) word indices."""
    _check_float(out, "out")
    _check_float(embeddings, "embeddings")
    if embeddings.dim() != 2:
        raise ValueError(f"embeddings must have shape (n, d), got {tuple(embeddings.shape)}")
    if out.shape[-1] != embeddings.shape[1]:
        raise ValueError(f"out must have last dimension {embeddings.shape[1]}, got {tuple(out.shape)}")
    return (out @ embeddings.T).argmax(-1)


# --------------------------------------------------------------------------------------
# Regression data
# --------------------------------------------------------------------------------------


@torch.no_grad()
def teacher_data(teacher: nn.Module, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x ~ N(0, I_d) (n, d) and labels teacher(x), from a generator seeded with seed."""
    positive_int(n, "n"), positive_int(d, "d")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    return x, teacher(x)


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
    _check_float(y, "y")
    pred = model(x)
    if pred.shape != y.shape:
        raise ValueError(f"model(x) has shape {tuple(pred.shape)} but y has shape {tuple(y.shape)}")
    var = y.var(unbiased=False)
    if not var > 0:
        raise ValueError("y is constant (zero variance): the relative MSE is undefined")
    return float(((pred - y) ** 2).mean() / var)


# --------------------------------------------------------------------------------------
# Bilinear attention (chapter 3)
# --------------------------------------------------------------------------------------


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
    lowrank._check_dense(layer)
    out = copy.deepcopy(layer)
    out.interaction.copy_(lowrank.symmetric_part(layer.interaction))
    return out


@torch.no_grad()
def antisymmetric_part(layer: BilinearAttentionMLP) -> BilinearAttentionMLP:
    """A copy of ``layer`` with every A_j replaced by (A_j − A_jᵀ)/2; all its scores are 0."""
    lowrank._check_dense(layer)
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
    _check_float(x, "x")
    _check_float(y, "y")
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
    _check_float(x, "x")
    _check_float(y, "y")
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


class LiftedBilinearAttention(nn.Module):
    """A gated MLP written as bilinear attention on a lifted token.

    ``lift(x)`` = z = [x, σ(x·q) for every query row q of every slot], of width d + m·r
    (the token followed by its query features); ``bilinear`` is a
    :class:`BilinearAttentionMLP` on z with the identity activation whose slot j pairs
    each of its query features with the matching key row k: row d + j·r + s of A_j is
    [key[j, s], 0], so z A_j zᵀ = Σ_s σ(x·query[j, s]) (x·key[j, s]).
    ``forward(x)`` = bilinear(lift(x)).
    Built by :func:`gated_as_bilinear_attention`. Shapes: (..., d) -> (..., d_out).
    """

    def __init__(self, query: torch.Tensor, activation, bilinear: BilinearAttentionMLP):
        super().__init__()
        self.register_buffer("query", query)      # (m·r, d)
        self.activation = get_activation(activation)
        self.bilinear = bilinear

    def lift(self, x: torch.Tensor) -> torch.Tensor:
        """z = [x, σ(x Q_flatᵀ)]: (..., d) -> (..., d + m·r)."""
        _check_float(x)
        if x.shape[-1] != self.query.shape[1]:
            raise ValueError(f"expected input of shape (..., {self.query.shape[1]}), "
                             f"got {tuple(x.shape)}")
        return torch.cat([x, self.activation(x @ self.query.T)], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bilinear(self.lift(x))


@torch.no_grad()
def gated_as_bilinear_attention(layer: GatedMLP) -> LiftedBilinearAttention:
    """The gated MLP as bilinear attention (identity σ) on z = [x, σ(xQᵀ)].

    Slot j's score is the bilinear form z A_j zᵀ = Σ_s a_s b_s between the nonlinear
    query features a_s = σ(x·query[j, s]) and the linear keys b_s = x·key[j, s]; nothing is
    applied to the score. The result equals ``layer`` on every input.
    """
    if not isinstance(layer, GatedMLP):
        raise TypeError(f"layer must be a GatedMLP, got {type(layer).__name__}")
    m, r, d = layer.d_hidden, layer.rank, layer.d_model
    w = layer.value
    width = d + m * r
    bi = BilinearAttentionMLP(width, m, layer.d_out, activation="identity",
                              device=w.device, dtype=w.dtype)
    bi.interaction.zero_()
    for j in range(m):
        for s in range(r):
            bi.interaction[j, d + j * r + s, :d] = layer.key[j, s]
    bi.value.copy_(layer.value)
    query = layer.query.detach().reshape(m * r, d).clone()
    return LiftedBilinearAttention(query, layer.activation, bi)


def directional_derivative(f, x: torch.Tensor, u: torch.Tensor, order: int = 1) -> torch.Tensor:
    """dⁿ/dtⁿ f(x + t u) at t = 0, by n nested forward-mode derivatives (torch.func).

    f maps (..., d) to (..., k); x and u have shape (..., d) (broadcast). Returns a
    tensor of f(x)'s shape. Exact up to rounding for smooth f (use float64).
    """
    from torch.func import jacfwd

    _check_float(x)
    _check_float(u, "u")
    positive_int(order, "order")
    x, u = torch.broadcast_tensors(x, u)

    def h(t):
        return f(x + t * u)

    for _ in range(order):
        h = jacfwd(h)
    return h(torch.zeros((), dtype=x.dtype, device=x.device))


def gradient_jump(f, x0: torch.Tensor, normal: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """The jump of f's Jacobian across the hyperplane through x0 with normal ``normal``.

    J(x0 + ε n) − J(x0 − ε n) for a piecewise-smooth f whose pieces near x0 are separated
    by that hyperplane; J is the Jacobian (k, d) of f: (d,) -> (k,) (a scalar f gives
    (d,)). x0, normal: (d,). Accurate to O(ε) for piecewise-polynomial f.
    """
    from torch.func import jacrev

    _check_float(x0, "x0")
    _check_float(normal, "normal")
    if x0.dim() != 1 or normal.shape != x0.shape:
        raise ValueError(f"x0 and normal must be vectors of one shape (d,), got "
                         f"{tuple(x0.shape)} and {tuple(normal.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")
    n = normal / normal.norm()
    jac = jacrev(f)
    return jac(x0 + eps * n) - jac(x0 - eps * n)


#: Widths and seeds of chapter 3's product study.
PRODUCT_WIDTHS = (1, 2, 4, 8, 32)
PRODUCT_SEEDS = tuple(range(10))


def product_study(widths: Sequence[int] = PRODUCT_WIDTHS,
                  seeds: Sequence[int] = PRODUCT_SEEDS) -> dict:
    """Chapter 3's experiment: :func:`compare_on_product` at every width and seed;
    a JSON-ready dict ``{"widths", "seeds", "results": {width: compare_on_product(...)}}``."""
    return {"widths": list(widths), "seeds": list(seeds),
            "results": {str(w): compare_on_product(w, seeds=seeds) for w in widths}}


def _main(argv=None) -> None:
    """``python -m qkmlp.examples static-query --out FILE``: run chapter 2's study and
    store it as JSON with its provenance."""
    import argparse
    import datetime
    import json
    import platform
    import subprocess
    import sys
    import time

    parser = argparse.ArgumentParser(prog="python -m qkmlp.examples")
    parser.add_argument("study", choices=["static-query", "product"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=20, help="static-query only")
    parser.add_argument("--steps", type=int, default=3000, help="static-query only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.study == "static-query":
        data = static_query_study(range(args.seeds), args.steps)
    else:
        data = product_study()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    data["provenance"] = {
        "command": "python -m qkmlp.examples " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": commit,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    with open(args.out, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    _main()
