"""The geometry of a gated layer's (query, key) pairs, and what real inputs do to them.

For a rank-1 :class:`~qkmlp.GatedMLP` with rows q_j (gate) and k_j (up), j = 1..m:

- ``cos`` = q_j·k_j / (‖q_j‖‖k_j‖): alignment of the pair (±1: q_j = c·k_j);
- ``balance`` = log(‖q_j‖/‖k_j‖): where the pair sits on its inverse-scaling orbit
  q → αq, k → k/α (which moves the balance by log|α|);
- the two non-zero eigenvalues of sym(q_jᵀk_j) = ½(q_jᵀk_j + k_jᵀq_j), the quadratic form
  x ↦ (x·q_j)(x·k_j) that the symmetric and bilinear layers see:
  λ± = ½(q_j·k_j ± ‖q_j‖‖k_j‖), one ≥ 0 and one ≤ 0, with λ₊/|λ₋| = (1+cos)/(1−cos).

On inputs x (N, d) (what the MLP receives), with a = x·q_j, b = x·k_j and the unit's
output coefficient h = σ(a)·b, :func:`input_statistics` summarises how far a and b reach
into σ's nonlinear range, how aligned a and b are on those inputs, and how large the
units' outputs get.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..layers import GatedMLP

__all__ = ["QUANTILES", "pair_geometry", "shuffled_pairs", "sym_eigenvalues", "summarise",
           "input_statistics", "cos_histogram", "alignment_bins"]

#: Quantiles stored for every distribution (fractions).
QUANTILES = (0.001, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999)


def _rank1(layer: GatedMLP) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(layer, GatedMLP):
        raise TypeError(f"expected a GatedMLP, got {type(layer).__name__}")
    if layer.rank != 1:
        raise ValueError(f"the pair geometry is defined for rank 1; got rank {layer.rank}")
    return layer.query[:, 0].detach().double(), layer.key[:, 0].detach().double()


def pair_geometry(layer: GatedMLP) -> dict[str, torch.Tensor]:
    """Per-unit ``cos``, ``balance``, ``norm_q``, ``norm_k`` (each (m,), float64)."""
    q, k = _rank1(layer)
    nq, nk = q.norm(dim=1), k.norm(dim=1)
    return {"cos": (q * k).sum(1) / (nq * nk), "balance": torch.log(nq / nk), "norm_q": nq, "norm_k": nk}


def shuffled_pairs(layer: GatedMLP, generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
    """``cos`` and ``balance`` of the *unpaired* rows (q_j, k_π(j)) for a random cyclic
    permutation π (π(j) ≠ j): the baseline that keeps each matrix's rows as they are and
    only breaks the pairing. Each (m,), float64."""
    q, k = _rank1(layer)
    m = q.shape[0]
    if m < 2:
        raise ValueError("shuffled_cos needs at least two units")
    order = torch.randperm(m, generator=generator)
    perm = torch.empty_like(order)
    perm[order] = order.roll(-1)          # one random m-cycle: π(j) ≠ j for every j
    kk = k[perm]
    nq, nk = q.norm(dim=1), kk.norm(dim=1)
    return {"cos": (q * kk).sum(1) / (nq * nk), "balance": torch.log(nq / nk)}


def sym_eigenvalues(layer: GatedMLP) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-zero eigenvalues (λ₊ ≥ 0, λ₋ ≤ 0) of sym(q_jᵀk_j) per unit, from the
    closed form ½(q·k ± ‖q‖‖k‖): two (m,) float64 tensors."""
    q, k = _rank1(layer)
    dot, nn_ = (q * k).sum(1), q.norm(dim=1) * k.norm(dim=1)
    return 0.5 * (dot + nn_), 0.5 * (dot - nn_)


def summarise(values: torch.Tensor, quantiles: Sequence[float] = QUANTILES) -> dict:
    """``{"mean", "sd", "min", "max", "quantiles": [...]}`` of a tensor (flattened, float64)."""
    v = values.detach().double().flatten().cpu()
    if v.numel() == 0:
        raise ValueError("cannot summarise an empty tensor")
    qs = torch.quantile(v if v.numel() <= 2 ** 24 else v[torch.randperm(v.numel())[:2 ** 24]],
                        torch.tensor(list(quantiles), dtype=torch.float64))
    return {"mean": float(v.mean()), "sd": float(v.std()) if v.numel() > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max()), "quantiles": [float(x) for x in qs]}


def cos_histogram(cos: torch.Tensor, bins: int = 40) -> list[int]:
    """Counts of ``cos`` in ``bins`` equal bins over [-1, 1]."""
    return [int(c) for c in torch.histc(cos.double(), bins=bins, min=-1.0, max=1.0)]


@torch.no_grad()
def input_statistics(layer: GatedMLP, x: torch.Tensor, *, band: float = 1.0) -> dict:
    """How real inputs x (N, d) (what the MLP receives) meet the layer's units.

    With a = x·q_j (gate pre-activations), b = x·k_j and h = σ(a)·b, returns:

    - ``a``, ``b``: :func:`summarise` of all N·m values;
    - ``frac_a_in_band``: share of all a with |a| ≤ ``band``;
    - ``nonlinear_share``: ‖σ(a) − c·a‖ / ‖σ(a)‖ over all (token, unit) entries, with c the
      least-squares slope: the part of σ(a) that no linear σ reproduces on these inputs
      (0 for linear σ, at most 1);
    - ``corr_ab`` (m,): per unit the correlation of a and b over the tokens (their
      alignment as the inputs see it; cos is the alignment of the weights);
    - ``peak_h`` (m,): per unit the largest |h| over the tokens; ``rms_h`` (m,): its RMS.
    """
    q, k = _rank1(layer)
    x = x.detach().reshape(-1, layer.d_model).double()
    if x.shape[0] < 2:
        raise ValueError("input_statistics needs at least two input rows")
    a, b = x @ q.T, x @ k.T
    sa = layer.activation(a)
    h = sa * b
    c = (sa * a).sum() / (a * a).sum()
    ac, bc = a - a.mean(0), b - b.mean(0)
    return {
        "a": summarise(a), "b": summarise(b),
        "frac_a_in_band": float((a.abs() <= band).double().mean()),
        "nonlinear_share": float((sa - c * a).norm() / sa.norm()),
        "corr_ab": (ac * bc).sum(0) / (ac.norm(dim=0) * bc.norm(dim=0)),
        "peak_h": h.abs().amax(0), "rms_h": h.pow(2).mean(0).sqrt(),
    }


def alignment_bins(alignment: torch.Tensor, rel_peak: torch.Tensor, edges: Sequence[float] = (
        0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)) -> dict:
    """How a unit's relative peak output depends on its alignment.

    ``alignment`` (n,) in [0, 1] (|cos| or |corr(a, b)|), ``rel_peak`` (n,) the unit's
    peak |h| over its layer's median. Per bin [e_i, e_{i+1}) (the last one closed):
    ``count``, ``median``, ``q99`` and ``max`` of ``rel_peak`` (``None`` when empty).
    """
    if alignment.shape != rel_peak.shape or alignment.dim() != 1:
        raise ValueError("alignment and rel_peak must be 1-D tensors of the same length")
    al, rp = alignment.double(), rel_peak.double()
    out = {"edges": list(edges), "count": [], "median": [], "q99": [], "max": []}
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        last = i == len(edges) - 2
        sel = rp[(al >= lo) & ((al <= hi) if last else (al < hi))]
        out["count"].append(int(sel.numel()))
        if sel.numel():
            out["median"].append(float(sel.median()))
            out["q99"].append(float(torch.quantile(sel, 0.99)))
            out["max"].append(float(sel.max()))
        else:
            out["median"].append(None), out["q99"].append(None), out["max"].append(None)
    return out
