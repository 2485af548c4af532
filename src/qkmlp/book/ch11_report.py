"""Reading a stored retraining grid (``book/data/pretrained/retrain.json``).

Every comparison is *paired*: an arm and the control (``gated``) trained with the same
seed saw the same training batches in the same order and are evaluated on the same
held-out windows, so their difference is free of the data-order and window noise that
they share. Two spreads remain and are reported apart:

- over **windows**: a run's held-out loss is the mean over ``n_windows`` windows of a
  text; the paired per-window differences give a standard error for *this* run pair
  (how precisely the text measures it);
- over **seeds**: a different data order gives a different run pair. With two seeds
  there is no interval worth the name; the report gives every seed's value and their
  range, and a verdict needs the same sign in every seed.

Losses are in nats per token (SmolLM2's tokenizer). ``gap`` always means arm − control
(positive: the arm is worse).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np

__all__ = ["load_retrain", "arms", "seeds", "texts", "run_of", "curve", "gap_curve", "closed_at", "original_loss",
           "window_gap", "gap_summary", "recovery_rows", "schedule_at", "shrink_per_full_rate", "is_matched_control", "matched_status",
           "matched_control", "MATCHED_VERDICTS", "verdict_against_confounds", "NOT_RESOLVED_CONFOUNDS",
           "load_distances", "distance_summary", "layer_excess"]

CONTROL = "gated"
MATCHED_PREFIX = "swapped-f"


def load_retrain(path) -> dict:
    """The stored results; refuses a file without the keys the book reads."""
    path = Path(path)
    res = json.loads(path.read_text())
    missing = [k for k in ("meta", "config", "runs", "tuning", "texts") if k not in res]
    if missing:
        raise ValueError(f"{path} is not a retraining results file: no {', '.join(missing)}")
    if not res["runs"]:
        raise ValueError(f"{path} holds no main runs")
    return res


def is_matched_control(arm: str) -> bool:
    """Whether ``arm`` is a matched control (``swapped-f0.xxx``: the control with q and k
    exchanged in a fraction of its units), read in its own section of chapter 11."""
    return arm.startswith(MATCHED_PREFIX)


def arms(results: dict, *, matched: bool = True) -> list[str]:
    """The arms with at least one stored run, in the configuration's order; without the
    matched controls (``swapped-f…``) when ``matched=False``."""
    have = {r["arm"] for r in results["runs"]}
    return [a for block in results["config"]["arm_blocks"] for a in block
            if a in have and (matched or not is_matched_control(a))]


def seeds(results: dict, arm: str = CONTROL) -> list[int]:
    """The seeds with a stored run of ``arm``, sorted."""
    return sorted(r["seed"] for r in results["runs"] if r["arm"] == arm)


def texts(results: dict) -> list[str]:
    """The held-out texts, the main text first."""
    main = results["config"]["main_text"]
    return [main] + [t for t in results["config"]["heldout_texts"] if t != main]


def run_of(results: dict, arm: str, seed: int) -> dict:
    for r in results["runs"]:
        if r["arm"] == arm and r["seed"] == seed:
            return r
    raise KeyError(f"no stored run of arm {arm!r} with seed {seed}; stored: "
                   f"{sorted((r['arm'], r['seed']) for r in results['runs'])}")


def _text(results: dict, text: Optional[str]) -> str:
    text = text or results["config"]["main_text"]
    if text not in results["config"]["heldout_texts"]:
        raise KeyError(f"no held-out text {text!r}; expected one of {results['config']['heldout_texts']}")
    return text


def curve(results: dict, arm: str, seed: int, text: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps [P], held-out loss [P]) of one run on ``text`` (default: the main text)."""
    c = run_of(results, arm, seed)["curve"]
    return np.asarray(c["step"]), np.asarray(c["heldout"][_text(results, text)], dtype=float)


def gap_curve(results: dict, arm: str, seed: int, text: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps [P], arm − control [P]) for one seed: the paired gap along training."""
    s, a = curve(results, arm, seed, text)
    s0, c = curve(results, CONTROL, seed, text)
    if not np.array_equal(s, s0):
        raise ValueError(f"arm {arm!r} and the control were evaluated at different steps for seed {seed}")
    return s, a - c


def closed_at(results: dict, arm: str, seed: int, step: int, text: Optional[str] = None) -> float:
    """The share of one seed's starting gap (arm − control at step 0) closed by ``step``:
    1 − gap(step) / gap(0). ``step`` must be one of the evaluated steps."""
    s, g = gap_curve(results, arm, seed, text)
    hit = np.flatnonzero(s == step)
    if not hit.size:
        raise ValueError(f"step {step} was not evaluated; evaluated steps: {s.tolist()}")
    if g[0] == 0:
        raise ValueError(f"arm {arm!r}, seed {seed}: no gap at step 0, so no share of it can close")
    return float(1 - g[hit[0]] / g[0])


def original_loss(results: dict, text: Optional[str] = None) -> float:
    """The loss of the model as trained (before any change or retraining) on ``text``:
    the mean over windows of ``heldout_transformers`` (plain ``transformers``, no surgery),
    the same in every control run."""
    text = _text(results, text)
    vals = {round(float(np.mean(r["heldout_transformers"][text])), 10)
            for r in results["runs"] if r["arm"] == CONTROL}
    if len(vals) != 1:
        raise ValueError(f"the control runs disagree on the original model's loss on {text}: {sorted(vals)}")
    return vals.pop()


def window_gap(results: dict, arm: str, seed: int, text: Optional[str] = None, when: str = "after",
               against: str = CONTROL) -> dict:
    """The paired gap arm − ``against`` (default: the control) over the held-out windows at
    the start (``when="before"``) or the end (``"after"``) of one seed's runs: ``mean``,
    ``se`` (over windows), ``t``, the two-sided ``p`` of a paired t-test, ``n`` windows.
    Two arms of one seed saw the same batches, so any two of them pair window by window."""
    from ..runbase.stats import paired_t

    if when not in ("before", "after"):
        raise ValueError(f"when must be 'before' or 'after', got {when!r}")
    if arm == against:
        raise ValueError(f"an arm's gap to itself is zero by construction; got arm = against = {arm!r}")
    text = _text(results, text)
    key = f"windows_{when}"
    a = run_of(results, arm, seed)[key][text]
    c = run_of(results, against, seed)[key][text]
    return {**paired_t(c, a), "n": len(a)}


def schedule_at(results: dict, step: int) -> float:
    """The learning rate at ``step`` as a fraction of its peak (read from a stored run)."""
    r = results["runs"][0]
    lrs = r["lr_per_step"]
    return lrs[min(max(step, 0), len(lrs) - 1)] / max(lrs)


def shrink_per_full_rate(results: dict, arm: str, text: Optional[str] = None, *,
                         from_step: int = 250, per: int = 100) -> list[float]:
    """Per seed (the order of :func:`seeds` shared with the control): how fast the gap to the
    control still shrank from ``from_step`` to the end, *per unit of learning rate*: the gap's
    fall (positive: shrinking) divided by the steps taken, each weighted by its rate as a
    fraction of the peak, times ``per`` (nats per ``per`` full-rate steps). Under a decaying
    schedule a flat tail can be the rate running out rather than the gap settling; this
    separates the two. ``from_step`` must be an evaluated step before the last."""
    text = _text(results, text)
    ss = [s for s in seeds(results, arm) if s in seeds(results, CONTROL)]
    if not ss:
        raise KeyError(f"no seed has both a run of {arm!r} and of the control")
    out = []
    for s in ss:
        steps, g = gap_curve(results, arm, s, text)
        hits = np.flatnonzero(steps == from_step)
        if not len(hits) or from_step >= steps[-1]:
            raise ValueError(f"from_step must be an evaluated step before the last ({steps.tolist()}), "
                             f"got {from_step}")
        lrs = np.asarray(run_of(results, arm, s)["lr_per_step"], dtype=float)
        # the weights after evaluation at step n have taken updates 0 … n−1
        full_rate_steps = lrs[from_step:int(steps[-1])].sum() / lrs.max()
        out.append(float(g[hits[0]] - g[-1]) / full_rate_steps * per)
    return out


def matched_status(results: dict, matching: dict, has_record) -> dict:
    """Which runs of the matched controls exist: ``want`` (one job per matched control and
    seed of the control), ``have`` (those for which ``has_record(job)`` is true), ``complete``
    (all stored), ``in_results`` (matched-control arms in the results file) and ``text``: a
    line for the page ("2 of the 4 runs are stored (…)")."""
    from ..pretrained.retrain.grid import job_name

    lr, key = results["tuning"]["lr"], results["meta"]["run_key"]
    want = [(m["control"], s) for m in matching["matches"].values() for s in seeds(results)]
    jobs = {w: job_name("main", w[0], lr, w[1], key) for w in want}
    have = [w for w in want if has_record(jobs[w])]
    done = "; ".join(f"{a}, seed {s}" for a, s in have) or "none"
    text = (f"all {len(want)} runs are stored" if len(have) == len(want) else
            f"{len(have)} of the {len(want)} runs are stored ({done}); the verdict waits for the rest")
    return {"want": want, "have": have, "complete": len(have) == len(want),
            "in_results": [a for a in arms(results) if is_matched_control(a)], "text": text}


def gap_summary(results: dict, arm: str, text: Optional[str] = None, *, tail: int = 100) -> dict:
    """Per seed, how far ``arm`` got back towards the control on ``text``.

    Returns ``seeds`` and, per seed (lists in that order): ``start`` (gap at step 0),
    ``end`` (gap at the last step), ``end_se`` (its standard error over windows), ``end_p``
    (paired t-test over windows), ``closed`` (fraction of the starting gap closed,
    1 − end/start), ``tail_change`` (gap change over the last ``tail`` steps; negative:
    still shrinking), ``to_original`` (the arm's final loss − the original model's) and
    ``control_to_original`` (the same for the control). Also ``same_sign`` (every seed's
    final gap has the sign of the first and is resolved over windows at p < 0.05)."""
    text = _text(results, text)
    out = {k: [] for k in ("start", "end", "end_se", "end_p", "closed", "tail_change", "to_original",
                           "control_to_original")}
    ss = [s for s in seeds(results, arm) if s in seeds(results, CONTROL)]
    if not ss:
        raise KeyError(f"no seed has both a run of {arm!r} and of the control")
    orig = original_loss(results, text)
    for s in ss:
        steps, g = gap_curve(results, arm, s, text)
        w = window_gap(results, arm, s, text)
        if not math.isclose(w["mean"], g[-1], rel_tol=1e-6, abs_tol=1e-6):
            raise ValueError(f"seed {s}: the final gap over windows ({w['mean']}) is not the curve's last "
                             f"point ({g[-1]})")
        back = int(np.searchsorted(steps, steps[-1] - tail))
        out["start"].append(float(g[0]))
        out["end"].append(float(g[-1]))
        out["end_se"].append(w["se"])
        out["end_p"].append(w["p"])
        out["closed"].append(1 - float(g[-1]) / float(g[0]) if g[0] != 0 else float("nan"))
        out["tail_change"].append(float(g[-1] - g[back]))
        out["to_original"].append(float(curve(results, arm, s, text)[1][-1]) - orig)
        out["control_to_original"].append(float(curve(results, CONTROL, s, text)[1][-1]) - orig)
    sign = np.sign(out["end"][0])
    out["same_sign"] = bool(all(np.sign(e) == sign and p < 0.05 for e, p in zip(out["end"], out["end_p"])))
    out["seeds"] = ss
    out["arm"], out["text"], out["tail"] = arm, text, tail
    return out


def recovery_rows(results: dict, text: Optional[str] = None, digits: int = 3) -> list[list]:
    """Table rows, one per arm other than the control and the matched controls: arm, gap at step 0, final gap per
    seed (± se over windows), fraction closed (range over seeds), change over the last 100
    steps (range), final loss − the original model's (range)."""
    def rng(v, fmt):
        lo, hi = min(v), max(v)
        return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)} to {fmt.format(hi)}"

    rows = []
    for arm in arms(results, matched=False):
        if arm == CONTROL:
            continue
        g = gap_summary(results, arm, text)
        f = f"{{:+.{digits}f}}"
        rows.append([arm, rng(g["start"], f"{{:.{digits - 1}f}}"),
                     "; ".join(f"{e:+.{digits}f} ± {se:.{digits}f}" for e, se in zip(g["end"], g["end_se"])),
                     rng([100 * c for c in g["closed"]], "{:.1f}\u00a0%"),
                     rng(g["tail_change"], f), rng(g["to_original"], f)])
    return rows


#: The verdicts of the declared matched-control test
#: (``book/data/pretrained/declared/retrain-matched-control.json``), keyed as its outcomes.
MATCHED_VERDICTS = ("symmetric form costs beyond its distance", "distance accounts for the gap",
                    "gated form costs more at equal distance", "not resolved")


def matched_control(results: dict, matching: dict, declaration: dict) -> dict:
    """The declared test of chapter 11's matched controls, read from stored runs.

    For each symmetric arm S of ``matching["matches"]`` (``retrain_matching.json``) with its
    matched control M = ``matches[S]["control"]`` (a gated arm with q and k swapped in a
    fraction of the units, started as far from the model as S), every held-out text and
    every seed that has runs of M, S and the control, the cell holds, over the text's windows
    at the end of training (nats/token):

    - ``D``: mean of (loss of M − loss of S), with ``se``, the paired t ``p`` and its Holm
      adjustment ``holm_p`` over *all* cells of all arms, and ``tost_p`` against the
      declared margin;
    - ``G``: S's own end gap to the control (S − control); ``share``: D / (−G), the share of
      S's gap the matched control avoids; ``GM``: M's end gap to the control.

    Per arm: ``verdict`` (one of :data:`MATCHED_VERDICTS`, by the declared rule),
    ``budget_limited`` (M's own gap ≥ ``budget_gap`` in every cell: both stall far
    behind), ``seed_means`` (D averaged over texts, per seed) and ``third_seed``
    (those differ in sign: the declaration then runs seed 2). Returns
    ``{"cells", "arms", "alpha", "margin"}``."""
    from ..runbase.stats import holm, paired_t, tost

    alpha = float(declaration.get("alpha", 0.05))
    margin = float(declaration["equivalence"]["margin"])
    budget_gap = 0.5
    matches = matching.get("matches") if isinstance(matching, dict) else None
    if not matches:
        raise ValueError("matching must be the dict of retrain_matching.json, with a non-empty 'matches'")
    cells = []
    for s_arm, m in matches.items():
        m_arm = m["control"]
        ss = [s for s in seeds(results, s_arm) if s in seeds(results, m_arm) and s in seeds(results, CONTROL)]
        if not ss:
            raise KeyError(f"no seed has runs of {s_arm!r}, its matched control {m_arm!r} and the control")
        for text in texts(results):
            for seed in ss:
                w_m = run_of(results, m_arm, seed)["windows_after"][text]
                w_s = run_of(results, s_arm, seed)["windows_after"][text]
                w_c = run_of(results, CONTROL, seed)["windows_after"][text]
                d = [a - b for a, b in zip(w_m, w_s)]
                t = paired_t(w_s, w_m)                     # mean of (M − S)
                g = float(np.mean(np.subtract(w_s, w_c)))
                cells.append({"arm": s_arm, "control": m_arm, "text": text, "seed": seed, "n": len(d),
                              "D": t["mean"], "se": t["se"], "p": t["p"], "tost_p": tost(d, margin),
                              "G": g, "share": t["mean"] / -g if g else float("nan"),
                              "GM": float(np.mean(np.subtract(w_m, w_c)))})
    for c, hp in zip(cells, holm([c["p"] for c in cells])):
        c["holm_p"] = hp
    out = {}
    for s_arm in matches:
        mine = [c for c in cells if c["arm"] == s_arm]
        if all(c["D"] < -margin and c["holm_p"] < alpha for c in mine):
            verdict = MATCHED_VERDICTS[0]
        elif all(c["tost_p"] < alpha for c in mine):
            verdict = MATCHED_VERDICTS[1]
        elif all(c["D"] > margin and c["holm_p"] < alpha for c in mine):
            verdict = MATCHED_VERDICTS[2]
        else:
            verdict = MATCHED_VERDICTS[3]
        by_seed = {}
        for c in mine:
            by_seed.setdefault(c["seed"], []).append(c["D"])
        seed_means = {s: float(np.mean(v)) for s, v in sorted(by_seed.items())}
        signs = {np.sign(v) for v in seed_means.values()}
        out[s_arm] = {"control": matches[s_arm]["control"], "verdict": verdict, "cells": mine,
                      "budget_limited": all(c["GM"] >= budget_gap for c in mine),
                      "seed_means": seed_means, "third_seed": len(signs) > 1}
    return {"cells": cells, "arms": out, "alpha": alpha, "margin": margin}



#: The combined verdict when the matched controls of one arm disagree
#: (``declared/retrain-matched-control-restored-unit.json``, "combination").
NOT_RESOLVED_CONFOUNDS = "not resolved against its confounds"


def verdict_against_confounds(results: dict, tests: list, arm: str = "symmetric") -> dict:
    """``arm``'s verdict over several declared matched-control tests, each a
    ``(matching, declaration)`` pair read by :func:`matched_control` (its own Holm family):
    the verdict they all give where they agree, else :data:`NOT_RESOLVED_CONFOUNDS`.
    Returns ``{"verdict", "by_control": {control: verdict}, "tests": [matched_control(...)[arm]]}``;
    a test whose matching has no ``arm`` raises ``KeyError``."""
    if not tests:
        raise ValueError("tests must list at least one (matching, declaration) pair")
    per = []
    for matching, declaration in tests:
        if arm not in matching.get("matches", {}):
            raise KeyError(f"a matching has no control for {arm!r}; it matches {sorted(matching.get('matches', {}))}")
        one = {"matches": {arm: matching["matches"][arm]}}
        per.append(matched_control(results, one, declaration)["arms"][arm])
    verdicts = {t["verdict"] for t in per}
    return {"verdict": verdicts.pop() if len(verdicts) == 1 else NOT_RESOLVED_CONFOUNDS,
            "by_control": {t["control"]: t["verdict"] for t in per}, "tests": per}


def load_distances(*paths) -> dict:
    """The arms of one or more distance files (``python -m qkmlp.pretrained.retrain
    --distances``, :mod:`qkmlp.pretrained.retrain.distance`), merged: ``{arm: record}``.
    Every file must come from the same run key; an arm stored twice must agree."""
    merged, keys = {}, set()
    for p in paths:
        d = json.loads(Path(p).read_text())
        keys.add(d["meta"]["run_key"])
        for arm, rec in d["arms"].items():
            if arm in merged and merged[arm]["start"] != rec["start"]:
                raise ValueError(f"{arm!r} is stored twice with different starts ({p})")
            merged[arm] = rec
    if len(keys) > 1:
        raise ValueError(f"distance files from different run keys: {sorted(keys)}")
    return merged


def distance_summary(distances: dict, arm: str, texts: list[str]) -> dict:
    """How far ``arm`` starts from the trained model, two ways (nats per token and
    relative RMS changes of the MLP outputs; see :mod:`qkmlp.pretrained.retrain.distance`):
    ``start`` (``{text: loss}`` on each of ``texts``), ``validation_mean``, ``local`` and
    ``in_model`` (the mean over layers of the per-layer relative change, the layer on the
    trained model's input, or in the model as run) and ``in_model_max`` (the largest layer)."""
    if arm not in distances:
        raise KeyError(f"no distance stored for {arm!r}; stored: {sorted(distances)}")
    rec = distances[arm]
    missing = [t for t in texts if t not in rec["start"]]
    if missing:
        raise KeyError(f"{arm!r} has no start on {missing}; it has {sorted(rec['start'])}")
    local, in_model = (np.asarray(rec["mlp_change"][k], dtype=float) for k in ("local", "in_model"))
    return {"start": {t: float(rec["start"][t]) for t in texts}, "validation_mean": float(rec["validation_mean"]),
            "local": float(local.mean()), "in_model": float(in_model.mean()), "in_model_max": float(in_model.max())}


def layer_excess(distances: dict, arm: str, controls: list[str], factor: float = 1.5) -> dict:
    """Where ``arm`` changes the MLP outputs more than every one of ``controls``, layer by
    layer: ``n_local_more`` (layers whose change in its own layer exceeds every control's),
    ``big`` (a bool (L,) array: layers whose change in the model exceeds ``factor`` times
    every control's there), ``rest_arm`` and ``rest_controls`` (``{control: mean}``): the
    mean in-model change over the other layers."""
    if not controls:
        raise ValueError("layer_excess needs at least one control")
    for a in (arm, *controls):
        if a not in distances:
            raise KeyError(f"no distance stored for {a!r}; stored: {sorted(distances)}")
    loc = {a: np.asarray(distances[a]["mlp_change"]["local"], dtype=float) for a in (arm, *controls)}
    inm = {a: np.asarray(distances[a]["mlp_change"]["in_model"], dtype=float) for a in (arm, *controls)}
    if len({v.shape for v in (*loc.values(), *inm.values())}) != 1:
        raise ValueError("every arm needs one change per layer, the same layers for all")
    big = np.all([inm[arm] > factor * inm[c] for c in controls], axis=0)
    if big.all():
        raise ValueError(f"{arm!r} exceeds {factor} times its controls in every layer: no other layers to average")
    return {"n_local_more": int(np.sum(np.all([loc[arm] > loc[c] for c in controls], axis=0))), "big": big,
            "rest_arm": float(inm[arm][~big].mean()), "rest_controls": {c: float(inm[c][~big].mean()) for c in controls}}
