"""The dimension of each layer's continuous symmetry group: measured, and predicted.

A *continuous symmetry direction* at weights θ is a tangent direction δθ along which the
layer's function does not change to first order. They span the null space of the
Jacobian J = ∂f(x_n; θ)/∂θ stacked over many inputs x_n, so

    symmetry dimension = (number of parameters) − rank J.

:func:`measure_symmetry` computes this in float64 from the singular values of J (with the
tolerance and the gap around it reported); :func:`predicted_symmetry_dimension` gives the
same number from theory (chapter "The continuous symmetry group of every layer"), as a
sum of named contributions in :func:`symmetry_breakdown`. The predictions are theorems
for *generic* weights, for the library's named activations (and declared-linear σ), and,
for the dense layer and the symmetric layer at rank ≥ d_model with a non-linear σ, only
when every S_j = sym(A_j) is indefinite. Outside these hypotheses
:func:`symmetry_breakdown` raises ``ValueError`` (an activation passed as a plain
callable; a definite or semidefinite S_j, e.g. a dead or linear ReLU slot; a linear
regime without a derived closed form) instead of returning a number the theorems do not
cover. ``check_weights=False`` skips the weight check (sizes only, e.g. on the meta
device), and the caller then asserts that hypothesis.

It imports neither :mod:`~qkmlp.symmetry.transforms` nor :mod:`~qkmlp.symmetry.group`.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .._checks import positive_int
from ..costs import parameter_count, require_layer
from ..layers import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
)

__all__ = [
    "SymmetryMeasurement",
    "jacobian",
    "measure_symmetry",
    "symmetry_dimension",
    "symmetry_breakdown",
    "predicted_symmetry_dimension",
    "effective_parameter_count",
    "low_rank_dimension",
    "symmetric_low_rank_dimension",
    "factor_fiber_dimension",
]


# --- measurement -------------------------------------------------------------------------

@dataclass(frozen=True)
class SymmetryMeasurement:
    """Result of :func:`measure_symmetry`.

    ``singular_values``: all singular values of J divided by the largest, descending
    (length = n_params). ``rank`` counts those above ``rtol``; ``dimension`` =
    n_params − rank. ``gap`` = (smallest kept) / (largest dropped): a rank is trustworthy
    when the gap is many orders of magnitude (float64 round-off sits near 1e-15, genuine
    directions of these small layers above 1e-6).
    """

    dimension: int
    n_params: int
    rank: int
    n_inputs: int
    rtol: float
    gap: float
    singular_values: torch.Tensor

    @property
    def smallest_kept(self) -> float:
        return float(self.singular_values[self.rank - 1]) if self.rank > 0 else float("nan")

    @property
    def largest_dropped(self) -> float:
        return float(self.singular_values[self.rank]) if self.rank < self.n_params else 0.0


def jacobian(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Jacobian of the outputs over a batch with respect to all parameters.

    x: (N, d_model). Returns (N·d_out, n_params) in the dtype of the layer, parameters
    flattened in ``named_parameters()`` order. Forward mode (one tangent per parameter).
    """
    require_layer(layer)
    if getattr(layer, "fused", False):
        layer = copy.deepcopy(layer)
        layer.fused = False  # the plain autograd formula: torch.func needs no custom Function
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach() for _, p in layer.named_parameters()]
    shapes = [p.shape for p in params]
    sizes = [p.numel() for p in params]
    theta = torch.cat([p.reshape(-1) for p in params])

    def f(flat: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(flat, sizes)
        d = {n: c.reshape(s) for n, c, s in zip(names, chunks, shapes)}
        return torch.func.functional_call(layer, d, (x,)).reshape(-1)

    return torch.func.jacfwd(f)(theta)


def measure_symmetry(
    layer: nn.Module,
    *,
    n_inputs: Optional[int] = None,
    rtol: float = 1e-8,
    min_gap: float = 1e4,
    seed: int = 0,
) -> SymmetryMeasurement:
    """Measure the number of continuous symmetry directions at the layer's weights.

    A float64 copy of the layer is evaluated on standard-normal inputs; the rank of the
    Jacobian counts the singular values above ``rtol`` × the largest. The default
    rtol = 1e-8 ≈ √eps sits midway (in log scale) between 1 and float64 round-off. If the
    ratio of the smallest kept to the largest dropped singular value is below ``min_gap``
    the rank is ambiguous and a ``RuntimeError`` says so (pass ``min_gap=0`` to get the
    numbers anyway). A dropped singular value above 1e-12 relative (far above float64
    round-off, where an exact symmetry direction sits) raises ``RuntimeError`` too: it is a
    weak direction of the function, and counting it would overcount (a StaticQueryMLP with
    tanh, d = 2, m = 3, d_out = 2 has one at 3e-9, which rtol = 1e-8 alone dropped).

    **How many inputs.** With ``n_inputs`` given, exactly that many. By default:

    - a smooth σ (every named activation but relu, leaky_relu and relu2, and a declared-linear
      one): 2·n_params + 20 inputs (the layer is analytic in x: while the rank over the inputs
      so far is below its value over all inputs, one more random input raises it almost surely,
      so n_params inputs reach it in exact arithmetic; chapter 7 measures the margin);
    - a piecewise σ (relu, leaky_relu, relu2, and any plain callable, whose kinks are not
      known): the layer is a different polynomial on each cell cut out by the kinks σ's
      inputs cross at 0, and a direction seen on one narrow cell only is missed by random
      inputs that land in no point of it (a gated leaky-ReLU layer with d = 2, m = 3,
      r = 4 needed about 4,000 Gaussian inputs; with 128 it counted 18 for 15, with a gap of
      1e9 that hides the error). So the inputs are sampled until the rank is stable:
      each round adds 2·n_params + 20 Gaussian inputs and, for every σ input, points
      around places where it crosses 0 (found by bisection on random segments, then moved
      off at distances 0.3 down to 3e-4 of their norm, landing in the cells on both sides,
      narrow ones included); the rounds double until two in a row give one rank (at most
      six rounds, else ``RuntimeError``). ``n_inputs`` in the result is the total used.
    """
    require_layer(layer)
    if not (0.0 < rtol < 1.0):
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    P = parameter_count(layer)
    adaptive = n_inputs is None and is_piecewise(layer.activation)
    if n_inputs is None:
        n_inputs = 2 * P + 20
    positive_int(n_inputs, "n_inputs")
    layer64 = copy.deepcopy(layer).to(device="cpu", dtype=torch.float64)   # jacobian() unfuses it
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_inputs, layer.d_model, generator=gen, dtype=torch.float64)
    if not adaptive:
        sv, used = torch.linalg.svdvals(jacobian(layer64, x)), n_inputs
    else:
        sv, used = _stable_singular_values(layer64, x, P, gen, rtol)
    full = torch.zeros(P, dtype=torch.float64)
    full[: sv.numel()] = sv  # fewer rows than parameters: the missing values are zeros
    top = float(full[0])
    rel = full / top if top > 0 else full
    rank = int((rel > rtol).sum())
    kept = float(rel[rank - 1]) if rank > 0 else float("nan")
    dropped = float(rel[rank]) if rank < P else 0.0
    gap = kept / dropped if dropped > 0 else math.inf
    if gap < min_gap:
        raise RuntimeError(
            f"ambiguous Jacobian rank for {type(layer).__name__}: smallest kept singular value "
            f"{kept:.2e}, largest dropped {dropped:.2e} (relative), gap {gap:.1e} < min_gap={min_gap:.0e}; "
            "use more inputs or better-conditioned weights"
        )
    if min_gap > 0 and dropped > _ROUNDOFF:
        raise RuntimeError(
            f"ambiguous Jacobian rank for {type(layer).__name__}: the largest dropped singular value "
            f"{dropped:.2e} (relative) is below rtol={rtol:.0e} but far above float64 round-off "
            f"({_ROUNDOFF:.0e}): a weak direction of the function, not a symmetry, so the count "
            f"{P - rank} would overcount; use better-conditioned weights (or min_gap=0 for the numbers)"
        )
    return SymmetryMeasurement(P - rank, P, rank, used, rtol, gap, rel)


_MAX_ROUNDS = 6
#: A singular value (relative to the largest) above this is not float64 round-off, which sits
#: near 1e-16·√rows (1e-14 at 10,000 rows): an exact symmetry direction has J·δθ = 0.
_ROUNDOFF = 1e-12


def is_piecewise(act) -> bool:
    """Whether σ may be piecewise (kinks at 0): relu, leaky_relu, relu2, or a plain callable."""
    from ..activations import ACTIVATIONS

    if act.is_linear:
        return False
    return ACTIVATIONS.get(act.name) is not act or act.homogeneity_degree is not None


def _sigma_inputs(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Every number σ receives in ``layer(x)``: (N, U), one column per σ input (x: (N, d))."""
    seen = []
    act = layer.activation

    def record(z):
        seen.append(z.reshape(x.shape[0], -1))
        return act(z)

    from ..activations import get_activation

    probe = copy.copy(layer)                   # shares the weights; its own activation
    probe.activation = get_activation(record)
    with torch.no_grad():
        probe(x)
    return torch.cat(seen, dim=1)


def _near_kinks(layer: nn.Module, n_pairs: int, gen: torch.Generator) -> torch.Tensor:
    """Inputs around the places where each σ input crosses 0: on n_pairs random segments
    whose ends σ's input sees with opposite signs, the crossing (50 bisection steps), moved
    off in a random direction by 0.3, 0.03, 3e-3 and 3e-4 of its norm."""
    d = layer.d_model
    a = torch.randn(n_pairs, d, generator=gen, dtype=torch.float64)
    b = torch.randn(n_pairs, d, generator=gen, dtype=torch.float64)
    za, zb = _sigma_inputs(layer, a) > 0, _sigma_inputs(layer, b) > 0
    lo_pts, hi_pts, cols = [], [], []
    for c in range(za.shape[1]):
        cross = za[:, c] != zb[:, c]
        lo_pts.append(a[cross])
        hi_pts.append(b[cross])
        cols.append(torch.full((int(cross.sum()),), c))
    lo, hi, col = torch.cat(lo_pts), torch.cat(hi_pts), torch.cat(cols)
    if lo.shape[0] == 0:
        return lo
    side = _sigma_inputs(layer, lo).gather(1, col[:, None]) > 0
    t0, t1 = torch.zeros(lo.shape[0], 1, dtype=torch.float64), torch.ones(lo.shape[0], 1, dtype=torch.float64)
    for _ in range(50):
        mid = (t0 + t1) / 2
        same = (_sigma_inputs(layer, lo + mid * (hi - lo)).gather(1, col[:, None]) > 0) == side
        t0, t1 = torch.where(same, mid, t0), torch.where(same, t1, mid)
    p = lo + t0 * (hi - lo)
    out = []
    for step in (0.3, 0.03, 3e-3, 3e-4):
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        out.append(p + step * p.norm(dim=1, keepdim=True) * g / g.norm(dim=1, keepdim=True))
    return torch.cat(out)


def _stable_singular_values(layer64: nn.Module, x: torch.Tensor, P: int, gen: torch.Generator, rtol: float):
    """Singular values of the Jacobian over inputs added in rounds (:func:`measure_symmetry`)
    until two rounds in a row give one rank; the rows are folded into a QR factor R
    (J and R have the same singular values), so memory stays P × P."""
    state = {"R": None, "sv": None}

    def fold(batch):
        J = jacobian(layer64, batch)
        state["R"] = torch.linalg.qr(J if state["R"] is None else torch.cat([state["R"], J]), mode="r").R
        sv = state["sv"] = torch.linalg.svdvals(state["R"])
        return int((sv > rtol * sv[0]).sum()) if float(sv[0]) > 0 else 0

    _, used = settled_rank(layer64, x, gen, fold, what="Jacobian", fixed="n_inputs= to measure on a fixed number")
    return state["sv"], used


def settled_rank(layer64: nn.Module, x: torch.Tensor, gen: torch.Generator, fold, *, what: str,
                 fixed: str) -> tuple[int, int]:
    """A rank over the inputs of a layer with a piecewise σ, added in rounds until it settles.

    Round k folds ``x`` (k = 0) or n·2^(k−1) new standard-normal inputs (n = len(x)), and
    points around the places where σ's inputs cross 0 (:func:`_near_kinks`), into the
    measurement: ``fold(batch)`` adds the batch (N, d) and returns the rank so far. Stops
    when two rounds in a row give one rank; returns (rank, inputs used). After
    ``_MAX_ROUNDS`` rounds, ``RuntimeError`` naming ``what`` was measured and ``fixed``, the
    way to measure on fixed inputs instead. Used by :func:`measure_symmetry` and
    :func:`qkmlp.symmetry.gauge_symmetry_dimension`."""
    n0 = x.shape[0]
    units = _sigma_inputs(layer64, x[:1]).shape[1]
    used, ranks = 0, []
    for k in range(_MAX_ROUNDS):
        if k:
            x = torch.randn(n0 * 2 ** (k - 1), layer64.d_model, generator=gen, dtype=torch.float64)
        batch = torch.cat([x, _near_kinks(layer64, max(8, -(-n0 // units)) * 2 ** k, gen)])
        used += batch.shape[0]
        ranks.append(fold(batch))
        if k and ranks[-1] == ranks[-2]:
            return ranks[-1], used
    raise RuntimeError(
        f"the {what} rank of this {type(layer64).__name__} did not settle in {_MAX_ROUNDS} rounds of "
        f"inputs ({used} in all; ranks {ranks}); pass {fixed}")


def symmetry_dimension(layer: nn.Module, **kwargs) -> int:
    """Number of continuous symmetry directions at the layer's current weights.

    Measured as n_params − rank of the Jacobian of outputs w.r.t. all parameters over
    random inputs, in float64; keyword arguments go to :func:`measure_symmetry`.
    """
    return measure_symmetry(layer, **kwargs).dimension


# --- theory --------------------------------------------------------------------------------

def _require_positive_ints(**kwargs) -> None:
    for name, v in kwargs.items():
        positive_int(v, name)


def low_rank_dimension(rows: int, cols: int, rank: int) -> int:
    """Dimension of the (rows × cols) matrices of rank exactly min(rank, rows, cols)."""
    _require_positive_ints(rows=rows, cols=cols, rank=rank)
    rho = min(rank, rows, cols)
    return rho * (rows + cols - rho)


def symmetric_low_rank_dimension(d: int, rank: int) -> int:
    """Dimension of the symmetric d × d matrices of rank exactly min(rank, d)."""
    _require_positive_ints(d=d, rank=rank)
    rho = min(rank, d)
    return rho * d - rho * (rho - 1) // 2


def factor_fiber_dimension(rank: int, d: int) -> int:
    """Dimension of the set of factor pairs (Q, K), each r × d, with the same sym(QᵀK).

    For generic (Q, K):

    2r ≤ d: the orbit of O(r, r), of dimension r(2r − 1). 2r > d: 2rd − d(d+1)/2.
    """
    _require_positive_ints(rank=rank, d=d)
    return 2 * rank * d - symmetric_low_rank_dimension(d, 2 * rank)


def _linear_mixing(n_slots: int, space: int, d_out: int) -> int:
    """Fiber of (a_j, v_j), j ≤ m ↦ Σ_j a_j ⊗ v_j, a_j free in a space of that dimension."""
    return n_slots * (space + d_out) - low_rank_dimension(space, d_out, n_slots)


def _kind(act) -> str:
    from ..activations import ACTIVATIONS

    if act.is_linear:
        return "linear"
    if ACTIVATIONS.get(act.name) is not act:
        raise ValueError(
            f"the symmetry counts are predicted only for the library's named activations "
            f"({', '.join(ACTIVATIONS)}) and for declared-linear σ; {act.name!r} is not one of them, and "
            "its class (homogeneous non-polynomial or strictly non-homogeneous, chapter 7) is not "
            "checked from what it declares. Outside those classes no count is claimed, and a count can change or not: "
            "σ(z) = z·log|z| gives KeyValueMLP(2, 3, 1) one direction where SiLU gives 0, but "
            "KeyValueMLP(3, 2, 2) none, as SiLU does. Measure it with symmetry_dimension instead."
        )
    if act.homogeneity_degree is not None:
        return "homogeneous"
    return "generic"


def _require_indefinite(layer: nn.Module) -> None:
    """Hypothesis (G)'s first half: every S_j = sym(A_j) has eigenvalues of both signs."""
    if isinstance(layer, BilinearAttentionMLP):
        A = layer.interaction.detach()
    else:
        A = layer.interactions().detach()
    if A.device.type == "meta":
        raise ValueError(
            "cannot check that every S_j is indefinite on the meta device (no values); "
            "pass check_weights=False to get the count under that hypothesis"
        )
    A = A.to(device="cpu", dtype=torch.float64)
    ev = torch.linalg.eigvalsh((A + A.transpose(-1, -2)) / 2)       # (m, d), ascending
    tol = 1e-10 * ev.abs().amax(dim=-1).clamp_min(1e-300)
    bad = [j for j in range(ev.shape[0]) if not (ev[j, 0] < -tol[j] and ev[j, -1] > tol[j])]
    if bad:
        raise ValueError(
            f"{type(layer).__name__}: S_j = sym(A_j) is not indefinite for slot(s) {bad[:10]}; "
            "the count is proven only when every S_j is indefinite (a definite S_j makes a ReLU "
            "slot dead or linear, and the count can then be larger). Measure it with symmetry_dimension, or "
            "pass check_weights=False for the count at generic weights with indefinite S_j."
        )


def symmetry_breakdown(layer: nn.Module, *, check_weights: bool = True) -> dict[str, int]:
    """Predicted continuous symmetry directions, as named contributions (generic weights).

    Raises ``ValueError`` outside the hypotheses of the theorems: an activation that is a
    plain callable (not one of the named ones, not declared linear); for
    ``BilinearAttentionMLP``, and ``SymmetricBilinearMLP`` with rank ≥ d_model, with a
    non-linear σ, an S_j that is not indefinite (checked at the layer's weights unless
    ``check_weights=False``; on the meta device it must be False); a linear regime
    without a closed form. The other genericity conditions (pairwise independent keys,
    non-zero values, no coinciding cones) are not checked: they fail only on a set of
    measure zero.

    With m = d_hidden, d = d_model, r = rank, D = d(d+1)/2, ρ(a, b, k) = min(k, a, b):

    Here "homogeneous" means positively homogeneous of degree p (σ(cz) = cᵖσ(z) for c > 0,
    ``Activation.homogeneity_degree``) and not linear; the theorems also need σ not to be a
    polynomial, which holds for every named activation (the degree-p ones are ReLU, leaky
    ReLU and squared ReLU). All other non-linear σ are counted as having no rescaling, which
    the book proves for the six other named activations.

    - KeyValueMLP: homogeneous σ: m (k_j → β k_j, v_j → β⁻ᵖ v_j); linear σ: the fiber of
      (K, V) ↦ KᵀV, m(d + d_out) − ρ(d + d_out − ρ) with ρ = min(m, d, d_out) (= m² when
      m ≤ min(d, d_out)); otherwise 0.
    - StaticQueryMLP: d² (W_Q → W_Q G, K → KG⁻ᵀ, for invertible W_Q) plus the key-value
      count.
    - BilinearAttentionMLP: m·d(d−1)/2 (antisymmetric part of A_j), plus m for homogeneous
      σ, or for linear σ the fiber of (S, V) ↦ Σ_j S_j ⊗ v_j (m² when m ≤ min(D, d_out)).
      (S_j = sym(A_j).) A non-linear σ needs every S_j indefinite (checked; for ReLU-type σ a
      definite S_j makes the unit dead or linear).
    - SymmetricBilinearMLP: m·(2rd − dim of symmetric rank-min(2r, d) matrices), which is
      m·r(2r−1) (the group O(r, r)) when 2r ≤ d; plus m for non-linear homogeneous σ
      (needs every S_j indefinite, automatic for r < d at generic weights; for r ≥ d a definite S_j makes a
      ReLU slot dead or linear, and the count can then be larger); for
      linear σ plus the mixing of the S_j: when 2r ≥ d the full Σ_j S_j ⊗ v_j fiber; when
      2r < d and m ≤ min(d_out, D), m + m·max(0, m − 1 − k(k+1)/2) with k = d − 2r (the
      combinations of the other S_i that vanish on ker S_j); else no closed form here
      (ValueError).
    - GatedMLP: m (K_j → βK_j, v_j → v_j/β) for every non-linear σ, plus m·r
      (q → βq, k → β⁻ᵖk per component) for homogeneous σ; linear σ: as the symmetric form.
    """
    require_layer(layer)
    act = layer.activation
    kind = _kind(act)
    m, d, do = layer.d_hidden, layer.d_model, layer.d_out
    out: dict[str, int] = {}
    needs_g = kind != "linear" and (
        isinstance(layer, BilinearAttentionMLP)
        or (isinstance(layer, SymmetricBilinearMLP) and layer.rank >= d)
    )
    if needs_g and check_weights:
        _require_indefinite(layer)

    def kv_part(prefix: str = "") -> None:
        if kind == "linear":
            out[prefix + "GL mixing of slots (K, V) -> (GK, G^-T V)"] = _linear_mixing(m, d, do)
        elif kind == "homogeneous":
            out[prefix + "positive rescaling k_j -> b k_j, v_j -> b^-p v_j"] = m

    if isinstance(layer, KeyValueMLP):
        kv_part()
    elif isinstance(layer, StaticQueryMLP):
        out["absorbed query W_Q -> W_Q G, K -> K G^-T"] = d * d
        kv_part("absorbed keys: ")
    elif isinstance(layer, BilinearAttentionMLP):
        D = d * (d + 1) // 2
        out["antisymmetric part of A_j"] = m * d * (d - 1) // 2
        if kind == "linear":
            out["mixing of slots (S, V)"] = _linear_mixing(m, D, do)
        elif kind == "homogeneous":
            out["rescaling S_j -> b S_j, v_j -> b^-p v_j"] = m
    elif isinstance(layer, SymmetricBilinearMLP) or (isinstance(layer, GatedMLP) and kind == "linear"):
        r = layer.rank
        D = d * (d + 1) // 2
        name = "O(r, r) acting on [Q_j; K_j]" if 2 * r <= d else "fiber of (Q_j, K_j) -> sym(Q_j^T K_j), 2r > d"
        out[name] = m * factor_fiber_dimension(r, d)
        if kind == "homogeneous":
            out["rescaling S_j -> b S_j, v_j -> b^-p v_j"] = m
        elif kind == "linear":
            if 2 * r >= d:
                out["mixing of slots (S, V)"] = _linear_mixing(m, D, do)
            else:
                k = d - 2 * r  # dimension of ker S_j
                if m > min(do, D):
                    raise ValueError(
                        f"no closed form derived for linear σ with 2·rank < d_model and "
                        f"d_hidden > min(d_out, d(d+1)/2) = {min(do, D)}; got d_hidden={m}"
                    )
                out["rescaling S_j -> b S_j, v_j -> v_j / b"] = m
                extra = m * max(0, m - 1 - k * (k + 1) // 2)
                if extra:
                    out["mixing S_j -> S_j + sum_i c_ij S_i vanishing on ker S_j"] = extra
    elif isinstance(layer, GatedMLP):
        out["key-value rescaling K_j -> b K_j, v_j -> v_j / b"] = m
        if kind == "homogeneous":
            out["per component q -> b q, k -> b^-p k"] = m * layer.rank
    return out


def predicted_symmetry_dimension(layer: nn.Module, *, check_weights: bool = True) -> int:
    """Number of continuous symmetry directions predicted by theory for generic weights.

    The sum of :func:`symmetry_breakdown`, which lists the contributions and the regimes
    and raises ``ValueError`` outside them. Depends on the sizes and on σ's ``is_linear`` /
    ``homogeneity_degree``, and (unless ``check_weights=False``) on whether every S_j is
    indefinite where the theorem needs it.
    """
    return sum(symmetry_breakdown(layer, check_weights=check_weights).values())


def effective_parameter_count(layer: nn.Module, *, check_weights: bool = True) -> int:
    """Parameters minus predicted symmetry dimension: the dimension of the function family."""
    return parameter_count(layer) - predicted_symmetry_dimension(layer, check_weights=check_weights)
