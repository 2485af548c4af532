"""The activation registry: names, torch definitions, and the declared properties."""
import math

import pytest
import torch
import torch.nn.functional as F

import qkmlp
from qkmlp import get_activation

EXPECTED = {
    "identity": lambda z: z,
    "relu": F.relu,
    "leaky_relu": lambda z: F.leaky_relu(z, 0.01),
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": lambda z: torch.log1p(torch.exp(z)),
    "relu2": lambda z: F.relu(z) ** 2,
}

Z = torch.linspace(-4, 4, 801, dtype=torch.float64)


def test_registry_names_are_the_documented_ones():
    assert set(qkmlp.activation_names()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_values_match_torch(name):
    act = get_activation(name)
    assert act.name == name
    torch.testing.assert_close(act(Z), EXPECTED[name](Z))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_declared_homogeneity_holds_and_undeclared_fails(name):
    act = get_activation(name)
    p = act.homogeneity_degree
    for c in (0.3, 2.5, 7.0) if p is not None else ():
        assert torch.allclose(act(c * Z), c**p * act(Z), atol=1e-12), f"{name}: σ(cz) != c^{p} σ(z) for c={c}"
    if p is None:
        # no degree p fits: check σ(2z)/σ(z) is not a constant power of 2 on z > 0
        pos = Z[Z > 0.1]
        ratio = act(2 * pos) / act(pos)
        assert not torch.allclose(ratio, ratio[0].expand_as(ratio), atol=1e-6)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_declared_linearity_and_oddness(name):
    act = get_activation(name)
    is_linear = torch.allclose(act(Z), act(torch.ones(1, dtype=Z.dtype)) * Z, atol=1e-12)
    is_odd = torch.allclose(act(-Z), -act(Z), atol=1e-12)
    assert act.is_linear == is_linear
    assert act.is_odd == is_odd


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError) as err:
        get_activation("mish")
    for name in EXPECTED:
        assert name in str(err.value)


def test_callable_is_wrapped_with_conservative_defaults():
    def cube(z):
        return z**3

    act = get_activation(cube)
    assert act.name == "cube" and not act.is_linear and act.homogeneity_degree is None
    declared = get_activation(cube, homogeneity_degree=3, is_odd=True)
    assert declared.homogeneity_degree == 3 and declared.is_odd
    torch.testing.assert_close(declared(Z), Z**3)
    assert get_activation(lambda z: 2 * z, is_linear=True).homogeneity_degree == 1


def test_non_callable_rejected():
    with pytest.raises(TypeError, match="name .* or a callable"):
        get_activation(3)


def test_gelu_is_not_homogeneous_even_approximately():
    act = get_activation("gelu")
    assert not math.isclose(float(act(torch.tensor(2.0))), 2 * float(act(torch.tensor(1.0))), rel_tol=1e-3)


def test_softplus_has_no_threshold():
    """log(1 + eᶻ) everywhere (F.softplus returns z above 20): continuous, σ(z) − z > 0 and
    σ' = sigmoid past the threshold, in float64; in float32 the same numbers as F.softplus."""
    sp = get_activation("softplus")
    z = torch.tensor([19.9999, 20.0, 20.0001, 25.0, 40.0, -30.0, -800.0, 800.0], dtype=torch.float64)
    want = torch.where(z < 30, torch.log1p(torch.exp(z.clamp(max=30))), z + torch.exp(-z))
    torch.testing.assert_close(sp(z), want, rtol=1e-15, atol=0)
    # the tail e^-z past the threshold, where float64 can hold it next to z (z <= 25)
    assert bool(((sp(z) - z)[:4] > 0).all()) and (sp(z)[:4] - z[:4] - torch.exp(-z[:4])).abs().max() < 1e-15
    assert torch.isfinite(sp(z)).all() and abs(float(sp(z)[5]) / math.exp(-30) - 1) < 1e-12
    zz = z.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(sp(zz).sum(), zz)
    torch.testing.assert_close(g, torch.sigmoid(z), rtol=1e-15, atol=0)
    z32 = torch.linspace(-40, 40, 4001)
    ref = F.softplus(z32)            # float32: within one rounding of torch's own softplus
    assert bool(((sp(z32) - ref).abs() <= torch.finfo(torch.float32).eps * ref.abs().clamp(min=1)).all())
    assert torch.equal(sp(z32[z32 > 20]), F.softplus(z32[z32 > 20]))
