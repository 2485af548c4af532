"""Tests of qkmlp.lowrank: rank-r factors of the interaction matrices and their errors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkmlp import BilinearAttentionMLP, SymmetricBilinearMLP
from qkmlp import lowrank as L

F64 = torch.float64


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_with_spectrum_has_that_spectrum():
    S = L.with_spectrum([3.0, -1.0, 0.0, 0.5], seed=2)
    torch.testing.assert_close(S, S.T)
    torch.testing.assert_close(torch.linalg.eigvalsh(S), torch.tensor([-1.0, 0.0, 0.5, 3.0], dtype=F64))
    with pytest.raises(ValueError, match="eigenvalues"):
        L.with_spectrum([])


def test_symmetric_part_gives_the_same_quadratic_form():
    A = _rand(5, 7, 7)
    x = _rand(11, 7, seed=1)
    S = L.symmetric_part(A)
    assert torch.allclose(S, S.transpose(-1, -2))
    lhs = torch.einsum("nd,jde,ne->nj", x, A, x)
    rhs = torch.einsum("nd,jde,ne->nj", x, S, x)
    assert torch.allclose(lhs, rhs, atol=1e-12)


def test_identity_factors_reproduce_any_matrix_exactly():
    A = _rand(4, 6, 6)
    q, k = L.identity_factors(A)
    assert q.shape == k.shape == (4, 6, 6)
    assert torch.allclose(L.factors_to_matrix(q, k), A, atol=1e-14)


def test_exact_layer_equals_the_dense_layer():
    torch.manual_seed(0)
    dense = BilinearAttentionMLP(6, 5, 3, activation="gelu", dtype=F64)
    sym = L.exact_layer(dense)
    assert isinstance(sym, SymmetricBilinearMLP) and sym.rank == 6
    x = _rand(20, 6, seed=2)
    assert torch.allclose(sym(x), dense(x), atol=1e-12)


def test_eig_factors_match_a_truncated_svd_and_the_eckart_young_error():
    A = _rand(9, 9, seed=3)
    S = L.symmetric_part(A)
    U, s, Vh = torch.linalg.svd(S)
    for r in range(1, 10):
        q, k = L.eig_factors(A, r)
        assert q.shape == (r, 9)
        B = L.factors_to_matrix(q, k)
        assert torch.allclose(B, B.T, atol=1e-12)          # the eig factors give a symmetric B
        svd_r = (U[:, :r] * s[:r]) @ Vh[:r]                # Eckart-Young via the SVD
        assert torch.allclose(B, svd_r, atol=1e-10)
        err = L.symmetric_error(A, q, k)
        assert torch.isclose(err, L.eckart_young_error(A, r), atol=1e-10)
        assert torch.isclose(err, torch.linalg.matrix_norm(S - svd_r), atol=1e-10)


def test_balanced_factors_reach_the_balanced_error_and_beat_eig():
    A = _rand(3, 10, 10, seed=4)
    for r in range(1, 11):
        q, k = L.balanced_factors(A, r)
        err = L.symmetric_error(A, q, k)
        theory = L.balanced_error(A, r)
        assert torch.allclose(err, theory, atol=1e-10)
        assert (theory <= L.eckart_young_error(A, r) + 1e-12).all()
        # r factors keep at most 2r eigenpairs, so they cannot beat rank-2r truncation
        assert (theory >= L.eckart_young_error(A, min(2 * r, 10)) - 1e-12).all()


def test_balanced_equals_eig_for_a_positive_semidefinite_matrix():
    S = L.with_spectrum([5.0, 3.0, 2.0, 1.0, 0.5, 0.0], seed=5)
    for r in range(1, 7):
        assert torch.isclose(L.balanced_error(S, r), L.eckart_young_error(S, r), atol=1e-12)


@pytest.mark.parametrize("pos,neg,seed", [(3.0, -0.7, 6), (0.2, -5.0, 12), (1.0, -1.0, 13)])
def test_one_factor_represents_a_rank_two_indefinite_matrix(pos, neg, seed):
    S = L.with_spectrum([pos, 0.0, 0.0, neg, 0.0], seed=seed)
    assert L.inertia(S) == (1, 1, 3)
    assert L.factor_rank(S) == 1
    q, k = L.balanced_factors(S, 1)
    assert L.symmetric_error(S, q, k) < 1e-12
    # one eigenpair must drop the smaller |eigenvalue|
    assert torch.isclose(L.eckart_young_error(S, 1), torch.tensor(min(pos, -neg), dtype=F64), atol=1e-12)


@pytest.mark.parametrize("spectrum", [[2.0, 1.0, -1.0, 0.0, 0.0], [1.0, 1.0, 1.0, -2.0, 0.0], [-1.0, -2.0, -3.0, 0.0, 0.0]])
def test_factor_rank_is_the_larger_inertia_count(spectrum):
    S = L.with_spectrum(spectrum, seed=7)
    pos = sum(v > 0 for v in spectrum)
    neg = sum(v < 0 for v in spectrum)
    assert L.inertia(S) == (pos, neg, 5 - pos - neg)
    r = L.factor_rank(S)
    assert r == max(pos, neg)
    assert L.symmetric_error(S, *L.balanced_factors(S, r)) < 1e-12
    if r > 1:
        assert L.balanced_error(S, r - 1) > 0.5


def test_numerical_search_finds_the_balanced_error_and_never_beats_it():
    A = _rand(7, 7, seed=8)
    for r in (1, 2, 3):
        theory = float(L.balanced_error(A, r))
        for seed in range(2):
            found = float(L.symmetric_error(A, *L.fit_factors(A, r, seed=seed)))
            assert found >= theory - 1e-9
            assert found <= theory * (1 + 1e-6) + 1e-9


def test_rank_one_eigenvalues_match_eigvalsh():
    q, k = _rand(8, seed=9), _rand(8, seed=10)
    lam = torch.linalg.eigvalsh(L.symmetric_part(torch.outer(q, k)))
    pred = L.rank_one_eigenvalues(q, k)
    assert torch.isclose(lam[-1], pred[0]) and torch.isclose(lam[0], pred[1])
    assert torch.allclose(lam[1:-1], torch.zeros(6, dtype=F64), atol=1e-12)
    assert L.inertia(torch.outer(q, k)) == (1, 1, 6)
    assert L.inertia(torch.outer(q, 2.5 * q)) == (1, 0, 7)
    assert L.inertia(torch.outer(q, -q)) == (0, 1, 7)


@pytest.mark.parametrize("d", [1, 2, 3, 7])
def test_rank_one_eigenvalues_are_the_spectrum_with_d_minus_2_zeros(d):
    """Against torch.linalg.eigvalsh of the plain d×d matrix ½(qᵀk + kᵀq): for d ≥ 2 the
    spectrum is [λ₋, 0 (d − 2 times), λ₊]; at d = 1 it is the single value λ₊ + λ₋ = q·k."""
    q, k = _rand(5, d, seed=20 + d), _rand(5, d, seed=40 + d)
    k[0] = -2.0 * q[0]                                   # one parallel pair, q·k < 0
    pred = L.rank_one_eigenvalues(q, k)
    assert pred.shape == (5, 2)
    for i in range(5):
        plain = (torch.outer(q[i], k[i]) + torch.outer(k[i], q[i])) / 2
        lam = torch.linalg.eigvalsh(plain)
        if d == 1:
            assert torch.isclose(lam[0], q[i, 0] * k[i, 0])
            assert torch.isclose(pred[i].sum(), lam[0])
            nonzero, zero = (pred[i, 0], pred[i, 1]) if lam[0] > 0 else (pred[i, 1], pred[i, 0])
            assert torch.isclose(nonzero, lam[0]) and zero == 0
        else:
            want = torch.cat([pred[i, 1:], torch.zeros(d - 2, dtype=F64), pred[i, :1]])
            assert torch.allclose(lam, want, atol=1e-12)


@pytest.mark.parametrize("c", [2.5, -0.4])
def test_rank_one_eigenvalues_parallel_case(c):
    q = _rand(6, seed=14)
    lam = torch.linalg.eigvalsh(L.symmetric_part(torch.outer(q, c * q)))
    lp, lm = L.rank_one_eigenvalues(q, c * q)
    qk = (q @ (c * q))
    assert torch.isclose(lp if c > 0 else lm, qk) and abs(lm if c > 0 else lp) < 1e-12
    assert torch.isclose(lam[-1] if c > 0 else lam[0], qk)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(2, 8), r=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_property_balanced_error_is_exact_and_no_worse_than_eig(d, r, seed):
    r = min(r, d)
    A = _rand(d, d, seed=seed)
    qb, kb = L.balanced_factors(A, r)
    qe, ke = L.eig_factors(A, r)
    eb, ee = L.symmetric_error(A, qb, kb), L.symmetric_error(A, qe, ke)
    assert torch.isclose(eb, L.balanced_error(A, r), atol=1e-9)
    assert torch.isclose(ee, L.eckart_young_error(A, r), atol=1e-9)
    assert eb <= ee + 1e-9


def test_truncated_layer_matches_the_dense_layer_at_full_factor_rank():
    torch.manual_seed(1)
    dense = BilinearAttentionMLP(6, 4, activation="silu", dtype=F64)
    x = _rand(30, 6, seed=11)
    full = L.truncated_layer(dense, 6, method="eig")
    assert torch.allclose(full(x), dense(x), atol=1e-10)
    half = L.truncated_layer(dense, 3, method="balanced")
    assert half.query.shape == (4, 3, 6)
    # each slot's error is the balanced error, and the layer uses those factors
    errs = L.symmetric_error(dense.interaction, half.query, half.key)
    assert torch.allclose(errs, L.balanced_error(dense.interaction, 3), atol=1e-10)


def test_dtype_is_preserved():
    A = torch.randn(5, 5, dtype=torch.float32)
    q, k = L.balanced_factors(A, 2)
    assert q.dtype == k.dtype == torch.float32
    assert L.balanced_error(A, 2).dtype == torch.float32


def test_bad_input_raises_clear_errors():
    A = _rand(4, 4)
    with pytest.raises(ValueError, match="square"):
        L.symmetric_part(_rand(3, 4))
    with pytest.raises(TypeError, match="floating"):
        L.eig_factors(torch.ones(3, 3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="rank"):
        L.eig_factors(A, 0)
    with pytest.raises(ValueError, match="rank"):
        L.balanced_factors(A, 5)
    with pytest.raises(ValueError, match="rank"):
        L.balanced_error(A, True)
    with pytest.raises(ValueError, match="finite"):
        L.eckart_young_error(torch.full((3, 3), float("nan")), 1)
    with pytest.raises(ValueError, match="same shape"):
        L.factors_to_matrix(_rand(2, 4), _rand(3, 4))
    with pytest.raises(TypeError, match="BilinearAttentionMLP"):
        L.truncated_layer(SymmetricBilinearMLP(4, 2), 1)
    with pytest.raises(ValueError, match="method"):
        L.truncated_layer(BilinearAttentionMLP(4, 2), 1, method="svd")
    with pytest.raises(ValueError, match="one"):
        L.inertia(_rand(2, 3, 3))
    with pytest.raises(TypeError, match="floating"):
        L.rank_one_eigenvalues(torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="same shape"):
        L.rank_one_eigenvalues(_rand(3), _rand(4))
    with pytest.raises(ValueError, match="steps"):
        L.fit_factors(A, 1, steps=0)


def test_batched_functions_equal_the_loop_in_the_input_dtype():
    """What the module docstring promises: a batch (..., d, d) gives, matrix by matrix, what
    one matrix gives, in the input's dtype; inertia takes one matrix only."""
    A = _rand(2, 3, 5, 5, seed=31).to(torch.float32)
    one = lambda f, *a: torch.stack([torch.stack([f(*(t[i, j] for t in a)) for j in range(3)]) for i in range(2)])
    q, k = L.eig_factors(A, 2)
    for f, args in ((L.symmetric_part, (A,)), (lambda a: L.eckart_young_error(a, 2), (A,)),
                    (lambda a: L.balanced_error(a, 2), (A,)), (lambda a: L.eig_factors(a, 2)[0], (A,)),
                    (lambda a: L.balanced_factors(a, 2)[1], (A,)), (L.symmetric_error, (A, q, k)),
                    (L.factors_to_matrix, (q, k)), (lambda a: L.identity_factors(a)[1], (A,)),
                    (L.rank_one_eigenvalues, (q[..., 0, :], k[..., 0, :]))):
        batched = f(*args)
        assert batched.dtype == torch.float32
        torch.testing.assert_close(batched, one(f, *args), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="one \\(d, d\\) matrix"):
        L.inertia(A)
