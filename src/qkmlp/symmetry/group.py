"""The symmetry group of every layer beyond its dimension: the gauge count, the discrete
symmetries, and the conserved quantities.

- :func:`gauge_symmetry_dimension`: how many directions of the GL(r) gauge of
  :func:`qkmlp.symmetry.gauge_transformed` leave a factored layer unchanged, measured
  through the public transform.
- The discrete symmetries: :func:`slot_permuted`, :func:`odd_sign_flip`.
- The conserved quantities of gradient flow that the continuous symmetries imply
  (:func:`conserved_quantities`).

The dimension of the continuous group, measured and predicted, lives in
:mod:`~qkmlp.symmetry.dimensions`. This module builds on :mod:`~qkmlp.symmetry.transforms`;
nothing it imports imports it.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from ..costs import require_layer
from ..layers import BilinearAttentionMLP, GatedMLP, KeyValueMLP, StaticQueryMLP, SymmetricBilinearMLP
from .transforms import gauge_transformed

__all__ = [
    "gauge_symmetry_dimension",
    "slot_permuted",
    "odd_sign_flip",
    "conserved_quantities",
]


def gauge_symmetry_dimension(
    layer: nn.Module,
    x: Optional[torch.Tensor] = None,
    *,
    eps: float = 1e-4,
    rtol: float = 1e-6,
    seed: int = 0,
) -> int:
    """Number of directions of the GL(r) gauge that leave a factored layer unchanged.

    The gauge moves slot j's factors as Q_j → G_j Q_j, K_j → G_j⁻ᵀ K_j
    (:func:`qkmlp.symmetry.gauge_transformed`). For each of the m·r² generators E (one
    entry of one slot's r × r matrix) the output's derivative along G = I + εE is taken by
    central differences with step ``eps``; the result is m·r² minus the rank of the stacked
    derivatives (singular values above ``rtol`` × the norm of the outputs on the inputs, so
    a layer on which every generator is a symmetry counts them all). Symmetric layer: m·r²;
    gated ReLU: m·r (positive diagonals); gated SiLU: 0. Only the public transform is
    used, so the count does not depend on how the layer stores its weights.

    Inputs: ``x`` (N, d) if given. By default, for a smooth σ, 2·m·r² + 20 standard-normal
    inputs (float64); for a piecewise σ (relu, leaky_relu, relu2, a plain callable) a
    direction seen on one narrow cell of the kinks is missed by random inputs that land in
    no point of it (a gated ReLU layer with d = 2, m = 3, r = 2 counted 8 for 6 on 44
    Gaussian inputs), so inputs are added in rounds, Gaussian and around the kinks, until
    two rounds in a row give one rank, as :func:`qkmlp.symmetry.measure_symmetry` does
    (at most six rounds, else ``RuntimeError``).
    """
    from .dimensions import is_piecewise, settled_rank

    if not isinstance(layer, (SymmetricBilinearMLP, GatedMLP)):
        raise TypeError("gauge_symmetry_dimension expects a SymmetricBilinearMLP or "
                        f"GatedMLP (a layer with rank-r factors); got {type(layer).__name__}")
    if not (0.0 < eps < 1.0) or not (0.0 < rtol < 1.0):
        raise ValueError(f"eps and rtol must be in (0, 1), got eps={eps!r}, rtol={rtol!r}")
    layer64 = copy.deepcopy(layer).to(device="cpu", dtype=torch.float64)
    m, r = layer64.d_hidden, layer64.rank
    n_gen = m * r * r
    if x is not None:
        return n_gen - _gauge_rank(layer64, x.to(device="cpu", dtype=torch.float64), eps, rtol)[0]
    gen = torch.Generator().manual_seed(seed)
    n0 = 2 * n_gen + 20
    x = torch.randn(n0, layer64.d_model, generator=gen, dtype=torch.float64)
    if not is_piecewise(layer64.activation):
        return n_gen - _gauge_rank(layer64, x, eps, rtol)[0]
    state = {"R": None, "out_sq": 0.0}

    def fold(batch):
        rank, state["R"], state["out_sq"] = _gauge_rank(layer64, batch, eps, rtol, state["R"], state["out_sq"])
        return rank

    return n_gen - settled_rank(layer64, x, gen, fold, what="gauge", fixed="x= to measure on fixed inputs")[0]


def _gauge_rank(layer64, x: torch.Tensor, eps: float, rtol: float, R=None, out_sq: float = 0.0):
    """(rank, R, out_sq): the rank of the gauge derivatives on ``x`` stacked under the rows
    already folded into the QR factor ``R`` (same singular values, n_gen × n_gen memory),
    against ``rtol`` × the norm of all outputs so far (``out_sq`` its square)."""
    m, r = layer64.d_hidden, layer64.rank
    n_gen = m * r * r
    eye = torch.eye(r, dtype=torch.float64).expand(m, r, r)
    columns = []
    with torch.no_grad():
        for g in range(n_gen):
            E = torch.zeros(n_gen, dtype=torch.float64)
            E[g] = 1.0
            E = E.reshape(m, r, r)
            up = gauge_transformed(layer64, eye + eps * E)(x)
            down = gauge_transformed(layer64, eye - eps * E)(x)
            columns.append(((up - down) / (2 * eps)).reshape(-1))
        D = torch.stack(columns, dim=1)
        R = torch.linalg.qr(D if R is None else torch.cat([R, D]), mode="r").R
        sv = torch.linalg.svdvals(R)
        # relative to the size of the output, not to the largest singular value: when every
        # generator is a symmetry, all singular values are round-off and none may count
        out_sq += float(torch.linalg.vector_norm(layer64(x)) ** 2)
    return int((sv > rtol * out_sq ** 0.5).sum()), R, out_sq


# --- discrete symmetries ------------------------------------------------------------------

def _slot_params(layer) -> list[str]:
    if isinstance(layer, (KeyValueMLP, StaticQueryMLP)):
        return ["key", "value"]
    if isinstance(layer, BilinearAttentionMLP):
        return ["interaction", "value"]
    return ["query", "key", "value"]


@torch.no_grad()
def slot_permuted(layer: nn.Module, perm) -> nn.Module:
    """A copy with the memory slots reordered by ``perm`` (a permutation of range(m)).

    Every layer is a sum over slots, so this is a symmetry for every σ.
    """
    require_layer(layer)
    perm = torch.as_tensor(perm, dtype=torch.long)
    m = layer.d_hidden
    if perm.shape != (m,) or not torch.equal(perm.sort().values, torch.arange(m)):
        raise ValueError(f"perm must be a permutation of range(d_hidden={m}), got {perm.tolist()}")
    out = copy.deepcopy(layer)
    for name in _slot_params(layer):
        getattr(out, name).copy_(getattr(layer, name)[perm])
    return out


@torch.no_grad()
def odd_sign_flip(layer: nn.Module, slot: int) -> nn.Module:
    """A copy with slot ``slot``'s σ-argument and value negated.

    Flips k_j (key-value, static query), A_j (dense), the queries q[j, s] for all s (symmetric,
    gated) together with v_j. Since σ(−z)(−v) = σ(z)v exactly when σ is odd, this is a
    symmetry for odd σ (tanh, identity) and changes the function otherwise.
    """
    require_layer(layer)
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < layer.d_hidden:
        raise ValueError(f"slot must be an integer in [0, {layer.d_hidden}), got {slot!r}")
    out = copy.deepcopy(layer)
    first = _slot_params(layer)[0]  # key / interaction / query: the factor inside σ
    getattr(out, first)[slot].neg_()
    out.value[slot].neg_()
    return out


# --- conserved quantities ------------------------------------------------------------------

@torch.no_grad()
def conserved_quantities(layer: nn.Module) -> dict[str, torch.Tensor]:
    """Quantities that gradient flow on any loss of the layer's output keeps constant.

    For a symmetry θ → exp(εX)θ with X symmetric, ⟨θ, Xθ⟩ is conserved
    (Kunin et al. 2021). Returned per layer type (float64 tensors):

    - SymmetricBilinearMLP (every σ): ``"QQt-KKt"`` (m, r, r) = Q_jQ_jᵀ − K_jK_jᵀ and
      ``"skew(KQt)"`` (m, r, r) = antisymmetric part of K_jQ_jᵀ (the symmetric generators
      of O(r, r)); the diagonal of the first is ‖q[j, s]‖² − ‖k[j, s]‖². Homogeneous
      non-linear σ of degree p also ``"(|Q|^2+|K|^2)/2-p|v|^2"`` (m,) =
      (‖Q_j‖²_F + ‖K_j‖²_F)/2 − p‖v_j‖², from S_j → tS_j (Q_j, K_j → √t Q_j, √t K_j),
      v_j → t⁻ᵖ v_j.
    - GatedMLP (every σ): ``"|K|^2-|v|^2"`` (m,) = ‖K_j‖²_F − ‖v_j‖²; homogeneous
      σ of degree p also ``"|q|^2-p|k|^2"`` (m, r); linear σ also the symmetric form's two.
    - KeyValueMLP with homogeneous σ: ``"|k|^2-p|v|^2"`` (m,).

    Other layers and activations: an empty dict.
    """
    require_layer(layer)
    act = layer.activation
    p = act.homogeneity_degree
    out: dict[str, torch.Tensor] = {}
    if isinstance(layer, SymmetricBilinearMLP) or (isinstance(layer, GatedMLP) and act.is_linear):
        Q, K = layer.query.double(), layer.key.double()
        out["QQt-KKt"] = Q @ Q.transpose(-1, -2) - K @ K.transpose(-1, -2)
        KQ = K @ Q.transpose(-1, -2)
        out["skew(KQt)"] = 0.5 * (KQ - KQ.transpose(-1, -2))
        if isinstance(layer, SymmetricBilinearMLP) and p is not None and not act.is_linear:
            out["(|Q|^2+|K|^2)/2-p|v|^2"] = (
                0.5 * (Q.pow(2).sum((-1, -2)) + K.pow(2).sum((-1, -2))) - p * layer.value.double().pow(2).sum(-1)
            )
    if isinstance(layer, GatedMLP):
        K, V = layer.key.double(), layer.value.double()
        out["|K|^2-|v|^2"] = K.pow(2).sum((-1, -2)) - V.pow(2).sum(-1)
        if p is not None and not act.is_linear:
            Q = layer.query.double()
            out["|q|^2-p|k|^2"] = Q.pow(2).sum(-1) - p * K.pow(2).sum(-1)
    elif isinstance(layer, KeyValueMLP) and p is not None and not act.is_linear:
        out["|k|^2-p|v|^2"] = layer.key.double().pow(2).sum(-1) - p * layer.value.double().pow(2).sum(-1)
    return out
