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


class _Cells(__import__("html.parser").parser.HTMLParser):
    """Rows of (tag, attrs, text) cells, parsed back from the HTML (not from the code that
    wrote it), and the text of any <style> block."""

    def __init__(self, text):
        super().__init__()
        self.rows, self.style, self._cell, self._in_style = [], "", None, False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = [tag, dict(attrs), ""]
            self.rows[-1].append(self._cell)
        elif tag == "style":
            self._in_style = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None
        elif tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data
        elif self._cell is not None:
            self._cell[2] += data


HEADER = ["comparison", "gain", "95 % interval", "Holm p", "verdict"]
ROWS = [["SwiGLU vs ReLU", 0.0151, "[0.011, 0.019]", 0.002, "gated better"],
        ["GEGLU vs ReLU", 0.0203, "[0.016, 0.025]", 0.001, "gated better"]]


def test_table_html_keeps_its_old_output_without_the_phone_options():
    """No new option given: the same HTML as before them (plain <td>, no style block)."""
    out = figures.table_html(HEADER, ROWS, digits=2)
    cells = _Cells(out)
    assert [c[2] for c in cells.rows[0]] == HEADER
    assert [c[2] for c in cells.rows[1]] == ["SwiGLU vs ReLU", "0.015", "[0.011, 0.019]", "0.002", "gated better"]
    assert all(c[1] == {} for row in cells.rows for c in row) and not cells.style
    assert out.startswith('<div class="qk-table" style="overflow-x:auto;max-width:100%"><table class="table">')


def test_table_html_lead_moves_columns_to_the_front_in_order():
    cells = _Cells(figures.table_html(HEADER, ROWS, lead=["verdict", 0]))
    want = ["verdict", "comparison", "gain", "95 % interval", "Holm p"]
    assert [c[2] for c in cells.rows[0]] == want
    for row, src in zip(cells.rows[1:], ROWS):     # every cell moved with its column
        assert [c[2] for c in row] == [str(src[HEADER.index(h)]) if not isinstance(src[HEADER.index(h)], float)
                                       else f"{src[HEADER.index(h)]:.4g}" for h in want]
    assert [c[2] for c in _Cells(figures.table_html(HEADER, ROWS, lead=-1)).rows[0]][0] == "verdict"
    with pytest.raises(ValueError, match=r"no column 'verdit'; the columns are \['comparison'"):
        figures.table_html(HEADER, ROWS, lead=["verdit"])
    with pytest.raises(ValueError, match="twice"):
        figures.table_html(HEADER, ROWS, lead=["verdict", 4])
    with pytest.raises(ValueError, match="out of range"):
        figures.table_html(HEADER, ROWS, nowrap=[5])
    with pytest.raises(TypeError, match="header text or index"):
        figures.table_html(HEADER, ROWS, lead=[1.0])


def test_table_html_nowrap_columns():
    cells = _Cells(figures.table_html(HEADER, ROWS, nowrap=["95 % interval"]))
    for row in cells.rows:
        styles = [c[1].get("style") for c in row]
        assert styles == [None, None, "white-space:nowrap", None, None]


def test_table_html_stacks_rows_as_labelled_cards_below_the_breakpoint():
    out = figures.table_html(HEADER, ROWS, lead=["comparison", "verdict"], stack_below=600,
                             caption="P1")
    cells = _Cells(out)
    head = [c[2] for c in cells.rows[0]]
    assert head == ["comparison", "verdict", "gain", "95 % interval", "Holm p"]
    for row in cells.rows[1:]:   # each cell names its column, for the card's label
        assert [c[1]["data-label"] for c in row] == head
    assert 'class="qk-table qk-stack-600"' in out
    media = re.search(r"@media \(max-width: ([0-9.]+)px\)", cells.style)
    assert media and 599 < float(media.group(1)) < 600
    assert ".qk-stack-600 > table > tbody > tr > td::before { content: attr(data-label)" in cells.style
    assert out.index("<figcaption") < out.index("<style>")   # the caption stays first
    # a quote in a header cannot break out of the attribute
    q = _Cells(figures.table_html(['say "hi"'], [[1]], stack_below=500))
    assert q.rows[1][0][1]["data-label"] == 'say "hi"'
    for bad in (0, -5, 600.0, True, "600"):
        with pytest.raises(ValueError, match="stack_below must be a window width"):
            figures.table_html(HEADER, ROWS, stack_below=bad)
