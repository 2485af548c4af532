"""Headless tests of qkmlp.book.widgets: set a control, check numbers and figure follow the theorems."""
from __future__ import annotations

import io
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from qkmlp import activation_names, get_activation  # noqa: E402
from qkmlp.book.widgets import (  # noqa: E402
    PLANE_CMAP,
    SymmetryExplorer,
    SLIDER_HEIGHT_PX,
    SLIDER_TRACK_PX,
    alpha_ticks,
    component_products,
    default_alphas,
    exchange_plane,
    make_batch,
    make_layer,
    measure,
    scaling_sweep,
    symmetry_explorer,
)

TOL = 1e-12  # float64: "invariant" means ≤ a few ulps of relative change
BREAK = 1e-3  # what the theorems say breaks must break by at least this on generic weights


@pytest.fixture(scope="module")
def ex():
    return symmetry_explorer(activation="silu", form="gated", alpha=2.0, rank=1)


def test_controls_are_widgets(ex):
    import ipywidgets as W

    for name in ("alpha", "activation", "form", "rank"):
        assert isinstance(getattr(ex, name), W.ValueWidget), name
    assert set(ex.activation.options) == set(activation_names())
    alphas = [v for _, v in ex.alpha.options]
    assert min(alphas) < 0 < max(alphas) and -1.0 in alphas and 1.0 in alphas
    assert set(ex.form.options) == {"gated", "symmetric"}


def test_default_alphas_log_spaced_and_signed():
    a = default_alphas(4.0, 4)
    pos = [v for v in a if v > 0]
    assert [-v for v in reversed(pos)] == [v for v in a if v < 0]
    ratios = np.diff(np.log2(pos))
    np.testing.assert_allclose(ratios, 0.25)
    assert {0.25, 0.5, 1.0, 2.0, 4.0} <= set(pos)


@pytest.mark.parametrize("name", activation_names())
@pytest.mark.parametrize("alpha", [-4.0, -1.0, 0.5, 1.0, 2.0])
def test_numbers_follow_theorems_gated(ex, name, alpha):
    with ex.hold():
        ex.form.value = "gated"
        ex.rank.value = 1
        ex.activation.value = name
        ex.alpha.value = alpha
    n = ex.numbers()
    act = get_activation(name)
    # what the theorems say, stated from the activation's properties (not the predicates)
    inv = alpha == 1.0 or act.is_linear or (alpha > 0 and act.homogeneity_degree == 1) or (alpha == -1.0 and act.is_odd)
    assert n["scale_predicted_invariant"] is inv
    assert n["swap_predicted_invariant"] is act.is_linear
    if inv:
        assert n["scale_change"] <= TOL
    else:
        assert n["scale_change"] > BREAK
    if act.is_linear:
        assert n["swap_change"] <= TOL
    else:
        assert n["swap_change"] > BREAK


def test_relu2_factor(ex):
    ex.form.value = "gated"
    ex.activation.value = "relu2"
    for alpha in (0.5, 2.0, 4.0):
        ex.alpha.value = alpha
        n = ex.numbers()
        assert n["scale_predicted_change"] == pytest.approx(abs(alpha - 1))
        assert n["scale_change"] == pytest.approx(abs(alpha - 1), rel=1e-12)


@pytest.mark.parametrize("rank", [1, 3])
def test_symmetric_form_always_invariant(ex, rank):
    ex.form.value = "symmetric"
    ex.rank.value = rank
    assert ex.layer.rank == rank
    for name in ("silu", "relu2", "tanh"):
        for alpha in (-4.0, -1.0, 0.25, 2.0):
            with ex.hold():
                ex.activation.value = name
                ex.alpha.value = alpha
            n = ex.numbers()
            assert n["scale_predicted_invariant"] and n["swap_predicted_invariant"]
            assert n["scale_change"] <= TOL and n["swap_change"] <= TOL
    ex.rank.value = 1


def test_rank_control_rebuilds_layer(ex):
    ex.form.value = "gated"
    ex.activation.value = "relu"
    ex.alpha.value = 2.0
    ex.rank.value = 2
    n = ex.numbers()
    assert ex.layer.rank == 2 and n["rank"] == 2
    assert n["scale_change"] <= TOL and n["swap_change"] > BREAK
    ex.rank.value = 1


def test_figure_updates_in_place(ex):
    ex.form.value = "gated"
    ex.activation.value = "silu"
    ex.alpha.value = 1.0
    n_axes = len(ex.figure.axes)
    png_before = ex.image.value
    off = ex.scale_points.get_offsets()
    np.testing.assert_allclose(off[:, 0], off[:, 1], atol=1e-15)  # α = 1: on the diagonal
    ex.alpha.value = 2.0
    off = np.asarray(ex.scale_points.get_offsets())
    a, b = ex._a, ex._b
    silu = get_activation("silu")
    expected = (silu(torch.tensor(2.0 * a)) * torch.tensor(b / 2.0)).numpy()
    np.testing.assert_allclose(off[:, 1], expected, rtol=1e-12, atol=1e-15)
    assert np.abs(off[:, 0] - off[:, 1]).max() > BREAK  # off the diagonal: the break is visible
    assert ex.image.value != png_before and ex.image.value[:4] == b"\x89PNG"
    assert len(ex.figure.axes) == n_axes  # the same figure, no new axes
    assert "breaks" in ex.readout.value


def test_component_products_relations():
    a = np.linspace(-2, 2, 9)
    b = np.linspace(1.5, -1.5, 9)
    p0, pa, ps = component_products("gated", "relu2", 3.0, a, b)
    np.testing.assert_allclose(pa, 3.0 * p0, rtol=1e-14)  # α^(p−1) with p = 2
    p0, pa, ps = component_products("symmetric", "gelu", -2.0, a, b)
    np.testing.assert_allclose(pa, p0, rtol=1e-14)
    np.testing.assert_allclose(ps, pa, rtol=1e-14)
    with pytest.raises(ValueError, match="same shape"):
        component_products("gated", "relu", 2.0, a, b[:3])


def test_measure_agrees_with_sweep():
    alphas = [-2.0, 0.5, 3.0]
    sw = scaling_sweep("gated", alphas, ["gelu", "relu"])
    x = make_batch()
    layer = make_layer("gated", "gelu")
    for i, a in enumerate(alphas):
        assert sw["gelu"][i] == measure(layer, x, a)["scale_change"]
    assert sw["relu"][2] <= TOL and sw["relu"][0] > BREAK


def test_same_weights_across_forms_and_activations():
    g = make_layer("gated", "silu", 2)
    s = make_layer("symmetric", "relu", 2)
    assert torch.equal(g.query, s.query) and torch.equal(g.key, s.key) and torch.equal(g.value, s.value)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown activation"):
        SymmetryExplorer(activations=["relu", "nope"])
    with pytest.raises(ValueError, match="alpha must be one of"):
        SymmetryExplorer(alpha=3.14159)
    with pytest.raises(ValueError, match="unknown form"):
        make_layer("dense", "relu")
    with pytest.raises(ValueError, match="rank"):
        SymmetryExplorer(rank=0)
    with pytest.raises(ValueError, match="max_alpha"):
        default_alphas(0.5)


def _image_changes(ex):
    """Record every new value of the panel's image widget (one entry per message sent)."""
    seen = []
    ex.image.observe(lambda change: seen.append(change["new"]), names="value")
    return seen


def test_hold_redraws_once(ex):
    ex.alpha.value = 1.0
    seen = _image_changes(ex)
    try:
        with ex.hold():
            ex.activation.value = "tanh"
            ex.alpha.value = -1.0
            ex.form.value = "gated"
    finally:
        ex.image.unobserve_all("value")
    assert len(seen) == 1
    assert ex.numbers()["scale_change"] <= TOL  # tanh is odd: α = −1 is a symmetry


def _widgets_in(box):
    out = [box]
    for child in getattr(box, "children", ()):
        out += _widgets_in(child)
    return out


def test_both_figures_change_in_one_image_update(ex):
    """The scatter plots and the heat maps are one PNG: a move of α sends one image, and
    that image is the two figures' pixels stacked (decoded here, compared pixel for pixel
    with each figure drawn on its own). The heat maps are redrawn by blitting (a stored
    background, the changing artists drawn over it); the reference here is a full draw
    of the figure with every artist in it, so the blit must draw exactly what a full
    draw does."""
    import ipywidgets as W
    from PIL import Image

    images = [w for w in _widgets_in(ex.widget) if isinstance(w, W.Image)]
    assert images == [ex.image]
    ex.alpha.value = 1.0
    seen = _image_changes(ex)
    try:
        ex.alpha.value = 2.0
    finally:
        ex.image.unobserve_all("value")
    assert len(seen) == 1
    got = np.asarray(Image.open(io.BytesIO(seen[0])).convert("RGBA"))
    parts = []
    for a in ex._plane_animated:
        a.set_animated(False)
    try:
        for fig in (ex.plane_figure, ex.figure):          # the heat maps on top, as on the website
            buf = io.BytesIO()
            fig.savefig(buf, format="raw", dpi=fig.dpi)       # the figure alone, RGBA bytes
            w, h = (int(round(v)) for v in fig.get_size_inches() * fig.dpi)
            parts.append(np.frombuffer(buf.getvalue(), np.uint8).reshape(h, w, 4))
    finally:
        for a in ex._plane_animated:
            a.set_animated(True)
    assert got.shape[0] == sum(p.shape[0] for p in parts) and got.shape[1] == max(p.shape[1] for p in parts)
    top = parts[0].shape[0]
    np.testing.assert_array_equal(got[:top, :parts[0].shape[1]], parts[0])
    np.testing.assert_array_equal(got[top:, :parts[1].shape[1]], parts[1])


def test_no_warning_after_the_book_set_its_figure_style():
    """figures.panel() turns on constrained layout in rcParams; the explorer's scatter figure
    sets its own margins and must not warn about a layout engine (it did, in red, in Lab)."""
    from qkmlp.book import figures

    figures.panel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = symmetry_explorer(alphas=[-1.0, 1.0, 2.0], activations=["silu", "relu"])
        e.alpha.value = 2.0


def test_opens_at_alpha_one():
    assert SymmetryExplorer(activation="relu", activations=["relu"]).alpha.value == 1.0


def test_repr_mimebundle(ex):
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "text/html" not in bundle                     # no static page given
    assert math.isfinite(ex.numbers()["scale_change"])


def test_static_html_rides_beside_the_widget_view():
    """JupyterLab renders the widget view (rank above HTML); the website build renders the
    text/html (see test_website_build_prefers_html_over_the_widget_view)."""
    page = "<div class='qkmlp-static-explorer'>static</div>"
    e = SymmetryExplorer(activation="relu", activations=["relu"], static_html=page)
    bundle = e._repr_mimebundle_()
    assert bundle["text/html"] == page
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == e.widget.model_id
    with pytest.raises(TypeError, match="static_html must be a str"):
        SymmetryExplorer(activation="relu", activations=["relu"], static_html=b"<div></div>")


def test_website_build_prefers_html_over_the_widget_view():
    """The book's Sphinx config, read as myst-nb reads it: for the html builder text/html
    outranks the widget view, so the website shows the static explorer."""
    yaml = pytest.importorskip("yaml")
    render = pytest.importorskip("myst_nb.core.render")
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "_config.yml").read_text())
    overrides = [tuple(o) for o in config["sphinx"]["config"]["nb_mime_priority_overrides"]]
    order = render.get_mime_priority("html", overrides)
    assert order.index("text/html") < order.index("application/vnd.jupyter.widget-view+json")
    # without the override myst-nb would show the (dead, offline) widget view
    base = render.get_mime_priority("html", [])
    assert base.index("text/html") > base.index("application/vnd.jupyter.widget-view+json")


def test_one_thread_restores_thread_count():
    from qkmlp.book.widgets import one_thread

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_predicted_change_for_negative_alpha_odd_degree_two():
    """σ(z) = z|z| (odd, degree 2): α < 0 gives |α|^(p−1) f, measured against the prediction."""
    from qkmlp.book.widgets import predicted_scale_change

    odd2 = get_activation(lambda z: z * z.abs(), homogeneity_degree=2, is_odd=True)
    even2 = get_activation(torch.square, homogeneity_degree=2)
    x = make_batch()
    layer = make_layer("gated", odd2)
    for alpha in (-4.0, -2.0, -0.5, 0.5, 3.0):
        got = measure(layer, x, alpha)
        assert got["scale_predicted_change"] == pytest.approx(abs(abs(alpha) - 1))
        assert got["scale_change"] == pytest.approx(abs(abs(alpha) - 1), rel=1e-12, abs=1e-14)
    assert measure(layer, x, -1.0)["scale_change"] == 0.0
    # an even σ: no number predicted for α < 0 (the change is |α|^(p−1) + 1, not declared)
    assert predicted_scale_change(make_layer("gated", even2), -2.0) is None
    assert measure(make_layer("gated", even2), x, -2.0)["scale_change"] == pytest.approx(3.0, rel=1e-12)


# --- the (a, b) plane ---------------------------------------------------------------------

def _silu(z):
    return z / (1.0 + math.exp(-z))


def _gelu(z):
    return 0.5 * z * (1.0 + math.erf(z / math.sqrt(2.0)))


@pytest.mark.parametrize("alpha", [-4.0, -1.0, 0.5, 1.0, 2.0])
def test_exchange_plane_is_the_formula(alpha):
    """Each cell against the unit written out by hand: gated σ(αa)·(b/α) and its swap
    σ(b/α)·(αa), symmetric σ((αa)(b/α)), at b = axis[i] (rows), a = axis[j] (columns)."""
    n, span = 9, 1.5
    axis = [-span + 2 * span * k / (n - 1) for k in range(n)]
    g = exchange_plane("gated", "silu", alpha, n=n, span=span)
    s = exchange_plane("symmetric", "gelu", alpha, n=n, span=span)
    np.testing.assert_allclose(g["a"], axis, rtol=0, atol=1e-15)
    np.testing.assert_allclose(g["b"], axis, rtol=0, atol=1e-15)
    for i, b in enumerate(axis):
        for j, a in enumerate(axis):
            unit, swap = _silu(alpha * a) * (b / alpha), _silu(b / alpha) * (alpha * a)
            assert g["unit"][i, j] == pytest.approx(unit, rel=1e-12, abs=1e-15)
            assert g["swap"][i, j] == pytest.approx(swap, rel=1e-12, abs=1e-15)
            assert g["difference"][i, j] == pytest.approx(unit - swap, rel=1e-12, abs=1e-14)
            want = _gelu((alpha * a) * (b / alpha))
            assert s["unit"][i, j] == pytest.approx(want, rel=1e-12, abs=1e-15)
            assert s["swap"][i, j] == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", activation_names())
def test_exchange_plane_symmetric_equals_its_swap_gated_does_not(name):
    """The picture of the theorems: the symmetric unit's map equals its swap (difference
    exactly 0) for every σ and α; the gated one's differs unless σ is linear. At α = 1 the
    swap is the unit reflected in a = b (the transpose)."""
    linear = get_activation(name).is_linear
    for alpha in (-2.0, 0.5, 1.0, 4.0):
        s = exchange_plane("symmetric", name, alpha)
        assert np.array_equal(s["unit"], s["swap"]) and not s["difference"].any()
        g = exchange_plane("gated", name, alpha)
        gap = np.abs(g["difference"]).max()
        if linear:
            assert gap <= 1e-12 * np.abs(g["unit"]).max()
        else:
            assert gap > 0.05 * np.abs(g["unit"]).max(), (name, alpha, gap)
    g1 = exchange_plane("gated", name, 1.0)
    np.testing.assert_array_equal(g1["swap"], g1["unit"].T)


def test_exchange_plane_bad_input():
    with pytest.raises(ValueError, match="unknown form"):
        exchange_plane("dense", "relu", 1.0)
    with pytest.raises(ValueError, match="alpha must be finite and non-zero"):
        exchange_plane("gated", "relu", 0.0)
    with pytest.raises(ValueError, match="n must be"):
        exchange_plane("gated", "relu", 1.0, n=1)
    with pytest.raises(ValueError, match="span must be"):
        exchange_plane("gated", "relu", 1.0, span=-1.0)
    with pytest.raises(ValueError, match="unknown activation"):
        exchange_plane("gated", "nope", 1.0)


def test_plane_figure_follows_the_controls(ex):
    """The live heat maps redraw in place on each control: the six images hold
    explorer_planes' maps in PLANE_PANELS' order; the four maps of the unit and its swap
    share one colour scale, each difference has its own, all symmetric about 0."""
    with ex.hold():
        ex.form.value = "gated"
        ex.activation.value = "silu"
        ex.alpha.value = 1.0
    n_axes = len(ex.plane_figure.axes)
    assert len(ex.plane_images) == 6 and len(ex.plane_bar_labels) == 6
    unit, swap, xdiff, at1, unit_again, sdiff = (np.asarray(im.get_array()) for im in ex.plane_images)
    a = ex.plane_images[0].get_extent()
    assert a == [-2.0, 2.0, -2.0, 2.0] or tuple(a) == (-2.0, 2.0, -2.0, 2.0)
    np.testing.assert_array_equal(swap, unit.T)        # α = 1: the reflection in a = b
    np.testing.assert_array_equal(unit_again, unit)
    np.testing.assert_array_equal(at1, unit)            # α = 1: the scaling moves nothing
    assert not sdiff.any()                              # ... so its difference is drawn blank
    assert np.abs(xdiff).max() > 1.0                    # gated silu: the exchange breaks
    maps = max(np.abs(unit).max(), np.abs(swap).max())
    for k in (0, 1, 3, 4):
        assert ex.plane_images[k].get_clim() == pytest.approx((-maps, maps))
    top = np.abs(unit - unit.T).max()
    assert ex.plane_images[2].get_clim() == pytest.approx((-top, top))   # its own scale
    assert [t.get_text() for t in ex.plane_bar_labels[2]] == [f"\u2212{top:.3g}", "0", f"+{top:.3g}"]
    assert [t.get_text() for t in ex.plane_bar_labels[5]] == ["", "0 everywhere", ""]
    assert "difference 0 everywhere" in ex.plane_headings[1].get_text()
    png = ex.image.value
    ex.alpha.value = 2.0
    unit2, at1_2, sdiff2 = (np.asarray(ex.plane_images[k].get_array()) for k in (0, 3, 5))
    i, j = 16, 12                                       # b = 2, a = 1
    assert unit2[i, j] == pytest.approx(_silu(2.0 * 1.0) * (2.0 / 2.0), rel=1e-12)
    assert at1_2[i, j] == pytest.approx(_silu(1.0) * 2.0, rel=1e-12)
    assert sdiff2[i, j] == pytest.approx(_silu(2.0) - 2.0 * _silu(1.0), rel=1e-12)
    top = np.abs(sdiff2).max()
    assert ex.plane_images[5].get_clim() == pytest.approx((-top, top))
    assert ex.image.value != png and ex.image.value[:4] == b"\x89PNG"
    ex.form.value = "symmetric"
    unit, swap, xdiff, at1, _, sdiff = (np.asarray(im.get_array()) for im in ex.plane_images)
    assert np.array_equal(unit, swap) and not xdiff.any() and not sdiff.any()
    np.testing.assert_allclose(at1, unit, rtol=1e-14, atol=1e-15)
    assert len(ex.plane_figure.axes) == n_axes
    assert ex.image in ex.widget.children
    ex.form.value = "gated"


def test_a_small_scaling_difference_fills_its_colour_scale(ex):
    """GELU at α = 2^(1/4): the unit at α differs from the unit at 1 by a few % of the
    maps (the smallest difference on the α grid). Its map's colour limits are its own
    largest magnitude, so its largest cell is drawn in the colour map's end colour; the
    heading states the size."""
    from matplotlib import colormaps

    with ex.hold():
        ex.form.value = "gated"
        ex.activation.value = "gelu"
        ex.alpha.value = 2 ** 0.25
    im = ex.plane_images[5]
    d = np.asarray(im.get_array())
    lo, hi = im.get_clim()
    assert hi == -lo == np.abs(d).max()
    maps = ex.plane_images[3].get_clim()[1]
    assert 0.01 < hi / maps < 0.05
    cmap = colormaps[PLANE_CMAP]
    k = np.unravel_index(np.abs(d).argmax(), d.shape)
    assert im.to_rgba(d[k]) == cmap(0.0 if d[k] < 0 else 1.0)
    assert f"{100 * float(f'{hi:.3g}') / float(f'{maps:.3g}'):.2g} % of the maps' max" in ex.plane_headings[1].get_text()
    with ex.hold():
        ex.activation.value = "silu"
        ex.alpha.value = 1.0


def test_slider_is_a_touch_target(ex):
    assert SLIDER_HEIGHT_PX >= 44
    assert ex.alpha.layout.height == f"{SLIDER_HEIGHT_PX}px"


def test_slider_track_is_long_and_starts_where_the_ticks_do(ex):
    """Track: the slider's width less its description box and the margins around the
    track, as measured in JupyterLab 4.6 with ipywidgets 8.1 in Chromium: the track starts
    12 px after the description and ends 8 px before the slider's edge (there the track
    measured 400 px and the ticks at α = ±1 sat within 2 px of the handle; this checks the
    arithmetic, a real JupyterLab the pixels)."""
    style_px = int(ex.alpha.style.description_width.removesuffix("px"))
    width_px = int(ex.alpha.layout.width.removesuffix("px"))
    track = width_px - (style_px + 12) - 8
    assert track == SLIDER_TRACK_PX >= 200
    assert ex.alpha.readout is False                     # no readout of varying width
    assert ex.alpha_ticks.layout.width == ex.alpha.layout.width
    margin = re.search(r"margin:0 (\d+)px 0 (\d+)px", ex.alpha_ticks.value)
    assert (int(margin.group(2)), int(margin.group(1))) == (style_px + 12, 8)


def test_ticks_label_minus_one_and_one_where_the_handle_stops(ex):
    values = [v for _, v in ex.alpha.options]
    labels = {text: float(left) for _, left, text in re.findall(
        r"data-index='(\d+)' style='position:absolute;left:([0-9.]+)%;top:5px[^>]*>([^<]+)<",
        ex.alpha_ticks.value)}
    n = len(values) - 1
    for alpha, text in ((-1.0, "\u22121"), (1.0, "1")):
        assert labels[text] == pytest.approx(100 * values.index(alpha) / n, abs=1e-3)
    ex.alpha.value = -1.0
    assert ex.alpha_value.value == "α = \u22121"
    ex.alpha.value = 1.0


def test_alpha_ticks_marks_powers_of_two_and_labels_the_ends():
    ticks = alpha_ticks([-3.0, -2.0, -1.5, 1.0, 1.5, 8.0])
    assert ticks == [(0, 0.0, "\u22123"), (1, 0.2, None), (3, 0.6, "1"), (5, 1.0, "8")]
    with pytest.raises(ValueError, match="at least 2"):
        alpha_ticks([1.0])
    with pytest.raises(ValueError, match="finite and non-zero"):
        alpha_ticks([1.0, 0.0])
