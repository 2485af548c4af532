"""The symmetry theorems as properties: what must be invariant is, what must break does.

Hypothesis draws shapes, activations and α; the predicates of qkmlp.symmetry say which
case we are in, and the measurement must agree on generic (random) weights.
"""
import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import RANK_R
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
    activation_names,
    get_activation,
)
from qkmlp.symmetry import (
    gauge_is_symmetry,
    gauge_transformed,
    relative_change,
    rescaled,
    rescaling_is_symmetry,
    scalar_rescaling_commutes,
    swap_is_symmetry,
    swapped,
)

F64 = torch.float64
INVARIANT = 1e-9  # float64 round-off on these sizes is ~1e-15
# The rank-r forms whose symmetry predicates the theorems make exact (iff). For the symmetrised
# gated form gauge_is_symmetry is a sufficient condition only (its own test is below), so the
# drawn 'must break' checks leave it out.
THEOREM_FORMS = tuple(c for c in RANK_R if c is not SymmetrizedGatedMLP)
BROKEN = 1e-3  # generic weights: a broken symmetry moves the output by far more

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def factored_layers(draw, cls=None):
    cls = cls or draw(st.sampled_from(THEOREM_FORMS))
    d = draw(st.integers(2, 6))
    m = draw(st.integers(1, 4))
    r = draw(st.integers(1, 3))
    d_out = draw(st.integers(1, 4))
    act = draw(st.sampled_from(activation_names()))
    seed = draw(st.integers(0, 2**16))
    torch.manual_seed(seed)
    layer = cls(d, m, d_out, rank=r, activation=act, dtype=F64)
    # generic weights of order one so every nonlinearity bends
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    x = torch.randn(64, d, dtype=F64)
    return layer, x


# α bounded away from ±1 (where any change is small), plus the exact special values.
alphas = st.one_of(
    st.sampled_from([-1.0, 1.0]),
    st.floats(0.2, 5.0).filter(lambda a: abs(math.log(a)) > 0.2),
    st.floats(-5.0, -0.2).filter(lambda a: abs(math.log(-a)) > 0.2),
)


@SETTINGS
@given(factored_layers(SymmetricBilinearMLP), alphas)
def test_symmetric_form_is_invariant_under_swap_and_rescaling_for_every_sigma(case, alpha):
    layer, x = case
    assert swap_is_symmetry(layer) and rescaling_is_symmetry(layer, alpha)
    assert relative_change(layer, swapped(layer), x) < INVARIANT
    assert relative_change(layer, rescaled(layer, alpha), x) < INVARIANT


@SETTINGS
@given(factored_layers(GatedMLP), alphas)
def test_gated_form_rescaling_invariant_exactly_when_the_theorem_says(case, alpha):
    layer, x = case
    change = relative_change(layer, rescaled(layer, alpha), x)
    if rescaling_is_symmetry(layer, alpha):
        assert change < INVARIANT
    else:
        assert change > BROKEN


@SETTINGS
@given(factored_layers(GatedMLP))
def test_gated_form_swap_invariant_iff_sigma_linear(case):
    layer, x = case
    # Generic weights: if some k_{j,s} = c·q_{j,s} with c > 0, ReLU-type gating keeps the swap
    # for that component (σ(a)·ca = σ(ca)·a), so nearly parallel draws would change the output
    # by an arbitrarily small amount. Keep every pair at least ~25° from parallel.
    cos = torch.nn.functional.cosine_similarity(layer.query, layer.key, dim=-1)
    assume(bool((cos.abs() < 0.9).all()))
    change = relative_change(layer, swapped(layer), x)
    assert swap_is_symmetry(layer) == (change < INVARIANT)
    if layer.activation.is_linear:
        assert change < INVARIANT
    else:
        assert change > BROKEN


@SETTINGS
@given(factored_layers(GatedMLP), st.floats(0.2, 5.0))
def test_degree_p_homogeneous_sigma_scales_gated_output_by_alpha_to_p_minus_one(case, alpha):
    layer, x = case
    layer.activation = get_activation("relu2")  # p = 2
    y, y_scaled = layer(x), rescaled(layer, alpha)(x)
    torch.testing.assert_close(y_scaled, alpha ** (2 - 1) * y, rtol=1e-10, atol=1e-12)


def away_from_one(n: int) -> torch.Tensor:
    """n positive values in [0.3, 0.8] or [1.25, 3.3]: scalings that move a generic output."""
    v = torch.rand(n, dtype=F64) * 0.5 + 0.3
    return torch.where(torch.rand(n) < 0.5, v, 1 / v)


@SETTINGS
@given(factored_layers(), st.data())
def test_gauge_symmetry(case, data):
    layer, x = case
    r, m = layer.rank, layer.d_hidden
    kind = data.draw(st.sampled_from(["generic", "positive_diagonal", "permutation", "per_slot"]))
    if kind == "generic":
        G = torch.randn(r, r, dtype=F64) + 2 * torch.eye(r, dtype=F64)
    elif kind == "positive_diagonal":
        G = torch.diag(away_from_one(r))
    elif kind == "permutation":
        G = torch.eye(r, dtype=F64)[torch.randperm(r)]
    else:
        G = torch.randn(m, r, r, dtype=F64) + 2 * torch.eye(r, dtype=F64)
    if r == 1 and kind in ("generic", "per_slot"):
        # a 1x1 gauge is a scalar rescaling: keep it away from ±1, where any change is small
        signs = torch.where(torch.rand(G.shape, dtype=F64) < 0.5, -1.0, 1.0).to(F64)
        G = signs * away_from_one(G.numel()).reshape(G.shape)
    change = relative_change(layer, gauge_transformed(layer, G), x)
    if gauge_is_symmetry(layer, G):
        assert change < INVARIANT
    else:
        assert change > BROKEN
    if isinstance(layer, SymmetricBilinearMLP):
        assert gauge_is_symmetry(layer, G)


def test_gauge_keeps_the_dense_interactions():
    torch.manual_seed(0)
    layer = SymmetricBilinearMLP(5, 3, rank=3, dtype=F64)
    G = torch.randn(3, 3, 3, dtype=F64) + 2 * torch.eye(3, dtype=F64)
    torch.testing.assert_close(gauge_transformed(layer, G).interactions(), layer.interactions())


def test_dense_swap_is_a_transpose_and_an_invariance():
    torch.manual_seed(0)
    layer = BilinearAttentionMLP(5, 3, activation="gelu", dtype=F64)
    sw = swapped(layer)
    torch.testing.assert_close(sw.interaction, layer.interaction.transpose(1, 2))
    assert swap_is_symmetry(layer)
    assert relative_change(layer, sw, torch.randn(20, 5, dtype=F64)) < INVARIANT


def test_static_query_rescaling_is_an_invariance():
    torch.manual_seed(0)
    layer = StaticQueryMLP(5, 4, activation="gelu", dtype=F64)
    assert rescaling_is_symmetry(layer, -2.5)
    assert relative_change(layer, rescaled(layer, -2.5), torch.randn(20, 5, dtype=F64)) < INVARIANT


@pytest.mark.parametrize(
    "name,alpha,expected",
    [
        ("relu", 3.0, True), ("relu", -3.0, False), ("relu", -1.0, False),
        ("leaky_relu", 0.5, True), ("leaky_relu", -0.5, False),
        ("tanh", -1.0, True), ("tanh", 2.0, False), ("tanh", -2.0, False),
        ("identity", -7.0, True), ("silu", 2.0, False), ("silu", 1.0, True),
        ("relu2", 2.0, False), ("gelu", -1.0, False),
    ],
)
def test_scalar_rescaling_table(name, alpha, expected):
    assert scalar_rescaling_commutes(get_activation(name), alpha) is expected


def test_transforms_leave_their_input_untouched():
    torch.manual_seed(0)
    layer = GatedMLP(4, 3, rank=2, dtype=F64)
    before = copy.deepcopy(layer.state_dict())
    swapped(layer), rescaled(layer, 2.0), gauge_transformed(layer, torch.eye(2, dtype=F64) * 3)
    for k, v in layer.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_relative_change_value():
    torch.manual_seed(0)
    layer = KeyValueMLP(4, 3, dtype=F64)
    other = copy.deepcopy(layer)
    with torch.no_grad():
        other.value.mul_(1.5)
    assert math.isclose(relative_change(layer, other, torch.randn(10, 4, dtype=F64)), 0.5, rel_tol=1e-12)


# --- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0, 0.0, float("nan"), float("inf"), -float("inf")])
def test_bad_alpha_is_rejected(alpha):
    layer = GatedMLP(4, 3)
    with pytest.raises(ValueError, match="alpha"):
        rescaled(layer, alpha)
    with pytest.raises(ValueError, match="alpha"):
        rescaling_is_symmetry(layer, alpha)


def test_singular_or_misshapen_gauge_is_rejected():
    layer = SymmetricBilinearMLP(4, 3, rank=2)
    with pytest.raises(ValueError, match="invertible"):
        gauge_transformed(layer, torch.tensor([[1.0, 2.0], [2.0, 4.0]]))
    with pytest.raises(ValueError, match="invertible"):
        gauge_transformed(layer, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="shape"):
        gauge_transformed(layer, torch.eye(3))
    with pytest.raises(ValueError, match="finite"):
        gauge_transformed(layer, torch.full((2, 2), float("nan")))


def test_transforms_reject_layers_they_do_not_apply_to():
    with pytest.raises(TypeError, match="SymmetricBilinearMLP"):
        swapped(KeyValueMLP(4, 3))
    with pytest.raises(TypeError, match="GatedMLP"):
        rescaled(BilinearAttentionMLP(4, 3), 2.0)
    with pytest.raises(TypeError, match="GatedMLP"):
        gauge_transformed(StaticQueryMLP(4, 3), torch.eye(1))


# --- the predicates are sufficient conditions, exact only for the named activations ------

def _zlogz(z):
    return z * torch.log(z.abs().clamp_min(1e-300))


def test_predicates_false_yet_symmetric_for_a_custom_sigma():
    """σ(z) = z·log|z| commutes with no α ≠ 1, so the predicates answer False for the
    symmetrised gated layer; yet σ(αz) − ασ(z) = (α·log|α|)·z, a linear term the
    symmetrisation cancels: the layer keeps every α ≠ 0 and every diagonal gauge."""
    torch.manual_seed(0)
    x = torch.randn(64, 6, dtype=F64)
    sg = SymmetrizedGatedMLP(6, 5, rank=3, activation=_zlogz, dtype=F64)
    gated = GatedMLP(6, 5, rank=3, activation=_zlogz, dtype=F64)
    gated.load_state_dict(sg.state_dict())
    for alpha in (2.0, -2.0, 0.5, -0.3):
        assert not rescaling_is_symmetry(sg, alpha)
        assert relative_change(sg, rescaled(sg, alpha), x) < INVARIANT
        assert relative_change(gated, rescaled(gated, alpha), x) > BROKEN   # the gated form does change
    G = torch.diag(torch.tensor([2.0, -0.5, 3.0], dtype=F64))
    assert not gauge_is_symmetry(sg, G)
    assert relative_change(sg, gauge_transformed(sg, G), x) < INVARIANT
    assert relative_change(gated, gauge_transformed(gated, G), x) > BROKEN


def test_a_nonlinear_odd_sigma_can_commute_with_one_negative_alpha():
    """σ(z) = z·(2 + sin(2π·log₂|z|)) is odd and σ(2z) = 2σ(z), so σ(−2z) = −2σ(z): the gated
    layer keeps α = −2 (and 2) without σ being linear; the predicate, reading declared
    properties only, says False, and α = −3 does change the layer."""
    def log_periodic(z):
        return z * (2 + torch.sin(2 * math.pi * torch.log2(z.abs().clamp_min(1e-300))))

    z = torch.linspace(-5, 5, 1000, dtype=F64)
    assert torch.allclose(log_periodic(-2 * z), -2 * log_periodic(z), atol=1e-12)
    assert not torch.allclose(log_periodic(3 * z), 3 * log_periodic(z), atol=1e-3)
    torch.manual_seed(0)
    layer = GatedMLP(5, 4, activation=log_periodic, dtype=F64)
    x = torch.randn(100, 5, dtype=F64)
    assert not rescaling_is_symmetry(layer, -2.0)
    assert relative_change(layer, rescaled(layer, -2.0), x) < INVARIANT
    assert relative_change(layer, rescaled(layer, -3.0), x) > BROKEN


def test_degree_p_homogeneous_sigma_keeps_minus_one_exactly_when_odd():
    """A degree-2 gate changes the layer at every α > 0 but 1; at α = −1 the odd z|z| keeps it
    (σ(−z) = −σ(z)) and squared ReLU does not."""
    torch.manual_seed(2)
    x = torch.randn(60, 6, dtype=F64)
    odd = GatedMLP(6, 5, activation=lambda z: z * z.abs(), dtype=F64)
    relu2 = GatedMLP(6, 5, activation="relu2", dtype=F64)
    assert relative_change(odd, rescaled(odd, -1.0), x) < INVARIANT
    assert relative_change(relu2, rescaled(relu2, -1.0), x) > BROKEN
    for alpha in (0.5, 2.0):
        assert relative_change(odd, rescaled(odd, alpha), x) > BROKEN


@pytest.mark.parametrize("alpha", [-0.5, -2.0, -3.0])
def test_degree_p_homogeneous_sigma_with_negative_alpha_reflects_the_input(alpha):
    """For α < 0 a degree-p gate gives x ↦ |α|^(p−1)·f(−x) (not α^(p−1)·f(x))."""
    torch.manual_seed(1)
    layer = GatedMLP(6, 8, rank=2, activation="relu2", dtype=F64)
    x = torch.randn(50, 6, dtype=F64)
    moved = rescaled(layer, alpha)(x)
    torch.testing.assert_close(moved, abs(alpha) ** (2 - 1) * layer(-x), rtol=1e-10, atol=1e-12)
    wrong = alpha ** (2 - 1) * layer(x)
    assert (moved - wrong).norm() > 0.5 * moved.norm()
