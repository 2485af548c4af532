"""Chapter 4, rank one: the gated MLP as bilinear attention on a lifted token, and the
two measurements behind the chapter's "the classes differ".

- :class:`LiftedBilinearAttention` and :func:`gated_as_bilinear_attention` (a gated MLP
  as bilinear attention on the token followed by its query features).
- :func:`directional_derivative` (the n-th derivative of x ↦ f(x + t u) at t = 0) and
  :func:`gradient_jump` (the jump of a Jacobian across a hyperplane).
"""
from __future__ import annotations

import torch
from torch import nn

from .._checks import float_tensor, positive_int
from ..activations import get_activation
from ..layers import BilinearAttentionMLP, GatedMLP

__all__ = ["LiftedBilinearAttention", "gated_as_bilinear_attention", "directional_derivative",
           "gradient_jump"]


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
        float_tensor(x)
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

    float_tensor(x)
    float_tensor(u, "u")
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

    float_tensor(x0, "x0")
    float_tensor(normal, "normal")
    if x0.dim() != 1 or normal.shape != x0.shape:
        raise ValueError(f"x0 and normal must be vectors of one shape (d,), got "
                         f"{tuple(x0.shape)} and {tuple(normal.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")
    n = normal / normal.norm()
    jac = jacrev(f)
    return jac(x0 + eps * n) - jac(x0 - eps * n)
