"""Tests declared before their runs, and the analysis each declaration fixes.

A declaration is a JSON file under ``book/data/experiments/declared/`` (one per test),
committed to git *before* the grid it reads was started: its hypothesis, the comparison
(families a and b), the statistic, the tests, α, the multiplicity family and the
equivalence margin. This module

- checks the order from git (:func:`commit_order`): the commit that added the declaration
  must be an ancestor of (or equal to) the commit of the code that trained every run it
  reads (each run record carries ``git_commit``); a run from a checkout with uncommitted
  changes, or without a commit, fails the check;
- runs the declared analysis: per budget (:func:`budget_tests`: paired t-test with an
  exact Wilcoxon companion, Holm across the declared family, TOST against the margin),
  the trend in log₂ budget (:func:`trend_tests`: per-seed least-squares slopes), and the
  compute multiplier (:func:`compute_multiplier`, an estimate with a seed-bootstrap
  interval);
- words each result by the declared rule (:func:`verdict`): a difference only under Holm,
  "level" only under the TOST, "not resolved" otherwise;
- reads the declared tests of one grid (:func:`corpus_tests`: several comparisons, Holm
  over them, e.g. P1 on a second corpus) and the group-sequential test of one comparison
  (:func:`sequential_test`: declared looks, Lan-DeMets boundaries, a stopping rule).

Results are dicts of the runner's format (:func:`qkmlp.experiments.runner.load_results`),
passed as ``{step budget: results}``.
"""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .runner import values_by_seed
from ..runbase.stats import (detectable_difference, holm, mean_sd, sequential_bounds, sequential_look, t_interval,
                             t_test, tost, wilcoxon_test)

__all__ = ["load_declarations", "declaration_commit", "commit_order", "budget_tests", "extension_tests",
           "corpus_tests", "sequential_runs", "sequential_test", "trend_tests", "compute_multiplier", "verdict", "trend_verdict"]


def load_declarations(folder, prefix: str = "") -> dict[str, dict]:
    """{id: declaration} of the JSON files in ``folder`` whose names start with ``prefix``;
    each declaration gets ``path`` (where it was read from)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder of declarations at {folder}")
    out = {}
    for p in sorted(folder.glob(f"{prefix}*.json")):
        d = json.loads(p.read_text())
        if d.get("id") != p.stem:
            raise ValueError(f"{p}: the declaration's id {d.get('id')!r} must equal its file name {p.stem!r}")
        out[d["id"]] = {**d, "path": str(p)}
    if not out:
        raise FileNotFoundError(f"no declarations {prefix}*.json in {folder}")
    return out


def _git(folder: Path, *args) -> Optional[subprocess.CompletedProcess]:
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def declaration_commit(path) -> Optional[dict]:
    """The commit that added the file at ``path`` ({"commit", "date"}), or None without git
    history (a source archive) or when the file is not committed."""
    path = Path(path).resolve()
    out = _git(path.parent, "log", "--diff-filter=A", "--format=%H %cI", "--", path.name)
    if out is None or out.returncode != 0 or not out.stdout.strip():
        return None
    sha, date = out.stdout.strip().splitlines()[-1].split()
    return {"commit": sha, "date": date}


def commit_order(declaration: dict, runs: list[dict]) -> dict:
    """Was ``declaration`` committed before the code that trained each of ``runs``?

    Returns ``{"status", "declared_in", "declared_at", "runs", "after", "problems"}``:
    status ``"declared before its runs"`` when the declaring commit is an ancestor of (or
    equal to) every run's ``git_commit`` and no run came from a dirty checkout;
    ``"NOT declared before its runs"`` otherwise (``problems`` says which runs and why);
    ``"unknown: no git history"`` where git cannot answer (then nothing is claimed).
    """
    folder = Path(declaration["path"]).resolve().parent
    dc = declaration_commit(declaration["path"])
    base = {"declared_in": dc and dc["commit"], "declared_at": dc and dc["date"], "runs": len(runs)}
    if dc is None:
        return {**base, "status": "unknown: no git history", "after": None, "problems": []}
    problems, checked = [], {}
    for r in runs:
        sha = r.get("git_commit")
        name = f"{r.get('family')} seed {r.get('seed')} lr {r.get('lr')}"
        if not sha or sha == "unknown":
            problems.append(f"{name}: no commit recorded")
            continue
        if r.get("git_dirty"):
            problems.append(f"{name}: trained from a checkout with uncommitted changes")
        if sha not in checked:
            out = _git(folder, "merge-base", "--is-ancestor", dc["commit"], sha)
            checked[sha] = out is not None and out.returncode == 0
        if not checked[sha]:
            problems.append(f"{name}: its commit {sha[:10]} does not descend from the declaration's")
    after = len(runs) - len({p.split(':')[0] for p in problems})
    status = "declared before its runs" if not problems and runs else "NOT declared before its runs"
    return {**base, "status": status, "after": after, "problems": problems}


def _diffs(results: dict, a: dict, b: dict, metric: str) -> tuple[list[int], list[float]]:
    va, vb = values_by_seed(results, metric, **a), values_by_seed(results, metric, **b)
    seeds = sorted(set(va) & set(vb))
    return seeds, [va[s] - vb[s] for s in seeds]


def verdict(holm_p: float, tost_p: float, mean_diff: float, alpha: float) -> str:
    """The declared rule: 'a lower' / 'b lower' under Holm, 'level within ±margin' under the
    TOST, else 'not resolved'."""
    if holm_p < alpha:
        return "a lower" if mean_diff < 0 else "b lower"
    if tost_p < alpha:
        return "level within ±margin"
    return "not resolved"


def budget_tests(declarations: Mapping[str, dict], results_by_steps: Mapping[int, dict]) -> list[dict]:
    """The per-budget tests of ``declarations`` (each with a ``comparison``) on every budget
    present, Holm-corrected together over the declared family (each declaration times the
    grids it names; a grid not stored yet enters as p = 1). One row per (test, budget):
    ``id``, ``steps``, ``a``, ``b``, ``n``, ``mean_diff`` (a − b), ``ci`` (95 % t), ``t_p``,
    ``wilcoxon_p``, ``holm_p`` (and ``holm_m``, the family's size), ``tost_p``, ``margin``,
    ``verdict``, ``wilcoxon_agrees``
    (both tests on the same side of α, uncorrected) and ``diffs``/``seeds``."""
    rows = []
    for key, d in declarations.items():
        a, b = d["comparison"]["a"], d["comparison"]["b"]
        for steps in sorted(results_by_steps):
            seeds, diffs = _diffs(results_by_steps[steps], a, b, d["metric"])
            mu, sd = mean_sd(diffs)
            rows.append({"id": key, "steps": steps, "a": a["family"], "b": b["family"], "n": len(diffs),
                         "mean_diff": mu, "sd_diff": sd, "ci": t_interval(diffs), "t_p": t_test(diffs),
                         "wilcoxon_p": wilcoxon_test(diffs), "tost_p": tost(diffs, d["equivalence"]["margin"]),
                         "margin": d["equivalence"]["margin"], "alpha": d["alpha"], "seeds": seeds, "diffs": diffs})
    # Holm over the whole declared family (every declaration x every grid it names); a grid
    # not stored yet counts as p = 1, which can only make the correction stricter
    declared = sum(len(d.get("grids", ())) for d in declarations.values())
    pad = max(0, declared - len(rows))
    for r, p in zip(rows, holm([r["t_p"] for r in rows] + [1.0] * pad)[:len(rows)] if rows else []):
        r["holm_p"] = p
        r["holm_m"] = len(rows) + pad
        r["verdict"] = verdict(p, r["tost_p"], r["mean_diff"], r["alpha"])
        r["wilcoxon_agrees"] = (r["t_p"] < r["alpha"]) == (r["wilcoxon_p"] < r["alpha"])
    return rows


def extension_tests(extension: dict, per_budget: Mapping[str, dict], results_by_steps: Mapping[int, dict],
                    steps: int, seeds: Sequence[int], new_seeds: Sequence[int], power: float = 0.8) -> dict:
    """A declared re-test of one budget on more seeds (``lm24k-twenty-seeds.json``).

    ``extension["comparisons"]`` (each ``{"id", "a", "b"}``) are read at ``steps`` on all of
    ``seeds``, inside the Holm family of ``per_budget`` (the declarations whose family the
    extension keeps: every other budget enters as stored in ``results_by_steps``). Every
    family of the comparisons must have exactly ``seeds`` at ``steps``: a partial grid
    raises, so nothing is read before the runs are complete.

    Returns ``{"rows", "replication", "family"}``:

    - ``rows``: one :func:`budget_tests` row per comparison (``id`` the extension's), with
      ``mde``, the difference the paired t-test detects with probability ``power`` at the
      family's strictest Holm level α/m;
    - ``replication``: the same comparisons on ``new_seeds`` alone, Holm over the
      comparisons: ``n``, ``mean_diff``, ``ci``, ``t_p``, ``wilcoxon_p``, ``holm_p``,
      ``same_sign`` (as the row on all seeds); a companion, so it carries no verdict;
    - ``family``: every row of the Holm family (all budgets).
    """
    seeds, new_seeds = sorted(seeds), sorted(new_seeds)
    if not set(new_seeds) <= set(seeds) or not new_seeds:
        raise ValueError(f"new_seeds {new_seeds} must be a non-empty subset of seeds {seeds}")
    if steps not in results_by_steps:
        raise KeyError(f"no results at {steps} steps; stored budgets: {sorted(results_by_steps)}")
    by_pair = {(d["comparison"]["a"]["family"], d["comparison"]["b"]["family"]): k for k, d in per_budget.items()}
    keys = {}
    for comp in extension["comparisons"]:
        pair = (comp["a"]["family"], comp["b"]["family"])
        if pair not in by_pair:
            raise KeyError(f"comparison {comp['id']!r} ({pair[0]} vs {pair[1]}) is not one of the per-budget "
                           f"declarations {sorted(per_budget)}")
        for fam in pair:
            have = sorted(values_by_seed(results_by_steps[steps], extension["metric"], family=fam))
            if have != seeds:
                missing = sorted(set(seeds) - set(have))
                raise ValueError(f"{fam} at {steps} steps has seeds {have}; the declared test reads {seeds}"
                                 + (f" (missing {missing})" if missing else ""))
        keys[comp["id"]] = by_pair[pair]
    family = budget_tests(per_budget, results_by_steps)
    at = {r["id"]: r for r in family if r["steps"] == steps}
    rows, rep = [], []
    for cid, key in keys.items():
        r = {**at[key], "id": cid, "declaration": key}
        r["mde"] = detectable_difference(r["sd_diff"], r["n"], alpha=r["alpha"] / r["holm_m"], power=power)
        rows.append(r)
        new = [d for s, d in zip(r["seeds"], r["diffs"]) if s in set(new_seeds)]
        mu, _ = mean_sd(new)
        rep.append({"id": cid, "a": r["a"], "b": r["b"], "steps": steps, "n": len(new), "mean_diff": mu,
                    "ci": t_interval(new), "t_p": t_test(new), "wilcoxon_p": wilcoxon_test(new),
                    "same_sign": (mu > 0) == (r["mean_diff"] > 0), "seeds": new_seeds, "diffs": new})
    for r, p in zip(rep, holm([r["t_p"] for r in rep])):
        r["holm_p"] = p
    return {"rows": rows, "replication": rep, "family": family}


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def trend_verdict(holm_p: float, tost_p: float, mean_slope: float, alpha: float) -> str:
    """'gap grows' / 'gap shrinks' (the gap a − b moving away from or towards b's favour)
    under Holm, 'flat within ±margin' under the TOST, else 'not resolved'."""
    if holm_p < alpha:
        return "a gains with compute" if mean_slope < 0 else "b gains with compute"
    if tost_p < alpha:
        return "flat within ±margin"
    return "not resolved"


def trend_tests(declaration: dict, results_by_steps: Mapping[int, dict]) -> list[dict]:
    """The declared trend test: for each comparison and seed, the least-squares slope of
    (a − b) against log₂(step budget); one-sample t-test and Wilcoxon of the slopes, Holm
    over the comparisons, TOST against the margin. Needs at least two budgets. One row per
    comparison: ``a``, ``b``, ``steps``, ``n``, ``mean_slope``, ``ci``, ``t_p``,
    ``wilcoxon_p``, ``holm_p``, ``tost_p``, ``verdict``, ``slopes``."""
    steps = sorted(results_by_steps)
    if len(steps) < 2:
        raise ValueError(f"a trend needs at least two budgets, got {steps}")
    xs = [math.log2(s) for s in steps]
    rows = []
    for comp in declaration["comparisons"]:
        a, b = comp["a"], comp["b"]
        per = [dict(zip(*_diffs(results_by_steps[s], a, b, declaration["metric"]))) for s in steps]
        seeds = sorted(set.intersection(*(set(p) for p in per)))
        slopes = [_slope(xs, [p[sd] for p in per]) for sd in seeds]
        mu, _ = mean_sd(slopes)
        rows.append({"id": declaration["id"], "a": a["family"], "b": b["family"], "steps": steps, "n": len(slopes),
                     "mean_slope": mu, "ci": t_interval(slopes), "t_p": t_test(slopes),
                     "wilcoxon_p": wilcoxon_test(slopes), "tost_p": tost(slopes, declaration["equivalence"]["margin"]),
                     "margin": declaration["equivalence"]["margin"], "alpha": declaration["alpha"],
                     "seeds": seeds, "slopes": slopes})
    for r, p in zip(rows, holm([r["t_p"] for r in rows])):
        r["holm_p"] = p
        r["verdict"] = trend_verdict(p, r["tost_p"], r["mean_slope"], r["alpha"])
    return rows


def _match_budget(curve_steps: list[float], curve_loss: list[float], target: float) -> float:
    """The budget at which the loss curve, linear in log₂ steps between the stored budgets,
    first falls to ``target``: 0.0 when it is there already at the smallest budget (below the
    grid), inf when it never gets there (beyond the grid)."""
    if curve_loss[0] < target:
        return 0.0
    if curve_loss[0] == target:
        return float(curve_steps[0])
    for (s0, l0), (s1, l1) in zip(zip(curve_steps, curve_loss), zip(curve_steps[1:], curve_loss[1:])):
        if l1 <= target < l0:
            x0, x1 = math.log2(s0), math.log2(s1)
            return 2 ** (x0 + (l0 - target) / (l0 - l1) * (x1 - x0))
    return math.inf


def compute_multiplier(declaration: dict, results_by_steps: Mapping[int, dict], n_boot: int = 10000,
                       seed: int = 0) -> list[dict]:
    """The declared estimate: at each budget B but the largest, the budget B' where b's mean
    test loss (interpolated linearly in log₂ steps) equals a's at B; multiplier B'/B.

    One row per comparison and budget: ``multiplier`` (inf: b does not reach a's loss within
    the grid; 0.0: b is there already at the smallest budget), ``ci`` (95 % percentile
    interval over ``n_boot`` resamples of the seeds, shared across families and budgets;
    an end at inf or 0.0 is outside the grid) and ``outside_grid``, the share of resamples
    whose multiplier lies outside the grid.
    """
    import random

    steps = sorted(results_by_steps)
    metric = declaration["metric"]
    rng = random.Random(seed)
    vals = {}
    for comp in declaration["comparisons"]:
        for fam in (comp["a"], comp["b"]):
            vals[fam["family"]] = [values_by_seed(results_by_steps[s], metric, **fam) for s in steps]
    seeds = sorted(set.intersection(*(set(v) for per in vals.values() for v in per)))
    boots = [[rng.choice(seeds) for _ in seeds] for _ in range(n_boot)]

    def mult(a, b, i, sample):
        la = sum(vals[a][i][s] for s in sample) / len(sample)
        lb = [sum(vals[b][k][s] for s in sample) / len(sample) for k in range(len(steps))]
        return _match_budget(steps, lb, la) / steps[i]

    rows = []
    for comp in declaration["comparisons"]:
        a, b = comp["a"]["family"], comp["b"]["family"]
        for i in range(len(steps) - 1):
            bs = sorted(mult(a, b, i, s) for s in boots)
            rows.append({"a": a, "b": b, "steps": steps[i], "multiplier": mult(a, b, i, seeds),
                         "ci": (bs[int(0.025 * n_boot)], bs[int(0.975 * n_boot) - 1]),
                         "outside_grid": sum(1 for x in bs if x in (0.0, math.inf)) / n_boot})
    return rows


def _complete(results: dict, families: Sequence[str], seeds: Sequence[int], metric: str) -> None:
    """Raise unless every family has exactly ``seeds`` in ``results`` (nothing is read early)."""
    for fam in families:
        have = sorted(values_by_seed(results, metric, family=fam))
        if have != sorted(seeds):
            missing = sorted(set(seeds) - set(have))
            raise ValueError(f"{fam} has seeds {have}; the declared test reads {sorted(seeds)}"
                             + (f" (missing {missing})" if missing else ""))


def corpus_tests(declaration: dict, results: dict, seeds: Optional[Sequence[int]] = None,
                 power: float = 0.8) -> list[dict]:
    """The declared comparisons of one grid (``lm-python-p1.json``), Holm over them.

    ``declaration["comparisons"]`` (each ``{"id", "a", "b"}``) are read on ``results`` (the
    runner's format; pass :func:`qkmlp.experiments.runner.unrounded` results), every family
    on exactly ``seeds`` (default: the evaluation seeds of the declaration's task size; a
    partial grid raises). One row per comparison: ``id``, ``a``,
    ``b``, ``n``, ``mean_diff`` (a − b), ``sd_diff``, ``ci`` (95 % t), ``t_p``, ``holm_p``,
    ``wilcoxon_p``, ``wilcoxon_agrees``, ``tost_p``, ``margin``, ``verdict`` (the rule of
    :func:`verdict`), ``a_wins`` (seeds with a lower), ``mde`` (the difference the paired
    t-test detects with probability ``power`` at the strictest Holm level α/m) and
    ``seeds``/``diffs``.
    """
    metric, alpha, margin = declaration["metric"], declaration["alpha"], declaration["equivalence"]["margin"]
    comps = declaration["comparisons"]
    if seeds is None:
        from .tasks import get_task

        seeds = get_task(declaration["task"]).config(declaration["size"])["seeds"]
    _complete(results, sorted({c[x]["family"] for c in comps for x in ("a", "b")}), seeds, metric)
    rows = []
    for comp in comps:
        sd_seeds, diffs = _diffs(results, comp["a"], comp["b"], metric)
        mu, sd = mean_sd(diffs)
        rows.append({"id": comp["id"], "a": comp["a"]["family"], "b": comp["b"]["family"], "n": len(diffs),
                     "mean_diff": mu, "sd_diff": sd, "ci": t_interval(diffs), "t_p": t_test(diffs),
                     "wilcoxon_p": wilcoxon_test(diffs), "tost_p": tost(diffs, margin), "margin": margin,
                     "alpha": alpha, "a_wins": sum(1 for x in diffs if x < 0), "seeds": sd_seeds, "diffs": diffs})
    for r, p in zip(rows, holm([r["t_p"] for r in rows])):
        r["holm_p"] = p
        r["verdict"] = verdict(p, r["tost_p"], r["mean_diff"], alpha)
        r["wilcoxon_agrees"] = (r["t_p"] < alpha) == (r["wilcoxon_p"] < alpha)
        r["mde"] = detectable_difference(r["sd_diff"], r["n"], alpha=alpha / len(rows), power=power)
    return rows


def sequential_runs(declaration: dict, folder) -> list[dict]:
    """The evaluation records in ``folder`` (``eval_<cell>_lr<lr>_s<seed>.json``) whose seed
    belongs to the declaration's last (largest) look, sorted by file name; the records of
    other seeds sharing the folder are left out. Pass them to :func:`sequential_test` as
    ``{"meta": {"metric": ...}, "runs": records}``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder of run records at {folder}")
    seeds = set(declaration["looks"][-1]["seeds"])
    return [json.loads(p.read_text()) for p in sorted(folder.glob("eval_*_s*.json"))
            if int(p.stem.rsplit("_s", 1)[1]) in seeds]


def sequential_test(declaration: dict, results: dict) -> dict:
    """The declared group-sequential test of one comparison (``lm24k-p1-sequential.json``).

    ``declaration["looks"]`` lists each look's seeds (nested, increasing) and information
    fraction; the boundaries are :func:`qkmlp.runbase.stats.sequential_bounds` of those
    fractions at ``alpha`` with the declared spending function. Looks are taken in order on
    ``results`` (the runner's format, unrounded; it may hold more seeds than a look reads):
    a look whose seeds are not all stored for both families ends the reading. At each look:
    stop with 'a lower' / 'b lower' when the paired t p-value is at most the look's nominal
    p; else stop with 'level within ±margin' when the repeated confidence interval lies
    inside ±margin; else go on to the next look, or 'not resolved' after the last.

    Returns ``{"looks", "bounds", "verdict", "stopped_at", "status"}``: ``looks`` one
    :func:`qkmlp.runbase.stats.sequential_look` row per look taken (with ``look``,
    ``seeds``, ``diffs``, ``wilcoxon_p``, ``wilcoxon_agrees`` at the nominal p, ``a_wins``,
    ``ci95`` the naive 95 % t-interval, and ``decision``); ``verdict`` None and ``status``
    'waiting for look k' while the rule has not decided.
    """
    kind = declaration["spending"]["kind"]
    metric, alpha = declaration["metric"], declaration["alpha"]
    margin = declaration["equivalence"]["margin"]
    a, b = declaration["comparison"]["a"], declaration["comparison"]["b"]
    looks = declaration["looks"]
    seeds_by_look = [sorted(lk["seeds"]) for lk in looks]
    if any(not set(p) < set(q) for p, q in zip(seeds_by_look, seeds_by_look[1:])):
        raise ValueError("each look's seeds must strictly contain the previous look's")
    bounds = sequential_bounds([lk["information_fraction"] for lk in looks], alpha, kind)
    def stored(cell):                                    # no run of a family yet: nothing stored
        return values_by_seed(results, metric, **cell) if any(
            all(r.get(k) == v for k, v in cell.items()) for r in results["runs"]) else {}

    va, vb = stored(a), stored(b)
    out = {"looks": [], "bounds": bounds, "verdict": None, "stopped_at": None}
    for k, (seeds, bound) in enumerate(zip(seeds_by_look, bounds), start=1):
        if not (set(seeds) <= set(va) and set(seeds) <= set(vb)):
            out["status"] = f"waiting for look {k} (seeds {seeds[0]}-{seeds[-1]} of both families)"
            return out
        diffs = [va[s] - vb[s] for s in seeds]
        row = {"look": k, "seeds": seeds, "diffs": diffs,
               **sequential_look(diffs, bound["nominal_p"], margin), "ci95": t_interval(diffs),
               "wilcoxon_p": wilcoxon_test(diffs), "a_wins": sum(1 for x in diffs if x < 0)}
        row["wilcoxon_agrees"] = row["rejects"] == (row["wilcoxon_p"] <= bound["nominal_p"])
        if row["rejects"]:
            row["decision"] = "a lower" if row["mean_diff"] < 0 else "b lower"
        elif row["inside_margin"]:
            row["decision"] = "level within ±margin"
        else:
            row["decision"] = "continue" if k < len(looks) else "not resolved"
        out["looks"].append(row)
        if row["decision"] != "continue":
            out.update(verdict=row["decision"], stopped_at=k, status="decided")
            return out
    raise AssertionError("unreachable: the last look always decides")
