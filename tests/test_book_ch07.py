"""qkmlp.book.ch07_symmetry_group: the conditions of chapter 7's theorems, checked at
given weights, against cases whose answer is known without the search."""
from __future__ import annotations

import math

import pytest
import torch

from qkmlp import get_activation
from qkmlp.book.ch07_symmetry_group import (asymptotes, cone_points, cones_separated,
                                             eigen_cone_point, orr_component, split_form)

F64 = torch.float64


def _sym(A):
    return (A + A.transpose(-1, -2)) / 2


def test_cone_points_lie_on_their_cone_and_off_the_others():
    gen = torch.Generator().manual_seed(0)
    S = _sym(torch.randn(4, 5, 5, generator=gen, dtype=F64))
    points = cone_points(S)
    assert all(p is not None for p in points) and cones_separated(S)
    for j, x in enumerate(points):
        forms = torch.einsum("d,mde,e->m", x, S, x)
        assert abs(forms[j]) < 1e-10 and math.isclose(x.norm().item(), 1.0)
        assert (x @ S[j]).norm() > 1e-3
        assert (torch.cat([forms[:j], forms[j + 1:]]).abs() > 1e-6).all()


def test_definite_or_repeated_slots_are_not_separated():
    gen = torch.Generator().manual_seed(1)
    S = _sym(torch.randn(3, 4, 4, generator=gen, dtype=F64))
    definite = S.clone()
    definite[1] = torch.eye(4, dtype=F64) + 0.1 * S[1]        # positive definite
    assert torch.linalg.eigvalsh(definite[1]).min() > 0
    pts = cone_points(definite)
    assert pts[1] is None and pts[0] is not None
    repeated = S.clone()
    repeated[2] = 3.0 * repeated[0]                           # the same cone twice
    pts = cone_points(repeated)
    assert pts[0] is None and pts[2] is None and pts[1] is not None
    assert not cones_separated(repeated)


def test_eigen_cone_point_on_a_hand_made_form_and_on_random_ones():
    # diag(2, -8): lambda = 2 at e1, mu = -8 at e2, so x0 = (sqrt 8, sqrt 2) up to the signs
    # of the eigenvectors; x0 S x0^T = 2*8 - 8*2 = 0 and x0 S = (2 sqrt 8, -8 sqrt 2)
    x0 = eigen_cone_point(torch.diag(torch.tensor([2.0, -8.0], dtype=F64)))
    assert torch.allclose(x0.abs(), torch.tensor([8.0, 2.0], dtype=F64).sqrt())
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        S = _sym(torch.randn(5, 5, generator=gen, dtype=F64))
        ev = torch.linalg.eigvalsh(S)
        if not (ev[0] < 0 < ev[-1]):
            continue
        x = eigen_cone_point(S)
        assert abs(float(x @ S @ x)) < 1e-12 * float(x @ x) * float(ev.abs().max())
        assert float((x @ S).norm()) > 1e-3 * float(x.norm()) * float(ev.abs().max())


def test_eigen_cone_point_refuses_a_semidefinite_form_and_bad_shapes():
    with pytest.raises(ValueError, match="indefinite"):
        eigen_cone_point(torch.diag(torch.tensor([1.0, 0.0, 2.0], dtype=F64)))
    with pytest.raises(ValueError, match="indefinite"):
        eigen_cone_point(-torch.eye(3, dtype=F64))
    with pytest.raises(ValueError, match="one d × d"):
        eigen_cone_point(torch.eye(3, dtype=F64)[None])
    with pytest.raises(ValueError, match="symmetric"):
        eigen_cone_point(torch.tensor([[1.0, 2.0], [0.0, -1.0]], dtype=F64))


def test_cone_points_rejects_bad_input():
    with pytest.raises(ValueError, match="symmetric"):
        cone_points(torch.randn(2, 3, 3, dtype=F64) + torch.triu(torch.ones(3, 3, dtype=F64)))
    with pytest.raises(ValueError, match="shape"):
        cone_points(torch.randn(3, 3, dtype=F64))
    with pytest.raises(TypeError, match="floating"):
        cone_points(torch.ones(1, 2, 2, dtype=torch.long))


@pytest.mark.parametrize("name,a,b", [
    ("silu", (1.0, 0.0), (0.0, 0.0)), ("gelu", (1.0, 0.0), (0.0, 0.0)),
    ("gelu_tanh", (1.0, 0.0), (0.0, 0.0)), ("softplus", (1.0, 0.0), (0.0, 0.0)),
    ("tanh", (0.0, 0.0), (1.0, -1.0)), ("sigmoid", (0.0, 0.0), (1.0, 0.0)),
])
def test_asymptotes_of_the_six_smooth_activations(name, a, b):
    near, far = asymptotes(get_activation(name), far=10.0), asymptotes(get_activation(name), far=30.0)
    for got, want in ((far["a"], a), (far["b"], b)):
        assert all(math.isclose(g, w, abs_tol=1e-9) for g, w in zip(got, want)), (got, want)
    assert far["residual"] < 1e-5 and far["residual"] <= 1e-3 * near["residual"]   # exponential


def test_asymptotes_of_relu_are_exact_and_bad_input_is_refused():
    res = asymptotes(get_activation("relu"))
    assert res["a"] == (1.0, 0.0) and res["residual"] == 0.0
    with pytest.raises(ValueError, match="far"):
        asymptotes(torch.tanh, far=float("inf"))
    with pytest.raises(TypeError, match="callable"):
        asymptotes(3.0)


def test_orr_component_of_o11_against_its_four_known_components():
    # O(1, 1) = ±diag(a, 1/a) and ±[[0, a], [1/a, 0]], a > 0 (chapter 7, exercise 2); in the
    # basis (e1 ± e2)/√2 the exchange acts as +1 on e+ and −1 on e−, −I as −1 on both.
    a = 2.5
    d = torch.tensor([[a, 0.0], [0.0, 1 / a]], dtype=torch.float64)
    x = torch.tensor([[0.0, a], [1 / a, 0.0]], dtype=torch.float64)
    assert orr_component(d) == (1, 1) and orr_component(-d) == (-1, -1)
    assert orr_component(x) == (1, -1) and orr_component(-x) == (-1, 1)


@pytest.mark.parametrize("r", [1, 2, 3, 4])
def test_the_exchange_and_a_single_pair_exchange(r):
    J = split_form(r)
    assert torch.equal(J, J.T) and torch.equal(J @ J, torch.eye(2 * r, dtype=torch.float64))
    pair = torch.eye(2 * r, dtype=torch.float64)
    pair[[0, r]] = pair[[r, 0]]
    assert orr_component(pair) == (1, -1)
    assert orr_component(J) == (1, (-1) ** r)        # det J = (−1)^r
    assert torch.linalg.det(J).round().item() == (-1) ** r
    # the gauge diag(G, G^-T) with det G < 0 sits in (−, −)
    G = torch.diag(torch.tensor([-2.0] + [1.0] * (r - 1), dtype=torch.float64))
    gauge = torch.block_diag(G, torch.linalg.inv(G).T)
    assert orr_component(gauge) == (-1, -1)


def test_orr_component_rejects_matrices_outside_o_rr():
    with pytest.raises(ValueError, match="not in O"):
        orr_component(torch.eye(4, dtype=torch.float64) * 2)
    with pytest.raises(ValueError, match="2r"):
        orr_component(torch.eye(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="positive integer"):
        split_form(0)
