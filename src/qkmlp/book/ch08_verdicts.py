"""Verdicts worded at the strength of their tests, and the cells of tables that fit a phone
(the typography itself, signed numbers and non-breaking spaces, is :mod:`qkmlp.book.typography`).

Two kinds of comparison reach the experiments chapter:

- **declared** ones (:mod:`qkmlp.experiments.declared`): the test, α, the multiplicity family and the
  equivalence margin were committed before the grid they read; :func:`budget_rows`
  adds the budgets a declaration names but that are not stored yet, and
  :func:`trend_status` / :func:`multiplier_status` say what the stored budgets allow;
- **exploratory** ones (:func:`family_tests`): a family of paired comparisons chosen after
  (some of) its runs, with an equivalence margin chosen now. They get the same
  machinery — Holm over the family for the paired t-test and for its distribution-free
  companions (Wilcoxon signed-rank, sign test), a TOST against the margin, the smallest
  difference the first Holm step detects with power 0.8 — and the same rule, but the label
  "exploratory" travels with them.

The rule, for both: a difference only where the Holm-adjusted paired t-test p-value is
below α; "level" only where the TOST shows the mean difference within ±margin at α;
otherwise "not resolved", with the detectable difference beside it.

Rows of :func:`family_tests` are :func:`qkmlp.book.ch08_report.gain` rows: ``diffs``
oriented so that a positive difference means the first family (a) is better.
"""
from __future__ import annotations

import math

import re
from typing import Mapping, Optional, Sequence, Union

from ..runbase.stats import detectable_difference, holm, tost
from .typography import MINUS, NBSP, breakable, interval, signed  # noqa: F401  (chapter 11 imports NBSP, signed from here)

__all__ = ["family_tests", "verdict", "gain_cell", "verdict_cell", "family_table",
           "declared_steps", "budget_rows", "budget_table", "budget_p_table", "trend_status", "multiplier_status",
           "status_text", "share_kept", "extension_table", "corpus_table", "sequential_table", "sequential_bound"]

_STEPS = re.compile(r"_(\d+)\.json$")


def verdict(holm_p: float, tost_p: float, mean_diff: float, alpha: float = 0.05) -> str:
    """The rule for a row oriented as a gain (> 0: a is better): ``"a better"`` or
    ``"b better"`` when the Holm-adjusted t-test p-value is below ``alpha``, ``"level"``
    when the TOST p-value is, else ``"not resolved"``."""
    if holm_p < alpha:
        return "a better" if mean_diff > 0 else "b better"
    if tost_p < alpha:
        return "level"
    return "not resolved"


def family_tests(rows: list[dict], margin: Union[float, Mapping[str, float]], alpha: float = 0.05,
                 power: float = 0.8, missing: int = 0) -> list[dict]:
    """Test one family of :func:`~qkmlp.book.ch08_report.gain` rows, in place.

    ``margin``: the equivalence margin in the rows' units (a number), or ``{task: margin}``
    looked up by ``row["task"]``. ``missing``: members of the family whose grid is not
    stored yet; each enters Holm's correction as p = 1, which can only make it stricter.

    Adds to each row: ``p_holm`` (paired t-test, Holm over the family of
    ``len(rows) + missing``), ``wilcoxon_holm``, ``sign_holm`` (the companions, Holm over
    the same family), ``survives`` (``p_holm < alpha``), ``tost_p`` and ``margin``, ``mde``
    (the difference the paired t-test at level alpha/m detects with probability
    ``power``, from the row's own spread), ``family_size`` and ``verdict``
    (:func:`verdict`). Returns ``rows``.
    """
    if not rows:
        raise ValueError("a family of tests needs at least one comparison")
    if not (isinstance(missing, int) and missing >= 0):
        raise ValueError(f"missing must be a non-negative integer, got {missing!r}")
    m = len(rows) + missing
    for key, out in (("t_p", "p_holm"), ("wilcoxon_p", "wilcoxon_holm"), ("sign_p", "sign_holm")):
        for r, p in zip(rows, holm([r[key] for r in rows] + [1.0] * missing)):
            r[out] = p
    for r in rows:
        if isinstance(margin, Mapping):
            if r.get("task") not in margin:
                raise KeyError(f"no equivalence margin for task {r.get('task')!r}; expected one of {sorted(margin)}")
            mg = margin[r["task"]]
        else:
            mg = margin
        r["margin"] = mg
        r["tost_p"] = tost(r["diffs"], mg)
        r["survives"] = r["p_holm"] < alpha
        r["mde"] = detectable_difference(r["sd_diff"], r["n"], alpha=alpha / m, power=power)
        r["family_size"] = m
        r["verdict"] = verdict(r["p_holm"], r["tost_p"], r["mean_diff"], alpha)
    return rows


# --- cells of narrow tables -----------------------------------------------------------------

def gain_cell(row: dict, digits: int, scale: float = 1.0, mde_digits: Optional[int] = None) -> str:
    """The mean difference and its interval: "+0.005 [−0.012, +0.022]" (a break only
    between the two); with ``mde_digits``, an unresolved row adds the difference the test
    could have detected: "… (detectable 0.035)"."""
    out = f"{signed(row['mean_diff'], digits, scale)} {interval(row['ci'], digits, scale)}"
    if mde_digits is not None and row.get("verdict") == "not resolved":
        out += f" (detectable {row['mde'] * scale:.{mde_digits}f})"
    return out


def verdict_cell(row: dict, a: str, b: str, digits: int = 3, scale: float = 1.0) -> str:
    """The verdict in words for a table: "{a} better", "{b} better", "level (±margin)" or
    "not resolved" (its detectable difference goes beside the gain, :func:`gain_cell`)."""
    v = row["verdict"]
    if v == "a better":
        return f"{a} better"
    if v == "b better":
        return f"{b} better"
    if v == "level":
        return f"level (±{row['margin'] * scale:.{digits}g})"
    return "not resolved"


def family_table(rows: list[dict], labels: Sequence[str], a: str = "gated", b: str = "control", digits: int = 2,
                 scale: float = 1.0, mde_digits: int = 1) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a three-column table for :func:`qkmlp.book.figures.table`: the
    verdict first, then the comparison (``labels``, one per row), then the gain and its
    interval on one line (and, where unresolved, the detectable difference). A level row
    names its margin."""
    if len(labels) != len(rows):
        raise ValueError(f"got {len(labels)} labels for {len(rows)} rows")
    body = [[verdict_cell(r, a, b, 3, scale), breakable(lab), gain_cell(r, digits, scale, mde_digits)]
            for r, lab in zip(rows, labels)]
    return ["verdict", "case", "gain (95 % interval)"], body


# --- declared grids: what the stored budgets allow ------------------------------------------------

def declared_steps(declaration: dict) -> list[int]:
    """The step budgets of the grids a declaration names (``lm_compute_1500.json`` → 1500)."""
    out = []
    for g in declaration.get("grids", ()):
        m = _STEPS.search(g)
        if not m:
            raise ValueError(f"cannot read a step budget from the grid name {g!r}; expected '..._<steps>.json'")
        out.append(int(m.group(1)))
    return sorted(out)


def budget_rows(declarations: Mapping[str, dict], results_by_steps: Mapping[int, dict]) -> list[dict]:
    """:func:`.declared.budget_tests` on the stored budgets, plus one row
    ``{"id", "steps", "a", "b", "verdict": "not yet run"}`` for each budget a declaration
    names that is not stored; ordered by declaration, then budget."""
    from ..experiments.declared import budget_tests

    tested = budget_tests(declarations, results_by_steps) if results_by_steps else []
    by = {(r["id"], r["steps"]): r for r in tested}
    rows = []
    for key, d in declarations.items():
        for steps in declared_steps(d):
            rows.append(by.get((key, steps)) or {"id": key, "steps": steps, "a": d["comparison"]["a"]["family"],
                                                 "b": d["comparison"]["b"]["family"], "verdict": "not yet run"})
    return rows


def share_kept(rows: list[dict], positive: str = "kv-relu", control: str = "symgated1-silu") -> dict[int, float]:
    """{steps: share} of a's lead over the ``positive`` baseline that the exact ``control``
    keeps, per stored budget of :func:`budget_rows`: 1 − (a − control) / (a − positive),
    from the paired means (same seeds, so they subtract). A point estimate, not a test; above
    1 where the control beats a."""
    by = {(r["b"], r["steps"]): r for r in rows if r["verdict"] != "not yet run"}
    steps = sorted({s for b, s in by if b == positive} & {s for b, s in by if b == control})
    if not steps:
        raise KeyError(f"no stored budget holds both {positive!r} and {control!r}")
    out = {}
    for s in steps:
        lead = by[positive, s]["mean_diff"]
        if lead == 0:
            raise ValueError(f"at {s} steps a and {positive!r} tie exactly: no lead to share")
        out[s] = 1 - by[control, s]["mean_diff"] / lead
    return out


def budget_table(rows: list[dict], labels: Mapping[str, str], a: str = "SwiGLU",
                 digits: int = 3) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the declared per-budget tests (:func:`budget_rows`), verdict first:
    ``labels`` names each ``b`` family. A budget not stored yet says so; beside an unresolved
    gap, the difference the first Holm step would detect with power 0.8. A budget
    not stored yet gets one row for all its comparisons, at the end."""
    body, missing = [], []
    for r in rows:
        what = breakable(f"{labels[r['b']]}, {_steps(r['steps'])} steps")
        v = r["verdict"]
        if v == "not yet run":
            if r["steps"] not in missing:
                missing.append(r["steps"])
            continue
        if v == "a lower":
            words = f"{a} lower"
        elif v == "b lower":
            words = f"{labels[r['b']]} lower"
        elif v == "level within ±margin":
            words = f"level (±{r['margin']:g})"
        else:
            words = "not resolved"
        cell = gain_cell(r, digits)
        if v == "not resolved":
            mde = detectable_difference(r["sd_diff"], r["n"], alpha=r["alpha"] / r["holm_m"])
            cell += f" (detectable {mde:.{digits}f})"
        body.append([words, what, cell])
    body += [["not yet run", f"every test, {_steps(s)} steps", "–"] for s in sorted(missing)]
    return ["verdict", f"{a} against", f"{a} − control (95 % interval)"], body


def budget_p_table(rows: list[dict], labels: Mapping[str, str]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the p-values behind :func:`budget_table`, for the stored budgets:
    the paired t-test after Holm and before, the Wilcoxon companion (uncorrected) and the
    TOST. Where the t-test and the Wilcoxon test disagree at α before correction (one
    below, the other not), the Wilcoxon cell says so, as the declarations require."""
    body = []
    for r in rows:
        if r["verdict"] == "not yet run":
            continue
        w = f"{r['wilcoxon_p']:.3f}"
        if (r["t_p"] < r["alpha"]) != (r["wilcoxon_p"] < r["alpha"]):
            w += " (disagrees with t)"
        body.append([breakable(f"{labels[r['b']]}, {_steps(r['steps'])}"), f"{r['holm_p']:.3f}", f"{r['t_p']:.3f}",
                     w, f"{r['tost_p']:.3f}"])
    return ["against, steps", "t, Holm", "t", "Wilcoxon", "TOST"], body


def extension_table(out: dict, labels: Mapping[str, str], a: str = "SwiGLU",
                    digits: int = 3) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a declared re-test on more seeds
    (:func:`qkmlp.experiments.declared.extension_tests`): per comparison the verdict, the
    gap on all seeds with its interval (and, unresolved, the detectable difference), the
    p-values (t after Holm over the family and before; Wilcoxon, flagged where it disagrees
    with t at α before correction) and the replication on the new seeds alone, its gap,
    interval and whether its sign is the full test's."""
    _, main = budget_table(out["rows"], labels, a, digits)
    rep = {r["id"]: r for r in out["replication"]}
    body = []
    for r, (words, what, cell) in zip(out["rows"], main):
        w = f"{r['wilcoxon_p']:.3f}"
        if (r["t_p"] < r["alpha"]) != (r["wilcoxon_p"] < r["alpha"]):
            w += " (disagrees with t)"
        x = rep[r["id"]]
        sign = "same sign" if x["same_sign"] else "opposite sign"
        body.append([words, what, cell, f"{r['holm_p']:.3f} / {r['t_p']:.3f} / {w}",
                     f"{gain_cell(x, digits)}, {sign}"])
    seeds = out["replication"][0]["seeds"] if out["replication"] else []
    new = f"seeds {seeds[0]}–{seeds[-1]} alone" if seeds else "new seeds alone"
    n = out["rows"][0]["n"] if out["rows"] else 0
    return (["verdict", f"{a} against", f"{a} − control, {n} seeds (95 % interval)", "p: t Holm / t / Wilcoxon",
             f"{new} (replication)"], body)


def corpus_table(rows: list[dict], labels: Mapping[str, str], a: str = "SwiGLU",
                 digits: int = 4) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of one grid's declared comparisons
    (:func:`qkmlp.experiments.declared.corpus_tests`): the verdict, the comparison
    (``labels`` names each ``b`` family), the gap with its 95 % interval (and, unresolved,
    the difference the first Holm step detects with power 0.8, the rows' ``mde``), seeds
    favouring ``a``, and the p-values: t after Holm and before, the Wilcoxon companion
    (flagged where it disagrees with t at α before correction) and the TOST."""
    words = {"a lower": f"{a} lower", "not resolved": "not resolved"}
    body = []
    for r in rows:
        v = r["verdict"]
        w = (words[v] if v in words else f"{labels[r['b']]} lower" if v == "b lower"
             else f"level (±{r['margin']:g})")
        cell = gain_cell(r, digits, mde_digits=digits)
        wil = f"{r['wilcoxon_p']:.3f}"
        if (r["t_p"] < r["alpha"]) != (r["wilcoxon_p"] < r["alpha"]):
            wil += " (disagrees with t)"
        body.append([w, labels[r["b"]], cell, f"{r['a_wins']} of {r['n']}",
                     f"{r['holm_p']:.3g} / {r['t_p']:.3g} / {wil}", f"{r['tost_p']:.2f}"])
    return (["verdict", f"{a} against", f"{a} − control (95 % interval)", f"seeds {a} lower",
             "p: t Holm / t / Wilcoxon", f"TOST (±{rows[0]['margin']:g})" if rows else "TOST"], body)


def sequential_table(result: dict, a: str = "SwiGLU", b: str = "control",
                     digits: int = 4) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a declared group-sequential test
    (:func:`qkmlp.experiments.declared.sequential_test`), one row per look taken: its
    seeds, the mean of ``a`` − ``b`` with the naive 95 % interval, the paired t p-value
    against the look's nominal p, the repeated confidence interval (the bound that look
    gives), the Wilcoxon p (flagged where it disagrees with t at the nominal p), seeds
    favouring ``a`` and the look's decision."""
    words = {"a lower": f"stop: {a} lower", "b lower": f"stop: {b} lower", "continue": "go on to the next look",
             "level within ±margin": "stop: level within the margin", "not resolved": "not resolved"}
    body = []
    for r in result["looks"]:
        w = words[r["decision"]]
        wil = f"{r['wilcoxon_p']:.3g}" + ("" if r["wilcoxon_agrees"] else " (disagrees with t)")
        body.append([f"{r['look']}", f"{r['seeds'][0]}–{r['seeds'][-1]} ({r['n']})",
                     f"{signed(r['mean_diff'], digits)} {interval(r['ci95'], digits)}",
                     f"{r['t_p']:.3g} (stops at ≤ {r['nominal_p']:.3g})", interval(r["rci"], digits), wil,
                     f"{r['a_wins']} of {r['n']}", w])
    return (["look", "seeds (n)", f"{a} − {b} (95 % interval)", "t p (boundary)", "repeated interval",
             "Wilcoxon p", f"seeds {a} lower", "decision"], body)


def sequential_bound(result: dict) -> dict:
    """What the last look taken of a group-sequential test excludes, read from its repeated
    confidence interval (lo, hi) of a − b: ``lead`` = −lo (no lead of a larger than this)
    and ``deficit`` = hi (no deficit of a larger than this); ``look`` and ``n``. A bound of
    zero or less means the interval lies on one side of zero. Raises while no look is
    taken."""
    if not result.get("looks"):
        raise ValueError(f"no look of the test has been taken yet ({result.get('status', 'no status')})")
    r = result["looks"][-1]
    lo, hi = r["rci"]
    return {"look": r["look"], "n": r["n"], "lead": -lo, "deficit": hi}


def _steps(n: int) -> str:
    """1500 -> "1 500" with a thin no-break space (the chapter's digit grouping)."""
    return f"{n:,}".replace(",", "\u202f")


def trend_status(declaration: dict, results_by_steps: Mapping[int, dict]) -> dict:
    """What the declared trend test can say with the budgets stored.

    ``{"status", "stored", "declared", "rows"}``: status ``"not yet run"`` with fewer than
    two budgets (``rows`` empty); ``"a difference of two budgets"`` with two (the slopes
    are then differences between two budgets, not a trend over the range; ``rows`` from
    :func:`.declared.trend_tests`); ``"trend"`` with three or more.
    """
    from ..experiments.declared import trend_tests

    stored, declared = sorted(results_by_steps), declared_steps(declaration)
    base = {"stored": stored, "declared": declared}
    if len(stored) < 2:
        return {**base, "status": "not yet run", "rows": []}
    rows = trend_tests(declaration, results_by_steps)
    return {**base, "status": "a difference of two budgets" if len(stored) == 2 else "trend", "rows": rows}


def multiplier_status(declaration: dict, results_by_steps: Mapping[int, dict], budget: list[dict],
                      n_boot: int = 10000, seed: int = 0, trend: Optional[dict] = None) -> list[dict]:
    """The declared compute multiplier where the data allow it, else why not.

    One row per comparison and budget but the largest declared: ``status`` ``"not yet run"``
    (fewer than two budgets stored, or this budget or a larger one missing), ``"not
    resolved"`` (the per-budget declared test at this budget, in ``budget``, did not show
    a lower than b: the declaration reports the multiplier only there) or ``"estimated"``
    (with ``multiplier``, ``ci``, ``outside_grid`` from
    :func:`.declared.compute_multiplier` on the stored budgets).

    With ``trend`` (:func:`trend_status`), an estimated row also says whether the
    declaration reports it: ``declared`` is true when that comparison's trend test is
    resolved (the rule of lm-compute-multiplier as written, settled in lm24k-twenty-seeds);
    otherwise the estimate is shown as undeclared. Without ``trend``, ``declared`` is None.
    """
    from ..experiments.declared import compute_multiplier

    declared = declared_steps(declaration)
    stored = sorted(results_by_steps)
    verdicts = {(r["a"], r["b"], r["steps"]): r["verdict"] for r in budget}
    est = {}
    if len(stored) >= 2:
        est = {(r["a"], r["b"], r["steps"]): r
               for r in compute_multiplier(declaration, results_by_steps, n_boot=n_boot, seed=seed)}
    resolved = {}
    if trend is not None:
        resolved = {r["b"]: r["verdict"] in ("a gains with compute", "b gains with compute") for r in trend["rows"]}
    rows = []
    for comp in declaration["comparisons"]:
        a, b = comp["a"]["family"], comp["b"]["family"]
        for steps in declared[:-1]:
            row = {"a": a, "b": b, "steps": steps}
            if (a, b, steps) not in est:
                row["status"] = "not yet run"
            elif verdicts.get((a, b, steps)) != "a lower":
                row["status"] = "not resolved"
            else:
                row.update(est[a, b, steps], status="estimated", declared=resolved.get(b))
            rows.append(row)
    return rows


def _and(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _multiplier_words(r: dict, labels: Mapping[str, str], a: str, largest: int) -> str:
    """One estimated multiplier in words. inf (b does not reach a's loss within the grid) is
    "beyond the grid", as the declaration words it, with the factor the grid does reach;
    an interval end at inf or 0.0 lies beyond or below the grid."""
    b, steps, (lo, hi) = labels[r["b"]], _steps(r["steps"]), r["ci"]
    reach = f"{largest / r['steps']:g}"
    if r["multiplier"] == math.inf:
        return (f"the {b} does not reach {a}'s loss at {steps} within the grid: beyond the grid (more than "
                f"{reach} times the steps; {100 * r['outside_grid']:.0f} % of the seed resamples outside it)")
    lo_w = "below the grid" if lo == 0.0 else f"{lo:.2g}"
    hi_w = f"beyond the grid, which reaches {reach}" if hi == math.inf else f"{hi:.2g}"
    return (f"the {b} needs {r['multiplier']:.2g} times the steps to match {a} at {steps} "
            f"(95 % interval {lo_w} to {hi_w})")


def status_text(budget: list[dict], trend: dict, multiplier: list[dict], labels: Mapping[str, str],
                a: str = "SwiGLU") -> str:
    """What the stored budgets allow, in words (Markdown without math): which budgets are
    stored and which not yet, what the declared trend test can say (nothing with one budget,
    a difference with two) and where the compute multiplier is estimated, not resolved or
    not yet run. Made from :func:`budget_rows`, :func:`trend_status` and
    :func:`multiplier_status`, so it changes with the stored files."""
    stored = sorted({r["steps"] for r in budget if r["verdict"] != "not yet run"})
    missing = sorted({r["steps"] for r in budget if r["verdict"] == "not yet run"})
    out = [f"**Stored:** {_and([_steps(s) for s in stored]) if stored else 'none'} steps."]
    if missing:
        out.append(f"**Not yet run:** {_and([_steps(s) for s in missing])} steps.")
    if trend["status"] == "not yet run":
        out.append("**Trend:** not yet run; the declared trend test needs at least two budgets.")
    else:
        words = []
        say = {"a gains with compute": f"{a} gains with compute", "b gains with compute": "the control gains "
               "with compute", "not resolved": "not resolved"}
        for r in trend["rows"]:
            v = say.get(r["verdict"], f"flat within ±{r['margin']:g}")
            words.append(f"against the {labels[r['b']]}, {v} ({signed(r['mean_slope'], 4)} nats per "
                         f"character per doubling, 95 % interval {interval(r['ci'], 4)})")
        head = ("**Trend (two budgets only, so each slope is the difference between them per doubling, not a "
                "trend over the range):** " if trend["status"] == "a difference of two budgets" else "**Trend:** ")
        out.append(head + "; ".join(words) + ".")
    est = [r for r in multiplier if r["status"] == "estimated"]
    unresolved = [r for r in multiplier if r["status"] == "not resolved"]
    kept = [r for r in est if r.get("declared") is not False]
    undeclared = [r for r in est if r.get("declared") is False]
    if kept:
        out.append("**Compute multiplier:** " + "; ".join(_multiplier_words(r, labels, a, max(stored))
                                                          for r in kept) + ".")
    if undeclared:
        out.append("**Compute multiplier, undeclared** (the declaration reports one only where the comparison's "
                   "trend is resolved, and it is not): " + "; ".join(_multiplier_words(r, labels, a, max(stored))
                                                                      for r in undeclared) + ".")
    if unresolved:
        out.append(f"**Compute multiplier, not resolved** (the declared test shows no lead for {a} there): "
                   + _and([f"against the {labels[r['b']]} at {_steps(r['steps'])}" for r in unresolved]) + ".")
    if not est and not unresolved:
        out.append("**Compute multiplier:** not yet run; it needs a larger budget than the one it starts from.")
    return " ".join(out)
