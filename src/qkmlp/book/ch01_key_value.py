"""Chapter 1, the feed-forward layer as a key-value memory: biases as a constant
coordinate, and a memory of facts built by hand.

- Biases: :func:`with_bias_coordinate`, :class:`BiasCoordinate`,
  :func:`key_value_from_mlp` (an ``nn.Linear → σ → nn.Linear`` MLP with biases as an
  equal :class:`~qkmlp.KeyValueMLP` on ``[x, 1]``; chapters 3 and 4 use it too).
- Facts: :func:`capital_facts`, :func:`fact_memory`, :func:`decode`.

Deterministic (explicit seeds) and small enough to run in a fraction of a second on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from torch import nn

from .._checks import float_tensor
from ..activations import get_activation
from ..layers import KeyValueMLP

__all__ = ["with_bias_coordinate", "BiasCoordinate", "key_value_from_mlp", "FactTask", "capital_facts",
           "fact_memory", "decode"]


def with_bias_coordinate(x: torch.Tensor) -> torch.Tensor:
    """Append a constant 1 to every token: (..., d) -> (..., d + 1)."""
    float_tensor(x)
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
    float_tensor(emb, "task.embeddings")
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
    float_tensor(out, "out")
    float_tensor(embeddings, "embeddings")
    if embeddings.dim() != 2:
        raise ValueError(f"embeddings must have shape (n, d), got {tuple(embeddings.shape)}")
    if out.shape[-1] != embeddings.shape[1]:
        raise ValueError(f"out must have last dimension {embeddings.shape[1]}, got {tuple(out.shape)}")
    return (out @ embeddings.T).argmax(-1)
