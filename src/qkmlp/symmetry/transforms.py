"""Symmetry transforms of the layers, measurements, and the theorems as predicates.

Transforms return a new layer and leave their input untouched:

- ``swapped(layer)``: exchange query and key (q_{j,s} ↔ k_{j,s}; for the dense layer
  A_j → A_jᵀ).
- ``rescaled(layer, alpha)``: inverse scaling q → αq, k → k/α.
- ``gauge_transformed(layer, G)``: per slot Q_j → G Q_j, K_j → G⁻ᵀ K_j, where Q_j is the
  (r, d) matrix with rows q_{j,s}; G is (r, r) or (m, r, r).

Predicates (the theorems of the book, chapter "Symmetry breaking") give a *sufficient
condition*, read from the activation's declared properties (``is_linear``,
``homogeneity_degree``, ``is_odd`` of :class:`~qkmlp.activations.Activation`): ``True``
means the theorems guarantee that the transform leaves the layer's function unchanged for
every input and every weight. ``False`` means the declared properties do not guarantee it,
not that the transform changes the function. For the ten named activations of
:func:`qkmlp.get_activation` the converse of the theorems applies to the symmetric and gated
forms, and to the exchange and the rescalings of the symmetrised gated form: there ``False``
does mean that some weights change (chapters "Symmetry breaking" and "Rank r" measure a change
above 1e-3 at random weights for the exchanges, rescalings and gauges they try); for the
symmetrised form's gauge it is a sufficient condition only. For a custom σ it need not: the symmetrised gated layer
with σ(z) = z·log|z| keeps every inverse scaling and every diagonal gauge, although
σ(αz) = ασ(z) fails and the predicates say ``False``.

This is the lower layer of :mod:`qkmlp.symmetry`: :mod:`~qkmlp.symmetry.group` builds on
these transforms, and nothing imported here imports it.
"""
from __future__ import annotations

import copy
import math
from numbers import Real

import torch

from .._checks import tolerance
from ..activations import Activation
from ..layers import (
    BilinearAttentionMLP,
    GatedMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)

__all__ = [
    "swapped",
    "rescaled",
    "gauge_transformed",
    "relative_change",
    "swap_is_symmetry",
    "rescaling_is_symmetry",
    "gauge_is_symmetry",
    "scalar_rescaling_commutes",
]

_FACTORED = (SymmetricBilinearMLP, GatedMLP, SymmetrizedGatedMLP)
# σ on single linear forms: the scaling and gauge rules of the gated form apply
_GATED = (GatedMLP, SymmetrizedGatedMLP)


def _clone(layer):
    return copy.deepcopy(layer)


def _require(layer, types, what: str) -> None:
    if not isinstance(layer, types):
        names = ", ".join(t.__name__ for t in types)
        raise TypeError(f"{what} is defined for {names}; got {type(layer).__name__}")


def _check_alpha(alpha) -> float:
    """α as a float: a real number (int, float, NumPy scalar or one-element real tensor;
    not bool, str or complex), finite and non-zero."""
    if isinstance(alpha, torch.Tensor):
        if alpha.numel() != 1:
            raise ValueError(f"alpha must be a scalar, got a tensor of shape {tuple(alpha.shape)}")
        if alpha.dtype == torch.bool or alpha.is_complex():
            raise TypeError(f"alpha must be a real number, got a {alpha.dtype} tensor")
        alpha = alpha.item()
    if isinstance(alpha, bool) or type(alpha).__name__ == "bool_" or not isinstance(alpha, Real):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__} {alpha!r}")
    a = float(alpha)
    if not math.isfinite(a) or a == 0.0:
        raise ValueError(f"alpha must be a finite non-zero number, got {alpha!r}")
    return a


@torch.no_grad()
def swapped(layer):
    """Exchange query and key: q_{j,s} ↔ k_{j,s} (dense layer: A_j → A_jᵀ)."""
    _require(layer, (*_FACTORED, BilinearAttentionMLP), "swapped")
    out = _clone(layer)
    if isinstance(layer, BilinearAttentionMLP):
        out.interaction.copy_(layer.interaction.transpose(-1, -2))
    else:
        out.query.copy_(layer.key)
        out.key.copy_(layer.query)
    return out


@torch.no_grad()
def rescaled(layer, alpha):
    """Inverse scaling: query → α·query, key → key/α. α must be finite and non-zero."""
    _require(layer, (*_FACTORED, StaticQueryMLP), "rescaled")
    a = _check_alpha(alpha)
    out = _clone(layer)
    out.query.mul_(a)
    out.key.div_(a)
    return out


def _check_gauge(layer, G) -> torch.Tensor:
    m, r = layer.d_hidden, layer.rank
    if not isinstance(G, torch.Tensor):
        try:
            G = torch.as_tensor(G)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"G must be a real matrix (tensor or nested lists), got {type(G).__name__}") from None
    if G.is_complex() or G.dtype == torch.bool:
        raise TypeError(f"G must be a real matrix, got dtype {G.dtype}")
    if not G.is_floating_point():
        G = G.to(torch.float64)
    if G.shape == (r, r):
        G = G.expand(m, r, r)
    elif G.shape != (m, r, r):
        raise ValueError(f"G must have shape (rank, rank)=({r}, {r}) or (d_hidden, rank, rank)=({m}, {r}, {r}); got {tuple(G.shape)}")
    G64 = G.to(torch.float64).cpu()
    if not torch.isfinite(G64).all():
        raise ValueError("G must be finite")
    sv = torch.linalg.svdvals(G64)
    smin, smax = sv[..., -1], sv[..., 0]
    if (smax == 0).any() or (smin / smax < 1e3 * torch.finfo(torch.float64).eps * r).any():
        raise ValueError("G must be invertible; got a singular (or numerically singular) matrix")
    return G


@torch.no_grad()
def gauge_transformed(layer, G):
    """Per slot Q_j → G Q_j, K_j → G⁻ᵀ K_j; G is (r, r) or (m, r, r) and invertible.

    Q_jᵀK_j = Σ_s q_{j,s}ᵀk_{j,s} is unchanged, so the symmetric form is invariant for
    every G; the gated form only for the G allowed by :func:`gauge_is_symmetry`.
    """
    _require(layer, _FACTORED, "gauge_transformed")
    G = _check_gauge(layer, G)
    out = _clone(layer)
    G64 = G.to(torch.float64)
    q = layer.query.to(torch.float64)
    k = layer.key.to(torch.float64)
    G_inv_T = torch.linalg.inv(G64.to(q.device)).transpose(-1, -2)
    out.query.copy_(torch.matmul(G64.to(q.device), q))
    out.key.copy_(torch.matmul(G_inv_T, k))
    return out


@torch.no_grad()
def relative_change(layer_a, layer_b, x: torch.Tensor) -> float:
    """‖f_b(x) − f_a(x)‖ / ‖f_a(x)‖ over the whole batch (Frobenius norms, in float64).

    Returns the absolute difference norm when f_a(x) is exactly zero.
    """
    ya, yb = layer_a(x), layer_b(x)
    if ya.shape != yb.shape:
        raise ValueError(f"layers give outputs of different shapes {tuple(ya.shape)} and {tuple(yb.shape)}")
    ya, yb = ya.double(), yb.double()
    diff = torch.linalg.vector_norm(yb - ya)
    base = torch.linalg.vector_norm(ya)
    return float(diff / base) if base > 0 else float(diff)


# --- the theorems as predicates -------------------------------------------------------

def scalar_rescaling_commutes(activation: Activation, alpha) -> bool:
    """Whether σ(αz) = α·σ(z) for every z follows from σ's declared properties.

    ``True`` for: α = 1; linear σ (any α); α = −1 and odd σ; α > 0 and σ positively
    homogeneous of degree 1. ``False`` otherwise, which for a custom σ only means the
    properties do not imply it: σ(z) = z(2 + sin(2π log₂|z|)) declares none of them and
    still commutes with α = 2, and, being odd, with α = −2. For the ten named activations the
    answer is exact. (Of the declared properties, only linearity implies it for an α < 0 other
    than −1; all α < 0 together force σ to be linear.)
    """
    a = _check_alpha(alpha)
    if a == 1.0 or activation.is_linear:
        return True
    if a == -1.0:
        return activation.is_odd
    if a > 0:
        return activation.homogeneity_degree == 1
    return False


def swap_is_symmetry(layer) -> bool:
    """Whether q ↔ k must leave the layer's function unchanged, for every weight.

    Symmetric, symmetrised and dense forms: ``True`` (x A xᵀ = x Aᵀ xᵀ; the symmetrised
    form is the average over the swap). Gated form: ``True`` iff σ is declared linear.
    The gated answer is exact for every σ whose ``is_linear`` is right: σ(a)b = σ(b)a for
    all a, b forces σ(z) = cz, so for a nonlinear σ some weights change (already with
    d = m = r = 1).
    """
    _require(layer, (*_FACTORED, BilinearAttentionMLP), "swap_is_symmetry")
    if isinstance(layer, GatedMLP):
        return layer.activation.is_linear
    return True


def rescaling_is_symmetry(layer, alpha) -> bool:
    """A sufficient condition for q → αq, k → k/α to leave the function unchanged.

    Symmetric form and static query: ``True`` for every σ and every α ≠ 0 (exact).
    Gated form: ``True`` when σ(αz) = ασ(z) follows from σ's declared properties
    (:func:`scalar_rescaling_commutes`): every α > 0 for ReLU and leaky ReLU, α = −1 for
    odd σ (tanh), every α for linear σ. The gated form is invariant for all weights iff
    σ(αz) = ασ(z) for all z, so for the ten named activations ``False`` means some
    weights change; a custom σ may commute with one α without declaring a property that
    implies it. A positively homogeneous σ of degree p ≠ 1 (squared ReLU) is invariant for no
    α > 0 but 1, and for α = −1 only if it is odd (z·|z|), but changes the layer exactly:
    f becomes α^(p−1)·f for α > 0 and x ↦ |α|^(p−1)·f(−x) for α < 0 (not a multiple of f for
    squared ReLU).

    The symmetrised gated form is invariant for all weights iff σ(αz) − ασ(z) = c·z for
    some constant c; this returns the gated answer, which implies it. For the ten named
    activations the two conditions pick the same α; for a custom σ they can differ:
    σ(z) = z·log|z| satisfies the symmetrised condition for every α ≠ 0 (c = α·log|α|)
    and the gated one only for α = ±1 (z·log|z| is odd).
    """
    _require(layer, (*_FACTORED, StaticQueryMLP), "rescaling_is_symmetry")
    if isinstance(layer, _GATED):
        return scalar_rescaling_commutes(layer.activation, alpha)
    _check_alpha(alpha)
    return True


def gauge_is_symmetry(layer, G, *, atol: float = 1e-12) -> bool:
    """A sufficient condition for the gauge transform by G to leave the function unchanged.

    Symmetric form: ``True`` for every invertible G (exact). Gated form with linear σ:
    ``True`` for every G. Otherwise ``True`` iff every slot's G is P·D (P a permutation
    of the rank components, D diagonal) with every diagonal entry δ such that
    σ(δz) = δσ(z) follows from σ's declared properties (:func:`scalar_rescaling_commutes`).
    For a continuous, non-affine σ and slots whose 2r query and key vectors are linearly
    independent, the gated form keeps exactly these G (chapter "Rank r"), so for the ten
    named activations ``False`` means some weights change. The symmetrised gated form
    gets the gated answer, a sufficient condition only: with σ(z) = z·log|z| it keeps
    every invertible diagonal G, e.g. diag(2, −½, 3), where this returns ``False``.
    """
    _require(layer, _FACTORED, "gauge_is_symmetry")
    atol = tolerance(atol, "atol")
    G = _check_gauge(layer, G).to(torch.float64)
    if isinstance(layer, SymmetricBilinearMLP) or layer.activation.is_linear:
        return True
    nonzero = G.abs() > atol
    # a generalised permutation has exactly one non-zero per row and per column
    if not (bool((nonzero.sum(-1) == 1).all()) and bool((nonzero.sum(-2) == 1).all())):
        return False
    return all(scalar_rescaling_commutes(layer.activation, v) for v in G[nonzero].unique().tolist())
