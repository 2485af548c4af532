"""What the symmetry explorers measure and draw, without a view (no ipywidgets).

Both explorers show these: the live panel (:class:`qkmlp.book.widgets.SymmetryExplorer`)
and the website's static HTML (:mod:`qkmlp.book.static_explorer`), so the two show the same
numbers and the same panels.

- A fixed random float64 layer and batch (:func:`make_layer`, :func:`make_batch`) and the
  relative changes under the inverse scaling and the exchange (:func:`measure`), with what
  the theorems predict.
- One rank component on a grid of projections (:func:`component_products`,
  :func:`scatter_grid`): the scatter plots.
- One rank component over the (a, b) plane (:func:`explorer_planes`): the six heat maps of
  :data:`PLANE_PANELS` in two rows, the exchange (:func:`exchange_plane`) and the scaling
  claim (:func:`scaling_plane`: the unit at α against the unit at 1), with their colour
  limits (a difference on its own scale, :func:`difference_limit`) and headings
  (:func:`plane_heading`).

What is measured, for a fixed random layer (float64) and batch x:

- ``scale_change``: ‖f_α(x) − f(x)‖/‖f(x)‖ with f_α = ``rescaled(layer, α)``
  (q → αq, k → k/α).
- ``swap_change``: the same for q ↔ k, applied *at the current point of the scaling
  orbit*: f_α versus ``swapped(rescaled(layer, α))``. At α = 1 this is the plain swap; for
  other α it shows that moving along the scaling orbit never repairs a broken swap.
"""
from __future__ import annotations

import contextlib
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
    "FORMS", "PLANE_CMAP", "SLIDER_HEIGHT_PX", "D_MODEL", "D_HIDDEN", "BATCH",
    "one_thread", "default_alphas", "alpha_ticks", "check_form", "make_layer", "make_batch",
    "predicted_scale_change", "measure", "component_products", "scatter_grid", "scaling_sweep",
    "plane_axis", "exchange_plane", "scaling_plane", "ZERO_RTOL", "difference_limit",
    "PLANE_PANELS", "PLANE_ROWS", "explorer_planes", "plane_heading",
]

#: The two rank-r forms the explorer compares.
FORMS = ("gated", "symmetric")
_LAYERS = {"gated": GatedMLP, "symmetric": SymmetricBilinearMLP}

#: Diverging colour map of the (a, b)-plane heat maps (chapter 5's unit pictures use it too).
PLANE_CMAP = "PuOr_r"
#: Height of both explorers' α slider, CSS px: a touch target at least 44 px tall.
SLIDER_HEIGHT_PX = 44

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


def check_form(form: str) -> str:
    """``form`` if it is one of :data:`FORMS`, else a ValueError naming them."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; expected one of {', '.join(FORMS)}")
    return form


def make_layer(form: str, activation, rank: int = 1, *, d_model: int = D_MODEL,
               d_hidden: int = D_HIDDEN, seed: int = 0):
    """The explorer's fixed random float64 layer: ``GatedMLP`` or ``SymmetricBilinearMLP``.

    The weights depend only on (rank, sizes, seed), not on the form or the activation, so
    switching either compares the same weights.
    """
    cls = _LAYERS[check_form(form)]
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
    check_form(form)
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
    check_form(form)
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha != 0):
        raise ValueError(f"alpha must be finite and non-zero, got {alpha!r}")
    g = plane_axis(n, span)
    b, a = np.meshgrid(g, g, indexing="ij")      # b varies along rows, a along columns
    _, unit, swap = component_products(form, activation, alpha, a, b)
    return {"a": g, "b": g, "unit": unit, "swap": swap, "difference": unit - swap}


def scaling_plane(form: str, activation, alpha: float, *, n: int = 17, span: float = 2.0) -> dict:
    """One rank component on the (a, b) plane at α and at α = 1: the scaling claim drawn.

    Lemma "inverse scaling reduces to commuting with α" (chapter 5): the inverse scaling
    q → αq, k → k/α keeps the gated unit for all weights iff σ(αz) = α σ(z) for all z.
    Here the unit at α, gated σ(αa)·(b/α), symmetric σ((αa)(b/α)), is set against the
    unit at 1, σ(a)·b or σ(ab), with a = x·q and b = x·k of the unmoved layer.

    Returns ``{"a": axis, "b": axis, "unit", "unit_at_1", "difference"}``: ``axis`` is
    :func:`plane_axis`; the (n, n) float64 arrays are indexed ``[i, j]`` at b = axis[i],
    a = axis[j], as in :func:`exchange_plane`; ``difference`` is unit − unit_at_1, zero
    (up to float rounding of α·(b/α)) exactly where the scaling by α keeps the unit.
    """
    check_form(form)
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha != 0):
        raise ValueError(f"alpha must be finite and non-zero, got {alpha!r}")
    g = plane_axis(n, span)
    b, a = np.meshgrid(g, g, indexing="ij")
    at1, unit, _ = component_products(form, activation, alpha, a, b)
    return {"a": g, "b": g, "unit": unit, "unit_at_1": at1, "difference": unit - at1}


#: A difference map whose largest magnitude is at most this fraction of the maps' largest
#: magnitude is float rounding of an exact zero (α·a·(b/α) against a·b): it is drawn as 0.
ZERO_RTOL = 1e-12


def difference_limit(difference, scale: float, *, rtol: float = ZERO_RTOL) -> float:
    """The limit L of a difference map's own diverging colour scale [−L, L] (centred at 0).

    L is the largest |difference|, so that the largest difference takes the darkest colour
    however small it is against the maps it compares (1 % of them is as visible as 100 %;
    the colour bar's numbers say which). 0.0 where that is at most ``rtol`` × ``scale``
    (the compared maps' largest magnitude): rounding of an exact zero, drawn blank.
    """
    d = np.asarray(difference, dtype=np.float64)
    if not np.isfinite(d).all():
        raise ValueError("difference must be finite")
    scale = float(scale)
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    top = float(np.abs(d).max()) if d.size else 0.0
    return top if top > rtol * scale else 0.0


#: The explorer's six heat maps, row by row (the exchange, then the scaling claim): the key
#: of :func:`explorer_planes` each one draws, the key of its colour limit in
#: ``explorer_planes(...)["limits"]``, and its titles for the gated and the symmetric form.
PLANE_PANELS = (
    ("unit", "maps", "unit at α: σ(αa)·(b/α)", "unit at α: σ((αa)(b/α))"),
    ("swap", "maps", "swap at α: σ(b/α)·(αa)", "swap at α: σ((b/α)(αa))"),
    ("exchange_difference", "exchange_difference", "unit − swap", "unit − swap"),
    ("unit_at_1", "maps", "unit at 1: σ(a)·b", "unit at 1: σ(ab)"),
    ("unit", "maps", "unit at α: σ(αa)·(b/α)", "unit at α: σ((αa)(b/α))"),
    ("scaling_difference", "scaling_difference", "unit at α − unit at 1", "unit at α − unit at 1"),
)


def explorer_planes(form: str, activation, alpha: float, *, n: int = 17, span: float = 2.0) -> dict:
    """Everything the explorer's heat maps draw at (form, σ, α): :data:`PLANE_PANELS`.

    Returns ``a``, ``b`` (the axis), the (n, n) maps ``unit`` (at α), ``swap`` (q ↔ k at
    α), ``unit_at_1``, ``exchange_difference`` (unit − swap, :func:`exchange_plane`) and
    ``scaling_difference`` (unit − unit_at_1, :func:`scaling_plane`), and ``limits``: the
    colour limits, ``maps`` (the largest magnitude of unit, swap and unit_at_1, one scale
    for the three so that they compare) and one per difference (:func:`difference_limit`).
    """
    ex = exchange_plane(form, activation, alpha, n=n, span=span)
    sc = scaling_plane(form, activation, alpha, n=n, span=span)
    maps = max(float(np.abs(m).max()) for m in (ex["unit"], ex["swap"], sc["unit_at_1"]))
    return {"a": ex["a"], "b": ex["b"], "unit": ex["unit"], "swap": ex["swap"],
            "unit_at_1": sc["unit_at_1"], "exchange_difference": ex["difference"],
            "scaling_difference": sc["difference"],
            "limits": {"maps": maps,
                       "exchange_difference": difference_limit(ex["difference"], maps),
                       "scaling_difference": difference_limit(sc["difference"], maps)}}


#: The two rows of heat maps (:data:`PLANE_PANELS`, three each) and their headings' names.
PLANE_ROWS = {"exchange": "Exchange q ↔ k at α", "scaling": "Inverse scaling q → αq, k → k/α"}


def plane_heading(row: str, limits: dict) -> str:
    """The heading over a row of heat maps (``row``: "exchange" or "scaling"): what the row
    compares and its largest |difference|, also as a percentage of the maps' largest
    |value| (``limits`` as :func:`explorer_planes` returns them), computed from the two
    limits rounded to 3 significant digits as the static explorer stores them, so that both
    explorers print the same heading."""
    if row not in PLANE_ROWS:
        raise ValueError(f"row must be one of {', '.join(PLANE_ROWS)}, got {row!r}")
    d, m = (float(f"{limits[k]:.3g}") for k in (f"{row}_difference", "maps"))
    if d == 0:
        return f"{PLANE_ROWS[row]}: difference 0 everywhere"
    return f"{PLANE_ROWS[row]}: max |difference| = {d:.3g} ({float(f'{100 * d / m:.2g}'):g} % of the maps' max)"


def scatter_grid(n: int = 7, span: float = 2.0):
    """The (a, b) grid of the scatter plots, flattened: two arrays of n² points."""
    g = np.linspace(-span, span, n)
    a, b = np.meshgrid(g, g, indexing="ij")
    return a.ravel(), b.ravel()


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
