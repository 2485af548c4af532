"""Figures and tables that read on every screen: the book's one plotting recipe.

The book's text column is 688 CSS px wide at a 1280 px window and 358 px on a 390 px
phone. A figure is therefore drawn as one or more *panels*, each at most
``PANEL_WIDTH`` inches wide (336 CSS px), as SVG (sharp at any zoom), and shown in a
row that wraps: two panels side by side on a desktop, stacked on a phone, each at its
natural size or nearly, so text drawn at ``FONT_PT`` stays at least 9 pt as displayed.

Use::

    from qkmlp.book import figures
    fig, ax = figures.panel()                 # one (fig, ax) at the book's size
    ax.plot(...)
    figures.show(fig)                         # or figures.show(fig1, fig2, ...)

    figures.table(["layer", "loss"], [["SwiGLU", 1.94], ...])   # an HTML table
    figures.table(header, rows, lead=["comparison", "verdict"], stack_below=600)  # phone cards

:func:`show` displays an HTML row of ``<img>`` elements with SVG data and closes the
figures; outside IPython it returns the HTML string.
"""
from __future__ import annotations

import base64
import html
import io
from typing import Iterable, Optional, Sequence

__all__ = ["PANEL_WIDTH", "PANEL_HEIGHT", "FONT_PT", "COLORS", "RC", "panel", "panels",
           "to_svg", "row_html", "show", "table_html", "table"]

#: Natural width and default height of one panel, inches (96 CSS px per inch).
PANEL_WIDTH = 3.5
PANEL_HEIGHT = 2.7
#: Smallest text size drawn in a panel, points (at natural size).
FONT_PT = 9.5

#: Colour-blind-safe colours (Okabe & Ito), one per family where a chapter needs them.
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]

#: The rcParams every panel is drawn with.
RC = {
    "font.size": 10.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 10.0,
    "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT,
    "legend.fontsize": FONT_PT,
    "legend.title_fontsize": FONT_PT,
    "figure.titlesize": 10.0,
    "lines.linewidth": 1.6,
    "lines.markersize": 5.0,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "svg.fonttype": "path",
    "svg.hashsalt": "qkmlp",        # reproducible ids in the SVG text
    "figure.constrained_layout.use": True,
}


def panel(width: float = PANEL_WIDTH, height: float = PANEL_HEIGHT, **subplot_kw):
    """One ``(fig, ax)`` at the book's panel size.

    Applies :data:`RC` to ``matplotlib.rcParams`` (legends and ticks read it when they are
    made), so call it before drawing. ``width`` may not exceed :data:`PANEL_WIDTH` (wider
    panels would shrink on a phone).
    """
    import matplotlib
    from matplotlib.figure import Figure

    if not 0 < width <= PANEL_WIDTH + 1e-9:
        raise ValueError(f"panel width must be in (0, {PANEL_WIDTH}] inches, got {width!r}")
    if not 0 < height <= 2 * PANEL_WIDTH:
        raise ValueError(f"panel height must be in (0, {2 * PANEL_WIDTH}] inches, got {height!r}")
    matplotlib.rcParams.update(RC)
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot(**subplot_kw)
    return fig, ax


def panels(n: int, width: float = PANEL_WIDTH, height: float = PANEL_HEIGHT, **subplot_kw):
    """``n`` separate ``(fig, ax)`` panels (see :func:`panel`), to be shown in one row."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return [panel(width, height, **subplot_kw) for _ in range(n)]


def to_svg(fig) -> str:
    """The figure as SVG text, at its natural size."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="svg")
    return buf.getvalue()


def row_html(*figs, alt: Sequence[str] | str = "") -> str:
    """An HTML row of the figures as SVG images that wraps on narrow screens."""
    if not figs:
        raise ValueError("row_html needs at least one figure")
    alts = [alt] * len(figs) if isinstance(alt, str) else list(alt)
    if len(alts) != len(figs):
        raise ValueError(f"got {len(alts)} alt texts for {len(figs)} figures")
    cells = []
    for fig, text in zip(figs, alts):
        w_px = round(fig.get_figwidth() * 96)
        data = base64.b64encode(to_svg(fig).encode()).decode()
        cells.append(
            f'<img class="qk-panel" alt="{html.escape(text)}" width="{w_px}" '
            f'style="width:{w_px}px;max-width:100%;height:auto" '
            f'src="data:image/svg+xml;base64,{data}">'
        )
    return ('<div class="qk-figure" style="display:flex;flex-wrap:wrap;gap:8px 12px;'
            'justify-content:center;align-items:flex-start">' + "".join(cells) + "</div>")


def show(*figs, alt: Sequence[str] | str = ""):
    """Display the figures in one wrapping row (in IPython) and close them.

    Returns the HTML string when IPython is not available.
    """
    out = row_html(*figs, alt=alt)
    try:
        from IPython.display import HTML, display
    except ImportError:   # pragma: no cover - IPython is installed with the book
        return out
    display(HTML(out))
    return None


def _cell(value, digits: int) -> str:
    if isinstance(value, float):
        return html.escape(f"{value:.{digits}g}")
    return html.escape(str(value))


def _columns(header: list, names, what: str) -> list[int]:
    """Indexes of the columns ``names`` (header texts or indexes) name, in that order."""
    if isinstance(names, (str, int)):
        names = [names]
    out = []
    for name in names:
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise TypeError(f"{what} names columns by header text or index, got {name!r}")
        if isinstance(name, int):
            if not -len(header) <= name < len(header):
                raise ValueError(f"{what}: column index {name} out of range for {len(header)} columns")
            i = name % len(header)
        else:
            matches = [i for i, h in enumerate(header) if str(h) == name]
            if not matches:
                raise ValueError(f"{what}: no column {name!r}; the columns are {[str(h) for h in header]}")
            i = matches[0]
        if i in out:
            raise ValueError(f"{what} names column {header[i]!r} twice")
        out.append(i)
    return out


def _stack_style(cls: str, below: int) -> str:
    """CSS that shows each row of ``.{cls}`` tables as a card under ``below`` px: the
    first cell as its title, then one line per cell, its column's name before it."""
    s = f".{cls} > table"
    return (
        f"<style>@media (max-width: {below - 0.02:g}px) {{"
        f"{s}, {s} > tbody, {s} > tbody > tr, {s} > tbody > tr > td {{ display: block; width: 100%; }}"
        f"{s} > thead {{ position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }}"
        f"{s} > tbody > tr:nth-child(n) {{ border: 1px solid rgba(128, 128, 128, 0.35); border-radius: 0.4em;"
        f" margin: 0 0 0.6em 0; padding: 0.25em 0.6em; background: none; }}"
        f"{s} > tbody > tr > td {{ display: flex; justify-content: space-between; gap: 1em;"
        f" border: none; padding: 0.15em 0; text-align: right; background: none; box-shadow: none; }}"
        f"{s} > tbody > tr > td::before {{ content: attr(data-label); font-weight: 600; text-align: left; }}"
        f"{s} > tbody > tr > td:first-child {{ justify-content: flex-start; font-weight: 600; text-align: left;"
        f" border-bottom: 1px solid rgba(128, 128, 128, 0.25); padding-bottom: 0.25em; margin-bottom: 0.15em; }}"
        f"{s} > tbody > tr > td:first-child::before {{ content: none; }}"
        f"}}</style>"
    )


def table_html(header: Sequence[str], rows: Iterable[Sequence], *, digits: int = 4,
               caption: Optional[str] = None, lead: Sequence[str | int] = (),
               nowrap: Sequence[str | int] = (), stack_below: Optional[int] = None) -> str:
    """A plain HTML table (scrolls sideways inside its own box if wider than the column).

    Floats are shown with ``digits`` significant digits; every row must have as many
    cells as ``header``. A ``caption`` sits above the scrolling box, in the page's width
    (inside the box it would scroll out of sight on a phone).

    For a phone (the text column is 358 px wide at a 390 px window):

    - ``lead``: columns (header texts or indexes) moved to the front, in this order, e.g.
      ``lead=["comparison", "verdict"]``: what a reader needs first stays in view when
      the rest scrolls.
    - ``nowrap``: columns whose cells never wrap (an interval ``[0.01, 0.03]`` on one
      line).
    - ``stack_below``: under this window width (CSS px; 600 covers phones) each row is
      shown as a card, its first cell (after ``lead``) as the title and every other cell
      on a line of its own after its column's name, so nothing scrolls sideways. At or
      above it the table is a table. The rule is a ``<style>`` block in the returned
      HTML (the notebook's output carries it to the website).
    """
    header = list(header)
    order = _columns(header, lead, "lead")
    order += [i for i in range(len(header)) if i not in order]
    keep = set(_columns(header, nowrap, "nowrap"))
    if stack_below is not None and (isinstance(stack_below, bool) or not isinstance(stack_below, int)
                                    or not 0 < stack_below <= 10_000):
        raise ValueError(f"stack_below must be a window width in CSS px (an int in 1..10000) or None, "
                         f"got {stack_below!r}")
    labels = [html.escape(str(header[i]), quote=True) for i in order]
    style = [' style="white-space:nowrap"' if i in keep else "" for i in order]
    body = []
    for n, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"row {n} has {len(row)} cells; the header has {len(header)}")
        cells = "".join(f'<td data-label="{label}"{st}>{_cell(row[i], digits)}</td>' if stack_below
                        else f"<td{st}>{_cell(row[i], digits)}</td>"
                        for i, label, st in zip(order, labels, style))
        body.append(f"<tr>{cells}</tr>")
    head = "<tr>" + "".join(f"<th{st}>{html.escape(str(header[i]))}</th>" for i, st in zip(order, style)) + "</tr>"
    cls, extra = "qk-table", ""
    if stack_below:
        cls += f" qk-stack-{stack_below}"
        extra = _stack_style(f"qk-stack-{stack_below}", stack_below)
    box = (f'{extra}<div class="{cls}" style="overflow-x:auto;max-width:100%">'
           f'<table class="table"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>')
    if not caption:
        return box
    return ('<figure class="qk-table-figure" style="margin:0 0 1em 0;max-width:100%">'
            f'<figcaption style="font-size:0.9em;margin-bottom:0.3em">{html.escape(caption)}</figcaption>'
            f'{box}</figure>')


def table(header: Sequence[str], rows: Iterable[Sequence], *, digits: int = 4,
          caption: Optional[str] = None, lead: Sequence[str | int] = (),
          nowrap: Sequence[str | int] = (), stack_below: Optional[int] = None):
    """Display :func:`table_html` in IPython (returns the HTML outside it)."""
    out = table_html(header, rows, digits=digits, caption=caption, lead=lead, nowrap=nowrap,
                     stack_below=stack_below)
    try:
        from IPython.display import HTML, display
    except ImportError:   # pragma: no cover
        return out
    display(HTML(out))
    return None
