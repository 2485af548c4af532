"""The units whose exchange moves the starting loss most: a forward-pass search.

A matched control (:mod:`~.matching`) exchanges q and k in a random fraction of every
layer's units. A few units can carry most of the start's change (chapter 9: a unit that
writes a massive activation); a control whose draw leaves such a unit intact while the
symmetric arm breaks it is matched on the mean but not on what it breaks. This search
finds those units on the *validation* windows, with no unit chosen by hand:

1. **screen** every unit of every layer (30 × 1536 for SmolLM2) cheaply, at the trained
   model: the first-order change of the validation loss when that unit alone is exchanged
   (the loss gradient at the layer's output dotted with the change,
   :func:`~qkmlp.pretrained.units.unit_swap_costs`, ``predicted``) and the size of its
   change relative to the layer's output (``local``);
2. **price exactly** the ``top`` units of each ranking (their union): one forward pass each,
   the model with that unit alone exchanged, its validation start (mean over the
   validation texts of the mean window loss, as :func:`~.matching.start_loss`);
3. the units exchanged with the control are those of largest exact change
   (``n_select``, by default one); for the ``symmetric_top`` largest the start with that unit
   alone replaced by σ(a·b) is measured too (does σ(ab) break it as well?).

A unit's effect depends on the units around it (a unit harmless to exchange in the trained
model can move the start by nats once most others are exchanged). :func:`restore_search`
asks the question *in the symmetric arm's own model*: which unit, given back its gated form
σ(a)·b while every other unit keeps σ(a·b), lowers the σ(ab) arm's start most: the unit
σ(ab) breaks most, in context. Same screen (first order at the σ(ab) model, and local
size), same exact pricing. :func:`next_unit_search` asks it in a matched *control's* own
model: among the units the control leaves gated, which one, exchanged as well, moves its
start most (the unit its draw leaves intact that matters most where it stands).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

__all__ = ["UnitSymmetric", "UnitForm", "FORMS", "validation_start", "screen_units", "unit_search", "restore_search",
           "next_unit_search", "write_unit_search"]


class UnitSymmetric(nn.Module):
    """The rank-1 gated layer ``g`` with the units ``units`` computing σ(a·b) instead of
    σ(a)·b (σ the layer's activation), the others untouched: g(x) + Σ_j∈units [σ(a_j b_j) −
    σ(a_j) b_j] v_j."""

    def __init__(self, g, units):
        super().__init__()
        if getattr(g, "rank", None) != 1:
            raise ValueError("UnitSymmetric needs a rank-1 GatedMLP")
        idx = torch.as_tensor(list(units), dtype=torch.long)
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < g.d_hidden):
            raise IndexError(f"units must lie in [0, {g.d_hidden}), got {idx.tolist()}")
        self.g, self.units = g, idx

    def forward(self, x):
        q, k = self.g.query[self.units, 0], self.g.key[self.units, 0]
        a, b = x @ q.T, x @ k.T
        act = self.g.activation
        return self.g(x) + (act(a * b) - act(a) * b) @ self.g.value[self.units]


#: A rank-1 unit's coefficient as a function of a = x·q_j (gate) and b = x·k_j (up).
FORMS = {
    "gated": lambda act, a, b: act(a) * b,
    "swap": lambda act, a, b: act(b) * a,
    "symmetric": lambda act, a, b: act(a * b),
}


class UnitForm(nn.Module):
    """``base`` (any layer computing Σ_j c_j(x) v_j with ``old`` coefficients, on the weights
    of the rank-1 gated layer ``g``) with the units ``units`` computing the ``new`` form:
    base(x) + Σ_j∈units [new(a_j, b_j) − old(a_j, b_j)] v_j (forms of :data:`FORMS`)."""

    def __init__(self, base, g, units, *, old: str, new: str):
        super().__init__()
        if getattr(g, "rank", None) != 1:
            raise ValueError("UnitForm needs the weights of a rank-1 GatedMLP")
        for f in (old, new):
            if f not in FORMS:
                raise ValueError(f"unknown form {f!r}; expected one of {', '.join(FORMS)}")
        idx = torch.as_tensor(list(units), dtype=torch.long)
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < g.d_hidden):
            raise IndexError(f"units must lie in [0, {g.d_hidden}), got {idx.tolist()}")
        self.base, self.g, self.units, self.old, self.new = base, g, idx, old, new

    def forward(self, x):
        q, k = self.g.query[self.units, 0], self.g.key[self.units, 0]
        a, b = x @ q.T, x @ k.T
        act = self.g.activation
        return self.base(x) + (FORMS[self.new](act, a, b) - FORMS[self.old](act, a, b)) @ self.g.value[self.units]


def _validation(data) -> dict:
    if not data.validation:
        raise ValueError("the data hold no validation texts")
    return data.validation


@torch.no_grad()
def validation_start(model, data, eval_batch: int = 8) -> float:
    """Mean over the validation texts of the mean window loss of ``model`` as it is."""
    from .core import evaluate

    per = evaluate(model, _validation(data), eval_batch)
    return sum(sum(v) / len(v) for v in per.values()) / len(per)


def screen_units(model, data, *, eval_batch: int = 8) -> dict:
    """Per layer: ``predicted`` (m,) and ``local`` (m,) of
    :func:`~qkmlp.pretrained.units.unit_swap_costs` on the validation windows, the
    predicted change weighted so that it is a change of the validation *mean* (each text's
    windows averaged, then the texts)."""
    from ..surgery import gated_mlps

    gs = gated_mlps(model)
    predicted, local = _screen(model, gs, data, eval_batch, lambda l, x, grad: _swap_costs(gs[l], x, grad))
    return {"predicted": predicted, "local": local}


def _swap_costs(g, x, grad) -> tuple:
    """(predicted (m,), ‖Δ[·, j]‖²·‖v_j‖² (m,), ‖f(x)‖²) of exchanging each unit of ``g``
    alone (:func:`~qkmlp.pretrained.units.unit_swap_costs`)."""
    from ..units import unit_swap_costs

    c = unit_swap_costs(g, x, grad)
    with torch.no_grad():
        f2 = float((g(x.to(g.value.dtype)).double() ** 2).sum())
    # local = ||Δ_j|| ||v_j|| / ||f||; its square times ||f||² pools over the texts
    return c["predicted"], c["local"].double() ** 2 * f2, f2


def _screen(model, layers, data, eval_batch: int, costs) -> tuple[list, list]:
    """First-order screen of every unit of ``layers`` (the model's MLPs, or layers on their
    weights) on the validation texts, run through ``model``: ``costs(l, x, grad)`` gives
    layer l's (predicted (m,), squared change (m,), squared output) on one text's MLP
    inputs x (n, L, d) and loss gradient at its output. Returns per layer ``predicted``
    (m,), the mean over the texts (a change of the validation *mean*), and ``local`` (m,),
    the unit's change relative to the layer's output, pooled over the texts."""
    from ..heldout import layer_inputs
    from ..units import mlp_output_grads

    n = len(layers)
    predicted = [torch.zeros(g.d_hidden, dtype=torch.float64) for g in layers]
    sq = [torch.zeros(g.d_hidden, dtype=torch.float64) for g in layers]
    fsq = [0.0] * n
    texts = _validation(data)
    for ids in texts.values():
        grads = mlp_output_grads(model, ids, list(range(n)), batch_size=eval_batch)
        _, _, mlp_in = layer_inputs(model, ids, mlp_inputs=True)
        for l in range(n):
            p, s, f = costs(l, mlp_in[l], grads[l])
            predicted[l] += p.double() / len(texts)
            sq[l] += s
            fsq[l] += f
    return predicted, [(s / f).sqrt() for s, f in zip(sq, fsq)]


def _check_top(top, n_select) -> None:
    if not (isinstance(top, int) and top >= 1 and isinstance(n_select, int) and 1 <= n_select <= top):
        raise ValueError(f"need ints top >= 1 and 1 <= n_select <= top, got top={top!r}, n_select={n_select!r}")


def _ranks(by_pred: list, by_local: list, unit: tuple) -> dict:
    """Where ``unit`` (layer, j) stands in each ranking (1 = first; None when not in it)."""
    return {"rank_predicted": by_pred.index(unit) + 1 if unit in by_pred else None,
            "rank_local": by_local.index(unit) + 1 if unit in by_local else None}


def _top(scores: list, n: int) -> list[tuple[int, int]]:
    flat = torch.cat(scores)
    sizes = [len(s) for s in scores]
    order = torch.argsort(flat, descending=True, stable=True)[:n].tolist()
    out = []
    for i in order:
        l = 0
        while i >= sizes[l]:
            i -= sizes[l]
            l += 1
        out.append((l, i))
    return out


def unit_search(model, data, *, top: int = 12, n_select: int = 1, symmetric_top: int = 3, eval_batch: int = 8,
                log=None) -> dict:
    """Screen every unit, price the ``top`` of each ranking exactly, select ``n_select``
    (see the module docstring). ``model`` is left as it was. Returns ``base`` (the trained
    model's validation start), ``candidates`` (one dict per priced unit, largest exact change
    first: ``layer``, ``unit``, ``predicted``, ``local``, ``rank_predicted``, ``rank_local``,
    ``start``, ``change``, and ``symmetric_start``/``symmetric_change`` where measured),
    ``selected`` ([(layer, unit)], sorted) and ``n_units`` (units screened)."""
    from ..surgery import gated_mlps, mlps_replaced
    from ..units import partially_swapped

    _check_top(top, n_select)
    gs = gated_mlps(model)
    t0 = time.perf_counter()
    base = validation_start(model, data, eval_batch)
    s = screen_units(model, data, eval_batch=eval_batch)
    if log:
        log(f"screened {sum(len(p) for p in s['predicted'])} units ({time.perf_counter() - t0:.0f} s); "
            f"validation start {base:.4f}")
    by_pred, by_local = _top(s["predicted"], top), _top(s["local"], top)
    cands = list(dict.fromkeys(by_pred + by_local))
    rows = []
    for l, j in cands:
        with mlps_replaced(model, {l: partially_swapped(gs[l], [j])}):
            start = validation_start(model, data, eval_batch)
        rows.append({"layer": l, "unit": j, "predicted": float(s["predicted"][l][j]), "local": float(s["local"][l][j]),
                     **_ranks(by_pred, by_local, (l, j)),
                     "start": start, "change": start - base})
        if log:
            log(f"layer {l}, unit {j}: exchanged alone, validation start {start:.4f} ({start - base:+.4f})")
    rows.sort(key=lambda r: -r["change"])
    for r in rows[:symmetric_top]:
        with mlps_replaced(model, {r["layer"]: UnitSymmetric(gs[r["layer"]], [r["unit"]])}):
            r["symmetric_start"] = validation_start(model, data, eval_batch)
        r["symmetric_change"] = r["symmetric_start"] - base
        if log:
            log(f"layer {r['layer']}, unit {r['unit']}: sigma(ab) alone, start {r['symmetric_start']:.4f}")
    selected = sorted((r["layer"], r["unit"]) for r in rows[:n_select])
    return {"base": base, "candidates": rows, "selected": selected, "top": top, "n_select": n_select,
            "n_units": sum(len(p) for p in s["predicted"]), "wall_s": time.perf_counter() - t0}


def next_unit_search(model, data, control: str, *, top: int = 12, n_select: int = 1, restore_top: int = 3,
                     restore_in: str = "symmetric", eval_batch: int = 8, log=None) -> dict:
    """In the model of ``control`` (a partially swapped control, ``swapped-f0.xxx[+L…U…]``),
    among the units it leaves gated, those whose exchange as well, alone, moves its
    validation start most: screen them (first order at the control's model, and local
    size; the units the control already exchanges are left out), price the ``top`` of each
    ranking exactly, select the ``n_select`` of largest rise. For the ``restore_top``
    largest, the fall of ``restore_in``'s start when that unit alone is made gated again in
    its model is measured too (does σ(ab) break it?). ``model`` is left as it was. Returns
    ``control``, ``base`` (the control's start), ``candidates`` (largest ``change`` first),
    ``selected``, ``n_units`` (units screened: those the control leaves gated), ``wall_s``."""
    import copy

    from ..surgery import decoder_layers, gated_mlps, mlps_replaced
    from ..units import partially_swapped
    from .core import PARTIAL_SWAP, build_arm

    if not (isinstance(control, str) and PARTIAL_SWAP.match(control)):
        raise ValueError(f"control must be a partially swapped control swapped-f0.xxx[+L<l>U<u>...], got {control!r}")
    _check_top(top, n_select)
    t0 = time.perf_counter()
    gs = gated_mlps(model)
    bm = copy.deepcopy(model)
    cl = build_arm(bm, control)
    for layer in cl:
        layer.requires_grad_(False)
    free = [~(c.query_weight != g.query_weight).any(1) for c, g in zip(cl, gs)]     # units still gated
    base = validation_start(bm, data, eval_batch)
    pred, local = _screen(bm, cl, data, eval_batch, lambda l, x, grad: _swap_costs(cl[l], x, grad))
    out_of_play = float("-inf")
    pred = [torch.where(m, p, out_of_play) for m, p in zip(free, pred)]
    local = [torch.where(m, v, out_of_play) for m, v in zip(free, local)]
    n_free = int(sum(int(m.sum()) for m in free))
    if log:
        log(f"screened the {n_free} units {control} leaves gated ({time.perf_counter() - t0:.0f} s); "
            f"its validation start {base:.4f}")
    by_pred, by_local = _top(pred, top), _top(local, top)
    rows = []
    for l, j in dict.fromkeys(by_pred + by_local):
        with mlps_replaced(bm, {l: partially_swapped(cl[l], [j])}):
            start = validation_start(bm, data, eval_batch)
        rows.append({"layer": l, "unit": j, "predicted": float(pred[l][j]), "local": float(local[l][j]),
                     **_ranks(by_pred, by_local, (l, j)),
                     "start": start, "change": start - base})
        if log:
            log(f"layer {l}, unit {j}: exchanged as well, start {start:.4f} ({start - base:+.4f})")
    rows.sort(key=lambda r: -r["change"])
    if restore_top:
        sm = copy.deepcopy(model)
        sl = build_arm(sm, restore_in)
        old = {"symmetric": "symmetric", "swapped": "swap"}[restore_in]
        s_base = validation_start(sm, data, eval_batch)
        dl = decoder_layers(sm)
        for r in rows[:restore_top]:
            with mlps_replaced(sm, {r["layer"]: UnitForm(dl[r["layer"]].mlp, gs[r["layer"]], [r["unit"]], old=old,
                                                         new="gated")}):
                r[f"{restore_in}_restore_fall"] = s_base - validation_start(sm, data, eval_batch)
            if log:
                log(f"layer {r['layer']}, unit {r['unit']}: gated again alone in {restore_in}, "
                    f"fall {r[f'{restore_in}_restore_fall']:+.4f}")
        del sl
    return {"control": control, "base": base, "candidates": rows,
            "selected": sorted((r["layer"], r["unit"]) for r in rows[:n_select]), "top": top, "n_select": n_select,
            "n_units": n_free, "wall_s": time.perf_counter() - t0}


def write_unit_search(grid, path, *, top: int = 12, n_select: int = 1, restore_in=None, next_to=None,
                      command=None, log=None) -> Path:
    """:func:`unit_search` (or, with ``restore_in`` an arm, :func:`restore_search` in that
    arm's model; with ``next_to`` a control, :func:`next_unit_search` in that control's
    model) on ``grid``'s model and validation windows, written with its provenance to
    ``path`` (``{"meta", "search"}``)."""
    from ...runbase.provenance import IMPORT_GIT, machine, versions

    model, _, data = grid._base()
    c = grid.cfg
    if next_to is not None:
        found = next_unit_search(model, data, next_to, top=top, n_select=n_select, eval_batch=c["eval_batch"], log=log)
    elif restore_in is None:
        found = unit_search(model, data, top=top, n_select=n_select, eval_batch=c["eval_batch"], log=log)
    else:
        found = restore_search(model, data, base_arm=restore_in, top=top, n_select=n_select,
                               eval_batch=c["eval_batch"], log=log)
    meta = {"command": command, **IMPORT_GIT, "run_key": grid.key, "model": grid.model_id,
            "validation_texts": list(c["validation_texts"]), "n_windows": c["n_windows"], "seq_len": c["seq_len"],
            "versions": versions("transformers"), "machine": machine(), "wall_s": found["wall_s"],
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "search": found}, indent=1) + "\n")
    return path


@torch.no_grad()
def _form_costs(g, x: torch.Tensor, grad: torch.Tensor, old: str, new: str) -> dict:
    """Per unit j of the rank-1 gated weights ``g`` on inputs x (n, L, d) with the loss
    gradient ``grad`` at the layer's output: ``predicted`` (m,), the first-order change of the
    mean window loss when unit j alone goes from form ``old`` to ``new``, and ``sq`` (m,) and
    ``f_sq``: ‖Δ[·, j]‖²·‖v_j‖² and ‖f_old(x)‖² (for the local size, pooled over texts)."""
    q, k = g.query[:, 0].detach().double(), g.key[:, 0].detach().double()
    v = g.value.detach().double()
    x, grad = x.detach().double(), grad.detach().double()
    a, b = x @ q.T, x @ k.T
    act = g.activation
    base = FORMS[old](act, a, b)
    delta = FORMS[new](act, a, b) - base
    predicted = ((grad @ v.T) * delta).sum(1).mean(0)
    return {"predicted": predicted, "sq": delta.pow(2).sum((0, 1)) * v.norm(dim=1) ** 2,
            "f_sq": float((base @ v).pow(2).sum())}


def restore_search(model, data, *, base_arm: str = "symmetric", top: int = 12, n_select: int = 1,
                   exchange_top: int = 3, eval_batch: int = 8, log=None) -> dict:
    """In ``base_arm``'s model (every MLP of ``model`` replaced by that arm's layer, σ(a·b)
    for ``"symmetric"``), the units whose return to the gated form σ(a)·b, alone, lowers
    the validation start most: screen every unit (first-order ``predicted`` fall, and
    ``local`` size relative to the layer's output), price the ``top`` of each ranking
    exactly, select the ``n_select`` of largest exact fall. For the ``exchange_top``
    largest, the start of the *trained* model with that unit alone exchanged is measured
    too. ``model`` is left as it was. Returns ``base`` (the arm's validation start),
    ``trained`` (the trained model's), ``candidates`` (largest ``fall`` first: ``layer``,
    ``unit``, ``predicted_fall``, ``local``, ranks, ``start``, ``fall`` and, where measured,
    ``exchange_change``), ``selected``, ``n_units``, ``wall_s``."""
    import copy

    from ..surgery import decoder_layers, gated_mlps, mlps_replaced
    from ..units import partially_swapped
    from .core import build_arm

    forms = {"symmetric": "symmetric", "swapped": "swap"}
    if base_arm not in forms:
        raise ValueError(f"base_arm must be one of {sorted(forms)} (an arm whose units have a form in FORMS), "
                         f"got {base_arm!r}")
    _check_top(top, n_select)
    old = forms[base_arm]
    t0 = time.perf_counter()
    gs = gated_mlps(model)
    bm = copy.deepcopy(model)
    base_layers = build_arm(bm, base_arm)
    for layer in base_layers:
        layer.requires_grad_(False)
    trained = validation_start(model, data, eval_batch)
    base = validation_start(bm, data, eval_batch)

    def fall(l, x, grad):                           # a fall of the start is positive
        c = _form_costs(gs[l], x, grad, old, "gated")
        return -c["predicted"], c["sq"], c["f_sq"]

    pred, local = _screen(bm, gs, data, eval_batch, fall)
    if log:
        log(f"screened {sum(len(p) for p in pred)} units at {base_arm} ({time.perf_counter() - t0:.0f} s); "
            f"its validation start {base:.4f}, the trained model's {trained:.4f}")
    by_pred, by_local = _top(pred, top), _top(local, top)
    rows = []
    dl = decoder_layers(bm)
    for l, j in dict.fromkeys(by_pred + by_local):
        with mlps_replaced(bm, {l: UnitForm(dl[l].mlp, gs[l], [j], old=old, new="gated")}):
            start = validation_start(bm, data, eval_batch)
        rows.append({"layer": l, "unit": j, "predicted_fall": float(pred[l][j]), "local": float(local[l][j]),
                     **_ranks(by_pred, by_local, (l, j)),
                     "start": start, "fall": base - start})
        if log:
            log(f"layer {l}, unit {j}: gated again alone in {base_arm}, start {start:.4f} (fall {base - start:+.4f})")
    rows.sort(key=lambda r: -r["fall"])
    for r in rows[:exchange_top]:
        with mlps_replaced(model, {r["layer"]: partially_swapped(gs[r["layer"]], [r["unit"]])}):
            r["exchange_change"] = validation_start(model, data, eval_batch) - trained
        if log:
            log(f"layer {r['layer']}, unit {r['unit']}: exchanged alone in the trained model, "
                f"start change {r['exchange_change']:+.4f}")
    return {"base_arm": base_arm, "base": base, "trained": trained, "candidates": rows,
            "selected": sorted((r["layer"], r["unit"]) for r in rows[:n_select]), "top": top, "n_select": n_select,
            "n_units": sum(len(p) for p in pred), "wall_s": time.perf_counter() - t0}
