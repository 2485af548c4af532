"""Outliers by position: massive activations at the first token, kept apart from the rest.

In many trained language models a few entries of the residual stream are thousands of
times larger than the median at the first token of a sequence (and at some delimiter
tokens), nearly independently of the input: the *massive activations* of Sun et al.
(2024, arXiv:2402.17762), who define one as an entry above 100 in magnitude and at least
1000 times the median magnitude of its hidden state. An MLP unit whose output is largest
at position 0 is then reporting that pattern, not a property of typical tokens, so every
statistic here comes twice: over all positions, and with position 0 left out.

- :func:`residual_outliers`: per decoder layer, the largest |entry| of the stream
  entering it at position 0 and elsewhere and the median |entry| (so :func:`is_massive`
  tells whether either place holds a massive activation, by the layer's median), and how
  many entries meet a stricter, per-token form of the criterion;
- :func:`unit_peaks`: per unit, the largest |σ(a)b| over all positions and over
  positions ≥ 1, and the position of the peak in each window.
"""
from __future__ import annotations

import torch

from ..layers import GatedMLP

__all__ = ["MASSIVE_ABS", "MASSIVE_RATIO", "is_massive", "residual_outliers", "unit_peaks"]

#: Sun et al.'s absolute threshold: a massive entry has |entry| > 100 ...
MASSIVE_ABS = 100.0
#: ... and |entry| ≥ 1000 × the median |entry|.
MASSIVE_RATIO = 1000.0


def is_massive(value: float, median: float) -> bool:
    """Sun et al.'s criterion: |value| > :data:`MASSIVE_ABS` and ≥ :data:`MASSIVE_RATIO` ×
    ``median`` (the median |entry| of the layer's hidden states)."""
    return abs(value) > MASSIVE_ABS and abs(value) >= MASSIVE_RATIO * median


def _check3(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] < 2:
        raise ValueError(f"{name} must be a (windows, positions >= 2, d) tensor, got "
                         f"{tuple(getattr(x, 'shape', ()))}")
    return x.detach().double()


@torch.no_grad()
def residual_outliers(h: torch.Tensor) -> dict:
    """Statistics of one layer's residual stream h (B, L, d), position 0 kept apart.

    Returns ``max_pos0``, ``max_rest`` (largest |entry| at position 0 and at positions
    ≥ 1) and ``median`` (median |entry| over all windows, positions and coordinates: the
    reference of :func:`is_massive`); and, stricter, ``massive_pos0`` and ``massive_rest``:
    entries with |h| > :data:`MASSIVE_ABS` and ≥ :data:`MASSIVE_RATIO` × the median
    |entry| of their own token's vector (a token whose whole vector is large, as the
    first token's can be, does not count), and ``windows_massive_rest``: in how many
    windows some position ≥ 1 holds one of those.
    """
    h = _check3(h, "h").abs()
    med_tok = h.median(dim=-1, keepdim=True).values
    massive = (h > MASSIVE_ABS) & (h >= MASSIVE_RATIO * med_tok)
    return {"max_pos0": float(h[:, 0].max()), "max_rest": float(h[:, 1:].max()), "median": float(h.median()),
            "massive_pos0": int(massive[:, 0].sum()), "massive_rest": int(massive[:, 1:].sum()),
            "windows_massive_rest": int(massive[:, 1:].flatten(1).any(1).sum())}


@torch.no_grad()
def unit_peaks(layer: GatedMLP, x: torch.Tensor) -> dict:
    """Per unit of a rank-1 gated layer on its inputs x (B, L, d):

    ``peak`` and ``peak_rest`` (m,): the largest |h| = |σ(a)b| over all positions and over
    positions ≥ 1; ``peak_position`` (B, m): the position of the largest |h| in each window.
    """
    if not isinstance(layer, GatedMLP) or layer.rank != 1:
        raise TypeError("unit_peaks needs a rank-1 GatedMLP")
    x = _check3(x, "x")
    q, k = layer.query[:, 0].detach().double(), layer.key[:, 0].detach().double()
    h = (layer.activation(x @ q.T) * (x @ k.T)).abs()           # (B, L, m)
    return {"peak": h.amax((0, 1)), "peak_rest": h[:, 1:].amax((0, 1)), "peak_position": h.argmax(1)}
