"""Tables and figures of stored results, for the experiments chapter.

Comparisons are oriented so that a positive ``mean_diff`` always means "the first family
is better": a − b for accuracies, b − a for losses (:func:`gain`). A declared *family of
tests* (one prediction over several tasks and activations) is corrected with Holm's
method by :func:`holm_family`, which also states each comparison's minimum detectable
effect. Figures are drawn on :mod:`qkmlp.book.figures` panels.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Optional, Sequence

from ..experiments.families import get_family
from ..experiments.runner import cell_key, compare, summary, values_by_seed
from ..runbase.stats import detectable_difference, holm, mean_sd

__all__ = ["gain", "comparison_rows", "form_vs_form", "holm_family", "family_label", "plot_paired",
           "SHAZEER_FAMILIES", "shazeer_table1", "shazeer_rows", "ordering_agreement", "tau_bootstrap",
           "plot_vs_shazeer", "plateau_rows",
           "plot_val_curves", "cross_table", "plot_cross_table", "swap_rows", "run_shifts", "provenance_rows",
           "plot_loss_vs_budget", "plot_gaps_vs_budget", "ACTIVATIONS"]

ACTIVATIONS = ("silu", "gelu", "relu")


def _higher_is_better(metric: str) -> bool:
    """Direction of a metric other than the task's own: accuracies up, losses down."""
    if metric.endswith("_acc"):
        return True
    if metric.endswith("_loss"):
        return False
    raise ValueError(f"cannot tell whether a higher {metric!r} is better; expected a name ending "
                     "in '_acc' or '_loss', or the task's own metric")


def gain(results: dict, a: dict, b: dict, metric: Optional[str] = None, level: float = 0.95) -> dict:
    """Paired comparison of cell ``a`` against cell ``b``, signed so that > 0 means a is better."""
    metric = metric or results["meta"]["metric"]
    higher = results["meta"]["higher_is_better"] if metric == results["meta"]["metric"] else _higher_is_better(metric)
    # for a loss, b − a > 0 (a "win" of compare(b, a)) means a is better
    res = compare(results, a, b, metric, level) if higher else compare(results, b, a, metric, level)
    res["a"], res["b"], res["metric"] = a, b, metric
    return res


def comparison_rows(results: dict, pairs: Sequence[tuple[dict, dict]], metric: Optional[str] = None) -> list[dict]:
    """:func:`gain` for each (a, b) in ``pairs``."""
    return [gain(results, a, b, metric) for a, b in pairs]


def form_vs_form(results: dict, kind_a: str = "gated", kind_b: str = "symgated", rank: int = 1,
                 activations: Sequence[str] = ACTIVATIONS, task: Optional[str] = None, **extra) -> list[dict]:
    """``{kind_a}{rank}-σ`` against ``{kind_b}{rank}-σ`` for each σ in ``activations``.

    ``extra`` fixes other cell entries (``teacher=...``, ``m_kv=...``); each row gets
    ``task`` (default: the results' task) and ``sigma``.
    """
    rows = comparison_rows(results, [({**extra, "family": f"{kind_a}{rank}-{s}"},
                                      {**extra, "family": f"{kind_b}{rank}-{s}"}) for s in activations])
    for r, s in zip(rows, activations):
        r["task"], r["sigma"] = task or results["meta"]["task"], s
    return rows


def holm_family(rows: list[dict], alpha: float = 0.05, power: float = 0.8) -> list[dict]:
    """Holm-correct one declared family of comparison rows (from :func:`gain`), in place.

    Adds ``p_holm`` (Holm-adjusted paired-t p-value), ``survives`` (p_holm < alpha) and
    ``mde``: the smallest true mean difference the paired t-test of the row would detect
    with probability ``power`` at level alpha/m (m = len(rows), the first and strictest
    Holm step), from the row's own spread of differences. Returns ``rows``.
    """
    if not rows:
        raise ValueError("a family of tests needs at least one comparison")
    adj = holm([r["t_p"] for r in rows])
    m = len(rows)
    for r, p in zip(rows, adj):
        r["p_holm"] = p
        r["survives"] = p < alpha
        r["mde"] = detectable_difference(r["sd_diff"], r["n"], alpha=alpha / m, power=power)
        r["family_size"] = m
    return rows


def family_label(name: str) -> str:
    return get_family(name).label


def plot_paired(rows: list[dict], ax, scale: float = 1.0, unit: str = "", labels: Optional[Sequence[str]] = None):
    """Paired differences, one row per comparison (top to bottom): each seed's difference
    (grey dots), the mean and its 95 % t-interval (bar; blue when the first family is
    better on average, vermilion when worse), the mean filled when the comparison survives
    Holm's correction (``row["survives"]``), hollow otherwise.

    ``scale`` multiplies the differences (100 for accuracy points).
    """
    import numpy as np

    from .figures import COLORS

    n = len(rows)
    for i, r in enumerate(rows):
        y = n - 1 - i
        diffs = np.asarray(r["diffs"]) * scale
        jitter = (np.arange(len(diffs)) % 5 - 2) * 0.07
        ax.scatter(diffs, y + jitter, s=6, color="0.6", zorder=2, lw=0)
        lo, hi = (v * scale for v in r["ci"])
        color = COLORS[0] if r["mean_diff"] >= 0 else COLORS[1]
        ax.plot([lo, hi], [y, y], color=color, lw=2.4, zorder=3, solid_capstyle="butt")
        filled = bool(r.get("survives", False))
        ax.scatter([r["mean_diff"] * scale], [y], s=30, zorder=4, color=color if filled else "white",
                   edgecolors=color, linewidths=1.4)
    ax.axvline(0, color="0.2", lw=0.8)
    ax.set_yticks(range(n))
    names = list(labels) if labels is not None else [
        f"{family_label(r['a']['family'])} − {family_label(r['b']['family'])}" for r in rows]
    ax.set_yticklabels(list(reversed(names)))
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel(f"paired difference{' (' + unit + ')' if unit else ''}")
    ax.grid(axis="y", alpha=0)


# --- the language model beside Shazeer's Table 1 -----------------------------------------

#: Shazeer (2020), Table 1: held-out log-perplexity of T5-base variants on C4 span filling
#: after 65 536 steps (mean, and the standard deviation over runs) and 524 288 steps.
#: Shazeer's FFN names (Table 1 of shazeer2020glu) and the layer families of this book.
SHAZEER_FAMILIES = {"ReLU": "kv-relu", "GELU": "kv-gelu", "Swish": "kv-silu", "GLU": "gated1-sigmoid",
                    "bilinear": "gated1-identity", "GEGLU": "gated1-gelu", "SwiGLU": "gated1-silu",
                    "ReGLU": "gated1-relu"}
_TABLE1 = Path(__file__).resolve().parents[3] / "book" / "data" / "shazeer2020" / "table1.json"


@functools.lru_cache(maxsize=None)
def shazeer_table1(path: Optional[str] = None) -> dict:
    """Shazeer's Table 1 as ``{family: (log-ppl at 65,536 steps, its sd, log-ppl at 524,288)}``,
    read from ``book/data/shazeer2020/table1.json`` (transcribed there with its source)."""
    path = Path(path) if path is not None else _TABLE1
    if not path.exists():
        raise FileNotFoundError(f"no Shazeer table at {path}; it ships with the book's source "
                                "(book/data/shazeer2020/table1.json)")
    table = json.loads(path.read_text())
    cols = table["columns"]
    i65, isd, i524 = cols.index("logppl_65536"), cols.index("sd_65536"), cols.index("logppl_524288")
    return {SHAZEER_FAMILIES[row[0]]: (row[i65], row[isd], row[i524]) for row in table["rows"]}


def shazeer_rows(results: dict, baseline: str = "kv-relu") -> list[dict]:
    """For each family of the LM grid: our mean test loss and paired difference from
    ``baseline`` (a − baseline, negative = better, with its 95 % interval; ``better_in``
    counts the seeds where a beat the baseline), beside Shazeer's differences from ReLU
    at 65 536 and 524 288 steps (None for our controls)."""
    out = []
    means = {r["family"]: r["mean"] for r in summary(results)}
    for fam in results["config"]["families"]:
        row = {"family": fam, "mean": means[fam]}
        if fam != baseline:
            c = compare(results, {"family": fam}, {"family": baseline}, metric="test_loss")
            row.update(diff=c["mean_diff"], ci=c["ci"], better_in=c["losses"], n=c["n"], t_p=c["t_p"],
                       sd_diff=c["sd_diff"], diffs=c["diffs"])
        else:
            row.update(diff=0.0, ci=(0.0, 0.0), better_in=None, n=len(results["meta"]["seeds"]), t_p=None,
                       sd_diff=0.0, diffs=[])
        if fam in shazeer_table1():
            s, base = shazeer_table1()[fam], shazeer_table1()[baseline]
            row.update(shazeer_65k=s[0] - base[0], shazeer_524k=s[2] - base[2])
        else:
            row.update(shazeer_65k=None, shazeer_524k=None)
        out.append(row)
    return out


def ordering_agreement(results: dict, column: int = 0) -> dict:
    """Which pairwise orderings of Shazeer's eight variants reproduce here.

    For each pair of families in :func:`shazeer_table1` (``column`` 0: 65 536 steps,
    2: 524 288 steps): Shazeer's order (lower loss first) against ours (the sign of our
    paired mean difference, and whether its 95 % t-interval excludes zero). A pair is
    ``resolved`` by Shazeer when his difference exceeds twice the root-sum-square of his
    two run-to-run standard deviations (65 536-step column). Returns ``{"pairs": [...],
    "n", "agree", "agree_significant", "disagree_significant", "resolved",
    "resolved_agree", "resolved_agree_significant", "kendall_tau"}`` (τ between the two
    rankings of the eight means).
    """
    from itertools import combinations

    from scipy.stats import kendalltau

    fams = [f for f in shazeer_table1() if f in results["config"]["families"]]
    pairs = []
    for a, b in combinations(fams, 2):
        theirs = shazeer_table1()[a][column] - shazeer_table1()[b][column]
        spread = (shazeer_table1()[a][1] ** 2 + shazeer_table1()[b][1] ** 2) ** 0.5
        c = compare(results, {"family": a}, {"family": b}, metric="test_loss")
        same = theirs != 0 and (c["mean_diff"] < 0) == (theirs < 0)
        pairs.append({"a": a, "b": b, "theirs": theirs, "ours": c["mean_diff"], "ci": c["ci"],
                      "agree": same, "significant": c["significant"],
                      "resolved": abs(theirs) > 2 * spread})
    means = {r["family"]: r["mean"] for r in summary(results)}
    tau = kendalltau([shazeer_table1()[f][column] for f in fams], [means[f] for f in fams]).statistic
    res = [p for p in pairs if p["resolved"]]
    return {"pairs": pairs, "n": len(pairs), "agree": sum(p["agree"] for p in pairs),
            "agree_significant": sum(p["agree"] and p["significant"] for p in pairs),
            "disagree_significant": sum((not p["agree"]) and p["significant"] for p in pairs),
            "resolved": len(res), "resolved_agree": sum(p["agree"] for p in res),
            "resolved_agree_significant": sum(p["agree"] and p["significant"] for p in res),
            "kendall_tau": float(tau)}


def _tau(x: list[float], y: list[float], pairs: list[tuple[int, int]]) -> float:
    """Kendall's τ-a over the given index pairs: (concordant − discordant) / pairs."""
    s = 0
    for i, j in pairs:
        prod = (x[i] - x[j]) * (y[i] - y[j])
        s += (prod > 0) - (prod < 0)
    return s / len(pairs)


def tau_bootstrap(results: dict, other: Optional[dict] = None, column: int = 0, n_boot: int = 10000,
                  seed: int = 0, level: float = 0.95) -> dict:
    """Kendall's τ between our mean test losses and Shazeer's (``column`` of his Table 1)
    with a seed-bootstrap interval, on all pairs of his eight variants and on the pairs his
    table resolves (see :func:`ordering_agreement`), where τ is the share of agreeing pairs
    minus the share of disagreeing ones.

    Seeds are resampled with replacement, the same seeds for every family (the runs are
    paired). With ``other`` (a second grid on the same seeds, e.g. a longer budget) the
    change τ(other) − τ(results) is bootstrapped too, with the same resampled seeds in
    both grids. Returns ``{"all": {...}, "resolved": {...}}``, each with ``tau``, ``ci``
    and, with ``other``, ``tau_other``, ``ci_other``, ``change``, ``ci_change``.
    """
    import random
    from itertools import combinations

    fams = [f for f in shazeer_table1() if f in results["config"]["families"]]
    theirs = [shazeer_table1()[f][column] for f in fams]
    all_pairs = list(combinations(range(len(fams)), 2))
    resolved = [(i, j) for i, j in all_pairs
                if abs(theirs[i] - theirs[j]) > 2 * math.hypot(shazeer_table1()[fams[i]][1], shazeer_table1()[fams[j]][1])]
    grids = [results] + ([other] if other is not None else [])
    by = [[values_by_seed(g, "test_loss", family=f) for f in fams] for g in grids]
    seeds = sorted(set.intersection(*(set(v) for g in by for v in g)))
    rng = random.Random(seed)

    def taus(sample):
        means = [[sum(v[s] for s in sample) / len(sample) for v in g] for g in by]
        return [[_tau(theirs, m, p) for m in means] for p in (all_pairs, resolved)]

    point = taus(seeds)
    boot = [taus([rng.choice(seeds) for _ in seeds]) for _ in range(n_boot)]
    lo_i, hi_i = int((1 - level) / 2 * n_boot), int((1 + level) / 2 * n_boot) - 1

    def interval(vals):
        vals = sorted(vals)
        return vals[lo_i], vals[hi_i]

    out = {}
    for k, name in enumerate(("all", "resolved")):
        row = {"pairs": len(all_pairs if k == 0 else resolved), "tau": point[k][0],
               "ci": interval([b[k][0] for b in boot])}
        if other is not None:
            row.update(tau_other=point[k][1], ci_other=interval([b[k][1] for b in boot]),
                       change=point[k][1] - point[k][0], ci_change=interval([b[k][1] - b[k][0] for b in boot]))
        out[name] = row
    out["seeds"] = seeds
    return out


def plot_vs_shazeer(rows: list[dict], ax, column: str = "shazeer_65k"):
    """Our difference from ReLU (y, nats per character, 95 % interval) against Shazeer's
    (x, nats per token), one labelled point per variant of his Table 1."""
    from .figures import COLORS

    pts = [r for r in rows if r[column] is not None]
    for i, r in enumerate(pts):
        color = COLORS[i % len(COLORS)]
        ax.errorbar(r[column], r["diff"], yerr=[[r["diff"] - r["ci"][0]], [r["ci"][1] - r["diff"]]], fmt="o",
                    color=color, ms=4, capsize=2, lw=1.2, label=family_label(r["family"]))
    ax.axhline(0, color="0.3", lw=0.7)
    ax.axvline(0, color="0.3", lw=0.7)
    ax.set_xlabel("Shazeer: Δ vs ReLU (nats/token)")
    ax.set_ylabel("here: Δ vs ReLU (nats/char)")
    # below the axes (constrained layout makes room), so no point hides under it
    ax.figure.legend(ncol=3, loc="outside lower center", handletextpad=0.2, columnspacing=0.6)


def plateau_rows(results: dict) -> list[dict]:
    """Per cell: how the evaluation runs ended. ``plateau``: runs stopped by patience;
    ``median_best_step`` (of ``max_steps``); ``late_gain``: the mean improvement of the best
    validation loss during the last fifth of each run (``run["late_gain"]``, 0 when the best
    came earlier), in the task's validation-loss units."""
    import numpy as np

    rows = []
    families = results["config"]["families"]
    for key in dict.fromkeys(cell_key(r) for r in results["runs"]):
        runs = [r for r in results["runs"] if cell_key(r) == key]
        rows.append({**dict(key), "n": len(runs), "plateau": sum(r["stopped"] == "plateau" for r in runs),
                     "median_best_step": float(np.median([r["best_step"] for r in runs])),
                     "max_steps": results["config"]["max_steps"],
                     "late_gain": float(np.mean([r["late_gain"] for r in runs]))})
    rows.sort(key=lambda r: families.index(r["family"]) if r["family"] in families else len(families))
    return rows


def plot_val_curves(results: dict, ax, families: Sequence[str], **cell):
    """Mean validation loss against step per family (one colour each), the evaluation runs."""
    import numpy as np

    from .figures import COLORS

    if len(families) > len(COLORS):
        raise ValueError(f"at most {len(COLORS)} families per panel (one colour each)")
    for fam, color in zip(families, COLORS):
        runs = [r for r in results["runs"] if r["family"] == fam and all(r.get(k) == v for k, v in cell.items())]
        length = min(len(r["curve"]["val_step"]) for r in runs)
        steps = runs[0]["curve"]["val_step"][:length]
        vals = np.array([r["curve"]["val_loss"][:length] for r in runs], dtype=float)
        ax.plot(steps[1:], vals[:, 1:].mean(0), color=color, label=family_label(fam))
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.legend()


def cross_table(results: dict, metric: Optional[str] = None):
    """(teachers, students, mean matrix[teacher][student]) of the teacher–student task."""
    metric = metric or results["meta"]["metric"]
    teachers, students = results["config"]["teachers"], results["config"]["families"]
    means = {(r["teacher"], r["family"]): r["mean"] for r in summary(results, metric)}
    return teachers, students, [[means[(t, s)] for s in students] for t in teachers]


def plot_cross_table(results: dict, ax, metric: Optional[str] = None):
    """Heat map of the mean test MSE, teacher rows × student columns (log colour scale)."""
    import numpy as np
    from matplotlib.colors import LogNorm

    teachers, students, mat = cross_table(results, metric)
    m = np.array(mat)
    im = ax.imshow(m, norm=LogNorm(vmin=max(m.min(), 1e-4), vmax=m.max()), cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(students)))
    ax.set_xticklabels([family_label(f) for f in students], rotation=75, ha="right")
    ax.set_yticks(range(len(teachers)))
    ax.set_yticklabels([family_label(f) for f in teachers])
    ax.set_xlabel("student")
    ax.set_ylabel("teacher")
    ax.grid(False)
    return im


def swap_rows(results_by_task: dict, families: Sequence[str]) -> list[dict]:
    """Mean swap change at initialisation and after training, per task and gated family."""
    rows = []
    for task, res in results_by_task.items():
        for fam in families:
            runs = [r for r in res["runs"] if r["family"] == fam]
            if not runs:
                continue
            init = [r["swap_init"] for r in runs]
            trained = [r["swap_trained"] for r in runs]
            rows.append({"task": task, "family": fam, "init": mean_sd(init)[0],
                         "trained": mean_sd(trained)[0],
                         "grew": sum(t > i for t, i in zip(trained, init)), "n": len(runs)})
    return rows


def provenance_rows(results_by_task: dict) -> list[dict]:
    """One row per results file: runs, tuning runs, seeds, learning rates, wall time, commit."""
    rows = []
    for task, r in results_by_task.items():
        m = r["meta"]
        rows.append({"task": task, "runs": len(r["runs"]), "tune_runs": len(r["tune_runs"]),
                     "seeds": len(m["seeds"]), "lrs": m["lrs"], "wall_min": m["wall_s"] / 60,
                     "commit": m["git_commit"][:8], "uncommitted": m["git_uncommitted_changes"],
                     "threads": m["hardware"]["torch_threads"], "world": m["world_size"]})
    return rows


def run_shifts(before: dict, after: dict, metric: Optional[str] = None) -> dict:
    """{(cell key, seed): |after − before|} of ``metric`` for two runs of the same grid.

    Both result dicts (from ``load_results``) must have the same configuration and the same
    runs (cell and seed); anything else raises, since the runs would not be comparable.
    """
    if before["config"] != after["config"]:
        raise ValueError("expected two runs of the same grid: the configurations differ")
    metric = metric or after["meta"]["metric"]
    vals = [{(cell_key(r), r["seed"]): r[metric] for r in res["runs"]} for res in (before, after)]
    if vals[0].keys() != vals[1].keys():
        raise ValueError("expected the same cells and seeds in both runs")
    return {k: abs(vals[1][k] - v) for k, v in vals[0].items()}


# --- the gap against compute ---------------------------------------------------------------

def _budget_axis(ax, steps: Sequence[int], stored: Sequence[int]):
    """x on a log2 scale with a tick at every declared budget; a budget not stored yet is
    labelled so under its tick."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(steps))
    ax.set_xticklabels([f"{s:,}".replace(",", "\u2009") + ("" if s in stored else "\nnot yet run") for s in steps])
    ax.minorticks_off()
    lo, hi = min(steps), max(steps)
    ax.set_xlim(lo / 1.6, hi * 1.6)
    ax.set_xlabel("training steps (log scale)")


def plot_loss_vs_budget(results_by_steps: dict, families: Sequence[str], ax, steps: Sequence[int]):
    """Mean test loss against the step budget, one colour per family, with the 95 %
    t-interval over seeds (bars); ``steps``: every declared budget (ticks), of which those
    in ``results_by_steps`` are drawn."""
    from .figures import COLORS
    from ..runbase.stats import t_interval

    if len(families) > len(COLORS):
        raise ValueError(f"at most {len(COLORS)} families (one colour each)")
    stored = sorted(results_by_steps)
    for i, (fam, color) in enumerate(zip(families, COLORS)):
        xs, ys, lo, hi = [], [], [], []
        for s in stored:
            vals = list(values_by_seed(results_by_steps[s], "test_loss", family=fam).values())
            m = sum(vals) / len(vals)
            a, b = t_interval(vals)
            xs.append(s * 2 ** (0.06 * (i - (len(families) - 1) / 2)))      # a small offset per family
            ys.append(m)
            lo.append(m - a)
            hi.append(b - m)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", color=color, ms=4, capsize=2, lw=1.2, label=family_label(fam))
    _budget_axis(ax, steps, stored)
    ax.set_ylabel("test loss (nats/char)")
    ax.legend(loc="upper right")


def plot_gaps_vs_budget(rows: list[dict], ax, steps: Sequence[int], labels: dict, margin: Optional[float] = None):
    """The declared paired gaps (a − b, test loss) against the step budget: per comparison
    (``labels``: {(a, b): name}, one colour each) the mean with its 95 % interval, each
    seed's difference as a grey dot, the mean filled where the declared verdict is a
    difference and hollow otherwise; the equivalence band ±``margin`` shaded."""
    from .figures import COLORS

    stored = sorted({r["steps"] for r in rows if r["verdict"] != "not yet run"})
    keys = list(labels)
    for i, (key, color) in enumerate(zip(keys, COLORS)):
        mine = [r for r in rows if (r["a"], r["b"]) == key and r["verdict"] != "not yet run"]
        shift = 2 ** (0.09 * (i - (len(keys) - 1) / 2))
        for j, r in enumerate(sorted(mine, key=lambda r: r["steps"])):
            x = r["steps"] * shift
            ax.scatter([x] * len(r["diffs"]), r["diffs"], s=5, color="0.65", lw=0, zorder=2)
            ax.plot([x, x], r["ci"], color=color, lw=2.2, zorder=3, solid_capstyle="butt")
            filled = r["verdict"] in ("a lower", "b lower")
            ax.scatter([x], [r["mean_diff"]], s=28, zorder=4, color=color if filled else "white", edgecolors=color,
                       linewidths=1.4, label=labels[key] if j == 0 else None)
    if margin:
        ax.axhspan(-margin, margin, color="0.85", alpha=0.6, lw=0, zorder=1)
    ax.axhline(0, color="0.2", lw=0.8)
    _budget_axis(ax, steps, stored)
    ax.set_ylabel("SwiGLU − control (nats/char)")
    ax.figure.legend(ncol=1, loc="outside lower center", handletextpad=0.2)
