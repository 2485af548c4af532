"""A self-contained HTML + JS symmetry explorer for the static book (no kernel, no network).

:func:`static_explorer_data` precomputes, for every (rank, form, activation, α) on a grid,
the numbers :meth:`qkmlp.book.widgets.SymmetryExplorer.numbers` reports and the two scatter
plots it draws; :func:`static_explorer_html` wraps them in one ``<div>`` with plain inline
JavaScript that moves the points of an inline SVG when the reader moves the α slider or
switches activation, form or rank. Show it with ``IPython.display.HTML(static_explorer_html())``.
The fragment is responsive: the two scatter plots are separate SVGs, 250 CSS px wide at
their natural size, side by side in a wide column and stacked (or shrunk) on a phone.

Above them, the unit's function on the (a, b) plane
(:func:`qkmlp.book.explorer_model.explorer_planes`), in two rows of three heat maps: the exchange
(the unit at α, its swap q ↔ k, unit − swap) and the scaling claim (the unit at α = 1, the
unit at α, unit at α − unit at 1), the same six panels as the live explorer
(:data:`qkmlp.book.explorer_model.PLANE_PANELS`). The four maps of the unit and its swap share one
colour scale per frame; each difference has its own, symmetric about 0 and reaching its
largest magnitude, so a small difference is drawn in full colour and its size is read on
its colour bar. Each grid is stored at build time as PLANE_N² characters, one per cell, each
a level of a 63-step diverging scale (:func:`encode_plane`); identical grids are stored
once, so the symmetric form (whose unit and swap are equal and do not move with α) costs
little. The α slider is ``SLIDER_HEIGHT_PX`` (44) CSS px tall: a touch target, not a 16 px line.

DOM contract (browser tests rely on these class names), all inside
``<div class="qkmlp-static-explorer" id="...">``: ``input[type=range].qkmlp-alpha``
(its value is an index into the α grid), ``select.qkmlp-activation``, ``select.qkmlp-form``,
``.qkmlp-rank`` (a ``select`` when there are several ranks, else a hidden input holding
the one rank), text elements ``.qkmlp-alpha-value``, ``.qkmlp-scale-change``,
``.qkmlp-swap-change`` (plus ``.qkmlp-scale-predicted``, ``.qkmlp-swap-predicted``), the
two inline SVG panels under ``.qkmlp-plot``, and under ``.qkmlp-plane`` the headings
``.qkmlp-exchange-head`` and ``.qkmlp-scaling-head`` and the six heat maps
:data:`PANEL_CLASSES` (``svg.qkmlp-heat-unit``, ``-swap``, ``-diff``, ``-at1``,
``-unit-at-alpha``, ``-scale-diff``; their cells are the ``rect`` elements of
``g.qkmlp-cells``, filled by the script, and each has a colour bar, ``g.qkmlp-cbar-bands``
with ``.qkmlp-cbar-lo``, ``-mid``, ``-hi``). Each explorer has its own id, and its script only
touches elements inside its own container, so several can share a page.
"""
from __future__ import annotations

import html
import json
import math
import uuid
from typing import Optional, Sequence

import numpy as np

from ..activations import activation_names, get_activation
from .explorer_model import (
    D_HIDDEN,
    D_MODEL,
    FORMS,
    PLANE_CMAP,
    PLANE_PANELS,
    PLANE_ROWS,
    SLIDER_HEIGHT_PX,
    alpha_ticks,
    check_form,
    component_products,
    default_alphas,
    explorer_planes,
    make_batch,
    make_layer,
    measure,
    one_thread,
    scatter_grid,
)

__all__ = ["static_explorer_data", "static_explorer_html", "encode_plane", "decode_plane",
           "PLANE_N", "PLANE_LEVELS", "FRAME_FIELDS", "PANEL_CLASSES"]

#: Significant digits kept for plot coordinates (the plots are 200 px wide).
PLOT_DIGITS = 3
#: Grid points per side of the (a, b)-plane heat maps (a, b in [−2, 2], step 0.25).
PLANE_N = 17
#: Colour levels on each side of 0 in a stored heat map: 2·31 + 1 = 63 steps.
PLANE_LEVELS = 31
#: One character per level, −PLANE_LEVELS..PLANE_LEVELS (the first 63 of base64's alphabet).
_LEVEL_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[:2 * PLANE_LEVELS + 1]


def encode_plane(values, scale: float) -> str:
    """A grid of values as one character per cell, row-major (rows are b, as in
    :func:`~qkmlp.book.explorer_model.exchange_plane`): the level round(v / scale · PLANE_LEVELS)
    (of that ratio rounded to 9 decimals), clipped to ±PLANE_LEVELS, written as ``_LEVEL_CHARS[level + PLANE_LEVELS]`` (0 is "f").
    """
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError("values must be finite")
    # rounded to 9 decimals first, so that float noise (α·a·b/α against a·b) cannot tip a
    # value lying on a boundary between two levels into either
    level = np.clip(np.rint(np.round(v / scale * PLANE_LEVELS, 9)), -PLANE_LEVELS, PLANE_LEVELS).astype(int)
    return "".join(_LEVEL_CHARS[k + PLANE_LEVELS] for k in level.ravel())


def decode_plane(text: str, scale: float, n: int = PLANE_N) -> np.ndarray:
    """The (n, n) grid :func:`encode_plane` stored (each value to within scale / 62)."""
    if len(text) != n * n:
        raise ValueError(f"a stored grid has n² = {n * n} characters, got {len(text)}")
    level = np.array([_LEVEL_CHARS.index(c) for c in text]) - PLANE_LEVELS
    return (level * (float(scale) / PLANE_LEVELS)).reshape(n, n)


def _palette() -> list[str]:
    """The 63 colours of the levels, PLANE_CMAP sampled evenly (level 0 is its middle)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[PLANE_CMAP]
    k = 2 * PLANE_LEVELS
    return [to_hex(cmap(i / k)) for i in range(k + 1)]


def _r(v: float):
    """Round to PLOT_DIGITS significant digits; zero (and −0) as the int 0 (shorter JSON)."""
    v = float(f"{v:.{PLOT_DIGITS}g}")
    return 0 if v == 0 else v


def static_explorer_data(*, alphas: Optional[Sequence[float]] = None,
                         activations: Optional[Sequence[str]] = None,
                         forms: Sequence[str] = FORMS, ranks: Sequence[int] = (1,),
                         seed: int = 0) -> dict:
    """All frames of the static explorer as a JSON-ready dict.

    ``numbers[str(rank)][form][activation]`` is a list, one entry per α, of
    ``[scale_change, swap_change, scale_predicted_invariant, swap_predicted_invariant,
    scale_predicted_change]`` (the last ``None`` where the theorems give no number), measured
    with :func:`qkmlp.book.explorer_model.measure` on the same layer and batch as the live explorer.
    ``plot[form][activation]`` holds ``x0`` (the unscaled product per grid point) and, per α,
    ``scale[i]`` (scaled product) and ``swap[i]`` (swapped product at α), each an index into
    ``points`` (the distinct rows of products, stored once): see
    :func:`qkmlp.book.explorer_model.component_products`. Plot coordinates keep ``PLOT_DIGITS`` significant digits.
    ``plane`` holds the heat maps: ``n``, ``span``, ``levels``, ``palette`` (one colour per
    level), ``grids`` (distinct grids, :func:`encode_plane`), ``rows`` (the two rows' names,
    :data:`~qkmlp.book.explorer_model.PLANE_ROWS`), ``titles[form]`` (the six maps' titles),
    ``panels`` (per map: its SVG's class, the frame slot of its grid and of its colour limit)
    and ``frames[form][activation]``, per α the list :data:`FRAME_FIELDS`: indices into
    ``grids`` of :func:`~qkmlp.book.explorer_model.explorer_planes`' unit, swap, unit at 1 and the
    two differences, then the colour limits (``PLOT_DIGITS`` digits) that encode them: the
    maps' largest magnitude and each difference's own (0: a blank difference).
    """
    alphas = [float(a) for a in (default_alphas() if alphas is None else alphas)]
    if not alphas:
        raise ValueError("alphas must not be empty")
    names = list(activations or activation_names())
    for n in names:
        get_activation(n)
    forms = [check_form(f) for f in forms]
    ranks = [int(r) for r in ranks]
    if not ranks or min(ranks) < 1:
        raise ValueError(f"ranks must be a non-empty list of integers >= 1, got {ranks!r}")

    with one_thread():
        return _compute(alphas, names, forms, ranks, seed)


def _compute(alphas, names, forms, ranks, seed) -> dict:
    x = make_batch(seed=seed + 1)
    numbers: dict = {}
    for r in ranks:
        numbers[str(r)] = {}
        for f in forms:
            numbers[str(r)][f] = {}
            for n in names:
                layer = make_layer(f, n, r, seed=seed)
                rows = []
                for a in alphas:
                    m = measure(layer, x, a)
                    rows.append([m["scale_change"], m["swap_change"],
                                 m["scale_predicted_invariant"], m["swap_predicted_invariant"],
                                 m["scale_predicted_change"]])
                numbers[str(r)][f][n] = rows

    ga, gb = scatter_grid()
    points: list = []
    store = _store(points, key=lambda row: tuple(row))
    plot: dict = {}
    for f in forms:
        plot[f] = {}
        for n in names:
            scale, swap = [], []
            for a in alphas:
                p0, pa, ps = component_products(f, n, a, ga, gb)   # p0, the unscaled product, is the same for every α
                scale.append(store([_r(v) for v in pa]))
                swap.append(store([_r(v) for v in ps]))
            plot[f][n] = {"x0": store([_r(v) for v in p0]), "scale": scale, "swap": swap}
    return {"alphas": alphas, "activations": names, "forms": forms, "ranks": ranks,
            "seed": seed, "numbers": numbers, "points": points, "plot": plot,
            "plane": _planes(alphas, names, forms)}


def _store(items: list, key=lambda item: item):
    """A function that appends an item to ``items`` unless an equal one is there, and
    returns its index: each distinct item is stored once."""
    where: dict = {}

    def store(item) -> int:
        k = key(item)
        if k not in where:
            where[k] = len(items)
            items.append(item)
        return where[k]
    return store


#: The grids of one stored frame, then their colour limits: see :func:`static_explorer_data`.
FRAME_FIELDS = ("unit", "swap", "unit_at_1", "exchange_difference", "scaling_difference",
                "maps_limit", "exchange_difference_limit", "scaling_difference_limit")
#: The class of each heat map's SVG, in the order of :data:`~qkmlp.book.explorer_model.PLANE_PANELS`.
PANEL_CLASSES = ("qkmlp-heat-unit", "qkmlp-heat-swap", "qkmlp-heat-diff",
                 "qkmlp-heat-at1", "qkmlp-heat-unit-at-alpha", "qkmlp-heat-scale-diff")


def _planes(alphas, names, forms) -> dict:
    grids: list[str] = []
    store = _store(grids)
    blank = encode_plane(np.zeros((PLANE_N, PLANE_N)), 1.0)
    frames: dict = {}
    span = 2.0
    for f in forms:
        frames[f] = {}
        for n in names:
            rows = []
            for a in alphas:
                p = explorer_planes(f, n, a, n=PLANE_N, span=span)
                lim = {k: (_r(v) if v > 0 else 0) for k, v in p["limits"].items()}
                maps = lim["maps"] or 1
                row = [store(encode_plane(p[k], maps)) for k in ("unit", "swap", "unit_at_1")]
                for k in ("exchange_difference", "scaling_difference"):
                    row.append(store(encode_plane(p[k], lim[k]) if lim[k] else blank))
                rows.append(row + [maps, lim["exchange_difference"], lim["scaling_difference"]])
            frames[f][n] = rows
    panels = [[cls, FRAME_FIELDS.index(key), FRAME_FIELDS.index("maps_limit" if limit == "maps" else limit + "_limit")]
              for cls, (key, limit, _, _) in zip(PANEL_CLASSES, PLANE_PANELS)]
    titles = {f: [panel[2 if f == "gated" else 3] for panel in PLANE_PANELS] for f in forms}
    return {"n": PLANE_N, "span": span, "levels": PLANE_LEVELS, "palette": _palette(),
            "grids": grids, "rows": dict(PLANE_ROWS), "titles": titles, "panels": panels,
            "heads": [[row, FRAME_FIELDS.index(f"{row}_difference_limit"), FRAME_FIELDS.index("maps_limit")]
                      for row in PLANE_ROWS],
            "frames": frames}


_CSS = """
#{uid} {{ box-sizing: border-box; max-width: 100%; border: 1px solid #ccc; border-radius: 6px;
  padding: 0.6em 0.7em; margin: 1em 0; font-size: 0.9em; }}
#{uid} .qkmlp-controls {{ display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; align-items: center; }}
#{uid} .qkmlp-controls label {{ white-space: nowrap; }}
#{uid} label.qkmlp-alpha-label {{ display: flex; align-items: center; gap: 0.4em; flex: 1 1 100%; }}
#{uid} .qkmlp-alpha-value {{ display: inline-block; min-width: 3.3em; }}
#{uid} input.qkmlp-alpha {{ flex: 1 1 8em; min-width: 8em; height: {slider}px; margin: 0;
  box-sizing: border-box; cursor: pointer; touch-action: pan-y; }}
#{uid} table {{ border-collapse: collapse; margin: 0.5em 0; width: 100%; }}
#{uid} td, #{uid} th {{ padding: 0.15em 0.5em; border-bottom: 1px solid #eee; text-align: left;
  vertical-align: top; }}
#{uid} th {{ white-space: nowrap; }}
#{uid} .qkmlp-scale-change, #{uid} .qkmlp-swap-change {{ font-family: monospace; white-space: nowrap; }}
#{uid} .qkmlp-plot {{ display: flex; flex-wrap: wrap; gap: 0.3em 1em; justify-content: center; }}
#{uid} .qkmlp-plot svg {{ width: {panel}px; max-width: 100%; height: auto; }}
#{uid} .qkmlp-note {{ color: #444; font-size: 0.9em; margin: 0.4em 0 0; overflow-wrap: break-word; }}
#{uid} svg text {{ font-size: 12px; font-family: sans-serif; }}
#{uid} .qkmlp-plane {{ margin: 0.6em 0; }}
#{uid} .qkmlp-plane-head {{ font-weight: 600; margin: 0.5em 0 0.2em; }}
#{uid} .qkmlp-plane-row {{ display: flex; flex-wrap: wrap; gap: 0.3em 6px; justify-content: center; }}
#{uid} .qkmlp-plane svg {{ max-width: 100%; height: auto; }}
#{uid} .qkmlp-plane svg text {{ font-size: 12.7px; }}
"""

# Plain ES5, no external scripts. Finds its container by id (or, inside JupyterLab where the
# output may not be attached yet, through document.currentScript's parent).
_JS = r"""
(function () {
  var uid = "__UID__";
  var me = document.currentScript;
  var root = (me && me.parentNode && me.parentNode.id === uid) ? me.parentNode : document.getElementById(uid);
  if (!root) { return; }
  var D = JSON.parse(root.querySelector(".qkmlp-data").textContent);
  var q = function (c) { return root.querySelector("." + c); };
  var slider = q("qkmlp-alpha"), act = q("qkmlp-activation"), form = q("qkmlp-form"), rank = q("qkmlp-rank");
  var P = 200, M = 40;  // plot square and left margin, in SVG units
  function fmt(v) {
    if (v === 0) { return "0"; }
    return Math.abs(v) < 1e-3 ? v.toExponential(2) : v.toFixed(4);
  }
  function fmtAlpha(a) { return (Math.abs(a) >= 1 ? a.toFixed(2) : a.toPrecision(3)).replace(/\.?0+$/, ""); }
  function verdict(measured, predicted) {
    return (measured < 1e-9 ? "invariant" : "changes") + " (theorem: " + (predicted ? "invariant" : "breaks") + ")";
  }
  function draw(panel, xs, ys, xl, yl) {
    var lo = Infinity, hi = -Infinity, i;
    for (i = 0; i < xs.length; i++) { lo = Math.min(lo, xs[i], ys[i]); hi = Math.max(hi, xs[i], ys[i]); }
    var pad = 0.05 * (hi - lo) + 1e-9; lo -= pad; hi += pad;
    var s = function (v) { return (v - lo) / (hi - lo) * P; };
    var dots = panel.querySelectorAll("circle");
    for (i = 0; i < dots.length; i++) {
      dots[i].setAttribute("cx", (M + s(xs[i])).toFixed(1));
      dots[i].setAttribute("cy", (P - s(ys[i]) + 6).toFixed(1));
    }
    panel.querySelector(".qkmlp-lo").textContent = lo.toPrecision(3);
    panel.querySelector(".qkmlp-hi").textContent = hi.toPrecision(3);
    panel.querySelector(".qkmlp-xlabel").textContent = xl;
    panel.querySelector(".qkmlp-ylabel").textContent = yl;
  }
  var PL = D.plane, NP = PL.n, CHARS = "__CHARS__", LEVEL = {};
  for (var c = 0; c < CHARS.length; c++) { LEVEL[CHARS.charAt(c)] = c; }
  var ns = "http://www.w3.org/2000/svg";
  function rect(g, x, y, w, h, fill) {
    var r = document.createElementNS(ns, "rect");
    r.setAttribute("x", x); r.setAttribute("y", y); r.setAttribute("width", w); r.setAttribute("height", h);
    if (fill) { r.setAttribute("fill", fill); }
    g.appendChild(r);
    return r;
  }
  function cells(svg) {  // the heat map's NP x NP rects and its colour bar's bands, made once
    var g = svg.querySelector(".qkmlp-cells"), out = [], x0 = +g.getAttribute("data-x"),
        y0 = +g.getAttribute("data-y"), w = +g.getAttribute("data-cell");
    for (var k = 0; k < NP * NP; k++) {
      var row = Math.floor(k / NP), col = k % NP;
      out.push(rect(g, x0 + col * w, y0 + (NP - 1 - row) * w, w, w));
    }
    var bar = svg.querySelector(".qkmlp-cbar-bands"), bw = +bar.getAttribute("data-w") / PL.palette.length;
    for (var b = 0; b < PL.palette.length; b++) {
      rect(bar, (+bar.getAttribute("data-x") + b * bw).toFixed(2), bar.getAttribute("data-y"),
           (bw + 0.3).toFixed(2), bar.getAttribute("data-h"), PL.palette[b]);
    }
    return out;
  }
  var heat = PL.panels.map(function (pn) { var svg = q(pn[0]); return {svg: svg, rects: cells(svg), grid: pn[1], lim: pn[2]}; });
  function sig(v, d) { return String(Number(v.toPrecision(d))); }
  function heading(row, d, m) {
    return PL.rows[row] + (d === 0 ? ": difference 0 everywhere"
      : ": max |difference| = " + sig(d, 3) + " (" + sig(100 * d / m, 2) + " % of the maps' max)");
  }
  function plane(i) {
    var f = PL.frames[form.value][act.value][i], titles = PL.titles[form.value];
    heat.forEach(function (h, k) {
      var g = PL.grids[f[h.grid]], L = f[h.lim], t = function (c) { return h.svg.querySelector("." + c); };
      for (var c = 0; c < h.rects.length; c++) { h.rects[c].setAttribute("fill", PL.palette[LEVEL[g.charAt(c)]]); }
      t("qkmlp-heat-title").textContent = titles[k];
      t("qkmlp-cbar-lo").textContent = L ? "−" + sig(L, 3) : "";
      t("qkmlp-cbar-hi").textContent = L ? "+" + sig(L, 3) : "";
      t("qkmlp-cbar-mid").textContent = L ? "0" : "0 everywhere";
      t("qkmlp-cbar-bands").style.visibility = L ? "" : "hidden";   // no scale to show for a blank map
    });
    PL.heads.forEach(function (hd) { q("qkmlp-" + hd[0] + "-head").textContent = heading(hd[0], f[hd[1]], f[hd[2]]); });
  }
  function update() {
    var i = parseInt(slider.value, 10), a = D.alphas[i];
    var n = D.numbers[rank.value][form.value][act.value][i];
    var p = D.plot[form.value][act.value], R = D.points;
    q("qkmlp-alpha-value").textContent = fmtAlpha(a);
    q("qkmlp-scale-change").textContent = fmt(n[0]);
    q("qkmlp-swap-change").textContent = fmt(n[1]);
    q("qkmlp-scale-predicted").textContent = verdict(n[0], n[2]) +
      (n[4] !== null && n[4] !== 0 ? "; predicted exactly " + fmt(n[4]) : "");
    q("qkmlp-swap-predicted").textContent = verdict(n[1], n[3]);
    var g = form.value === "gated";
    draw(q("qkmlp-panel-scale"), R[p.x0], R[p.scale[i]], g ? "σ(a)·b" : "σ(ab)", g ? "σ(αa)·(b/α)" : "σ((αa)(b/α))");
    draw(q("qkmlp-panel-swap"), R[p.scale[i]], R[p.swap[i]], g ? "σ(αa)·(b/α)" : "σ((αa)(b/α))", g ? "σ(b/α)·(αa)" : "σ((b/α)(αa))");
    plane(i);
  }
  [slider, act, form, rank].forEach(function (el) {
    el.addEventListener("input", update);
    el.addEventListener("change", update);
  });
  update();
})();
"""


#: Plot square and left margin of one scatter panel, in SVG units (= CSS px at natural size).
_P, _M = 200, 40
#: Natural width of one panel's SVG, CSS px; on a narrow screen it shrinks to the column.
PANEL_PX = 250


def _panel_svg(cls: str, title: str, npts: int) -> str:
    """One scatter panel as its own <svg> (the two panels wrap onto two lines on a phone)."""
    P, M = _P, _M
    circles = "".join(f'<circle r="2.6" cx="{M}" cy="{P}"/>' for _ in range(npts))
    fill = "#0072B2" if "scale" in cls else "#D55E00"
    return (
        f'<svg class="qkmlp-svg" viewBox="0 -18 {PANEL_PX} 268" width="{PANEL_PX}" height="268" '
        'xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{html.escape(title)}: one rank component before and after">'
        f'<g class="{cls}">'
        f'<text x="{M + P / 2}" y="0" dy="-4" text-anchor="middle">{html.escape(title)}</text>'
        f'<rect x="{M}" y="6" width="{P}" height="{P}" fill="none" stroke="#999"/>'
        f'<line x1="{M}" y1="{P + 6}" x2="{M + P}" y2="6" stroke="#bbb"/>'
        f'<g fill="{fill}">{circles}</g>'
        f'<text class="qkmlp-lo" x="{M}" y="{P + 21}" text-anchor="start"></text>'
        f'<text class="qkmlp-hi" x="{M + P}" y="{P + 21}" text-anchor="end"></text>'
        f'<text class="qkmlp-xlabel" x="{M + P / 2}" y="{P + 38}" text-anchor="middle"></text>'
        f'<text class="qkmlp-ylabel" transform="translate({M - 10},{6 + P / 2}) rotate(-90)" '
        'text-anchor="middle"></text>'
        "</g></svg>"
    )


#: Layout of one heat map, in SVG units (= CSS px at natural size): cell size, left and
#: top margin of the square, natural width and height. Three fit side by side in the
#: explorer's 666 px inside its border at 1280 px (a 688 px column), each map 170 px
#: square; on a 390 px phone they stack, at natural size.
_CELL, _HX, _HY = 10, 34, 20
_SIDE = _CELL * PLANE_N
_HW, _HH = _HX + _SIDE + 8, _HY + _SIDE + 62


def _heat_svg(cls: str, span: float) -> str:
    """One heat map: frame, diagonal a = b, ticks, labels and a horizontal colour bar under
    it (its own limits); the script fills g.qkmlp-cells, the bar's bands and the texts."""
    x0, y0, x1, y1 = _HX, _HY, _HX + _SIDE, _HY + _SIDE
    t = f"{span:g}"
    # the end ticks sit inside the square's span, so the two "−2" at its corner stay apart
    ticks = (f'<text x="{x0}" y="{y1 + 13}" text-anchor="start">−{t}</text>'
             f'<text x="{(x0 + x1) / 2}" y="{y1 + 13}" text-anchor="middle">0</text>'
             f'<text x="{x1}" y="{y1 + 13}" text-anchor="end">{t}</text>'
             f'<text x="{x0 - 3}" y="{y1}" text-anchor="end">−{t}</text>'
             f'<text x="{x0 - 3}" y="{(y0 + y1) / 2 + 4}" text-anchor="end">0</text>'
             f'<text x="{x0 - 3}" y="{y0 + 9}" text-anchor="end">{t}</text>')
    by = y1 + 35
    bar = (f'<g class="qkmlp-cbar-bands" data-x="{x0}" data-y="{by}" data-w="{_SIDE}" data-h="8" '
           'shape-rendering="crispEdges"></g>'
           f'<rect x="{x0}" y="{by}" width="{_SIDE}" height="8" fill="none" stroke="#999"/>'
           f'<text class="qkmlp-cbar-lo" x="{x0}" y="{by + 21}" text-anchor="start"></text>'
           f'<text class="qkmlp-cbar-mid" x="{(x0 + x1) / 2}" y="{by + 21}" text-anchor="middle"></text>'
           f'<text class="qkmlp-cbar-hi" x="{x1}" y="{by + 21}" text-anchor="end"></text>')
    return (
        f'<svg class="qkmlp-heat {cls}" viewBox="0 0 {_HW} {_HH}" width="{_HW}" height="{_HH}" '
        'xmlns="http://www.w3.org/2000/svg" role="img" '
        'aria-label="one rank component over the (a, b) plane, a = x·q across, b = x·k up, with its colour scale">'
        f'<text class="qkmlp-heat-title" x="{(x0 + x1) / 2}" y="{y0 - 6}" text-anchor="middle"></text>'
        f'<g class="qkmlp-cells" data-x="{x0}" data-y="{y0}" data-cell="{_CELL}" shape-rendering="crispEdges"></g>'
        f'<rect x="{x0}" y="{y0}" width="{_SIDE}" height="{_SIDE}" fill="none" stroke="#999"/>'
        f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y0}" stroke="#555" stroke-width="0.8" stroke-dasharray="3 3"/>'
        f"{ticks}"
        f'<text x="{(x0 + x1) / 2}" y="{y1 + 28}" text-anchor="middle">a = x·q</text>'
        f'<text transform="translate(10,{(y0 + y1) / 2}) rotate(-90)" text-anchor="middle">b = x·k</text>'
        f"{bar}</svg>"
    )


def static_explorer_html(*, activation: Optional[str] = None, form: str = "gated", alpha: float = 1.0,
                         rank: Optional[int] = None, ranks: Sequence[int] = (1,),
                         alphas: Optional[Sequence[float]] = None,
                         activations: Optional[Sequence[str]] = None,
                         forms: Sequence[str] = FORMS, seed: int = 0,
                         uid: Optional[str] = None, data: Optional[dict] = None) -> str:
    """The explorer as one self-contained HTML fragment (inline CSS, SVG and JS).

    ``activation``, ``form``, ``alpha`` and ``rank`` are the initial settings (``alpha``
    must be on the grid; ``activation`` defaults to silu, or the first of ``activations``
    without it; ``rank`` defaults to ``ranks[0]``). ``uid`` (default: random)
    namespaces the container's id. ``data``: frames already computed by
    :func:`static_explorer_data` (then ``alphas``, ``activations``, ``forms``, ``ranks`` and
    ``seed`` are taken from it). With the defaults the fragment is about 0.5 MB (0.12 MB of
    it the heat maps).
    """
    if data is not None:
        alphas, activations, forms = data["alphas"], data["activations"], data["forms"]
        ranks, seed = data["ranks"], data["seed"]
    names = list(activations or activation_names())
    if activation is None:
        activation = "silu" if "silu" in names else names[0]
    grid = [float(a) for a in (default_alphas() if alphas is None else alphas)]
    ranks = [int(r) for r in ranks]
    rank = ranks[0] if ranks and rank is None else rank
    for val, opts, what in ((activation, names, "activation"), (form, list(forms), "form"),
                            (rank, ranks, "rank")):
        if val not in opts:
            raise ValueError(f"{what} must be one of {opts}, got {val!r}")
    if float(alpha) not in grid:
        raise ValueError(f"alpha must be one of the grid's values {grid}, got {alpha!r}")
    uid = uid or f"qkmlp-explorer-{uuid.uuid4().hex[:10]}"
    if not uid.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"uid must contain only letters, digits, '-' and '_', got {uid!r}")
    if data is None:
        data = static_explorer_data(alphas=grid, activations=names, forms=forms, ranks=ranks, seed=seed)
    i0 = data["alphas"].index(float(alpha))
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    npts = len(data["points"][data["plot"][data["forms"][0]][data["activations"][0]]["x0"]])

    def options(values, selected):
        return "".join(
            f'<option value="{html.escape(str(v))}"{" selected" if v == selected else ""}>'
            f"{html.escape(str(v))}</option>"
            for v in values
        )

    several_ranks = len(data["ranks"]) > 1
    if several_ranks:
        rank_control = (f'<label>rank <select class="qkmlp-rank">{options(data["ranks"], rank)}'
                        "</select></label>")
    else:  # nothing to choose: the rank is fixed, not a menu with one entry
        rank_control = f'<input type="hidden" class="qkmlp-rank" value="{rank}">'
    plots = (_panel_svg("qkmlp-panel-scale", "inverse scaling q→αq, k→k/α", npts)
             + _panel_svg("qkmlp-panel-swap", "swap q↔k (at α)", npts))
    span = data["plane"]["span"]
    heat = "".join(
        f'<p class="qkmlp-plane-head qkmlp-{row}-head"></p><div class="qkmlp-plane-row">'
        + "".join(_heat_svg(cls, span) for cls in PANEL_CLASSES[3 * k:3 * k + 3]) + "</div>"
        for k, row in enumerate(data["plane"]["rows"]))
    pn = data["plane"]["n"]
    about_rank = (
        " The transforms act on each rank component separately, so the two plots are the "
        "same at every rank; the numbers in the table are measured on the whole layer of "
        "the chosen rank." if several_ranks else
        f" The layer has rank {rank}."
    )
    note = (
        "The table compares two layers on a fixed batch of 64 random inputs: the relative "
        "change ‖g(x) − f(x)‖/‖f(x)‖ and what the theorems predict. The scatter plots show one rank "
        "component on a 7×7 grid of projections (a, b) in [−2, 2]²: left, its value after "
        "the inverse scaling against before; right, after also swapping q and k. Points on "
        "the grey diagonal are unchanged. α runs over a log-spaced grid of negative and "
        f"positive values; the layer (d = {D_MODEL}, m = {D_HIDDEN}, float64, one fixed "
        "random seed) and every number were computed when the book was built, so the "
        "explorer works without Python." + about_rank
    )
    plane_note = (
        "The heat maps draw one rank component's output over the (a, b) plane, a = x·q "
        f"across and b = x·k up, on a {pn}×{pn} grid in [−{span:g}, {span:g}]²; orange positive, "
        "purple negative, white 0. First row, the exchange: the unit at α, the unit with q and "
        "k swapped, and their difference; the dashed line is a = b, and at α = 1 the swap is "
        "the unit reflected in it. Second row, the scaling claim: the unit at α = 1, the unit "
        "at α, and their difference, which is 0 everywhere exactly when σ(αz) = α σ(z). The "
        "four maps of the unit and its swap share one colour scale; each difference has its "
        "own, from −max to +max of its values, so that even a difference of 1 % of the maps "
        "takes the darkest colours: read its size on its colour bar and in the row's heading."
    )
    return (
        f'<div class="qkmlp-static-explorer" id="{uid}">'
        f"<style>{_CSS.format(uid=uid, panel=PANEL_PX, slider=SLIDER_HEIGHT_PX)}</style>"
        '<div class="qkmlp-controls">'
        f'<label class="qkmlp-alpha-label"><span>α = <span class="qkmlp-alpha-value">{alpha:.3g}</span></span> '
        f'<input type="range" class="qkmlp-alpha" min="0" max="{len(data["alphas"]) - 1}" '
        f'step="1" value="{i0}" list="{uid}-alpha-ticks" '
        'aria-label="alpha (index into a log-spaced grid of negative and positive values)">'
        "</label>"
        f'<datalist id="{uid}-alpha-ticks">'
        + "".join(f'<option value="{i}"></option>' for i, _, _ in alpha_ticks(data["alphas"]))
        + "</datalist>"
        f'<label>σ <select class="qkmlp-activation">{options(data["activations"], activation)}'
        "</select></label>"
        f'<label>form <select class="qkmlp-form">{options(data["forms"], form)}</select></label>'
        f"{rank_control}"
        "</div>"
        "<table><tr><th></th><th>change</th><th>measured (theorem)</th></tr>"
        '<tr><td>inverse scaling by α</td><td class="qkmlp-scale-change"></td>'
        '<td class="qkmlp-scale-predicted"></td></tr>'
        '<tr><td>swap q↔k at α</td><td class="qkmlp-swap-change"></td>'
        '<td class="qkmlp-swap-predicted"></td></tr>'
        "</table>"
        f'<div class="qkmlp-plane">{heat}</div>'
        f'<div class="qkmlp-plot">{plots}</div>'
        f'<p class="qkmlp-note">{html.escape(plane_note)}</p>'
        f'<p class="qkmlp-note">{html.escape(note)}</p>'
        f'<script type="application/json" class="qkmlp-data">{payload}</script>'
        f"<script>{_JS.replace('__UID__', uid).replace('__CHARS__', _LEVEL_CHARS)}</script>"
        "</div>"
    )
