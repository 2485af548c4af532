"""qkmlp.book.figures: panels at the book's size, SVG rows that wrap, HTML tables."""
import base64
import re

import pytest

from qkmlp.book import figures


def test_panel_is_drawn_at_the_book_size_as_svg():
    fig, ax = figures.panel()
    ax.plot([0, 1], [1, 0], label="a line")
    ax.legend()
    svg = figures.to_svg(fig)
    width_pt = float(re.search(r'<svg[^>]*width="([0-9.]+)pt"', svg).group(1))
    assert width_pt == pytest.approx(figures.PANEL_WIDTH * 72)
    assert ax.get_legend().get_texts()[0].get_fontsize() >= 9


def test_too_wide_panels_and_bad_counts_are_rejected():
    with pytest.raises(ValueError, match="width"):
        figures.panel(width=figures.PANEL_WIDTH * 2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            figures.panels(bad)


def test_row_html_embeds_each_figure_once_and_wraps():
    (f1, a1), (f2, a2) = figures.panels(2)
    a1.plot([0, 1]); a2.plot([1, 0])
    out = figures.row_html(f1, f2, alt=["left", "right"])
    assert "flex-wrap:wrap" in out
    imgs = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', out)
    assert len(imgs) == 2
    assert all(base64.b64decode(i).decode().lstrip().startswith("<?xml") for i in imgs)
    assert 'alt="left"' in out and 'alt="right"' in out
    with pytest.raises(ValueError, match="alt"):
        figures.row_html(f1, f2, alt=["only one"])
    with pytest.raises(ValueError, match="at least one"):
        figures.row_html()


def test_table_html_escapes_formats_and_checks_row_lengths():
    out = figures.table_html(["a<b", "x"], [["<i>", 1.234567], ["y", 2]], digits=3)
    assert "<th>a&lt;b</th>" in out and "<td>&lt;i&gt;</td>" in out and "<td>1.23</td>" in out
    assert out.count("<tr>") == 3
    with pytest.raises(ValueError, match="row 1 has 1 cells"):
        figures.table_html(["a", "b"], [[1, 2], [3]])


def test_table_caption_sits_outside_the_scrolling_box():
    out = figures.table_html(["a"], [[1]], caption="Δ < 0: better")
    cap, box = out.index("<figcaption"), out.index('<div class="qk-table"')
    assert cap < out.index("</figcaption>") < box and "Δ &lt; 0: better" in out
    assert "<caption>" not in out
    assert figures.table_html(["a"], [[1]]).startswith('<div class="qk-table"')
