"""The book's argument in one schematic: five units, drawn where q, k, v enter and σ sits.

Use::

    from qkmlp.book import figures
    from qkmlp.book.schematic import unit_schematic
    figures.show(*unit_schematic())                      # all five panels
    figures.show(*unit_schematic(("symmetric", "gated")))  # the two that differ in σ

Colours follow :data:`~qkmlp.book.figures.COLORS`: query/gate blue, key/up vermilion,
value/down green; σ is a yellow disc (a yellow box for the softmax of attention).
"""
from __future__ import annotations

from . import figures

__all__ = ["PANELS", "unit_schematic", "schematic_svg", "write_schematic"]

#: The panel names, in the order of the book's argument.
PANELS = ("attention", "key_value", "bilinear", "symmetric", "gated")

Q, K, V = figures.COLORS[0], figures.COLORS[1], figures.COLORS[2]
SIGMA = figures.COLORS[6]
INK = {"q": Q, "k": K, "v": V, None: "black"}
LABEL_PT, FORMULA_PT, NOTE_PT = 10.0, 11.0, figures.FONT_PT
W = figures.PANEL_WIDTH
H = 2.35                 # panel height, inches; data units are inches
YC = 1.27                # centre line of the flow
DY = 0.33                # half the gap between the q and k branches


def _canvas(title: str):
    fig, ax = figures.panel(W, H)
    fig.set_layout_engine("none")
    ax.set_position([0, 0, 1, 1])
    ax.set_xlim(0, W)
    ax.set_ylim(0, H)
    ax.set_axis_off()
    ax.text(0.12, H - 0.2, title, fontsize=LABEL_PT, fontweight="bold", va="center", gid="title")
    return fig, ax


def _box(ax, xy, text, ink=None, w=0.56, h=0.3, gid=None):
    from matplotlib.patches import FancyBboxPatch

    c = INK[ink]
    from matplotlib.colors import to_rgba

    box = FancyBboxPatch((xy[0] - w / 2, xy[1] - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                         fc=to_rgba(c, 0.14) if ink else "#f2f2f2", ec=c, lw=1.4, gid=gid or f"box-{ink}")
    ax.add_patch(box)
    ax.text(*xy, text, fontsize=LABEL_PT, ha="center", va="center", color="black")
    return box


def _sigma(ax, xy, r=0.15):
    from matplotlib.patches import Circle

    disc = Circle(xy, r, fc=SIGMA, ec="black", lw=1.3, gid="sigma", zorder=3)
    ax.add_patch(disc)
    ax.text(*xy, r"$\sigma$", fontsize=12, ha="center", va="center", zorder=4)
    return disc


def _op(ax, xy, sym=r"\times", r=0.11):
    from matplotlib.patches import Circle

    node = Circle(xy, r, fc="white", ec="black", lw=1.1, gid="op", zorder=3)
    ax.add_patch(node)
    ax.text(xy[0], xy[1], f"${sym}$", fontsize=LABEL_PT, ha="center", va="center", zorder=4)
    return node


def _arrow(ax, a, b, color="black", style="-|>", conn="arc3", gid=None):
    """An arrow from a to b; each is a patch (the arrow stops at its edge) or a point."""
    from matplotlib.patches import FancyArrowPatch

    pa, pb = (a, None) if isinstance(a, tuple) else (None, a)
    qa, qb = (b, None) if isinstance(b, tuple) else (None, b)
    start = pa if pa is not None else _centre(pb)
    end = qa if qa is not None else _centre(qb)
    arr = FancyArrowPatch(start, end, patchA=pb, patchB=qb, arrowstyle=style, mutation_scale=9,
                          color=color, lw=1.2, connectionstyle=conn, shrinkA=1, shrinkB=1, gid=gid, zorder=2)
    ax.add_patch(arr)
    return arr


def _centre(patch):
    if hasattr(patch, "center"):
        return tuple(patch.center)
    x, y = patch.get_x(), patch.get_y()
    return (x + patch.get_width() / 2, y + patch.get_height() / 2)


def _formula(ax, y, pieces, fontsize=FORMULA_PT, gid="formula"):
    """A mathtext formula centred at height y, each piece ``(tex, ink)`` in its colour."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.mathtext import MathTextParser

    parser, prop = MathTextParser("path"), FontProperties(size=fontsize)
    widths = [parser.parse(f"${t}$", dpi=720, prop=prop).width / 720 for t, _ in pieces]
    x = (W - sum(widths)) / 2
    for (tex, ink), w in zip(pieces, widths):
        ax.text(x, y, f"${tex}$", fontsize=fontsize, color=INK[ink], va="baseline", gid=gid)
        x += w


def _note(ax, text, y=0.14):
    ax.text(W / 2, y, text, fontsize=NOTE_PT, ha="center", va="center", color="#333333", gid="note")


def _value_out(ax, src, x=2.95):
    """σ-coefficient ``src`` scales v_j (a green box feeding a × node), summed into y."""
    node = _op(ax, (x, YC))
    _arrow(ax, src, node)
    v = _box(ax, (x, YC - 0.52), r"$v_j$", "v", w=0.42, gid="value")
    _arrow(ax, v, node, color=V)
    _arrow(ax, node, (W - 0.1, YC))
    ax.text(W - 0.2, YC + 0.2, r"$\sum_j$", fontsize=LABEL_PT, ha="center", va="center")
    return node


def _token(ax, xy=(0.3, YC)):
    return _box(ax, xy, r"$x$", None, w=0.34, gid="token")


def _attention():
    fig, ax = _canvas("attention head")
    yk = [YC + 0.4, YC, YC - 0.4]
    x = _token(ax, (0.3, YC))
    q = _box(ax, (0.95, YC), r"$q$", "q", w=0.38, gid="query")
    _arrow(ax, x, q, color=Q)
    ax.text(0.95, YC + 0.3, r"$xW_Q$", fontsize=NOTE_PT, ha="center", va="center", color=Q)
    keys = [_box(ax, (1.62, y), f"$k_{i}$", "k", w=0.42, h=0.26, gid="key") for i, y in enumerate(yk, 1)]
    for kb in keys:
        _arrow(ax, q, kb, color=Q, style="-")
    soft = _box(ax, (2.2, YC), "", None, w=0.3, h=1.06, gid="sigma")
    soft.set_facecolor(SIGMA)
    soft.set_edgecolor("black")
    ax.text(2.2, YC, "softmax", rotation=90, fontsize=NOTE_PT, ha="center", va="center")
    vals = [_box(ax, (2.7, y), f"$v_{i}$", "v", w=0.42, h=0.26, gid="value") for i, y in enumerate(yk, 1)]
    add = _op(ax, (3.18, YC), "+")
    for kb, vb in zip(keys, vals):
        _arrow(ax, kb, (2.05, _centre(kb)[1]))
        _arrow(ax, (2.35, _centre(vb)[1]), vb)
        _arrow(ax, vb, add)
    _arrow(ax, add, (W - 0.04, YC))
    _formula(ax, 0.5, [(r"\Sigma_i\ \mathrm{softmax}_i(", None), ("q", "q"), (r"\,{\cdot}\,", None),
                       ("k_i", "k"), (r")\ ", None), ("v_i", "v")])
    _note(ax, "keys, values: from the context", y=0.2)
    return fig


def _key_value():
    fig, ax = _canvas("key-value slot (MLP as memory)")
    x = _token(ax)
    dot = _box(ax, (0.95, YC), r"$x\cdot k_j$", "k", gid="key")
    _arrow(ax, x, dot, color=K)
    s = _sigma(ax, (1.75, YC))
    _arrow(ax, dot, s)
    _value_out(ax, s)
    _formula(ax, 0.5, [(r"\sigma(x\cdot ", None), ("k_j", "k"), (r")\ ", None), ("v_j", "v")])
    _note(ax, "keys, values: weights", y=0.2)
    return fig


def _bilinear():
    from matplotlib.patches import Rectangle

    fig, ax = _canvas("bilinear-attention slot")
    x = _token(ax)
    side, x0, y0 = 0.5, 0.75, YC - 0.25
    for i in range(4):
        for j in range(4):
            shade = 0.55 + 0.1 * ((i * 3 + j * 5) % 4)
            ax.add_patch(Rectangle((x0 + j * side / 4, y0 + i * side / 4), side / 4, side / 4,
                                   fc=(shade, shade, shade), ec="white", lw=0.8, gid="interaction"))
    mat = Rectangle((x0, y0), side, side, fill=False, ec="black", lw=1.2)
    ax.add_patch(mat)
    ax.text(x0 + side / 2, y0 + side + 0.13, r"$A_j\ (d\times d)$", fontsize=NOTE_PT, ha="center", va="center")
    _arrow(ax, x, (x0, YC))
    xm, yb = x0 + side / 2, y0 - 0.3            # x enters again, transposed, from below
    ax.plot([0.3, 0.3, xm], [YC - 0.16, yb, yb], color="black", lw=1.2, solid_joinstyle="miter")
    _arrow(ax, (xm, yb), (xm, y0))
    ax.text(xm + 0.06, yb + 0.13, r"$x^{\top}$", fontsize=LABEL_PT, ha="left", va="center")
    s = _sigma(ax, (1.75, YC))
    _arrow(ax, (x0 + side, YC), s)
    _value_out(ax, s)
    _formula(ax, 0.5, [(r"\sigma(x A_j x^{\top})\ ", None), ("v_j", "v")])
    _formula(ax, 0.16, [(r"\mathrm{rank\ 1:}\ A_j = ", None), (r"q_j^{\top}", "q"), ("k_j", "k")],
             fontsize=NOTE_PT + 0.5, gid="note")
    return fig


def _rank_one(gated: bool):
    fig, ax = _canvas("gated unit (GLU)" if gated else "symmetric rank-1 slot")
    x = _token(ax)
    q = _box(ax, (0.95, YC + DY), r"$x\cdot q_j$", "q", gid="query")
    k = _box(ax, (0.95, YC - DY), r"$x\cdot k_j$", "k", gid="key")
    _arrow(ax, x, q, color=Q, conn="angle,angleA=90,angleB=180,rad=0")
    _arrow(ax, x, k, color=K, conn="angle,angleA=-90,angleB=180,rad=0")
    mul = _op(ax, (2.05, YC))
    src_q = q
    if gated:
        src_q = _sigma(ax, (1.6, YC + DY))
        _arrow(ax, q, src_q)
    _arrow(ax, src_q, mul, conn="angle,angleA=0,angleB=90,rad=0")
    _arrow(ax, k, mul, conn="angle,angleA=0,angleB=-90,rad=0")
    out = mul
    if not gated:
        out = _sigma(ax, (2.5, YC))
        _arrow(ax, mul, out)
    _value_out(ax, out)
    if gated:
        ax.text(0.95, YC + DY + 0.27, "gate", fontsize=NOTE_PT, ha="center", va="center", color=Q)
        ax.text(0.95, YC - DY - 0.27, "up", fontsize=NOTE_PT, ha="center", va="center", color=K)
        ax.text(2.7, YC - 0.52, "down", fontsize=NOTE_PT, ha="right", va="center", color=V)
        _formula(ax, 0.42, [(r"\sigma(x\cdot ", None), ("q_j", "q"), (r")\,(x\cdot ", None), ("k_j", "k"),
                            (r")\ ", None), ("v_j", "v")])
        _note(ax, "σ on the gate only: not symmetric in q ↔ k")
    else:
        _formula(ax, 0.42, [(r"\sigma((x\cdot ", None), ("q_j", "q"), (r")(x\cdot ", None), ("k_j", "k"),
                            (r"))\ ", None), ("v_j", "v")])
        _note(ax, "σ on the product: symmetric in q ↔ k")
    return fig


_DRAW = {"attention": _attention, "key_value": _key_value, "bilinear": _bilinear,
         "symmetric": lambda: _rank_one(False), "gated": lambda: _rank_one(True)}


def unit_schematic(panels=None):
    """One matplotlib Figure per unit, each :data:`~qkmlp.book.figures.PANEL_WIDTH` wide.

    ``panels``: names from :data:`PANELS` (a sequence, or one name); ``None`` draws all
    five in the book's order. Show them with ``figures.show(*unit_schematic())``.
    """
    import matplotlib

    names = PANELS if panels is None else ((panels,) if isinstance(panels, str) else tuple(panels))
    bad = [n for n in names if n not in _DRAW]
    if bad or not names:
        what = f"unknown schematic panel(s) {bad!r}" if bad else "no schematic panel asked for"
        raise ValueError(f"{what}; the panels are {list(PANELS)}")
    with matplotlib.rc_context(figures.RC):
        return [_DRAW[n]() for n in names]


def schematic_svg(panel: str) -> str:
    """One panel of :func:`unit_schematic` as SVG text that is the same on every run.

    The text is drawn as paths, the ids come from a fixed salt, and the file carries no
    date or software stamp, so a committed copy can be checked against a fresh one.
    """
    import io

    import matplotlib

    (fig,) = unit_schematic((panel,))
    buf = io.StringIO()
    with matplotlib.rc_context({**figures.RC, "svg.hashsalt": f"qkmlp-{panel}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()


def write_schematic(folder, panels=("symmetric", "gated")) -> list:
    """Write ``schematic-<panel>.svg`` for each panel into ``folder`` (made if missing).

    Returns the paths written. The README and the introduction show the committed
    ``book/_static/schematic-symmetric.svg`` and ``schematic-gated.svg``, made by
    ``python -m qkmlp.book schematic --out book/_static``.
    """
    from pathlib import Path

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"--out must be a folder for the schematic, got the file {folder}")
    names = (panels,) if isinstance(panels, str) else tuple(panels)
    svgs = {name: schematic_svg(name) for name in names}   # checks every name before writing
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in svgs.items():
        path = folder / f"schematic-{name}.svg"
        path.write_text(text)
        paths.append(path)
    return paths
