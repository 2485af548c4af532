"""Rank-r factors of the interaction matrices A_j, and what the theory predicts.

The bilinear score x A xᵀ sees only the symmetric part S = sym(A) = (A + Aᵀ)/2 of A, so
every function here measures and approximates S. r *factors* q_s, k_s, the rows of Q, K of
shape (r, d) (the layout of ``SymmetricBilinearMLP.query[j]`` and ``.key[j]``), give the
interaction matrix Σ_s q_sᵀ k_s = Qᵀ K, of rank at most r.

Two ways to turn S into r factors (chapter "Rank r" of the book):

- :func:`eig_factors`: keep the r eigenpairs of largest |λ| and write λ uᵀu as
  (sign(λ)√|λ| u)ᵀ(√|λ| u). The best symmetric rank-r approximation (Eckart–Young):
  error² = sum of the discarded λ² (:func:`eckart_young_error`).
- :func:`balanced_factors`: pair the s-th largest positive eigenvalue a with the s-th most
  negative one −b: q = √a u + √b w, k = √a u − √b w has sym(qᵀk) = a uᵀu − b wᵀw. So r
  factors keep up to 2r eigenpairs (r of each sign), which is the best any r factors can
  do (:func:`balanced_error`).

The functions of matrices and factors accept a batch (..., d, d), compute in float64 and
return the input's dtype; :func:`inertia` and :func:`factor_rank` take one (d, d) matrix
and return integers, :func:`with_spectrum` builds one float64 matrix, and
:func:`truncated_layer` and :func:`exact_layer` take a layer.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._checks import integer, positive_int, tolerance
from .layers import BilinearAttentionMLP, SymmetricBilinearMLP

__all__ = [
    "symmetric_part",
    "with_spectrum",
    "inertia",
    "factor_rank",
    "rank_one_eigenvalues",
    "factors_to_matrix",
    "identity_factors",
    "eig_factors",
    "balanced_factors",
    "symmetric_error",
    "eckart_young_error",
    "balanced_error",
    "fit_factors",
    "truncated_layer",
    "exact_layer",
]


def _check_square(A, name: str = "A") -> torch.Tensor:
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (..., d, d), got {type(A).__name__}")
    if not A.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {A.dtype}")
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must have shape (..., d, d) (square matrices), got {tuple(A.shape)}")
    if not torch.isfinite(A).all():
        raise ValueError(f"{name} must be finite")
    return A


def _check_rank(rank, d: int) -> int:
    try:
        r = integer(rank, "rank")
    except TypeError:
        r = None
    if r is None or not 1 <= r <= d:
        raise ValueError(f"rank must be an integer in [1, d={d}], got {rank!r}")
    return r


def _check_seed(seed) -> int:
    return integer(seed, "seed")


def _check_factors(query, key) -> None:
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise TypeError(f"{name} must be a floating-point tensor of shape (..., r, d)")
    if query.shape != key.shape:
        raise ValueError(
            f"query and key must have the same shape (..., r, d), got {tuple(query.shape)} and {tuple(key.shape)}"
        )


def symmetric_part(A: torch.Tensor) -> torch.Tensor:
    """S = (A + Aᵀ)/2: (..., d, d) -> (..., d, d). x A xᵀ = x S xᵀ for every x."""
    _check_square(A)
    A64 = A.to(torch.float64)
    return ((A64 + A64.transpose(-1, -2)) / 2).to(A.dtype)


def with_spectrum(eigenvalues, seed: int = 0) -> torch.Tensor:
    """A symmetric (d, d) float64 matrix U diag(eigenvalues) Uᵀ, U a random orthonormal
    basis (QR of a standard-normal matrix drawn with ``seed``)."""
    seed = _check_seed(seed)
    if isinstance(eigenvalues, torch.Tensor) and (eigenvalues.is_complex() or eigenvalues.dtype == torch.bool):
        raise TypeError(f"eigenvalues must be real numbers, got dtype {eigenvalues.dtype}")
    try:
        lam = torch.as_tensor(eigenvalues, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"eigenvalues must be a 1-D list of real numbers, got {eigenvalues!r}") from None
    if lam.dim() != 1 or lam.numel() == 0:
        raise ValueError(f"expected a non-empty 1-D list of eigenvalues, got shape {tuple(lam.shape)}")
    if not torch.isfinite(lam).all():
        raise ValueError(f"eigenvalues must be finite, got {lam.tolist()}")
    d = lam.numel()
    U, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    return U @ torch.diag(lam) @ U.T


def _eigh(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending) and eigenvectors (columns) of sym(A), in float64."""
    S = symmetric_part(A).to(torch.float64)
    return torch.linalg.eigh(S)


def _default_tol(lam: torch.Tensor) -> torch.Tensor:
    d = lam.shape[-1]
    scale = lam.abs().amax(-1, keepdim=True)
    return 1e3 * d * torch.finfo(torch.float64).eps * scale


def inertia(A: torch.Tensor, *, tol: Optional[float] = None) -> tuple[int, int, int]:
    """(n₊, n₋, n₀): numbers of positive, negative and zero eigenvalues of sym(A).

    A: one (d, d) matrix. Eigenvalues with |λ| <= tol count as zero (default: a small
    multiple of machine precision times the largest |λ|).
    """
    _check_square(A)
    if A.dim() != 2:
        raise ValueError(f"inertia takes one (d, d) matrix, got shape {tuple(A.shape)}")
    t = None if tol is None else torch.tensor(tolerance(tol, "tol"), dtype=torch.float64)
    lam, _ = _eigh(A)
    t = _default_tol(lam) if t is None else t
    pos = int((lam > t).sum())
    neg = int((lam < -t).sum())
    return pos, neg, lam.numel() - pos - neg


def factor_rank(A: torch.Tensor, *, tol: Optional[float] = None) -> int:
    """The least r such that sym(A) = sym(Σ_{s≤r} q_sᵀk_s) for some factors: max(n₊, n₋).

    A: one (d, d) matrix.
    """
    pos, neg, _ = inertia(A, tol=tol)
    return max(pos, neg)


def rank_one_eigenvalues(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The two possibly non-zero eigenvalues of sym(qᵀk): ½(q·k + ‖q‖‖k‖) ≥ 0 ≥ ½(q·k − ‖q‖‖k‖).

    q, k: (..., d) -> (..., 2), ordered [λ₊, λ₋], at every d ≥ 1. For d ≥ 2 the d
    eigenvalues of sym(qᵀk) are λ₊, λ₋ and d − 2 zeros. For parallel q, k (k = cq) one of
    the two is 0 and the other is q·k. At d = 1, q and k are always parallel and
    sym(qᵀk) = [q·k] has the single eigenvalue q·k = λ₊ + λ₋: it is λ₊ when q·k > 0 and
    λ₋ when q·k < 0, and the other value returned, 0, is then not an eigenvalue.
    """
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        raise TypeError("q and k must be torch.Tensors of shape (..., d)")
    if not (q.is_floating_point() and k.is_floating_point()):
        raise TypeError(f"q and k must be floating-point tensors, got {q.dtype} and {k.dtype}")
    if q.shape != k.shape or q.dim() < 1:
        raise ValueError(f"q and k must have the same shape (..., d), got {tuple(q.shape)} and {tuple(k.shape)}")
    q64, k64 = q.to(torch.float64), k.to(torch.float64)
    dot = (q64 * k64).sum(-1)
    norms = torch.linalg.vector_norm(q64, dim=-1) * torch.linalg.vector_norm(k64, dim=-1)
    return torch.stack([(dot + norms) / 2, (dot - norms) / 2], dim=-1).to(q.dtype)


def factors_to_matrix(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The interaction matrix of r factors, Σ_s q_sᵀ k_s = Qᵀ K: two (..., r, d) -> (..., d, d)."""
    _check_factors(query, key)
    return (query.to(torch.float64).transpose(-1, -2) @ key.to(torch.float64)).to(query.dtype)


def identity_factors(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rank-d factors of any A: q_s = e_s, k_s = row s of A, so Σ_s e_sᵀ A[s] = A.

    (..., d, d) -> query, key, each (..., d, d) (r = d rows).
    """
    _check_square(A)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand_as(A).clone()
    return eye, A.clone()


def eig_factors(A: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best symmetric rank-r approximation of sym(A) as factors (Eckart–Young).

    Keeps the r eigenpairs (λ, u) of largest |λ| and writes λ uᵀu = qᵀk with
    q = sign(λ)√|λ| u, k = √|λ| u. (..., d, d) -> query, key, each (..., r, d).
    """
    _check_square(A)
    r = _check_rank(rank, A.shape[-1])
    lam, U = _eigh(A)
    order = torch.argsort(lam.abs(), dim=-1, descending=True, stable=True)[..., :r]
    lam_r = torch.gather(lam, -1, order)                                   # (..., r)
    u_r = torch.gather(U, -1, order.unsqueeze(-2).expand(*U.shape[:-1], r))  # (..., d, r)
    u_r = u_r.transpose(-1, -2)                                            # (..., r, d)
    root = lam_r.abs().sqrt().unsqueeze(-1)
    q = torch.sign(lam_r).unsqueeze(-1) * root * u_r
    k = root * u_r
    return q.to(A.dtype), k.to(A.dtype)


def balanced_factors(A: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best approximation of sym(A) by r factors: up to r positive and r negative eigenpairs.

    The s-th largest positive eigenvalue a (eigenvector u) is paired with the s-th most
    negative one −b (eigenvector w): q_s = √a u + √b w, k_s = √a u − √b w, so that
    sym(q_sᵀk_s) = a uᵀu − b wᵀw (a or b is 0 when that sign runs out).
    (..., d, d) -> query, key, each (..., r, d). qᵀk itself is not symmetric.
    """
    _check_square(A)
    d = A.shape[-1]
    r = _check_rank(rank, d)
    lam, U = _eigh(A)                                  # ascending
    top = torch.arange(d - 1, d - 1 - r, -1, device=lam.device)  # largest first
    bottom = torch.arange(r, device=lam.device)                  # most negative first
    a = lam[..., top].clamp(min=0)                     # (..., r)
    b = (-lam[..., bottom]).clamp(min=0)
    u = U[..., :, top].transpose(-1, -2)               # (..., r, d)
    w = U[..., :, bottom].transpose(-1, -2)
    su, sw = a.sqrt().unsqueeze(-1) * u, b.sqrt().unsqueeze(-1) * w
    return (su + sw).to(A.dtype), (su - sw).to(A.dtype)


def symmetric_error(A: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """‖sym(A) − sym(Σ_s q_sᵀk_s)‖_F: the error the bilinear score sees. Returns shape (...)."""
    _check_square(A)
    _check_factors(query, key)
    A_factors = query.to(torch.float64).transpose(-1, -2) @ key.to(torch.float64)
    if A_factors.shape != A.shape:
        raise ValueError(f"factors give matrices of shape {tuple(A_factors.shape)}, A has shape {tuple(A.shape)}")
    diff = symmetric_part(A.to(torch.float64)) - symmetric_part(A_factors)
    return torch.linalg.matrix_norm(diff).to(A.dtype)


def eckart_young_error(A: torch.Tensor, rank: int) -> torch.Tensor:
    """Theory for :func:`eig_factors`: sqrt of the sum of the d − r smallest λ² of sym(A)."""
    _check_square(A)
    r = _check_rank(rank, A.shape[-1])
    lam, _ = _eigh(A)
    sq = torch.sort(lam.square(), dim=-1, descending=True).values
    return sq[..., r:].sum(-1).sqrt().to(A.dtype)


def balanced_error(A: torch.Tensor, rank: int) -> torch.Tensor:
    """Theory for :func:`balanced_factors` (and the least error of any r factors).

    sqrt of the sum of λ² over the positive eigenvalues outside the r largest and the
    negative eigenvalues outside the r most negative.
    """
    _check_square(A)
    d = A.shape[-1]
    r = _check_rank(rank, d)
    lam, _ = _eigh(A)                                  # ascending
    idx = torch.arange(d, device=lam.device)
    kept = ((idx >= d - r) & (lam > 0)) | ((idx < r) & (lam < 0))
    return (lam.square() * (~kept)).sum(-1).sqrt().to(A.dtype)


def fit_factors(
    A: torch.Tensor, rank: int, *, steps: int = 200, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Search r factors minimising :func:`symmetric_error` numerically (L-BFGS, float64).

    A numerical check of the theory, not a method: a local search started from a random
    point, with no guarantee of reaching the global minimum. In the tests and the book it
    reaches the least error any r factors can have, which :func:`balanced_error` predicts.
    (..., d, d) -> query, key, each (..., r, d).
    """
    _check_square(A)
    d = A.shape[-1]
    r = _check_rank(rank, d)
    positive_int(steps, "steps")
    seed = _check_seed(seed)
    S = symmetric_part(A.detach().to(torch.float64))
    gen = torch.Generator().manual_seed(seed)
    scale = (S.square().mean() + 1e-30).sqrt().item() ** 0.5
    shape = (*A.shape[:-2], r, d)
    q = (scale * torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_()
    k = (scale * torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_()
    opt = torch.optim.LBFGS([q, k], max_iter=steps, tolerance_grad=1e-14,
                            tolerance_change=1e-16, history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        A_qk = q.transpose(-1, -2) @ k
        loss = (S - (A_qk + A_qk.transpose(-1, -2)) / 2).square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return q.detach().to(A.dtype), k.detach().to(A.dtype)


def _symmetric_layer(layer: BilinearAttentionMLP, q: torch.Tensor, k: torch.Tensor) -> SymmetricBilinearMLP:
    """The SymmetricBilinearMLP with factors q, k (m, r, d) and ``layer``'s values and σ."""
    w = layer.value
    out = SymmetricBilinearMLP(layer.d_model, layer.d_hidden, layer.d_out, rank=q.shape[1],
                               activation=layer.activation, device=w.device, dtype=w.dtype)
    out.query.copy_(q)
    out.key.copy_(k)
    out.value.copy_(w)
    return out


def check_dense(layer) -> None:
    if not isinstance(layer, BilinearAttentionMLP):
        raise TypeError(f"expected a BilinearAttentionMLP, got {type(layer).__name__}")


@torch.no_grad()
def truncated_layer(layer: BilinearAttentionMLP, rank: int, *, method: str = "balanced") -> SymmetricBilinearMLP:
    """A rank-r :class:`SymmetricBilinearMLP` approximating a dense layer slot by slot.

    method: "eig" (:func:`eig_factors`) or "balanced" (:func:`balanced_factors`).
    Values and activation are copied.
    """
    check_dense(layer)
    makers = {"eig": eig_factors, "balanced": balanced_factors}
    if method not in makers:
        raise ValueError(f"method must be one of {', '.join(makers)}, got {method!r}")
    q, k = makers[method](layer.interaction, rank)
    return _symmetric_layer(layer, q, k)


@torch.no_grad()
def exact_layer(layer: BilinearAttentionMLP) -> SymmetricBilinearMLP:
    """The rank-d :class:`SymmetricBilinearMLP` equal to a dense layer (:func:`identity_factors`)."""
    check_dense(layer)
    q, k = identity_factors(layer.interaction)
    return _symmetric_layer(layer, q, k)
