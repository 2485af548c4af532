"""qkmlp.book.explorer_model's (a, b)-plane maps: the scaling claim against plain torch
formulas and the theorems, and the colour limits that make a small difference visible."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qkmlp import activation_names, get_activation
from qkmlp.book.explorer_model import (
    PLANE_CMAP,
    PLANE_PANELS,
    ZERO_RTOL,
    default_alphas,
    difference_limit,
    exchange_plane,
    explorer_planes,
    plane_heading,
    scaling_plane,
)

# σ written with torch directly, by name: the reference shares no code with the library's
# activation registry.
PLAIN = {
    "identity": lambda z: z,
    "relu": F.relu,
    "leaky_relu": F.leaky_relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "relu2": lambda z: F.relu(z) ** 2,
}


def _plain_unit(form, name, alpha, a, b):
    """One rank component after the inverse scaling by alpha, at scalar a = x·q, b = x·k."""
    s = PLAIN[name]
    qa, kb = torch.tensor(alpha * a, dtype=torch.float64), torch.tensor(b / alpha, dtype=torch.float64)
    return float(s(qa) * kb) if form == "gated" else float(s(qa * kb))


def _theorem_keeps_scaling(form, name, alpha):
    """Chapter 5's theorems, stated from σ's properties: the symmetric form keeps every
    α; the gated form keeps α iff σ(αz) = α σ(z) (α = 1, linear σ, degree-1 σ with α > 0,
    odd σ with α = −1)."""
    act = get_activation(name)
    return form == "symmetric" or alpha == 1.0 or act.is_linear or (
        alpha > 0 and act.homogeneity_degree == 1) or (alpha == -1.0 and act.is_odd)


def test_plain_reference_covers_every_activation():
    assert set(PLAIN) == set(activation_names())


@pytest.mark.parametrize("name", activation_names())
@pytest.mark.parametrize("form", ["gated", "symmetric"])
def test_scaling_plane_is_the_formula(form, name):
    """Each cell against the unit written out in plain torch: at α, gated σ(αa)·(b/α) or
    symmetric σ((αa)(b/α)); at 1, σ(a)·b or σ(ab); rows b = axis[i], columns a = axis[j]."""
    n, span = 7, 1.5
    axis = [-span + 2 * span * k / (n - 1) for k in range(n)]
    for alpha in (-2.0, 0.5, 1.0, 2 ** 0.25):
        p = scaling_plane(form, name, alpha, n=n, span=span)
        np.testing.assert_allclose(p["a"], axis, rtol=0, atol=1e-15)
        for i, b in enumerate(axis):
            for j, a in enumerate(axis):
                at_alpha, at_1 = _plain_unit(form, name, alpha, a, b), _plain_unit(form, name, 1.0, a, b)
                assert p["unit"][i, j] == pytest.approx(at_alpha, rel=1e-12, abs=1e-14)
                assert p["unit_at_1"][i, j] == pytest.approx(at_1, rel=1e-12, abs=1e-14)
                assert p["difference"][i, j] == pytest.approx(at_alpha - at_1, rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("name", activation_names())
def test_scaling_difference_is_blank_exactly_where_the_theorems_keep_the_unit(name):
    """Over the explorer's whole α grid: the drawn scaling difference is 0 (limit 0) where
    chapter 5's theorems say the scaling keeps the unit, and at least 1 % of the maps
    where they say it breaks; the exchange likewise (gated: only linear σ keeps it)."""
    linear = get_activation(name).is_linear
    for form in ("gated", "symmetric"):
        for alpha in default_alphas():
            lim = explorer_planes(form, name, alpha)["limits"]
            if _theorem_keeps_scaling(form, name, alpha):
                assert lim["scaling_difference"] == 0.0, (form, name, alpha)
            else:
                assert lim["scaling_difference"] > 0.01 * lim["maps"], (form, name, alpha, lim)
            if form == "symmetric" or linear:
                assert lim["exchange_difference"] == 0.0, (form, name, alpha)
            else:
                assert lim["exchange_difference"] > 0.01 * lim["maps"], (form, name, alpha)


def test_degree_two_gate_scales_the_unit_by_alpha():
    """Corollary (degree-p gate, p = 2, α > 0): the unit at α is α^(p−1) = α times the unit
    at 1, so the difference map is (α − 1) times the unit at 1."""
    for alpha in (0.5, 2.0, 4.0):
        p = scaling_plane("gated", "relu2", alpha)
        np.testing.assert_allclose(p["unit"], alpha * p["unit_at_1"], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(p["difference"], (alpha - 1) * p["unit_at_1"], rtol=1e-12, atol=1e-14)


def test_explorer_planes_holds_both_rows_and_their_limits():
    p = explorer_planes("gated", "gelu", 2.0, n=9, span=1.0)
    ex, sc = exchange_plane("gated", "gelu", 2.0, n=9, span=1.0), scaling_plane("gated", "gelu", 2.0, n=9, span=1.0)
    np.testing.assert_array_equal(p["unit"], ex["unit"])
    np.testing.assert_array_equal(p["unit"], sc["unit"])
    np.testing.assert_array_equal(p["swap"], ex["swap"])
    np.testing.assert_array_equal(p["exchange_difference"], ex["unit"] - ex["swap"])
    np.testing.assert_array_equal(p["scaling_difference"], sc["unit"] - sc["unit_at_1"])
    maps = max(np.abs(ex["unit"]).max(), np.abs(ex["swap"]).max(), np.abs(sc["unit_at_1"]).max())
    assert p["limits"]["maps"] == maps
    assert p["limits"]["exchange_difference"] == np.abs(ex["unit"] - ex["swap"]).max()
    assert p["limits"]["scaling_difference"] == np.abs(sc["unit"] - sc["unit_at_1"]).max()
    # every panel names a map and a limit that exist
    assert len(PLANE_PANELS) == 6
    for key, limit, gated_title, symmetric_title in PLANE_PANELS:
        assert key in p and limit in p["limits"] and gated_title and symmetric_title


def test_rounding_of_an_exact_zero_is_drawn_blank():
    """The symmetric unit at α is the unit at 1 in exact arithmetic; α·a·(b/α) rounds, so
    the float difference is a few ulps, not 0. Its limit is 0: drawn blank, not as a
    full-colour pattern of rounding noise."""
    seen_noise = False
    for alpha in default_alphas():
        p = explorer_planes("symmetric", "silu", alpha)
        noise = np.abs(p["scaling_difference"]).max()
        assert noise <= 1e-15 * p["limits"]["maps"] * 10
        seen_noise |= noise > 0
        assert p["limits"]["scaling_difference"] == 0.0
    assert seen_noise, "no α gave a rounding difference: this test would not see a wrong limit"


def test_difference_limit_follows_the_data_and_its_zero_tolerance():
    d = np.array([[0.0, -0.03], [0.02, 0.01]])
    assert difference_limit(d, 3.0) == 0.03                  # the largest magnitude, either sign
    assert difference_limit(d * 1e-14, 3.0) == 0.0           # 3e-16 ≤ 1e-12 × 3: rounding
    assert difference_limit(d * 1e-11, 3.0) == pytest.approx(3e-13)   # above it: drawn
    assert difference_limit(np.zeros((2, 2)), 0.0) == 0.0
    assert ZERO_RTOL == 1e-12
    with pytest.raises(ValueError, match="difference must be finite"):
        difference_limit(np.array([np.nan]), 1.0)
    with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
        difference_limit(d, -1.0)


def test_a_one_percent_difference_takes_the_darkest_colour():
    """What "a small difference is visible" means here: two maps that differ by 1 % of
    their scale. On the maps' own scale (the explorer's old shared colour bar) the
    difference is 1 % of the way from white to the darkest colour; on its own limits it
    reaches the darkest colour at its largest cell. Colours from the colour map itself."""
    from matplotlib import colormaps

    cmap = colormaps[PLANE_CMAP]
    g = np.linspace(-2, 2, 17)
    unit = np.outer(g, g)
    other = unit * 1.01
    diff = other - unit
    maps = np.abs(other).max()
    L = difference_limit(diff, maps)
    assert L == pytest.approx(0.01 * np.abs(unit).max())

    def rgb(v, limit):                         # a diverging map centred at 0 on [−limit, limit]
        return np.array(cmap(0.5 + 0.5 * v / limit)[:3])

    white = rgb(0.0, 1.0)
    top = diff.flat[np.abs(diff).argmax()]
    shared = np.abs(rgb(top, maps) - white).max()
    own = np.abs(rgb(top, L) - white).max()
    end = np.abs(rgb(np.sign(top) * L, L) - white).max()   # the colour map's end on that side
    assert shared < 0.02                         # on the shared scale: indistinguishable from white
    assert own == pytest.approx(end) and own > 0.5   # on its own: the end of the colour map


def test_gelu_scaling_difference_is_small_and_drawn_in_full():
    """The smallest scaling difference on the explorer's grid, GELU at α = 2^(1/4), is a
    few % of the maps (measured here), and it is its own colour limit."""
    p = explorer_planes("gated", "gelu", 2 ** 0.25)
    share = p["limits"]["scaling_difference"] / p["limits"]["maps"]
    assert 0.01 < share < 0.05
    assert p["limits"]["scaling_difference"] == np.abs(p["scaling_difference"]).max()


def test_plane_heading_says_the_largest_difference_and_its_share():
    assert plane_heading("scaling", {"maps": 4.0, "scaling_difference": 0.0925, "exchange_difference": 0.0}) == (
        "Inverse scaling q → αq, k → k/α: max |difference| = 0.0925 (2.3 % of the maps' max)")
    assert plane_heading("exchange", {"maps": 4.0, "scaling_difference": 1.0, "exchange_difference": 0.0}) == (
        "Exchange q ↔ k at α: difference 0 everywhere")
    with pytest.raises(ValueError, match="row must be one of exchange, scaling"):
        plane_heading("swap", {"maps": 1.0})
