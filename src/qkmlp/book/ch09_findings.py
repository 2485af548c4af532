"""The chapter's findings, computed from a stored results file (one call per claim).

Each function reads the dict of :func:`qkmlp.pretrained.runner.run` and returns plain
numbers, so that the chapter states and asserts a conclusion with one line and the tests
can check each computation against a hand-made results dict:

- :func:`texts_table`: the held-out texts, their pins and the model's loss on each;
- :func:`layer_comparison`: per layer, intervention b against a (paired over windows,
  Holm-corrected across layers): where b costs more, significantly more or less;
- :func:`orbit_matched`: the size-matched comparison, every change of the exchange path
  priced against the scaling orbit at the same size of change;
- :func:`across_texts`: a per-layer count on every text;
- :func:`unit_findings`: the per-unit exchange, estimate against exact passes;
  :func:`unit_set_test`: is one set of exchanged units cheaper than another;
- :func:`claim_by_text`, :func:`orbit_summary`, :func:`all_layer_table`, :func:`top_units`:
  the chapter's tables, each from one call;
- :func:`context_changes`, :func:`context_reordering` and :func:`random_set_ranks` read the
  robustness file of :mod:`qkmlp.pretrained.robustness` (context length, with paired tests
  over windows; several random unit sets).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from ..pretrained.report import compare_layers, loss_change, text_results
from ..runbase.stats import holm_rejects, paired_t
from ..pretrained.textrun import parse_key

__all__ = ["texts_table", "layer_means", "layer_comparison", "orbit_points", "orbit_matched", "across_texts",
           "unit_findings", "unit_set_test", "ranges", "claim_by_text", "orbit_summary", "all_layer_table", "top_units",
           "context_changes", "context_reordering", "random_set_ranks"]


def texts_table(results: dict) -> list[dict]:
    """One row per text: name, genre, role, characters, tokens, the pinned SHA-256, and
    the model's mean window loss with its standard error."""
    rows = []
    for name in results["config"]["texts"]:
        t = text_results(results, name)
        base = t["base"]
        n = len(base)
        mean = sum(base) / n
        se = math.sqrt(sum((b - mean) ** 2 for b in base) / (n - 1) / n) if n > 1 else float("nan")
        info = t["text"]
        rows.append({"name": name, "genre": info["genre"], "role": info["role"], "n_chars": info["n_chars"],
                     "n_tokens": info["n_tokens"], "sha256": info["sha256"], "loss": mean, "se": se})
    return rows


def layer_means(results: dict, k: str, text: Optional[str] = None) -> list[Optional[float]]:
    """Per layer, the mean loss change of results key ``k`` (``None`` where not run)."""
    t = text_results(results, text)
    return [None if r is None else loss_change(t["base"], r)[0] for r in t["layer"][k]]


def layer_comparison(results: dict, a: str, b: str, *, text: Optional[str] = None, level: float = 0.05) -> dict:
    """Where ``b`` costs more than ``a`` (results keys), layer by layer on ``text``:
    ``n`` layers compared, ``more`` (mean b − a > 0), ``sig_more`` and ``sig_less``
    (paired t over windows, Holm across layers at ``level``), each a list of layers, and
    ``ratio`` the per-layer mean of b over the mean of a."""
    rows = compare_layers(results, a, b, level, text=text)
    ma, mb = layer_means(results, a, text), layer_means(results, b, text)
    return {"n": len(rows), "more": [r["layer"] for r in rows if r["mean"] > 0],
            "sig_more": [r["layer"] for r in rows if r["significant"] and r["mean"] > 0],
            "sig_less": [r["layer"] for r in rows if r["significant"] and r["mean"] < 0],
            "ratio": [None if x is None or y is None or x == 0 else y / x for x, y in zip(ma, mb)]}


def orbit_points(results: dict, layer: int, text: Optional[str] = None) -> list[tuple[float, float, float]]:
    """(size, loss change, α) of every per-layer rescaling stored for ``layer``, sorted by
    size (positions ≥ 1)."""
    t = text_results(results, text)
    out = []
    for k, rows in t["layer"].items():
        kind, p = parse_key(k)
        if kind == "rescale" and rows[layer] is not None:
            out.append((t["local_change"][layer][k]["rest"], loss_change(t["base"], rows[layer])[0], p))
    return sorted(out)


def _interp_loglog(points, x):
    """Piecewise-linear interpolation in (log size, log cost) through ``points`` (size,
    cost) sorted by size; None outside their size range or if a cost is not positive."""
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:]):
        if x0 <= x <= x1:
            if y0 <= 0 or y1 <= 0 or x0 <= 0:
                return None
            if x1 == x0:
                return max(y0, y1)
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp((1 - w) * math.log(y0) + w * math.log(y1))
    return None


def orbit_matched(results: dict, keys: Sequence[str] = ("toward_swap:0.25", "symmetrized", "swap"), *,
                  text: Optional[str] = None) -> list[dict]:
    """The size-matched comparison, per layer: for each change in ``keys`` that was run,
    its size and cost, and ``orbit``: the cost of the scaling orbit at the same size,
    interpolated (log–log, piecewise linear) between the layer's stored rescalings sorted
    by size; ``ratio`` = cost / orbit (``None`` when the size lies outside the orbit's
    range or a cost there is not positive)."""
    t = text_results(results, text)
    out = []
    for layer in range(results["model"]["n_layers"]):
        pts = [(s, c) for s, c, _ in orbit_points(results, layer, text)]
        row = {}
        for k in keys:
            if k not in t["layer"] or t["layer"][k][layer] is None:
                continue
            size = t["local_change"][layer][k]["rest"]
            cost = loss_change(t["base"], t["layer"][k][layer])[0]
            orbit = _interp_loglog(pts, size) if len(pts) >= 2 else None
            row[k] = {"size": size, "cost": cost, "orbit": orbit,
                      "ratio": None if orbit is None or orbit <= 0 else cost / orbit}
        out.append(row)
    return out


def across_texts(results: dict, fn, texts: Optional[Sequence[str]] = None) -> dict:
    """``{text: fn(results, text)}`` for every stored text (or those given)."""
    names = list(texts) if texts is not None else results["config"]["texts"]
    return {n: fn(results, n) for n in names}


def unit_findings(results: dict, layer: int, text: Optional[str] = None) -> dict:
    """The per-unit exchange of ``layer``: exact loss change of the three unit sets
    (``closest`` d_j, ``random``, ``farthest``; mean, se), of each group ordered by
    estimate and of each single unit (with their estimates), and the stored Spearman
    correlations."""
    t = text_results(results, text)
    u = t["units"]["layers"][str(layer)]
    base = t["base"]
    sets = {k: {"exact": loss_change(base, v["losses"]), "predicted": v["predicted"], "n_units": v["n_units"],
                "mean_d": v["mean_d"]} for k, v in u["sets"].items()}
    groups = [{"exact": loss_change(base, g["losses"])[0], "predicted": g["predicted"], "n_units": g["n_units"]}
              for g in u["groups"]]
    singles = [{"unit": s["unit"], "chosen": s["chosen"], "exact": loss_change(base, s["losses"])[0],
                "predicted": s["predicted"]} for s in u.get("singles", [])]
    return {"sets": sets, "groups": groups, "singles": singles, "spearman": u["spearman"]}


def unit_set_test(results: dict, a: str = "closest", b: str = "random", *, layers: Optional[Sequence[int]] = None,
                  text: Optional[str] = None, level: float = 0.05) -> list[dict]:
    """Per layer of the per-unit analysis (default: all stored): the exact loss of
    exchanging unit set ``a`` against set ``b`` ("closest", "random", "farthest"), paired
    over windows: ``layer``, ``mean`` and ``se`` of loss(a) − loss(b), the paired-t ``p``,
    ``significant`` (Holm across the layers at ``level``) and ``verdict``: "cheaper",
    "costlier" (significant) or "not resolved"."""
    u = text_results(results, text)["units"]["layers"]
    layers = sorted(int(l) for l in u) if layers is None else [int(l) for l in layers]
    rows = []
    for l in layers:
        sets = u[str(l)]["sets"]
        for name in (a, b):
            if name not in sets:
                raise KeyError(f"no unit set {name!r} in layer {l}; stored: {', '.join(sets)}")
        t = paired_t(sets[b]["losses"], sets[a]["losses"])        # mean of a − b
        rows.append({"layer": l, "mean": t["mean"], "se": t["se"], "p": t["p"]})
    for r, sig in zip(rows, holm_rejects([r["p"] for r in rows], level) if rows else []):
        r["significant"] = sig
        r["verdict"] = ("cheaper" if r["mean"] < 0 else "costlier") if sig else "not resolved"
    return rows


def ranges(values) -> tuple[float, float]:
    """(min, max) of the values that are not ``None``."""
    v = [x for x in values if x is not None]
    if not v:
        raise ValueError("no values")
    return min(v), max(v)


def claim_by_text(results: dict, a: str, b: str, *, texts: Optional[Sequence[str]] = None,
                  most: Optional[int] = None) -> dict:
    """The claim "``b`` costs more than ``a`` in most layers" on every text that priced
    both per layer: ``{"per_text": {text: {"n", "more", "sig_more", "sig_less"}}, "holds":
    [texts]}``, counts of layers (:func:`layer_comparison`), and the claim holds on a text
    when ``more`` exceeds ``most`` (default: half the layers compared, n // 2)."""
    names = list(texts) if texts is not None else results["config"]["texts"]
    per, holds = {}, []
    for name in names:
        layer = text_results(results, name)["layer"]
        if a not in layer or b not in layer:
            continue
        c = layer_comparison(results, a, b, text=name)
        per[name] = {"n": c["n"], "more": len(c["more"]), "sig_more": len(c["sig_more"]),
                     "sig_less": len(c["sig_less"])}
        if per[name]["more"] > (c["n"] // 2 if most is None else most):
            holds.append(name)
    return {"per_text": per, "holds": holds}


def orbit_summary(results: dict, keys: Sequence[str] = ("toward_swap:0.25", "symmetrized", "swap"), *,
                  text: Optional[str] = None) -> dict:
    """Per key of :func:`orbit_matched`, over the layers where the ratio exists: ``n``
    layers, ``n_more`` (cost above the orbit's at the same size), and the ``median``
    (upper median for an even count), ``min`` and ``max`` of the ratio (``None`` if
    ``n`` is 0)."""
    rows = orbit_matched(results, keys, text=text)
    out = {}
    for k in keys:
        v = sorted(r[k]["ratio"] for r in rows if k in r and r[k]["ratio"] is not None)
        out[k] = {"n": len(v), "n_more": sum(x > 1 for x in v),
                  "median": v[len(v) // 2] if v else None, "min": v[0] if v else None,
                  "max": v[-1] if v else None}
    return out


def all_layer_table(results: dict, keys: Sequence[str], texts: Optional[Sequence[str]] = None) -> dict:
    """``{key: {text: (mean, se) or None}}``: the loss change of each change applied to
    every layer at once, on each text (``None`` where the text's plan did not run it)."""
    names = list(texts) if texts is not None else results["config"]["texts"]
    out = {}
    for k in keys:
        out[k] = {}
        for name in names:
            t = text_results(results, name)
            out[k][name] = loss_change(t["base"], t["all"][k]) if k in t["all"] else None
    return out


def top_units(results: dict, n: int = 5, text: Optional[str] = None) -> list[dict]:
    """The ``n`` units with the largest peak |σ(a)b| relative to the median peak of
    their layer (the stored 50 % quantile), among each layer's stored top units:
    ``layer``, ``unit``, ``rel_peak`` and ``rel_peak_rest`` (positions ≥ 1, same
    median), ``at_position0`` (in how many windows the unit peaks at position 0),
    ``n_windows``, ``cos`` and ``corr_ab_rest``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rows = []
    for layer, r in enumerate(text_results(results, text)["inputs"]):
        med = r["peak"]["quantiles"][4]
        for u in r["top_units"]:
            rows.append({"layer": layer, "unit": u["unit"], "rel_peak": u["peak"] / med,
                         "rel_peak_rest": u["peak_rest"] / med,
                         "at_position0": sum(p == 0 for p in u["peak_positions"]),
                         "n_windows": len(u["peak_positions"]), "cos": u["cos"],
                         "corr_ab_rest": u["corr_ab_rest"]})
    return sorted(rows, key=lambda u: -u["rel_peak"])[:n]



WINDOW_PARTS = ("first", "last_in_context", "last_fresh")


def context_changes(robustness: dict) -> dict:
    """``{text: {kind: {part: (mean, se)}}}``: the loss change (nats/token) of each change made
    in every layer (``none``, ``swap``, ``rescale:-1``) on three scorings of the long windows
    of :func:`qkmlp.pretrained.robustness.context_costs`: the first ``short`` tokens, the
    last ``short`` tokens after ``long - short`` tokens of context, and those last tokens as
    a fresh window. Mean and standard error over the windows of the paired changes."""
    out = {}
    for text, c in robustness["context"].items():
        out[text] = {}
        for kind, parts in c["kinds"].items():
            out[text][kind] = {}
            for part in WINDOW_PARTS:
                t = paired_t(c["base"][part], parts[part])
                out[text][kind][part] = (t["mean"], t["se"])
    return out


def context_reordering(robustness: dict, a: str = "swap", b: str = "none") -> dict:
    """Change ``a`` priced against change ``b`` on each long window of the robustness file,
    every text's windows pooled (texts in file order), with paired t-tests over the windows.

    A window's *relative cost* in a part (``first``, ``last_in_context``, ``last_fresh``; see
    :func:`context_changes`) is loss(a) − loss(b): the unchanged model's loss cancels, and
    it is below 0 where ``a`` costs less than ``b``. Returns

    - ``n``: the number of windows; ``texts``: the text of each window;
    - ``relative``: ``{part: [relative cost per window]}``;
    - ``below``: ``{part: windows where a costs less than b}``, ``below_test``:
      ``{part: paired_t(b, a)}`` (mean relative cost, its se, t and two-sided p);
    - ``text_means``: ``{text: {part: mean relative cost over that text's windows}}``;
    - ``shift``: per window, relative cost on the last tokens in context minus on the first
      tokens; ``n_shift_down``: windows where it is below 0 (``a`` got cheaper relative to
      ``b``); ``shift_test``: the paired t-test of first against last in context;
    - ``fresh_test``: first against the same last tokens scored as a fresh window (the part
      of the shift that comes from which tokens are scored); ``context_test``: fresh against
      in context (the part the context adds). The three means add up:
      shift = fresh + context.
    """
    ctx = robustness.get("context") if isinstance(robustness, dict) else None
    if not ctx:
        raise ValueError("robustness must be the dict of qkmlp.pretrained.robustness with a "
                         "non-empty 'context' part")
    rel = {part: [] for part in WINDOW_PARTS}
    texts, per_text = [], {}
    for text, c in ctx.items():
        for kind in (a, b):
            if kind not in c["kinds"]:
                raise ValueError(f"change {kind!r} is not in the context part of {text!r}; "
                                 f"expected one of {sorted(c['kinds'])}")
        per_text[text] = {}
        for part in WINDOW_PARTS:
            la, lb = c["kinds"][a][part], c["kinds"][b][part]
            if len(la) != len(lb):
                raise ValueError(f"{text!r} {part}: {a!r} and {b!r} hold {len(la)} and {len(lb)} windows")
            r = [x - y for x, y in zip(la, lb)]
            rel[part] += r
            per_text[text][part] = sum(r) / len(r)
        texts += [text] * len(c["kinds"][a]["first"])
    n = len(texts)
    zeros = [0.0] * n
    shift = [y - x for x, y in zip(rel["first"], rel["last_in_context"])]
    return {"n": n, "texts": texts, "relative": rel,
            "below": {part: sum(v < 0 for v in rel[part]) for part in WINDOW_PARTS},
            "below_test": {part: paired_t(zeros, rel[part]) for part in WINDOW_PARTS},
            "text_means": per_text, "shift": shift, "n_shift_down": sum(v < 0 for v in shift),
            "shift_test": paired_t(rel["first"], rel["last_in_context"]),
            "fresh_test": paired_t(rel["first"], rel["last_fresh"]),
            "context_test": paired_t(rel["last_fresh"], rel["last_in_context"])}


def random_set_ranks(robustness: dict) -> dict:
    """Per layer of the random-set check: the exchange cost (mean window loss change, nats) of
    the closest 5 % of units, of each random 5 % draw, and ``rank``: how many random draws
    cost less than the closest set (0: the closest set is the cheapest of all)."""
    rs = robustness["random_sets"]
    base = rs["base"]
    out = {}
    for layer, row in rs["layers"].items():
        cost = {k: sum(a - b for a, b in zip(v, base)) / len(base) for k, v in row.items()}
        rand = [cost[f"random_{i}"] for i in range(rs["draws"])]
        out[int(layer)] = {"closest": cost["closest"], "random": rand,
                           "rank": sum(r < cost["closest"] for r in rand), "draws": rs["draws"]}
    return out

