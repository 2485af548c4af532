"""qkmlp.book.schematic: the five unit diagrams, at the book's size, σ where it belongs."""
import re

import pytest
from matplotlib.colors import to_hex

from qkmlp.book import figures
from qkmlp.book.schematic import PANELS, unit_schematic


@pytest.fixture(scope="module")
def drawn():
    return dict(zip(PANELS, unit_schematic()))


def _patches(fig, gid):
    return [p for p in fig.axes[0].patches if p.get_gid() == gid]


def _centre(p):
    if hasattr(p, "center"):
        return tuple(round(c, 6) for c in p.center)
    return (round(p.get_x() + p.get_width() / 2, 6), round(p.get_y() + p.get_height() / 2, 6))


def _formula(fig, gid="formula"):
    """The formula's pieces joined, and each piece's colour."""
    texts = [t for t in fig.axes[0].texts if t.get_gid() == gid]
    pieces = [(t.get_text().strip("$"), to_hex(t.get_color()).upper()) for t in texts]
    return "".join(p for p, _ in pieces), pieces


def _sigma_argument(formula: str) -> str:
    """What σ is applied to: the text inside the parentheses after the first \\sigma."""
    i = formula.index(r"\sigma(") + len(r"\sigma(")
    depth = 1
    for j in range(i, len(formula)):
        depth += {"(": 1, ")": -1}.get(formula[j], 0)
        if depth == 0:
            return formula[i:j]
    raise AssertionError(f"unbalanced σ in {formula!r}")


def test_all_panels_in_the_books_order_at_panel_width_with_legible_text(drawn):
    assert list(drawn) == ["attention", "key_value", "bilinear", "symmetric", "gated"]
    for name, fig in drawn.items():
        assert fig.get_figwidth() <= figures.PANEL_WIDTH + 1e-9, name
        sizes = [t.get_fontsize() for t in fig.axes[0].texts]
        assert sizes and min(sizes) >= figures.FONT_PT, name


def test_a_subset_comes_in_the_order_asked_and_a_bad_name_is_refused():
    figs = unit_schematic(("gated", "symmetric"))
    assert [f.axes[0].texts[0].get_text() for f in figs] == ["gated unit (GLU)", "symmetric rank-1 slot"]
    assert len(unit_schematic("key_value")) == 1          # one name, not its letters
    with pytest.raises(ValueError, match=r"'swiglu'.*'attention', 'key_value', 'bilinear', 'symmetric', 'gated'"):
        unit_schematic(("gated", "swiglu"))
    with pytest.raises(ValueError, match="no schematic panel"):
        unit_schematic(())


def test_svg_draws_text_as_paths(drawn):
    svg = figures.to_svg(drawn["gated"])
    assert "<text" not in svg and re.search(r'<path id="DejaVuSans-', svg)
    width_pt = float(re.search(r'<svg[^>]*width="([0-9.]+)pt"', svg).group(1))
    assert width_pt <= figures.PANEL_WIDTH * 72 + 1e-6


def test_each_formula_puts_sigma_on_the_right_factor(drawn):
    f = {name: _formula(fig)[0] for name, fig in drawn.items()}
    assert "softmax" in f["attention"] and "q" in f["attention"] and "k_i" in f["attention"]
    assert _sigma_argument(f["key_value"]) == r"x\cdot k_j"
    assert _sigma_argument(f["bilinear"]).replace(" ", "") == r"xA_jx^{\top}"
    assert _formula(drawn["bilinear"], "note")[0].startswith(r"\mathrm{rank\ 1:}\ A_j = q_j^{\top}k_j")  # leads on
    sym, gated = _sigma_argument(f["symmetric"]), _sigma_argument(f["gated"])
    assert "q_j" in sym and "k_j" in sym                    # σ of the product
    assert "q_j" in gated and "k_j" not in gated            # σ of the gate alone
    assert "k_j" in f["gated"].split(gated, 1)[1]           # the up factor follows, outside σ
    for name in PANELS[1:]:
        assert f[name].endswith("v_j"), name


def test_q_k_v_keep_their_colours_in_diagram_and_formula(drawn):
    ink = {"q": figures.COLORS[0], "k": figures.COLORS[1], "v": figures.COLORS[2]}
    for name, fig in drawn.items():
        for gid, letter in (("query", "q"), ("key", "k"), ("value", "v")):
            for p in _patches(fig, gid):
                assert to_hex(p.get_edgecolor()).upper() == ink[letter], (name, gid)
        for tex, colour in _formula(fig)[1]:
            if re.fullmatch(r"[qkv](_[ij])?(\^\{\\top\})?", tex):
                assert colour == ink[tex[0]], (name, tex)
        for p in _patches(fig, "sigma"):
            assert to_hex(p.get_facecolor()).upper() == figures.COLORS[6], name


def test_symmetric_and_gated_differ_only_in_where_sigma_sits(drawn):
    sym, gated = drawn["symmetric"], drawn["gated"]
    for gid in ("query", "key", "value", "op", "token"):
        assert sorted(map(_centre, _patches(sym, gid))) == sorted(map(_centre, _patches(gated, gid))), gid
    (q,), (mul, _) = _patches(gated, "query"), sorted(_patches(gated, "op"), key=_centre)
    (s_sym,), (s_gated,) = _patches(sym, "sigma"), _patches(gated, "sigma")
    # gated: σ on the gate branch, between the query box and the product
    assert _centre(s_gated)[1] == _centre(q)[1] and _centre(q)[0] < _centre(s_gated)[0] < _centre(mul)[0]
    # symmetric: σ on the product's line, after the product
    assert _centre(s_sym)[1] == _centre(mul)[1] and _centre(s_sym)[0] > _centre(mul)[0]


def test_every_slot_has_exactly_one_sigma(drawn):
    for name in PANELS:
        assert len(_patches(drawn[name], "sigma")) == 1, name
