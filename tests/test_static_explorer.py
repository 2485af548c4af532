"""qkmlp.book.static_explorer: structure, size, self-containment, and frames equal to the live numbers."""
from __future__ import annotations

import json
import math
import re
import shutil
from html.parser import HTMLParser

import numpy as np
import pytest

from qkmlp import activation_names
from qkmlp import get_activation
from qkmlp.book.explorer_model import (PLANE_PANELS, component_products, default_alphas, exchange_plane,
                                       explorer_planes, scatter_grid)
from qkmlp.book.static_explorer import (FRAME_FIELDS, PANEL_CLASSES, PLANE_LEVELS, PLANE_N, decode_plane,
                                        encode_plane, static_explorer_data, static_explorer_html)

MAX_BYTES = 600_000  # one explorer; the whole chapter page must stay under 2 MB


class _Tags(HTMLParser):
    """Collect (tag, attrs, text) for every element, and the stack depth of each."""

    def __init__(self):
        super().__init__()
        self.tags, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a, list(self.stack)))
        if tag not in ("input", "circle", "rect", "line", "meta", "br"):
            self.stack.append((tag, a.get("class", "")))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs), list(self.stack)))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break


def _parse(html):
    p = _Tags()
    p.feed(html)
    return p.tags


def _with_class(tags, cls):
    return [t for t in tags if cls in t[1].get("class", "").split()]


@pytest.fixture(scope="module")
def page():
    html = static_explorer_html(uid="ex-a", ranks=(1, 2))
    data = json.loads(re.search(r'<script type="application/json" class="qkmlp-data">(.*?)</script>',
                                html, re.S).group(1).replace("<\\/", "</"))
    return html, data


def test_dom_contract(page):
    html, _ = page
    tags = _parse(html)
    roots = _with_class(tags, "qkmlp-static-explorer")
    assert len(roots) == 1 and roots[0][0] == "div" and roots[0][1]["id"] == "ex-a"
    assert html.startswith('<div class="qkmlp-static-explorer"') and html.endswith("</div>")
    (rng,) = _with_class(tags, "qkmlp-alpha")
    assert rng[0] == "input" and rng[1]["type"] == "range"
    for cls in ("qkmlp-activation", "qkmlp-form", "qkmlp-rank"):
        (sel,) = _with_class(tags, cls)
        assert sel[0] == "select"
    options = [a["value"] for tag, a, stack in tags if tag == "option" and ("select", "qkmlp-activation") in stack]
    assert options == activation_names()
    for cls in ("qkmlp-alpha-value", "qkmlp-scale-change", "qkmlp-swap-change", "qkmlp-plot", "qkmlp-plane",
                "qkmlp-exchange-head", "qkmlp-scaling-head") + PANEL_CLASSES:
        assert len(_with_class(tags, cls)) == 1, cls
    for cls in PANEL_CLASSES:   # each heat map an SVG in the plane, with its cells and its colour bar
        ((tag, _, stack),) = _with_class(tags, cls)
        assert tag == "svg" and ("div", "qkmlp-plane") in stack, cls
        inside = [t for t in tags if ("svg", f"qkmlp-heat {cls}") in t[2]]
        for part in ("qkmlp-cells", "qkmlp-cbar-bands", "qkmlp-cbar-lo", "qkmlp-cbar-mid", "qkmlp-cbar-hi",
                     "qkmlp-heat-title"):
            assert len(_with_class(inside, part)) == 1, (cls, part)
    rows = _with_class(tags, "qkmlp-plane-row")
    assert len(rows) == 2                                  # the exchange, then the scaling claim
    for k, row in enumerate(rows):
        in_row = [a.get("class", "") for tag, a, stack in tags if tag == "svg" and ("div", "qkmlp-plane-row") in stack]
        assert [c.split()[1] for c in in_row[3 * k:3 * k + 3]] == list(PANEL_CLASSES[3 * k:3 * k + 3])
    assert not _with_class(tags, "qkmlp-colorbar")         # one colour bar per map now, not one shared
    circles = [t for t in tags if t[0] == "circle"]
    assert len(circles) == 2 * len(scatter_grid()[0])
    assert all(("div", "qkmlp-plot") in stack for _, _, stack in circles)  # the plot is under .qkmlp-plot
    for tag, a, stack in tags:  # everything sits inside the one container
        if a.get("class") != "qkmlp-static-explorer":
            assert ("div", "qkmlp-static-explorer") in stack, tag


def test_self_contained_and_light(page):
    html, _ = page
    tags = _parse(html)
    assert not any(t[0] in ("link", "iframe", "img") for t in tags)
    assert not any("src" in a or "href" in a for _, a, _ in tags)
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace is a name, not a fetch
    default = static_explorer_html(uid="ex-size")
    assert len(default.encode()) < MAX_BYTES
    assert len(html.encode()) < MAX_BYTES + 100_000  # a second rank adds only numbers


def test_slider_range_and_initial_value(page):
    html, data = page
    (rng,) = _with_class(_parse(html), "qkmlp-alpha")
    assert int(rng[1]["min"]) == 0 and int(rng[1]["max"]) == len(data["alphas"]) - 1
    assert data["alphas"][int(rng[1]["value"])] == 1.0   # opens at α = 1: one transform
    assert data["alphas"] == default_alphas()
    assert min(data["alphas"]) < 0 < max(data["alphas"])


def test_slider_ticks_mark_the_powers_of_two(page):
    """The range input's datalist (tick marks where the browser draws them) holds the
    slider positions of α = ±2^k, found here from the stored α grid."""
    html, data = page
    tags = _parse(html)
    (rng,) = _with_class(tags, "qkmlp-alpha")
    (datalist,) = [t for t in tags if t[0] == "datalist"]
    assert datalist[1]["id"] == rng[1]["list"] == "ex-a-alpha-ticks"
    marks = [int(a["value"]) for tag, a, stack in tags if tag == "option" and ("datalist", "") in stack]
    alphas = data["alphas"]
    assert marks == [i for i, a in enumerate(alphas) if math.log2(abs(a)).is_integer()]
    assert alphas.index(-1.0) in marks and alphas.index(1.0) in marks


def test_ids_do_not_collide():
    a, b = static_explorer_html(activations=["relu"]), static_explorer_html(activations=["relu"])
    ida = re.search(r'id="([^"]+)"', a).group(1)
    idb = re.search(r'id="([^"]+)"', b).group(1)
    assert ida != idb
    assert f'"{ida}"' in a and f"#{ida}" in a  # script and CSS are scoped to that id
    assert ida not in b


@pytest.mark.parametrize("form,act,alpha,rank", [
    ("gated", "silu", 2.0, 1), ("gated", "relu", -1.0, 1), ("gated", "tanh", -1.0, 2),
    ("gated", "relu2", 0.5, 1), ("symmetric", "gelu", -4.0, 2), ("gated", "identity", 4.0, 2),
])
def test_frames_match_live_numbers(page, form, act, alpha, rank):
    pytest.importorskip("ipywidgets")
    from qkmlp.book.widgets import SymmetryExplorer

    _, data = page
    i = data["alphas"].index(alpha)
    row = data["numbers"][str(rank)][form][act][i]
    live = SymmetryExplorer(activation=act, form=form, alpha=alpha, rank=rank).numbers()
    assert row[0] == pytest.approx(live["scale_change"], rel=1e-12, abs=1e-15)
    assert row[1] == pytest.approx(live["swap_change"], rel=1e-12, abs=1e-15)
    assert row[2] is live["scale_predicted_invariant"] and row[3] is live["swap_predicted_invariant"]
    assert row[4] == live["scale_predicted_change"]


def test_plot_frames_match_component_products(page):
    _, data = page
    a, b = scatter_grid()
    rows = data["points"]
    assert len({tuple(r) for r in rows}) == len(rows)          # each distinct row stored once
    for form, act in (("gated", "silu"), ("gated", "relu2"), ("symmetric", "tanh")):
        for i in (0, 5, len(data["alphas"]) - 1):
            p0, pa, ps = component_products(form, act, data["alphas"][i], a, b)
            frame = data["plot"][form][act]
            for got, want in ((frame["x0"], p0), (frame["scale"][i], pa), (frame["swap"][i], ps)):
                np.testing.assert_allclose(rows[got], want, rtol=5e-3, atol=1e-12)


def test_theorems_visible_in_frames(page):
    """What the theorems say is invariant is, and what breaks does, across the whole grid."""
    _, data = page
    for r in data["ranks"]:
        for form in data["forms"]:
            for act in data["activations"]:
                for scale, swap, scale_inv, swap_inv, _ in data["numbers"][str(r)][form][act]:
                    assert (scale <= 1e-12) == scale_inv, (r, form, act)
                    assert (swap <= 1e-12) == swap_inv, (r, form, act)
                    assert max(scale, swap) < 1e-12 or max(scale, swap) > 1e-3


def test_precomputed_data_gives_same_page():
    data = static_explorer_data(activations=["relu", "tanh"], ranks=(2,))
    a = static_explorer_html(uid="same", data=data, activation="tanh", alpha=-1.0)
    b = static_explorer_html(uid="same", activations=["relu", "tanh"], ranks=(2,), activation="tanh", alpha=-1.0)
    assert a == b
    assert '<input type="hidden" class="qkmlp-rank" value="2">' in a   # one rank: no menu


def test_bad_input():
    with pytest.raises(ValueError, match="activation must be one of"):
        static_explorer_html(activation="relu", activations=["silu"])
    with pytest.raises(ValueError, match="alpha must be one of"):
        static_explorer_html(alpha=3.3, activations=["silu"])
    with pytest.raises(ValueError, match="uid"):
        static_explorer_html(uid="a b", activations=["silu"])
    with pytest.raises(ValueError, match="unknown form"):
        static_explorer_data(forms=["dense"], activations=["silu"])
    with pytest.raises(ValueError, match="ranks"):
        static_explorer_data(ranks=[0], activations=["silu"])


def _chromium():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(_chromium() is None, reason="needs playwright and a chromium binary")
def test_js_updates_text_and_plot(tmp_path, page):
    from playwright.sync_api import sync_playwright

    html, data = page
    second = static_explorer_html(uid="ex-b", activations=["relu", "tanh"], alpha=1.0)
    f = tmp_path / "p.html"
    f.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{html}{second}</body></html>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            pg = browser.new_page()
            errors = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
            pg.goto(f.as_uri())
            root = pg.locator("#ex-a")

            def texts():
                return [root.locator(c).inner_text() for c in
                        (".qkmlp-alpha-value", ".qkmlp-scale-change", ".qkmlp-swap-change")] + [
                    root.locator(".qkmlp-plot circle").evaluate_all("cs => cs.map(c => c.getAttribute('cy')).join()")]

            t0 = texts()
            assert t0[0] == "1"                         # opens at α = 1
            i = data["alphas"].index(-1.0)
            root.locator("input.qkmlp-alpha").fill(str(i))
            t1 = texts()
            assert t1[0] == "-1" and t1[1] != t0[1] and t1[2] != t0[2] and t1[3] != t0[3]
            assert float(t1[1]) == pytest.approx(data["numbers"]["1"]["gated"]["silu"][i][0], rel=1e-3)
            root.locator("select.qkmlp-activation").select_option("tanh")
            t2 = texts()
            assert t2[1] != t1[1] and t2[2] != t1[2]
            assert float(t2[1]) < 1e-12  # tanh is odd: α = −1 leaves the gated form invariant
            assert pg.locator("#ex-b .qkmlp-alpha-value").inner_text() == "1"  # untouched

            def fills(cls):
                return root.locator(f".{cls} .qkmlp-cells rect").evaluate_all("rs => rs.map(r => r.getAttribute('fill'))")

            pal = data["plane"]["palette"]
            white = pal[PLANE_LEVELS]
            n = PLANE_N

            def want(values, limit):     # the colour of each cell, from the formula's values
                return [pal[int(np.clip(np.rint(v / limit * PLANE_LEVELS), -PLANE_LEVELS, PLANE_LEVELS)) + PLANE_LEVELS]
                        for v in np.asarray(values).ravel()]

            def heading(row):
                return root.locator(f".qkmlp-{row}-head").inner_text()

            root.locator("input.qkmlp-alpha").fill(str(data["alphas"].index(1.0)))
            root.locator("select.qkmlp-activation").select_option("silu")
            u, w, d, u1, ua, sd = (fills(c) for c in PANEL_CLASSES)
            assert len(u) == len(w) == len(d) == len(sd) == n * n
            # the cells are where explorer_planes puts them: cell k is row k // n (b), column k % n (a)
            p = explorer_planes("gated", "silu", 1.0, n=n)
            maps = float(f"{p['limits']['maps']:.3g}")
            assert u == want(p["unit"], maps) and ua == u and u1 == u
            assert u != w and set(d) != {white}                      # gated: the exchange breaks
            assert w == [u[(k % n) * n + k // n] for k in range(n * n)]  # α = 1: the swap is the transpose
            assert set(sd) == {white} and "difference 0 everywhere" in heading("scaling")
            # GELU at α = 2^(1/4): the scaling difference is a few % of the maps, drawn on its own scale
            root.locator("select.qkmlp-activation").select_option("gelu")
            root.locator("input.qkmlp-alpha").fill(str(data["alphas"].index(2 ** 0.25)))
            p = explorer_planes("gated", "gelu", 2 ** 0.25, n=n)
            lim = float(f"{p['limits']['scaling_difference']:.3g}")
            sd = fills("qkmlp-heat-scale-diff")
            assert sd == want(p["scaling_difference"], lim)
            assert {pal[0], pal[-1]} & set(sd)                        # its largest cell: an end colour
            assert fills("qkmlp-heat-at1") == want(p["unit_at_1"], float(f"{p['limits']['maps']:.3g}"))
            bar = root.locator(".qkmlp-heat-scale-diff")
            assert bar.locator(".qkmlp-cbar-hi").text_content() == f"+{lim:g}"
            share = 100 * lim / float(f"{p['limits']['maps']:.3g}")
            assert f"max |difference| = {lim:g} ({float(f'{share:.2g}'):g} % of the maps' max)" in heading("scaling")
            root.locator("select.qkmlp-activation").select_option("silu")
            root.locator("input.qkmlp-alpha").fill(str(data["alphas"].index(1.0)))
            root.locator("select.qkmlp-form").select_option("symmetric")
            u2, w2, d2 = fills("qkmlp-heat-unit"), fills("qkmlp-heat-swap"), fills("qkmlp-heat-diff")
            assert u2 == w2 and set(d2) == {white} and u2 != u       # symmetric: equal maps, blank difference
            assert "swap at α: σ((b/α)(αa))" in root.locator(".qkmlp-heat-swap").inner_html()
            assert "difference 0 everywhere" in heading("exchange")
            assert not errors
        finally:
            browser.close()


def test_one_rank_has_no_menu_and_the_note_matches():
    """A single rank is a fixed hidden value, not a menu with one option; the note says what the plots show."""
    one = static_explorer_html(uid="one", activations=["relu"])
    tags = _parse(one)
    (rank,) = _with_class(tags, "qkmlp-rank")
    assert rank[0] == "input" and rank[1]["type"] == "hidden" and rank[1]["value"] == "1"
    assert "same at every rank" not in one
    several = static_explorer_html(uid="two", activations=["relu"], ranks=(1, 2))
    (rank,) = _with_class(_parse(several), "qkmlp-rank")
    assert rank[0] == "select"
    assert "same at every rank" in several      # the plots show one component, rank-independent


def test_responsive_layout():
    """No fixed width wider than a phone's column: each panel is its own SVG that can shrink."""
    html = static_explorer_html(uid="resp", activations=["relu"])
    svgs = [a for tag, a, _ in _parse(html) if tag == "svg"]
    assert len(svgs) == 2 + 6          # two scatters; six heat maps, each with its colour bar
    for a in svgs:
        assert int(a["width"]) <= 300 and "viewBox" in a or "viewbox" in a
    assert "max-width: 100%" in html and "flex-wrap: wrap" in html
    assert not re.search(r'width="(4[0-9]{2}|[5-9][0-9]{2})"', html)   # nothing 400 px or wider


@pytest.mark.browser
@pytest.mark.skipif(_chromium() is None, reason="needs playwright and a chromium binary")
def test_fits_a_phone(tmp_path):
    """At a 390 px viewport the explorer is no wider than the page and its SVG text stays ≥ 12 px."""
    from playwright.sync_api import sync_playwright

    html = static_explorer_html(uid="phone", ranks=(1, 2))
    f = tmp_path / "phone.html"
    f.write_text("<!doctype html><html><head><meta charset='utf-8'>"
                 "<meta name='viewport' content='width=device-width, initial-scale=1'></head>"
                 f"<body style='margin:16px'>{html}</body></html>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            pg = browser.new_page(viewport={"width": 390, "height": 800})
            pg.goto(f.as_uri())
            box = pg.evaluate("""() => { const r = document.getElementById('phone');
                return {w: r.getBoundingClientRect().width, sw: r.scrollWidth,
                        doc: document.documentElement.scrollWidth,
                        svg: [...r.querySelectorAll('.qkmlp-plot svg')].map(s => s.getBoundingClientRect().width),
                        heat: [...r.querySelectorAll('.qkmlp-plane svg')].map(s => {
                            const b = s.getBoundingClientRect(); return [b.width / s.viewBox.baseVal.width, b.top]; }),
                        slider: r.querySelector('input.qkmlp-alpha').getBoundingClientRect().toJSON()}; }""")
            assert box["doc"] <= 390 and box["sw"] <= box["w"] + 1
            assert all(w >= 240 for w in box["svg"])     # at (nearly) natural size: text legible
            assert all(scale >= 0.99 for scale, _ in box["heat"])   # heat maps at natural size (9.5 pt text)
            tops = sorted({round(top) for _, top in box["heat"]})
            assert len(tops) == 6                         # one map a line: each at its natural 212 px
            assert box["slider"]["height"] >= 44 and box["slider"]["width"] >= 200   # a touch target
        finally:
            browser.close()


@pytest.mark.browser
@pytest.mark.skipif(_chromium() is None, reason="needs playwright and a chromium binary")
def test_heat_maps_read_at_1280px(tmp_path):
    """In the book's text column at 1280 px (688 CSS px, measured on the built chapter 5
    page, as tests/test_browser.py notes) the heat maps stand three to a row, two rows,
    each map's square of cells 170 px wide (it was 119 px) at natural size, inside the
    explorer."""
    from playwright.sync_api import sync_playwright

    html = static_explorer_html(uid="desk", activations=["silu", "gelu"])
    f = tmp_path / "desk.html"
    f.write_text("<!doctype html><html><head><meta charset='utf-8'></head>"
                 f"<body style='margin:0'><main style='width:688px;margin:0 296px'>{html}</main></body></html>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.goto(f.as_uri())
            got = pg.evaluate("""() => { const r = document.getElementById('desk'), e = r.getBoundingClientRect();
                return {right: e.right, sw: r.scrollWidth, cw: r.clientWidth,
                        maps: [...r.querySelectorAll('.qkmlp-plane svg')].map(s => {
                            const b = s.getBoundingClientRect(), c = s.querySelector('.qkmlp-cells').getBoundingClientRect();
                            return {top: Math.round(b.top), right: b.right, scale: b.width / s.viewBox.baseVal.width,
                                    cells: c.width}; })}; }""")
        finally:
            browser.close()
    maps = got["maps"]
    assert len(maps) == 6 and got["sw"] <= got["cw"] + 1
    assert len({m["top"] for m in maps}) == 2                 # two rows of three
    assert all(m["cells"] >= 170 and m["scale"] >= 0.99 for m in maps), maps
    assert all(m["right"] <= got["right"] for m in maps)


# --- the (a, b)-plane heat maps ------------------------------------------------------------

def test_encode_plane_round_trip_and_levels():
    """One character per cell, row-major, level round(v / scale · 31), 0 drawn as the middle."""
    v = np.array([[-2.0, -1.0, 0.0], [0.03, 1.0, 2.5]])
    text = encode_plane(v, 2.0)
    assert len(text) == 6
    levels = [-31, round(-31 / 2), 0, round(0.03 / 2 * 31), round(31 / 2), 31]   # 2.5 clips to +31
    chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    assert text == "".join(chars[k + 31] for k in levels)
    g = np.linspace(-1, 1, 17)[None, :] * np.linspace(-1, 1, 17)[:, None]
    np.testing.assert_allclose(decode_plane(encode_plane(g, 1.0), 1.0), g, atol=0.5 / 31 + 1e-15)
    with pytest.raises(ValueError, match="scale"):
        encode_plane(g, 0.0)
    with pytest.raises(ValueError, match="finite"):
        encode_plane(np.array([np.nan]), 1.0)
    with pytest.raises(ValueError, match="n²"):
        decode_plane("ff", 1.0)


def test_plane_frames_hold_explorer_planes(page):
    """Every stored frame decodes to explorer_planes' maps within half a level: the unit,
    its swap and the unit at 1 on the maps' limit, each difference on its own limit (0: a
    blank grid); the limits are explorer_planes' to 3 significant digits."""
    _, data = page
    pl = data["plane"]
    assert pl["n"] == PLANE_N and pl["levels"] == PLANE_LEVELS and len(pl["palette"]) == 2 * PLANE_LEVELS + 1
    assert len(set(pl["grids"])) == len(pl["grids"])          # each distinct grid stored once
    slot = {name: FRAME_FIELDS.index(name) for name in FRAME_FIELDS}
    for form in data["forms"]:
        for act in data["activations"]:
            for i in (0, 7, data["alphas"].index(1.0), data["alphas"].index(2 ** 0.25), len(data["alphas"]) - 1):
                a = data["alphas"][i]
                f = pl["frames"][form][act][i]
                p = explorer_planes(form, act, a, n=PLANE_N, span=pl["span"])
                for key in ("maps", "exchange_difference", "scaling_difference"):
                    stored = f[slot[f"{key}_limit"]]
                    want = p["limits"][key]
                    assert stored == pytest.approx(want, rel=5e-3, abs=0), (form, act, a, key)
                for key, limit in (("unit", "maps_limit"), ("swap", "maps_limit"), ("unit_at_1", "maps_limit"),
                                   ("exchange_difference", "exchange_difference_limit"),
                                   ("scaling_difference", "scaling_difference_limit")):
                    L = f[slot[limit]]
                    got = decode_plane(pl["grids"][f[slot[key]]], L)
                    if L == 0:
                        assert not got.any(), (form, act, a, key)
                    else:
                        np.testing.assert_allclose(got, np.clip(p[key], -L, L), atol=0.5 * L / PLANE_LEVELS * 1.0001)


def test_plane_panels_are_the_live_explorers(page):
    """The static explorer draws PLANE_PANELS, the live explorer's six maps, in order."""
    _, data = page
    pl = data["plane"]
    assert [cls for cls, _, _ in pl["panels"]] == list(PANEL_CLASSES)
    for (cls, grid, limit), (key, lim, gated, symmetric) in zip(pl["panels"], PLANE_PANELS):
        assert FRAME_FIELDS[grid] == key
        assert FRAME_FIELDS[limit] == ("maps_limit" if lim == "maps" else f"{lim}_limit")
    assert pl["titles"]["gated"] == [panel[2] for panel in PLANE_PANELS]
    assert pl["titles"]["symmetric"] == [panel[3] for panel in PLANE_PANELS]


def test_plane_frames_show_the_theorems(page):
    """The symmetric form's unit and swap are one stored grid at every α and σ and both its
    differences are blank; the gated form's exchange difference is blank only for linear
    σ, its scaling difference exactly where chapter 5's theorems keep the scaling."""
    _, data = page
    frames = data["plane"]["frames"]
    slot = {name: FRAME_FIELDS.index(name) for name in FRAME_FIELDS}
    for act in data["activations"]:
        s = get_activation(act)
        for alpha, sf, gf in zip(data["alphas"], frames["symmetric"][act], frames["gated"][act]):
            assert sf[slot["unit"]] == sf[slot["swap"]]
            assert sf[slot["exchange_difference_limit"]] == sf[slot["scaling_difference_limit"]] == 0
            assert (gf[slot["unit"]] == gf[slot["swap"]]) == s.is_linear, act
            assert (gf[slot["exchange_difference_limit"]] == 0) == s.is_linear, act
            keeps = alpha == 1.0 or s.is_linear or (alpha > 0 and s.homogeneity_degree == 1) or (
                alpha == -1.0 and s.is_odd)
            assert (gf[slot["scaling_difference_limit"]] == 0) == keeps, (act, alpha)
    # the symmetric unit does not move with α: one grid per σ
    assert all(len({row[0] for row in frames["symmetric"][act]}) == 1 for act in data["activations"])


def test_slider_is_44px_tall_in_the_css():
    html = static_explorer_html(uid="tall", activations=["relu"])
    rule = re.search(r"#tall input\.qkmlp-alpha \{([^}]*)\}", html).group(1)
    assert re.search(r"(?<![-\w])height: 44px", rule), rule
