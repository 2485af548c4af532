"""The live symmetry explorer (ipywidgets) of chapter 5.

:class:`SymmetryExplorer` is an ipywidgets panel whose controls are attributes
(``.alpha``, ``.activation``, ``.form``, ``.rank``) and whose current measurements are
:meth:`SymmetryExplorer.numbers`. What it measures and draws is
:mod:`qkmlp.book.explorer_model`'s (no ipywidgets there), which the website's static
explorer (:mod:`qkmlp.book.static_explorer`) shows too; those names stay importable from
this module. Two matplotlib figures, updated in place (``set_offsets``, ``set_data`` on
existing artists): the (a, b)-plane heat maps
(:func:`~qkmlp.book.explorer_model.explorer_planes`, two rows of three: the exchange and
the scaling claim) and two scatter plots of one rank component. Both are stacked into one
PNG in one ``ipywidgets.Image``, so moving a control redraws them together, in one update
of one image, never piling up figures or flickering.

Where it is shown: in a running kernel (JupyterLab) the live panel; where no kernel runs
(the website), the static HTML explorer given as ``static_html``. The panel's display
bundle carries both, the live widget view and that ``text/html``: JupyterLab renders the
widget view before HTML, and the book's Sphinx build ranks ``text/html`` first
(``nb_mime_priority_overrides`` in ``_config.yml``).
"""
from __future__ import annotations

import contextlib
import io
import math
from typing import Optional, Sequence

import numpy as np

from ..activations import activation_names, get_activation
# The measurements are explorer_model's; the names stay importable from here, where the
# chapters have always imported them.
from .explorer_model import (  # noqa: F401
    BATCH, D_HIDDEN, D_MODEL, FORMS, PLANE_CMAP, PLANE_PANELS, PLANE_ROWS, SLIDER_HEIGHT_PX,
    ZERO_RTOL, alpha_ticks, check_form, component_products, default_alphas, difference_limit,
    exchange_plane, explorer_planes, make_batch, make_layer, measure, one_thread, plane_axis,
    plane_heading, predicted_scale_change, scaling_plane, scaling_sweep, scatter_grid,
)

__all__ = ["SymmetryExplorer", "symmetry_explorer", "SLIDER_TRACK_PX"]

#: Length of the live α slider's track, CSS px (34 values: about 12 px a step).
SLIDER_TRACK_PX = 400
# The slider's box around its track: the description ("α", given this width) and the
# margins ipywidgets 8 puts around the track, measured in JupyterLab 4.6 (Chromium): the
# track starts 12 px after the description and ends 8 px before the slider's right edge.
# The tick row under the slider starts and ends where the track does.
_SLIDER_LABEL_PX = 24
_TRACK_LEFT_PX = _SLIDER_LABEL_PX + 12
_TRACK_RIGHT_PX = 8
_SLIDER_WIDTH_PX = _TRACK_LEFT_PX + SLIDER_TRACK_PX + _TRACK_RIGHT_PX

# The live heat-map figure, CSS px at 96 dpi: 720 wide; per column a 46 px margin (tick
# labels, "b = x·k") and a 180 px square; per row a 22 px heading, a 20 px title, the
# square, 38 px for its tick labels and "a = x·q", then an 8 px colour bar and its labels.
_PLANE_COL_PX, _PLANE_LEFT_PX, _PLANE_SQUARE_PX = 240, 46, 180
_PLANE_TOP_PX, _PLANE_HEAD_PX, _PLANE_TITLE_PX = 6, 22, 20
_PLANE_CBAR_GAP_PX, _PLANE_CBAR_PX = 38, 8
_PLANE_ROW_PX = _PLANE_HEAD_PX + _PLANE_TITLE_PX + _PLANE_SQUARE_PX + _PLANE_CBAR_GAP_PX + _PLANE_CBAR_PX + 26
_PLANE_FIG_PX = (3 * _PLANE_COL_PX, _PLANE_TOP_PX + 2 * _PLANE_ROW_PX)

def _ticks_html(alphas: Sequence[float]) -> str:
    """The row of tick marks and labels drawn under the α slider's track."""
    marks = []
    for i, frac, label in alpha_ticks(alphas):
        left = f"{100 * frac:.4f}%"
        marks.append(f"<span class='qkmlp-tick' data-index='{i}' style='position:absolute;left:{left};"
                     "top:0;height:6px;border-left:1px solid #555'></span>")
        if label is not None:
            weight = "600" if abs(alphas[i]) == 1 else "400"
            marks.append(f"<span class='qkmlp-tick-label' data-index='{i}' style='position:absolute;"
                         f"left:{left};top:5px;transform:translateX(-50%);font-weight:{weight}'>"
                         f"{label}</span>")
    return (f"<div class='qkmlp-alpha-ticks' style='position:relative;height:22px;"
            f"margin:0 {_TRACK_RIGHT_PX}px 0 {_TRACK_LEFT_PX}px;font-size:12px;line-height:16px;"
            f"color:#333'>{''.join(marks)}</div>")


# --- the ipywidgets view ----------------------------------------------------------------


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.2e}" if abs(v) < 1e-3 else f"{v:.4f}"


class SymmetryExplorer:
    """Live explorer of the scaling and swap symmetries of one fixed random layer.

    Controls (ipywidgets, also the model's state): ``.alpha`` (SelectionSlider over a
    log-spaced grid of negative and positive α), ``.activation`` (Dropdown over the
    registry), ``.form`` (Dropdown: gated / symmetric), ``.rank`` (IntSlider).
    Setting any control's ``.value`` updates :meth:`numbers`, the readout and both figures.
    ``.figure`` is the scatter plots' matplotlib Figure; ``.scale_points`` /
    ``.swap_points`` its two scatter artists. ``.plane_figure`` draws
    :func:`~qkmlp.book.explorer_model.explorer_planes` at the current form, σ and α:
    ``.plane_images`` are its six heat maps in the order of
    :data:`~qkmlp.book.explorer_model.PLANE_PANELS` (unit at α, swap, unit − swap; unit at
    1, unit at α, unit at α − unit at 1), each with a colour bar under it whose three
    labels are ``.plane_bar_labels``: the four maps of the unit and its swap on one scale, each
    difference on its own, all symmetric about 0; ``.plane_headings`` are the two rows'
    headings (:func:`~qkmlp.book.explorer_model.plane_heading`). ``.image``, one
    ipywidgets.Image, shows both figures stacked in one PNG (the heat maps on top, as on
    the website), so they change together.

    The α slider is ``SLIDER_HEIGHT_PX`` (44) px tall, a touch target, and its track
    ``SLIDER_TRACK_PX`` (400) px long; ``.alpha_ticks`` (ipywidgets.HTML) marks the powers
    of two under it and labels α = −1, 1 and the ends (:func:`alpha_ticks`);
    ``.alpha_value`` shows the current α.

    ``static_html``: HTML to show where no kernel runs the widgets (the website's static
    explorer, :func:`qkmlp.book.static_explorer.static_explorer_html`); it goes into the
    display bundle as ``text/html`` beside the live widget view.
    """

    def __init__(self, *, activation: str = "silu", form: str = "gated", alpha: float = 1.0,
                 rank: int = 1, max_rank: int = 4, alphas: Optional[Sequence[float]] = None,
                 activations: Optional[Sequence[str]] = None, seed: int = 0,
                 static_html: Optional[str] = None) -> None:
        import ipywidgets as W
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        alphas = list(default_alphas() if alphas is None else alphas)
        for a in alphas:
            if not (math.isfinite(a) and a != 0):
                raise ValueError(f"alphas must be finite and non-zero, got {a!r}")
        names = list(activations or activation_names())
        for n in names:
            get_activation(n)  # raises with the valid names
        if alpha not in alphas:
            raise ValueError(f"alpha must be one of the slider's values {alphas}, got {alpha!r}")
        if activation not in names:
            raise ValueError(f"activation must be one of {names}, got {activation!r}")
        check_form(form)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_rank:
            raise ValueError(f"rank must be an integer in 1..{max_rank}, got {rank!r}")
        if static_html is not None and not isinstance(static_html, str):
            raise TypeError(f"static_html must be a str of HTML or None, got {type(static_html).__name__}")
        self.static_html = static_html

        self.seed = seed
        self.x = make_batch(seed=seed + 1)
        self._a, self._b = scatter_grid()
        # no built-in readout (its width varies with the text): .alpha_value shows α, and
        # the track runs from _TRACK_LEFT_PX to _TRACK_RIGHT_PX from the slider's edges
        self.alpha = W.SelectionSlider(options=[(f"{a:.3g}", a) for a in alphas], value=alpha,
                                       description="α", continuous_update=True, readout=False,
                                       style={"description_width": f"{_SLIDER_LABEL_PX}px"},
                                       layout=W.Layout(height=f"{SLIDER_HEIGHT_PX}px",
                                                       width=f"{_SLIDER_WIDTH_PX}px",
                                                       max_width="100%"))
        self.alpha_ticks = W.HTML(_ticks_html(alphas),
                                  layout=W.Layout(width=f"{_SLIDER_WIDTH_PX}px", max_width="100%"))
        self.alpha_value = W.HTML(layout=W.Layout(min_width="5.5em"))
        self.activation = W.Dropdown(options=names, value=activation, description="σ")
        self.form = W.Dropdown(options=list(FORMS), value=form, description="form")
        self.rank = W.IntSlider(min=1, max=max_rank, value=rank, description="rank r")
        self.readout = W.HTML()
        # the PNG (both figures) is 720 px wide; on a narrow screen it shrinks to the page
        self.image = W.Image(format="png", layout=W.Layout(width="100%", max_width=f"{_PLANE_FIG_PX[0]}px",
                                                           height="auto"))

        # its own margins (subplots_adjust): no layout engine, whatever the rcParams say
        # (figures.panel() turns on constrained layout for the book's figures)
        fig = Figure(figsize=(7.5, 3.4), dpi=80, layout="none")
        FigureCanvasAgg(fig)
        self.figure = fig
        self._ax_scale, self._ax_swap = fig.subplots(1, 2)
        self.scale_points = self._ax_scale.scatter([], [], s=14, color="C0")
        self.swap_points = self._ax_swap.scatter([], [], s=14, color="C3")
        self._diag = [ax.plot([], [], color="0.6", lw=1, zorder=0)[0]
                      for ax in (self._ax_scale, self._ax_swap)]
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.16, top=0.86, wspace=0.3)
        self._build_plane_figure(W)

        self._layer = None
        self._layer_key = None
        self._held = False
        for w in (self.alpha, self.activation, self.form, self.rank):
            w.observe(self.update, names="value")
        self.update()

    def _build_plane_figure(self, W) -> None:
        """The (a, b)-plane figure: the six heat maps of :data:`PLANE_PANELS` in two rows
        of three (the exchange; the scaling claim), each with a horizontal colour bar under
        it, at 96 dpi so that its 9.5 pt text is 9.5 pt in the 720 px wide image shown at
        natural size. Axes are placed by hand (no layout engine runs on each redraw).

        What changes with the controls (the maps, their titles, the colour bars' labels,
        the headings, the frame and diagonal drawn over each map) is *animated*: the rest
        (ticks, axis labels) is drawn once into a background that each redraw restores
        (blitting, :meth:`_plane_pixels`). A colour bar is a fixed picture of the colour
        map from −1 to 1; its labels say what ±1 stand for."""
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from .figures import RC

        self._plane_rc = {**RC, "axes.grid": False, "figure.constrained_layout.use": False}
        W_PX, H_PX, dpi = _PLANE_FIG_PX[0], _PLANE_FIG_PX[1], 96
        span = float(plane_axis()[-1])
        ext = (-span, span, -span, span)

        def box(x, y, w, h):   # pixels from the top left -> figure fraction
            return (x / W_PX, 1 - (y + h) / H_PX, w / W_PX, h / H_PX)

        animated = []
        with matplotlib.rc_context(self._plane_rc):
            fig = Figure(figsize=(W_PX / dpi, H_PX / dpi), dpi=dpi, layout="none")
            FigureCanvasAgg(fig)
            self.plane_images, self._plane_axes, self._plane_bars, self.plane_bar_labels = [], [], [], []
            for k in range(len(PLANE_PANELS)):
                row, col = divmod(k, 3)
                x = col * _PLANE_COL_PX + _PLANE_LEFT_PX
                y = _PLANE_TOP_PX + row * _PLANE_ROW_PX + _PLANE_HEAD_PX + _PLANE_TITLE_PX
                ax = fig.add_axes(box(x, y, _PLANE_SQUARE_PX, _PLANE_SQUARE_PX))
                im = ax.imshow(np.zeros((2, 2)), origin="lower", extent=ext, cmap=PLANE_CMAP,
                               vmin=-1, vmax=1, interpolation="nearest")
                (diag,) = ax.plot([-span, span], [-span, span], color="0.35", lw=0.8, ls=(0, (3, 3)))
                ax.set_xlabel("a = x·q", labelpad=1)
                ax.set_ylabel("b = x·k", labelpad=0)
                ax.set_xticks([-span, 0, span])
                ax.set_yticks([-span, 0, span])
                ax.set_title(" ", pad=3)
                by = y + _PLANE_SQUARE_PX + _PLANE_CBAR_GAP_PX
                cax = fig.add_axes(box(x, by, _PLANE_SQUARE_PX, _PLANE_CBAR_PX))
                bar = cax.imshow(np.linspace(-1, 1, 256)[None, :], cmap=PLANE_CMAP, vmin=-1,
                                 vmax=1, aspect="auto", interpolation="nearest")
                cax.set_xticks([])
                cax.set_yticks([])
                for spine in cax.spines.values():
                    spine.set_linewidth(0.5)
                ty = 1 - (by + _PLANE_CBAR_PX + 3) / H_PX
                labels = [fig.text((x + dx) / W_PX, ty, "", ha=ha, va="top")
                          for dx, ha in ((0, "left"), (_PLANE_SQUARE_PX / 2, "center"),
                                         (_PLANE_SQUARE_PX, "right"))]
                self.plane_images.append(im)
                self._plane_axes.append(ax)
                self._plane_bars.append(bar)
                self.plane_bar_labels.append(labels)
                animated += [im, diag, *ax.spines.values(), ax.title, bar, *cax.spines.values(), *labels]
            self.plane_headings = [fig.text(6 / W_PX,
                                            1 - (_PLANE_TOP_PX + row * _PLANE_ROW_PX + 4) / H_PX, "",
                                            va="top", ha="left", fontweight="bold")
                                   for row in range(2)]
        for a in animated + self.plane_headings:
            a.set_animated(True)
        self._plane_animated = animated + self.plane_headings
        self._plane_background = None
        self.plane_figure = fig

    def _draw_plane(self, form: str, act: str, alpha: float) -> None:
        p = explorer_planes(form, act, alpha)
        lim = p["limits"]
        col = 2 if form == "gated" else 3
        for im, ax, bar, labels, panel in zip(self.plane_images, self._plane_axes, self._plane_bars,
                                              self.plane_bar_labels, PLANE_PANELS):
            key, limit_key, title = panel[0], panel[1], panel[col]
            L = lim[limit_key]
            if L > 0:
                im.set_data(p[key])
                im.set_clim(-L, L)
                texts = (f"\u2212{L:.3g}", "0", f"+{L:.3g}")
            else:   # nothing to draw (a difference that is rounding of 0): blank, no scale
                im.set_data(np.zeros_like(p[key]))
                im.set_clim(-1, 1)
                texts = ("", "0 everywhere", "")
            for label, text in zip(labels, texts):
                label.set_text(text)
            bar.set_visible(L > 0)
            ax.title.set_text(title)
        for text, row in zip(self.plane_headings, ("exchange", "scaling")):
            text.set_text(plane_heading(row, lim))

    def _plane_pixels(self) -> np.ndarray:
        """The heat-map figure's RGBA pixels: the background (drawn once) restored, and the
        animated artists drawn over it."""
        import matplotlib

        fig = self.plane_figure
        with matplotlib.rc_context(self._plane_rc):
            if self._plane_background is None:
                fig.canvas.draw()
                self._plane_background = fig.canvas.copy_from_bbox(fig.bbox)
            fig.canvas.restore_region(self._plane_background)
            for a in self._plane_animated:
                if a.get_visible():
                    fig.draw_artist(a)
        return np.asarray(fig.canvas.buffer_rgba())

    def _png(self) -> bytes:
        """Both figures, the heat maps above the scatter plots (as on the website), as one
        PNG (zlib level 1: 18 ms to encode against 24 ms at the default 6, 11 % larger)."""
        from PIL import Image

        self.figure.canvas.draw()
        rows = [self._plane_pixels(), np.asarray(self.figure.canvas.buffer_rgba())]
        width = max(r.shape[1] for r in rows)
        rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255)
                for r in rows]
        buf = io.BytesIO()
        Image.fromarray(np.vstack(rows)).save(buf, format="png", compress_level=1)
        return buf.getvalue()

    # model --------------------------------------------------------------------------
    @property
    def layer(self):
        """The current fixed random layer (rebuilt only when form, σ or rank change)."""
        key = (self.form.value, self.activation.value, self.rank.value)
        if key != self._layer_key:
            self._layer = make_layer(*key, seed=self.seed)
            self._layer_key = key
        return self._layer

    def numbers(self) -> dict:
        """Current measurements (see :func:`qkmlp.book.explorer_model.measure`) plus the control values."""
        out = measure(self.layer, self.x, self.alpha.value)
        out.update(alpha=self.alpha.value, activation=self.activation.value,
                   form=self.form.value, rank=self.rank.value)
        return out

    # view ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self):
        """Set several controls with one redraw: ``with ex.hold(): ex.alpha.value = ...``."""
        self._held = True
        try:
            yield self
        finally:
            self._held = False
            self.update()

    def update(self, change=None) -> None:
        """Recompute the numbers and redraw the one figure in place."""
        if self._held:
            return
        with one_thread():
            nums = self.numbers()
        alpha, form, act = nums["alpha"], nums["form"], nums["activation"]
        p0, pa, ps = component_products(form, act, alpha, self._a, self._b)
        self.scale_points.set_offsets(np.column_stack([p0, pa]))
        self.swap_points.set_offsets(np.column_stack([pa, ps]))
        if form == "gated":
            labels = [("σ(a)·b", "σ(αa)·(b/α)"), ("σ(αa)·(b/α)", "σ(b/α)·(αa)")]
        else:
            labels = [("σ(ab)", "σ((αa)(b/α))"), ("σ((αa)(b/α))", "σ((b/α)(αa))")]
        titles = ["inverse scaling q→αq, k→k/α", "swap q↔k (at α)"]
        for ax, diag, (xs, ys), (xl, yl), title in zip(
            (self._ax_scale, self._ax_swap), self._diag,
            ((p0, pa), (pa, ps)), labels, titles,
        ):
            lo = float(min(xs.min(), ys.min()))
            hi = float(max(xs.max(), ys.max()))
            pad = 0.05 * (hi - lo) + 1e-9
            lo, hi = lo - pad, hi + pad
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            diag.set_data([lo, hi], [lo, hi])
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            ax.set_title(title, fontsize=10)
        self.figure.suptitle(f"{form}, σ = {act}, α = {alpha:.3g}, one rank component on a 7×7 (a, b) grid",
                             fontsize=10)
        self._draw_plane(form, act, alpha)
        self.image.value = self._png()          # one message: both figures change at once
        self.alpha_value.value = "α = " + f"{alpha:.3g}".replace("-", "\u2212")
        self.readout.value = self._readout_html(nums)

    @staticmethod
    def _readout_html(n: dict) -> str:
        def verdict(measured: float, predicted: bool) -> str:
            seen = "invariant" if measured < 1e-9 else "changes"
            want = "invariant" if predicted else "breaks"
            return f"<td>{_fmt(measured)}</td><td>{seen}</td><td>{want}</td>"

        pred = n["scale_predicted_change"]
        extra = "" if pred is None or pred == 0 else f" (theorem: exactly {_fmt(pred)})"
        return (
            "<style>.qkmlp-readout td, .qkmlp-readout th {padding: 2px 12px; text-align: left;}</style>"
            "<table class='qkmlp-readout'><tr><th></th><th>relative output change</th><th>measured</th><th>theorem</th></tr>"
            f"<tr><td>scaling by α</td>{verdict(n['scale_change'], n['scale_predicted_invariant'])}</tr>"
            f"<tr><td>swap q↔k</td>{verdict(n['swap_change'], n['swap_predicted_invariant'])}</tr>"
            f"</table>{extra}"
        )

    @property
    def widget(self):
        """The whole panel as one ipywidgets.VBox."""
        import ipywidgets as W

        if not hasattr(self, "_box"):
            wrap = W.Layout(flex_flow="row wrap")   # controls wrap onto lines on a phone
            slider = W.VBox([self.alpha, self.alpha_ticks], layout=W.Layout(max_width="100%"))
            self._box = W.VBox([
                W.HBox([slider, self.alpha_value], layout=wrap),
                W.HBox([self.activation, self.form, self.rank], layout=wrap),
                self.readout,
                self.image,
            ], layout=W.Layout(max_width="100%"))
        return self._box

    def _repr_mimebundle_(self, **kwargs):
        """The live widget view, plus ``text/html`` (``static_html``) where it was given."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if self.static_html is not None and bundle is not None:
            bundle = {**bundle, "text/html": self.static_html}
        return bundle


def symmetry_explorer(**kwargs) -> SymmetryExplorer:
    """Build a :class:`SymmetryExplorer` (keyword arguments as its constructor)."""
    return SymmetryExplorer(**kwargs)
