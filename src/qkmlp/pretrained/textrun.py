"""The measurements on one held-out text, in jobs a process pool can share out.

For one text and one model, :func:`prepare` records the residual stream and what every
MLP receives on the text's windows, and from them the input statistics, the outliers by
position, the size of every intervention (the relative change of the layer's output on
those inputs) and the loss of every intervention applied to all layers at once;
:func:`layer_part` prices the per-layer interventions of some of the layers (a change
in layer l reruns only layers l and later from the recorded stream); :func:`unit_part`
ranks the units of a few layers by their estimated exchange cost and checks the ranking
with exact passes of groups of units. Each returns a JSON-ready dict that
:func:`merge` puts together; :mod:`qkmlp.pretrained.runner` runs them.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .anatomy import alignment_bins, input_statistics, pair_geometry, summarise
from .heldout import layer_inputs, nll_from_hidden, tail_losses, window_losses
from .outliers import residual_outliers, unit_peaks
from .probes import mean_input_probes, norm_gain
from .surgery import PARAMETRISED, decoder_layers, gated_mlps, mlps_replaced, replace_mlps, variant
from .units import mlp_output_grads, pair_distance, partially_swapped, unit_swap_costs

__all__ = ["key", "parse_key", "expand", "spearman", "Recorded", "record", "prepare", "layer_part",
           "unit_part", "merge"]


def key(kind: str, param: Optional[float] = None) -> str:
    """The results key of an intervention: ``"swap"``, ``"rescale:2"``, ``"toward_swap:0.25"``."""
    return kind if param is None else f"{kind}:{float(param):g}"


def parse_key(k: str) -> tuple[str, Optional[float]]:
    """Inverse of :func:`key`: ``"rescale:0.5"`` -> ``("rescale", 0.5)``."""
    kind, _, p = k.partition(":")
    return (kind, float(p)) if p else (kind, None)


def expand(kinds: Sequence[str], params: dict) -> list[tuple[str, Optional[float]]]:
    """(kind, parameter) pairs: a kind of :data:`~qkmlp.pretrained.surgery.PARAMETRISED`
    once per value of ``params[kind]``, every other kind once."""
    out = []
    for k in kinds:
        if k in PARAMETRISED:
            out += [(k, float(p)) for p in params[k]]
        else:
            out.append((k, None))
    return out


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors (ties broken by position)."""
    if x.shape != y.shape or x.dim() != 1 or x.numel() < 3:
        raise ValueError("spearman needs two 1-D tensors of the same length >= 3")
    rx = x.double().argsort().argsort().double()
    ry = y.double().argsort().argsort().double()
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


class Recorded:
    """The base pass on the windows, every MLP a GatedMLP: ``base`` (n,) losses,
    ``inputs[l]`` the stream entering layer l and ``mlp_in[l]`` what its MLP receives,
    each (n, L, d), in batches of ``batch_size`` (lists of tensors)."""

    def __init__(self, base, inputs, mlp_in, batch_size):
        self.base, self.inputs, self.mlp_in, self.batch_size = base, inputs, mlp_in, batch_size

    def mlp_inputs(self, l: int) -> torch.Tensor:
        return torch.cat(self.mlp_in[l])

    def residual(self, l: int) -> torch.Tensor:
        return torch.cat(self.inputs[l])


@torch.no_grad()
def record(model, ids: torch.Tensor, batch_size: int) -> Recorded:
    """Run the model (its MLPs already replaced) on ``ids`` and keep what each layer saw."""
    n = len(decoder_layers(model))
    base, inputs, mlp_in = [], [[] for _ in range(n)], [[] for _ in range(n)]
    for c in ids.split(batch_size):
        hidden, res, xin = layer_inputs(model, c, mlp_inputs=True)
        base.append(nll_from_hidden(model, hidden, c))
        for l in range(n):
            inputs[l].append(res[l])
            mlp_in[l].append(xin[l])
    return Recorded(torch.cat(base), inputs, mlp_in, batch_size)


def _top_units(g, x, peaks, geo, n_top=10):
    st_rest = input_statistics(g, x[:, 1:])
    top = peaks["peak"].argsort(descending=True)[:n_top]
    return [{"unit": int(j), "peak": float(peaks["peak"][j]), "peak_rest": float(peaks["peak_rest"][j]),
             "peak_positions": peaks["peak_position"][:, j].tolist(), "cos": float(geo["cos"][j]),
             "corr_ab_rest": float(st_rest["corr_ab"][j])} for j in top]


@torch.no_grad()
def prepare(model, ids: torch.Tensor, *, batch_size: int, local_kinds, all_kinds, gen_seed: int = 0,
            q4_noise: bool = False) -> dict:
    """Input statistics, outliers, sizes of the interventions and all-layer losses on ``ids``.

    ``local_kinds`` are the (kind, parameter) pairs whose size is measured in every layer,
    ``all_kinds`` those whose loss is measured with every layer changed at once (plus
    ``q4_noise``: one more 4-bit rounding error in every MLP, when asked).
    """
    from .surgery import with_q4_noise

    n_layers = len(decoder_layers(model))
    g = gated_mlps(model)
    originals = replace_mlps(model, dict(enumerate(g)))
    out = {}
    try:
        with mlps_replaced(model, originals):
            out["hf"] = window_losses(model, ids, batch_size=batch_size).tolist()
        rec = record(model, ids, batch_size)
        out["base"] = rec.base.tolist()
        inputs, residual, local = [], [], []
        pooled = {"abs_cos": [], "abs_corr_all": [], "abs_corr_rest": [], "rel_peak_all": [], "rel_peak_rest": []}
        for l in range(n_layers):
            x = rec.mlp_inputs(l)                                   # (n, L, d)
            geo = pair_geometry(g[l])
            st_all = input_statistics(g[l], x)
            st = input_statistics(g[l], x[:, 1:])
            peaks = unit_peaks(g[l], x)
            gain = norm_gain(decoder_layers(model)[l])
            rel_all = peaks["peak"] / peaks["peak"].median()
            rel_rest = peaks["peak_rest"] / peaks["peak_rest"].median()
            for name, v in (("abs_cos", geo["cos"].abs()), ("abs_corr_all", st_all["corr_ab"].abs()),
                            ("abs_corr_rest", st["corr_ab"].abs()), ("rel_peak_all", rel_all),
                            ("rel_peak_rest", rel_rest)):
                pooled[name].append(v)
            inputs.append({
                "a": st["a"], "b": st["b"], "frac_a_in_band": st["frac_a_in_band"],
                "nonlinear_share": st["nonlinear_share"], "corr_ab": summarise(st["corr_ab"]),
                "peak": summarise(peaks["peak"]), "peak_rest": summarise(peaks["peak_rest"]),
                "spearman_abs_cos_peak": spearman(geo["cos"].abs(), peaks["peak"]),
                "spearman_abs_cos_peak_rest": spearman(geo["cos"].abs(), peaks["peak_rest"]),
                "spearman_abs_corr_peak": spearman(st_all["corr_ab"].abs(), peaks["peak"]),
                "spearman_abs_corr_peak_rest": spearman(st["corr_ab"].abs(), peaks["peak_rest"]),
                "mean_input": mean_input_probes(g[l], x[:, 1:], gain),
                "mean_input_all": mean_input_probes(g[l], x, gain),
                "top_units": _top_units(g[l], x, peaks, geo),
            })
            residual.append(residual_outliers(rec.residual(l)))
            y0 = g[l](x).double()                                  # one pass per variant, both sizes
            n_all, n_rest = y0.norm(), y0[:, 1:].norm()
            sizes = {}
            for kind, p in local_kinds:
                if kind == "none":
                    continue
                dy = variant(g[l], kind, p)(x).double() - y0
                sizes[key(kind, p)] = {"all": float(dy.norm() / n_all), "rest": float(dy[:, 1:].norm() / n_rest)}
            local.append(sizes)
        pooled = {k: torch.cat(v) for k, v in pooled.items()}
        out["inputs"], out["residual"], out["local_change"] = inputs, residual, local
        out["alignment_bins"] = {
            "corr_ab_all": alignment_bins(pooled["abs_corr_all"], pooled["rel_peak_all"]),
            "corr_ab_rest": alignment_bins(pooled["abs_corr_rest"], pooled["rel_peak_rest"]),
            "cos_all": alignment_bins(pooled["abs_cos"], pooled["rel_peak_all"]),
            "cos_rest": alignment_bins(pooled["abs_cos"], pooled["rel_peak_rest"]),
        }
        del rec
        all_losses = {}
        for kind, p in all_kinds:
            if kind == "rescale" and p == 1.0:
                all_losses[key(kind, p)] = out["base"]            # α = 1 is the model itself
                continue
            with mlps_replaced(model, {l: variant(g[l], kind, p) for l in range(n_layers)}):
                all_losses[key(kind, p)] = window_losses(model, ids, batch_size=batch_size).tolist()
        if q4_noise:
            gen = torch.Generator().manual_seed(gen_seed)
            noisy = [with_q4_noise(g[l], gen) for l in range(n_layers)]
            with mlps_replaced(model, dict(enumerate(noisy))):
                all_losses["q4_noise"] = window_losses(model, ids, batch_size=batch_size).tolist()
        out["all"] = all_losses
    finally:
        replace_mlps(model, originals)
    return out


@torch.no_grad()
def layer_part(model, ids: torch.Tensor, layers: Sequence[int], kinds, *, batch_size: int) -> dict:
    """Per-window losses of each (kind, parameter) of ``kinds`` applied to each layer of
    ``layers`` alone: ``{"base": [...], "layer": {key: {layer: [...]}}}``."""
    g = gated_mlps(model)
    originals = replace_mlps(model, dict(enumerate(g)))
    try:
        rec = record(model, ids, batch_size)
        chunks = ids.split(batch_size)
        out = {key(k, p): {} for k, p in kinds}
        for l in layers:
            for kind, p in kinds:
                with mlps_replaced(model, {l: variant(g[l], kind, p)}):
                    vals = [tail_losses(model, h, l, c) for h, c in zip(rec.inputs[l], chunks)]
                out[key(kind, p)][int(l)] = torch.cat(vals).tolist()
    finally:
        replace_mlps(model, originals)
    return {"base": rec.base.tolist(), "layer": out}


def _round_sig(t: torch.Tensor, digits: int = 4) -> list[float]:
    return [0.0 if v == 0 or not math.isfinite(v) else float(f"{v:.{digits}g}") for v in t.tolist()]


@torch.no_grad()
def unit_part(model, ids: torch.Tensor, layers: Sequence[int], *, batch_size: int, n_groups: int = 10,
              n_single: int = 5, share: float = 0.05, seed: int = 0) -> dict:
    """Per-unit exchange in each of ``layers``: the first-order estimate for every unit,
    its Spearman correlation with the pair distance d_j, |cos θ_j| and the input
    correlation, and exact losses of groups of units swapped together: ``n_groups``
    groups of equal size by estimated cost (cheapest first), and the ``share`` of units
    with the smallest d_j, as many chosen at random, and those with the largest d_j; and
    single units, the ``n_single`` with the largest |estimate| and as many at random.
    """
    g = gated_mlps(model)
    originals = replace_mlps(model, dict(enumerate(g)))
    gen = torch.Generator().manual_seed(seed)
    try:
        rec = record(model, ids, batch_size)
        grads = mlp_output_grads(model, ids, layers, batch_size=batch_size)
        chunks = ids.split(batch_size)
        out = {"base": rec.base.tolist(), "layers": {}}
        for l in layers:
            x = rec.mlp_inputs(l)
            c = unit_swap_costs(g[l], x, grads[l])
            d = pair_distance(g[l])
            cos = pair_geometry(g[l])["cos"]
            corr = input_statistics(g[l], x[:, 1:])["corr_ab"]
            pred = c["predicted"]
            m = pred.numel()

            def exact(units):
                with mlps_replaced(model, {l: partially_swapped(g[l], units)}):
                    return torch.cat([tail_losses(model, h, l, ch) for h, ch in zip(rec.inputs[l], chunks)]).tolist()

            order = pred.argsort()
            groups = []
            for part in (torch.tensor_split(order, n_groups) if n_groups > 0 else ()):
                groups.append({"n_units": int(part.numel()), "predicted": float(pred[part].sum()),
                               "losses": exact(part)})
            n_sel = max(1, round(share * m))
            by_d = d.argsort()
            chosen = {"closest": by_d[:n_sel], "random": torch.randperm(m, generator=gen)[:n_sel],
                      "farthest": by_d[-n_sel:]}
            sets = {name: {"n_units": int(u.numel()), "predicted": float(pred[u].sum()),
                           "mean_d": float(d[u].mean()), "losses": exact(u)} for name, u in chosen.items()}
            top = pred.abs().argsort(descending=True)[:n_single].tolist()
            rnd = [j for j in torch.randperm(m, generator=gen).tolist() if j not in top][:n_single]
            singles = [{"unit": j, "chosen": "largest" if j in top else "random", "predicted": float(pred[j]),
                        "losses": exact([j])} for j in top + rnd] if n_single > 0 else []
            out["layers"][int(l)] = {
                "predicted": _round_sig(pred), "local_rest": _round_sig(c["local_rest"]),
                "spearman": {"d_predicted": spearman(d, pred), "d_local_rest": spearman(d, c["local_rest"]),
                             "abs_cos_predicted": spearman(cos.abs(), pred),
                             "abs_corr_predicted": spearman(corr.abs(), pred),
                             "local_rest_predicted": spearman(c["local_rest"], pred)},
                "groups": groups, "sets": sets, "singles": singles,
            }
    finally:
        replace_mlps(model, originals)
    return out


def merge(n_layers: int, parts: Sequence[dict]) -> dict:
    """Put one text's job results together: ``prepare``'s dict, any number of
    ``layer_part`` dicts (their ``layer`` entries become per-layer lists, ``None`` for
    layers no part covered) and at most one ``unit_part`` dict (under ``units``). Every
    part's base losses must agree (they are the same computation) to 1e-6 nats."""
    prep = [p for p in parts if "inputs" in p]
    if len(prep) != 1:
        raise ValueError(f"expected exactly one prepare() result, got {len(prep)}")
    text = dict(prep[0])
    base = text["base"]
    layer: dict = {}
    for p in parts:
        if any(abs(a - b) > 1e-6 for a, b in zip(p["base"], base)) or len(p["base"]) != len(base):
            raise ValueError("the jobs of one text disagree on the base losses: not the same model or windows")
        if "layer" in p:
            for k, rows in p["layer"].items():
                dest = layer.setdefault(k, [None] * n_layers)
                for l, v in rows.items():
                    dest[int(l)] = v
        if "layers" in p:
            if "units" in text:
                raise ValueError("more than one unit_part() result")
            text["units"] = {"layers": {str(l): v for l, v in p["layers"].items()}}
    text["layer"] = layer
    return text
