"""Interactive symmetry explorer (model/view) and the measurements behind it.

Two layers of code:

- **Measurements** (no ipywidgets needed): :func:`make_layer`, :func:`make_batch`,
  :func:`measure`, :func:`component_products`, :func:`exchange_plane`, :func:`scaling_sweep`. They also feed the
  static HTML explorer (:mod:`qkmlp.book.static_explorer`) and the chapter "Symmetry breaking".
- **View**: :class:`SymmetryExplorer`, an ipywidgets panel whose controls are attributes
  (``.alpha``, ``.activation``, ``.form``, ``.rank``) and whose current measurements are
  :meth:`SymmetryExplorer.numbers`. Its figure is one matplotlib ``Figure`` updated in
  place (``set_offsets`` on existing artists) and shown as PNG bytes in an
  ``ipywidgets.Image``, so moving a control never piles up figures or flickers. A second
  figure draws the unit's function on the (a, b) plane (:func:`exchange_plane`): the unit,
  its swap and their difference as heat maps, updated in place the same way. Both figures
  are stacked into one PNG, so the two redraw together, in one update of one image.

Where it is shown: in a running kernel (JupyterLab) the live panel; where no kernel runs
(the website), the static HTML explorer given as ``static_html``. The panel's display
bundle carries both, the live widget view and that ``text/html``: JupyterLab renders the
widget view before HTML, and the book's Sphinx build ranks ``text/html`` first
(``nb_mime_priority_overrides`` in ``_config.yml``).

What is measured, for a fixed random layer (float64) and batch x:

- ``scale_change``: ‖f_α(x) − f(x)‖/‖f(x)‖ with f_α = ``rescaled(layer, α)``
  (q → αq, k → k/α).
- ``swap_change``: the same for q ↔ k, applied *at the current point of the scaling
  orbit*: f_α versus ``swapped(rescaled(layer, α))``. At α = 1 this is the plain swap; for
  other α it shows that moving along the scaling orbit never repairs a broken swap.
"""
from __future__ import annotations

import contextlib
import io
import math
from typing import Optional, Sequence

import numpy as np
import torch

from .._checks import positive_int
from ..activations import activation_names, get_activation
from ..layers import GatedMLP, SymmetricBilinearMLP
from ..symmetry import (
    relative_change,
    rescaled,
    rescaling_is_symmetry,
    swap_is_symmetry,
    swapped,
)

__all__ = [
    "FORMS",
    "PLANE_CMAP",
    "SLIDER_HEIGHT_PX",
    "SLIDER_TRACK_PX",
    "alpha_ticks",
    "default_alphas",
    "one_thread",
    "make_layer",
    "make_batch",
    "measure",
    "predicted_scale_change",
    "component_products",
    "plane_axis",
    "exchange_plane",
    "scaling_sweep",
    "SymmetryExplorer",
    "symmetry_explorer",
]

#: The two rank-r forms the explorer compares.
FORMS = ("gated", "symmetric")
_LAYERS = {"gated": GatedMLP, "symmetric": SymmetricBilinearMLP}

#: Diverging colour map of the (a, b)-plane heat maps (chapter 5's unit pictures use it too).
PLANE_CMAP = "PuOr_r"
#: Height of the α slider, CSS px: a touch target at least 44 px tall.
SLIDER_HEIGHT_PX = 44
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

#: Default sizes of the explorer's fixed random layer and batch.
D_MODEL, D_HIDDEN, BATCH = 8, 16, 64


@contextlib.contextmanager
def one_thread():
    """Run torch on one CPU thread inside the block (restored after).

    The explorer's layers are tiny (8×16): for them thread start-up costs more than the
    arithmetic, by 10× on a busy 2-core machine.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def default_alphas(max_alpha: float = 4.0, steps_per_octave: int = 4) -> list[float]:
    """Log-spaced α grid, negative and positive: ±2^(k/steps), |α| ≤ max_alpha, sorted.

    Contains ±1 and every power of two in range exactly.
    """
    if not (math.isfinite(max_alpha) and max_alpha >= 1):
        raise ValueError(f"max_alpha must be a finite number >= 1, got {max_alpha!r}")
    positive_int(steps_per_octave, "steps_per_octave")
    kmax = int(math.floor(math.log2(max_alpha) * steps_per_octave + 1e-9))
    pos = [2.0 ** (k / steps_per_octave) for k in range(-kmax, kmax + 1)]
    return [-a for a in reversed(pos)] + pos


def _alpha_label(a: float) -> str:
    return f"{a:g}".replace("-", "\u2212")


def alpha_ticks(alphas: Sequence[float]) -> list[tuple[int, float, Optional[str]]]:
    """The α slider's tick marks: ``(index, fraction, label)`` for each value of
    ``alphas`` that is ± a power of two or an end of the track, where
    ``fraction = index / (len(alphas) − 1)`` is the handle's position along the track (a
    selection slider spaces its values evenly).

    Labelled (``label`` a string such as ``"−1"``): α = −1, α = 1 and the two ends; the
    other ticks have ``label`` None.
    """
    alphas = [float(a) for a in alphas]
    if len(alphas) < 2:
        raise ValueError(f"alphas must hold at least 2 values, got {len(alphas)}")
    last = len(alphas) - 1
    out = []
    for i, a in enumerate(alphas):
        if not (math.isfinite(a) and a != 0):
            raise ValueError(f"alphas must be finite and non-zero, got {a!r}")
        labelled = abs(a) == 1 or i in (0, last)
        if labelled or math.log2(abs(a)) % 1 == 0:
            out.append((i, i / last, _alpha_label(a) if labelled else None))
    return out


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


def _check_form(form: str) -> str:
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; expected one of {', '.join(FORMS)}")
    return form


def make_layer(form: str, activation, rank: int = 1, *, d_model: int = D_MODEL,
               d_hidden: int = D_HIDDEN, seed: int = 0):
    """The explorer's fixed random float64 layer: ``GatedMLP`` or ``SymmetricBilinearMLP``.

    The weights depend only on (rank, sizes, seed), not on the form or the activation, so
    switching either compares the same weights.
    """
    cls = _LAYERS[_check_form(form)]
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return cls(d_model, d_hidden, rank=rank, activation=activation, dtype=torch.float64)
    finally:
        torch.random.set_rng_state(gen_state)


def make_batch(d_model: int = D_MODEL, n: int = BATCH, *, seed: int = 1) -> torch.Tensor:
    """A fixed standard-normal float64 batch, shape (n, d_model)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_model, generator=g, dtype=torch.float64)


def predicted_scale_change(layer, alpha: float) -> Optional[float]:
    """What the theorems predict for ``scale_change``, or ``None`` where they say only "breaks".

    0 where inverse scaling is a symmetry. For the gated form with degree-p homogeneous σ:
    α > 0 multiplies the output by α^(p−1), so the relative change is |α^(p−1) − 1|; α < 0
    turns f(x) into |α|^(p−1) f(−x), which for odd σ is |α|^(p−1) f(x), a relative change
    of ||α|^(p−1) − 1|.
    """
    if rescaling_is_symmetry(layer, alpha):
        return 0.0
    act = layer.activation
    p = act.homogeneity_degree
    if isinstance(layer, GatedMLP) and p is not None:
        if alpha > 0:
            return abs(alpha ** (p - 1) - 1.0)
        if act.is_odd:
            return abs(abs(alpha) ** (p - 1) - 1.0)
    return None


def measure(layer, x: torch.Tensor, alpha: float) -> dict:
    """Measured relative changes at α and the theorems' predictions.

    layer: a ``GatedMLP`` or ``SymmetricBilinearMLP``; x: a batch of shape (n, d_model);
    alpha: a finite non-zero float.
    Returns ``scale_change``, ``swap_change`` (floats, see the module docstring),
    ``scale_predicted_invariant``, ``swap_predicted_invariant`` (bools from
    :func:`qkmlp.symmetry.rescaling_is_symmetry` and :func:`~qkmlp.symmetry.swap_is_symmetry`)
    and ``scale_predicted_change`` (float or ``None``, :func:`predicted_scale_change`).
    """
    moved = rescaled(layer, alpha)
    return {
        "scale_change": relative_change(layer, moved, x),
        "swap_change": relative_change(moved, swapped(moved), x),
        "scale_predicted_invariant": bool(rescaling_is_symmetry(layer, alpha)),
        "swap_predicted_invariant": bool(swap_is_symmetry(layer)),
        "scale_predicted_change": predicted_scale_change(layer, alpha),
    }


def component_products(form: str, activation, alpha: float, a, b):
    """One rank component's contribution before, after scaling, and after swapping.

    With a = x·q and b = x·k (arrays of equal shape), returns three numpy arrays:
    gated: σ(a)b, σ(αa)(b/α), σ(b/α)(αa); symmetric: σ(ab), σ((αa)(b/α)), σ((b/α)(αa)).
    The first two are the explorer's "scaling" scatter; the last two its "swap" scatter.
    """
    _check_form(form)
    sigma = get_activation(activation)
    a = torch.as_tensor(np.asarray(a, dtype=np.float64))
    b = torch.as_tensor(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    qa, kb = alpha * a, b / alpha
    if form == "gated":
        out = (sigma(a) * b, sigma(qa) * kb, sigma(kb) * qa)
    else:
        out = (sigma(a * b), sigma(qa * kb), sigma(kb * qa))
    return tuple(t.numpy() for t in out)


def plane_axis(n: int = 17, span: float = 2.0) -> np.ndarray:
    """The n grid values of a (and of b) in [−span, span] that :func:`exchange_plane` uses."""
    n = positive_int(n, "n")
    if n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if isinstance(span, bool) or not isinstance(span, (int, float)) or not (math.isfinite(span) and span > 0):
        raise ValueError(f"span must be a finite number > 0, got {span!r}")
    return np.linspace(-span, span, n)


def exchange_plane(form: str, activation, alpha: float, *, n: int = 17, span: float = 2.0) -> dict:
    """One rank component's function on the (a, b) plane at α, and its swap: what the
    explorer's heat maps draw.

    a = x·q and b = x·k are the projections of the *unmoved* layer, as in
    :func:`component_products`; α moves the layer along the scaling orbit (q → αq,
    k → k/α), so the unit is gated σ(αa)·(b/α), symmetric σ((αa)(b/α)), and its swap
    (q ↔ k at α) gated σ(b/α)·(αa), symmetric σ((b/α)(αa)). At α = 1 the swap is the unit
    reflected in the diagonal a = b.

    Returns ``{"a": axis, "b": axis, "unit", "swap", "difference"}``: ``axis`` is
    :func:`plane_axis` (n values in [−span, span]); the three (n, n) float64 arrays are
    indexed ``[i, j]`` at b = axis[i], a = axis[j] (rows are b, so
    ``imshow(unit, origin="lower")`` puts a across and b up); ``difference`` is
    unit − swap, zero exactly where the exchange is a symmetry of the unit.
    """
    _check_form(form)
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha != 0):
        raise ValueError(f"alpha must be finite and non-zero, got {alpha!r}")
    g = plane_axis(n, span)
    b, a = np.meshgrid(g, g, indexing="ij")      # b varies along rows, a along columns
    _, unit, swap = component_products(form, activation, alpha, a, b)
    return {"a": g, "b": g, "unit": unit, "swap": swap, "difference": unit - swap}


def scaling_sweep(form: str, alphas: Sequence[float], activations: Optional[Sequence[str]] = None,
                  rank: int = 1, *, seed: int = 0) -> dict:
    """``scale_change`` for every activation and α: {name: float64 array of len(alphas)}."""
    x = make_batch(seed=seed + 1)
    out = {}
    with one_thread():
        for name in activations or activation_names():
            layer = make_layer(form, name, rank, seed=seed)
            out[name] = np.array([relative_change(layer, rescaled(layer, a), x) for a in alphas])
    return out


# --- the ipywidgets view ----------------------------------------------------------------

def _grid(n: int = 7, span: float = 2.0):
    """The (a, b) grid of the scatter plots, flattened: two arrays of n² points."""
    g = np.linspace(-span, span, n)
    a, b = np.meshgrid(g, g, indexing="ij")
    return a.ravel(), b.ravel()


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
    ``.figure`` is the matplotlib Figure; ``.scale_points`` / ``.swap_points`` its two
    scatter artists. ``.plane_figure`` draws :func:`exchange_plane` at the current form, σ
    and α: ``.plane_images`` are its three heat maps (unit, swap, unit − swap) on one colour
    scale symmetric about 0 (the largest magnitude of the three). ``.image``, one
    ipywidgets.Image, shows both figures stacked in one PNG, so they change together.

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
        _check_form(form)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_rank:
            raise ValueError(f"rank must be an integer in 1..{max_rank}, got {rank!r}")
        if static_html is not None and not isinstance(static_html, str):
            raise TypeError(f"static_html must be a str of HTML or None, got {type(static_html).__name__}")
        self.static_html = static_html

        self.seed = seed
        self.x = make_batch(seed=seed + 1)
        self._a, self._b = _grid()
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
        # the PNG (both figures) is 600 px wide; on a narrow screen it shrinks to the page
        self.image = W.Image(format="png", layout=W.Layout(width="100%", max_width="600px",
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
        """The (a, b)-plane figure: three heat maps and one colour bar, drawn at 96 dpi so
        its 9.5 pt text is 9.5 pt in a 600 px wide image shown at natural size."""
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from .figures import RC

        self._plane_rc = {**RC, "axes.grid": False}
        with matplotlib.rc_context(self._plane_rc):
            fig = Figure(figsize=(6.25, 2.45), dpi=96)
            FigureCanvasAgg(fig)
            axes = fig.subplots(1, 3, sharex=True, sharey=True)
            span = float(plane_axis()[-1])
            ext = (-span, span, -span, span)
            self.plane_images = [ax.imshow(np.zeros((2, 2)), origin="lower", extent=ext,
                                           cmap=PLANE_CMAP, vmin=-1, vmax=1, interpolation="nearest")
                                 for ax in axes]
            for ax in axes:
                ax.plot([-span, span], [-span, span], color="0.35", lw=0.8, ls=(0, (3, 3)))
                ax.set_xlabel("a = x·q")
                ax.set_xticks([-span, 0, span])
                ax.set_yticks([-span, 0, span])
            axes[0].set_ylabel("b = x·k")
            self._plane_colorbar = fig.colorbar(self.plane_images[0], ax=list(axes), shrink=0.9,
                                                aspect=15, pad=0.02)
        self.plane_figure, self._plane_axes = fig, list(axes)

    def _draw_plane(self, form: str, act: str, alpha: float) -> None:
        import matplotlib

        p = exchange_plane(form, act, alpha)
        vmax = float(max(np.abs(p[k]).max() for k in ("unit", "swap", "difference"))) or 1.0
        if form == "gated":
            titles = ("σ(αa)·(b/α)", "swap: σ(b/α)·(αa)", "unit − swap")
        else:
            titles = ("σ((αa)(b/α))", "swap: σ((b/α)(αa))", "unit − swap")
        with matplotlib.rc_context(self._plane_rc):
            for im, ax, key, title in zip(self.plane_images, self._plane_axes,
                                          ("unit", "swap", "difference"), titles):
                im.set_data(p[key])
                im.set_clim(-vmax, vmax)
                ax.set_title(title)
            self.plane_figure.suptitle(f"{form}, σ = {act}, α = {alpha:.3g}: one rank component "
                                       "on the (a, b) plane")

    def _png(self) -> bytes:
        """Both figures, the scatter plots above the heat maps, as one PNG."""
        import matplotlib
        from PIL import Image

        rows = []
        for fig, rc in ((self.figure, {}), (self.plane_figure, self._plane_rc)):
            with matplotlib.rc_context(rc):
                fig.canvas.draw()
            rows.append(np.asarray(fig.canvas.buffer_rgba()))
        width = max(r.shape[1] for r in rows)
        rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255)
                for r in rows]
        buf = io.BytesIO()
        Image.fromarray(np.vstack(rows)).save(buf, format="png")
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
        """Current measurements (see :func:`measure`) plus the control values."""
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
