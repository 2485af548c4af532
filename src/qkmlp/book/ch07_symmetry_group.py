"""Chapter 7, the continuous symmetry group: the conditions its theorems put on weights
and activations, checked at given weights.

- :func:`cone_points`: for symmetric matrices S_1, ..., S_m, a point on each cone
  {x : x S_j xᵀ = 0} where S_j's form has a non-zero gradient and every other form is
  non-zero; :func:`cones_separated` says whether one was found for every j. This is
  condition (G) of the theorem "Quadratic terms cannot cancel".
- :func:`eigen_cone_point`: the point on an indefinite form's cone that the proof that (G)
  holds for almost all weights uses, built from two eigenvectors.
- :func:`split_form`, :func:`orr_component`: the split form 𝒥 = [[0, I], [I, 0]] and
  which of the four connected components of O(r, r) an element lies in.
- :func:`asymptotes`: the affine asymptotes ℓ± of an activation, which the same
  theorem's condition (A1) is about, measured far out, so that the notebook can compare
  them with the values the text states.
"""
from __future__ import annotations

import math

import torch

from .._checks import positive_int, tolerance

__all__ = ["cone_points", "cones_separated", "eigen_cone_point", "asymptotes", "split_form", "orr_component"]


def _check_forms(S) -> torch.Tensor:
    if not isinstance(S, torch.Tensor) or not S.is_floating_point():
        raise TypeError(f"S must be a floating-point tensor of shape (m, d, d), got {type(S).__name__}")
    if S.dim() != 3 or S.shape[-1] != S.shape[-2]:
        raise ValueError(f"S must have shape (m, d, d) (m square matrices), got {tuple(S.shape)}")
    S = S.detach().to(torch.float64).cpu()
    if not torch.isfinite(S).all():
        raise ValueError("S must be finite")
    if not torch.allclose(S, S.transpose(-1, -2), atol=1e-12 * (1 + S.abs().max().item())):
        raise ValueError("S must hold symmetric matrices (take sym(A) = (A + Aᵀ)/2 first)")
    return S


def cone_points(S: torch.Tensor, *, tries: int = 200, tol: float = 1e-6, seed: int = 0) -> list:
    """For each j, a unit x with x S_j xᵀ = 0, ‖x S_j‖ > tol·‖S_j‖ and
    |x S_i xᵀ| > tol·‖S_i‖ for every i ≠ j; ``None`` where none was found.

    S: (m, d, d) symmetric. The search walks random lines u + t·w (standard normal u, w)
    and takes the real roots t of the quadratic (u + t w) S_j (u + t w)ᵀ = 0, up to
    ``tries`` lines per j. A definite S_j has no such point (its cone is {0}); two slots
    with the same S have none either. Norms are Frobenius norms; computed in float64.
    """
    S = _check_forms(S)
    positive_int(tries, "tries")
    tol = tolerance(tol, "tol")
    m, d = S.shape[0], S.shape[-1]
    scale = torch.linalg.matrix_norm(S)                       # (m,)
    gen = torch.Generator().manual_seed(seed)
    found: list = []
    for j in range(m):
        point = None
        for _ in range(tries):
            u, w = torch.randn(2, d, generator=gen, dtype=torch.float64)
            a2, a1, a0 = w @ S[j] @ w, 2 * (u @ S[j] @ w), u @ S[j] @ u
            disc = a1 * a1 - 4 * a2 * a0
            if a2.abs() < 1e-12 or disc < 0:
                continue
            for t in ((-a1 + disc.sqrt()) / (2 * a2), (-a1 - disc.sqrt()) / (2 * a2)):
                x = u + t * w
                x = x / x.norm()
                forms = torch.einsum("d,mde,e->m", x, S, x).abs()
                others = torch.cat([forms[:j], forms[j + 1:]])
                if ((x @ S[j]).norm() > tol * scale[j]
                        and bool((others > tol * torch.cat([scale[:j], scale[j + 1:]])).all())):
                    point = x
                    break
            if point is not None:
                break
        found.append(point)
    return found


def cones_separated(S: torch.Tensor, **kwargs) -> bool:
    """Condition (G) of chapter 7 at S (m, d, d): :func:`cone_points` found a point for
    every slot. ``True`` is proven by the points; ``False`` means none was found in the
    lines tried (for a definite S_j or two equal slots, none exists)."""
    return all(p is not None for p in cone_points(S, **kwargs))


def eigen_cone_point(S: torch.Tensor) -> torch.Tensor:
    """A point x₀ = √(−μ)·u + √λ·w on the cone {x : x S xᵀ = 0} of an indefinite symmetric S,
    with x₀S ≠ 0: u, w unit eigenvectors of the largest eigenvalue λ > 0 and the smallest
    μ < 0 (then x₀Sx₀ᵀ = −μλ + λμ = 0 and x₀S = √(−μ)λu + √λμw). Float64.

    Raises ``ValueError`` unless S is a d × d symmetric matrix with eigenvalues of both signs
    (beyond 1e-12 of the largest |eigenvalue|): a definite or semidefinite S has no such point.
    """
    if not isinstance(S, torch.Tensor) or S.dim() != 2:
        raise ValueError(f"S must be one d × d symmetric matrix, got {getattr(S, 'shape', type(S).__name__)}")
    S = _check_forms(S[None])[0]
    ev, vec = torch.linalg.eigh(S)
    scale = ev.abs().max().item()
    if not (ev[0] < -1e-12 * scale and ev[-1] > 1e-12 * scale):
        raise ValueError(f"S must be indefinite (eigenvalues of both signs), got eigenvalues "
                         f"from {ev[0].item():.3g} to {ev[-1].item():.3g}")
    mu, lam = ev[0], ev[-1]
    return (-mu).sqrt() * vec[:, -1] + lam.sqrt() * vec[:, 0]


def asymptotes(activation, *, far: float = 30.0) -> dict:
    """The affine asymptotes ℓ±(z) = a±·z + b± of σ, read off far out, and what is left.

    a± = σ'(±far) (by autograd, float64), b± = σ(±far) ∓ far·a±; ``residual`` is the
    largest of |σ(z) − ℓ±(z)| and |σ'(z) − a±| over z in ±[far/2, far]. Condition (A1)
    of chapter 7 says the residual decays exponentially with ``far``; the caller compares
    two values of ``far`` and the a±, b± with those the text states.
    """
    if not callable(activation):
        raise TypeError(f"activation must be callable, got {type(activation).__name__}")
    if isinstance(far, bool) or not (isinstance(far, (int, float)) and math.isfinite(far) and far > 1):
        raise ValueError(f"far must be a finite number above 1, got {far!r}")
    grid = torch.linspace(far / 2, far, 21, dtype=torch.float64)
    z = torch.cat([grid, -grid]).requires_grad_()
    s = activation(z)
    (ds,) = torch.autograd.grad(s.sum(), z)
    z, s, ds = z.detach(), s.detach(), ds.detach()
    n = grid.numel()
    a_plus, a_minus = ds[n - 1].item(), ds[-1].item()
    b_plus = s[n - 1].item() - far * a_plus
    b_minus = s[-1].item() + far * a_minus
    a = torch.where(z > 0, a_plus, a_minus)
    b = torch.where(z > 0, b_plus, b_minus)
    residual = max((s - (a * z + b)).abs().max().item(), (ds - a).abs().max().item())
    return {"a": (a_plus, a_minus), "b": (b_plus, b_minus), "residual": residual}


def split_form(r: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """𝒥 = [[0, I_r], [I_r, 0]] (2r × 2r): the form of chapter 7's O(r, r)."""
    positive_int(r, "r")
    J = torch.zeros(2 * r, 2 * r, dtype=dtype)
    J[:r, r:] = J[r:, :r] = torch.eye(r, dtype=dtype)
    return J


def orr_component(g: torch.Tensor, *, atol: float = 1e-9) -> tuple[int, int]:
    """The component of O(r, r) (for 𝒥 = :func:`split_form`) that g lies in: the signs of
    det of g's diagonal blocks in the basis (e_i ± e_{r+i})/√2 of 𝒥's +1 and −1
    eigenvectors, (+, +) for the identity component SO⁺(r, r). Raises ``ValueError``
    unless g is a 2r × 2r real matrix with gᵀ𝒥g = 𝒥 (to ``atol`` relative to ‖g‖²)."""
    if not isinstance(g, torch.Tensor) or not g.is_floating_point() or g.dim() != 2 \
            or g.shape[0] != g.shape[1] or g.shape[0] % 2:
        raise ValueError(f"g must be a real 2r × 2r matrix, got {getattr(g, 'shape', type(g).__name__)}")
    g = g.detach().to(torch.float64).cpu()
    r = g.shape[0] // 2
    J = split_form(r)
    err = (g.T @ J @ g - J).abs().max().item()
    if not err <= atol * max(1.0, g.abs().max().item() ** 2):
        raise ValueError(f"g is not in O(r, r): |gᵀ𝒥g − 𝒥| = {err:.1e}")
    eye = torch.eye(r, dtype=torch.float64)
    U = torch.cat([torch.cat([eye, eye], 1), torch.cat([eye, -eye], 1)]) / math.sqrt(2)
    h = U.T @ g @ U                                   # Uᵀ𝒥U = diag(I, −I)
    return (1 if torch.linalg.det(h[:r, :r]) > 0 else -1,
            1 if torch.linalg.det(h[r:, r:]) > 0 else -1)
