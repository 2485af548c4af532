"""Tables and figures of stored results, for the experiments chapter.

Comparisons are oriented so that a positive ``gain`` always means "the first family is
better": a − b for accuracies, b − a for losses. A *family of tests* (one prediction,
several tasks and activations) is corrected with Holm's method by :func:`holm_family`,
which also states each comparison's minimum detectable effect.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .families import get_family
from .runner import cell_key, compare, summary
from .stats import detectable_difference, holm, mean_sd

__all__ = ["gain", "gated_vs_symmetric", "comparison_rows", "format_rows", "family_color", "holm_family",
           "plot_paired", "SHAZEER_TABLE1", "shazeer_rows", "ordering_agreement", "plateau_rows", "family_label",
           "plot_final", "plot_curves", "plot_cross_table", "plot_recall", "plot_swap", "swap_rows",
           "run_shifts"]

ACTIVATIONS = ("silu", "gelu", "relu", "identity")


def gain(results: dict, a: dict, b: dict, metric: Optional[str] = None, level: float = 0.95) -> dict:
    """Paired comparison of cell ``a`` against cell ``b``, signed so that > 0 means a is better."""
    metric = metric or results["meta"]["metric"]
    higher = results["meta"]["higher_is_better"] if metric == results["meta"]["metric"] else True
    # for a loss, b − a > 0 (a "win" of compare(b, a)) means a is better
    res = compare(results, a, b, metric, level) if higher else compare(results, b, a, metric, level)
    res["a"], res["b"], res["metric"] = a, b, metric
    return res


def comparison_rows(results: dict, pairs: Sequence[tuple[dict, dict]], metric: Optional[str] = None) -> list[dict]:
    """:func:`gain` for each (a, b) in ``pairs``."""
    return [gain(results, a, b, metric) for a, b in pairs]


def gated_vs_symmetric(results: dict, activations: Sequence[str] = ACTIVATIONS, **extra) -> list[dict]:
    """Gated rank-1 against symmetric rank-1 with the same σ, one row per activation.

    ``extra`` fixes other cell entries (``teacher=...``, ``m_kv=...``).
    """
    return comparison_rows(results, [({**extra, "family": f"gated1-{s}"}, {**extra, "family": f"sym1-{s}"})
                                     for s in activations])


def format_rows(rows: list[dict], digits: int = 4) -> str:
    """A plain-text table of comparison rows: a vs b, mean gain, 95 % CI, wins/losses, sign p."""
    def name(c):
        return " ".join(f"{v}" for k, v in c.items())
    w = max(len(f"{name(r['a'])} vs {name(r['b'])}") for r in rows)
    lines = [f"{'comparison':<{w}}  {'gain':>9}  {'95% CI':>21}  W-L  sign p  sig"]
    for r in rows:
        lo, hi = r["ci"]
        lines.append(
            f"{name(r['a']) + ' vs ' + name(r['b']):<{w}}  {r['mean_diff']:>+9.{digits}f}  "
            f"[{lo:>+9.{digits}f},{hi:>+9.{digits}f}]  {r['wins']}-{r['losses']}  {r['sign_p']:.4f}  "
            f"{'yes' if r['significant'] else 'no'}"
        )
    return "\n".join(lines)


def family_color(name: str):
    """One colour per activation, darker for the gated form, grey for key-value."""
    import matplotlib.pyplot as plt

    fam = get_family(name)
    base = {"silu": 0, "gelu": 1, "relu": 2, "identity": 3}[fam.activation]
    cmap = plt.get_cmap("tab20")
    if fam.kind == "kv":
        return "0.35" if fam.activation == "relu" else "0.6"
    return cmap(2 * base + (0 if fam.kind == "gated" else 1))


def plot_final(results: dict, ax, metric: Optional[str] = None, families: Optional[Sequence[str]] = None, **cell):
    """Per-seed final metric (dots) and mean ± sd (bar) for each family."""
    metric = metric or results["meta"]["metric"]
    rows = [r for r in summary(results, metric) if all(r.get(k) == v for k, v in cell.items())]
    if families is not None:
        rows = sorted((r for r in rows if r["family"] in families), key=lambda r: list(families).index(r["family"]))
    for i, r in enumerate(rows):
        c = family_color(r["family"])
        ax.errorbar(i, r["mean"], yerr=r["sd"], fmt="_", color=c, capsize=4, markersize=14, lw=1.5)
        ax.scatter([i] * len(r["values"]), r["values"], s=12, color=c, alpha=0.7, zorder=3)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([get_family(r["family"]).label for r in rows], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(metric.replace("_", " "))
    return rows


def plot_curves(results: dict, ax, families: Sequence[str], key: str = "test", **cell):
    """Mean learning curve (test metric, or ``key="train_loss"``) per family, ±sd band."""
    import numpy as np

    for fam in families:
        runs = [r for r in results["runs"] if r["family"] == fam and all(r.get(k) == v for k, v in cell.items())]
        steps = runs[0]["curve"]["step" if key == "test" else "train_loss_step"]
        vals = np.array([r["curve"][key] for r in runs])
        mu, sd = vals.mean(0), vals.std(0, ddof=1) if len(runs) > 1 else 0 * vals.mean(0)
        c = family_color(fam)
        ax.plot(steps, mu, color=c, label=get_family(fam).label)
        ax.fill_between(steps, mu - sd, mu + sd, color=c, alpha=0.15, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel(results["meta"]["metric"].replace("_", " ") if key == "test" else "train loss")
    ax.legend(fontsize=7)


def cross_table(results: dict, metric: Optional[str] = None):
    """(teachers, students, mean matrix[teacher][student]) of the teacher–student task."""
    metric = metric or results["meta"]["metric"]
    fams = results["config"]["families"]
    means = {(r["teacher"], r["family"]): r["mean"] for r in summary(results, metric)}
    return fams, fams, [[means[(t, s)] for s in fams] for t in fams]


def plot_cross_table(results: dict, ax, metric: Optional[str] = None):
    """Heat map of the mean test MSE, teacher rows × student columns (log colour scale)."""
    import numpy as np
    from matplotlib.colors import LogNorm

    teachers, students, mat = cross_table(results, metric)
    m = np.array(mat)
    im = ax.imshow(m, norm=LogNorm(vmin=max(m.min(), 1e-4), vmax=m.max()), cmap="viridis_r")
    labels = [get_family(f).label for f in students]
    ax.set_xticks(range(len(students)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(teachers)))
    ax.set_yticklabels([get_family(f).label for f in teachers], fontsize=7)
    ax.set_xlabel("student")
    ax.set_ylabel("teacher")
    return im


def plot_recall(results: dict, ax, families: Sequence[str]):
    """Test accuracy against feed-forward parameter count, mean ± sd over seeds."""
    for fam in families:
        rows = sorted((r for r in summary(results) if r["family"] == fam), key=lambda r: r["m_kv"])
        params = [next(x["params"] for x in results["runs"] if x["family"] == fam and x["m_kv"] == r["m_kv"])
                  for r in rows]
        ax.errorbar(params, [r["mean"] for r in rows], yerr=[r["sd"] for r in rows], marker="o", ms=3,
                    capsize=2, color=family_color(fam), label=get_family(fam).label)
    ax.set_xscale("log")
    ax.set_xlabel("feed-forward parameters")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7)


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


def plot_swap(rows: list[dict], ax):
    """Swap change at initialisation (hollow) and after training (filled), per task and family."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fams = list(dict.fromkeys(r["family"] for r in rows))
    width = 0.8 / len(fams)
    for j, fam in enumerate(fams):
        for i, task in enumerate(tasks):
            r = next((r for r in rows if r["task"] == task and r["family"] == fam), None)
            if r is None:
                continue
            x = i + (j - (len(fams) - 1) / 2) * width
            c = family_color(fam)
            ax.scatter(x, r["init"], facecolors="none", edgecolors=c, s=25)
            ax.scatter(x, r["trained"], color=c, s=25, label=get_family(fam).label if i == 0 else None)
            ax.plot([x, x], [r["init"], r["trained"]], color=c, lw=1)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels(tasks)
    ax.set_ylabel("‖f(swapped) − f‖ / ‖f‖")
    ax.legend(fontsize=7)


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


# --- families of tests --------------------------------------------------------------------

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
    """Paired differences, one row per comparison: each seed's difference (dots), the mean
    and its 95 % t-interval (bar), filled when the comparison survives Holm's correction.

    ``scale`` multiplies the differences (100 for accuracy points); positive means the
    first family is better.
    """
    import numpy as np
    from ..figures import COLORS

    n = len(rows)
    for i, r in enumerate(rows):
        y = n - 1 - i
        diffs = np.asarray(r["diffs"]) * scale
        jitter = (np.arange(len(diffs)) % 5 - 2) * 0.06
        ax.scatter(diffs, y + jitter, s=7, color="0.55", zorder=2, lw=0)
        lo, hi = (v * scale for v in r["ci"])
        color = COLORS[0] if r["mean_diff"] > 0 else COLORS[1]
        ax.plot([lo, hi], [y, y], color=color, lw=2.2, zorder=3)
        filled = r.get("survives", False)
        ax.scatter([r["mean_diff"] * scale], [y], s=34, zorder=4, color=color if filled else "white",
                   edgecolors=color, linewidths=1.5)
    ax.axvline(0, color="0.2", lw=0.8)
    ax.set_yticks(range(n))
    names = labels if labels is not None else [f"{family_label(r['a']['family'])} − {family_label(r['b']['family'])}"
                                               for r in rows]
    ax.set_yticklabels(list(reversed(list(names))))
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel(f"paired difference{' (' + unit + ')' if unit else ''}")
    ax.grid(axis="y", alpha=0)


# --- the language model beside Shazeer's Table 1 -----------------------------------------

#: Shazeer (2020), Table 1: held-out log-perplexity of T5-base variants on C4 span filling,
#: after 65 536 steps (mean of several runs, their standard deviation) and 524 288 steps.
SHAZEER_TABLE1 = {
    "kv-relu": (1.997, 0.005, 1.677),
    "kv-gelu": (1.983, 0.005, 1.679),
    "kv-silu": (1.994, 0.003, 1.683),
    "gated1-sigmoid": (1.982, 0.006, 1.663),
    "gated1-identity": (1.960, 0.005, 1.648),
    "gated1-gelu": (1.942, 0.004, 1.633),
    "gated1-silu": (1.944, 0.010, 1.636),
    "gated1-relu": (1.953, 0.003, 1.645),
}


def shazeer_rows(results: dict, baseline: str = "kv-relu") -> list[dict]:
    """For each family of the LM grid: our mean test loss and paired difference from
    ``baseline`` (a − baseline, negative = better, with its 95 % interval; ``better_in``
    counts the seeds where a beat the baseline), beside
    Shazeer's difference from ReLU at 65 536 and 524 288 steps (None for our controls)."""
    out = []
    means = {r["family"]: r["mean"] for r in summary(results)}
    for fam in results["config"]["families"]:
        row = {"family": fam, "mean": means[fam]}
        if fam != baseline:
            c = compare(results, {"family": fam}, {"family": baseline}, metric="test_loss")
            row.update(diff=c["mean_diff"], ci=c["ci"], better_in=c["losses"], n=c["n"], t_p=c["t_p"])
        else:
            row.update(diff=0.0, ci=(0.0, 0.0), better_in=None, n=len(results["meta"]["seeds"]), t_p=None)
        if fam in SHAZEER_TABLE1:
            s, base = SHAZEER_TABLE1[fam], SHAZEER_TABLE1[baseline]
            row.update(shazeer_65k=s[0] - base[0], shazeer_524k=s[2] - base[2])
        else:
            row.update(shazeer_65k=None, shazeer_524k=None)
        out.append(row)
    return out


def ordering_agreement(results: dict, column: int = 0) -> dict:
    """Which pairwise orderings of Shazeer's eight variants reproduce here.

    For each pair of families in :data:`SHAZEER_TABLE1` (``column`` 0: 65 536 steps,
    2: 524 288 steps), Shazeer's order (lower loss first) against ours (the sign of our
    paired mean difference, and whether its t-interval excludes zero). Returns
    ``{"pairs": [...], "agree": k, "agree_significant": j, "disagree_significant": i,
    "n": number of pairs, "kendall_tau": τ of the two rankings of the means}``.
    """
    from itertools import combinations

    from scipy.stats import kendalltau

    fams = [f for f in SHAZEER_TABLE1 if f in results["config"]["families"]]
    pairs = []
    for a, b in combinations(fams, 2):
        theirs = SHAZEER_TABLE1[a][column] - SHAZEER_TABLE1[b][column]
        c = compare(results, {"family": a}, {"family": b}, metric="test_loss")
        same = (c["mean_diff"] < 0) == (theirs < 0) and theirs != 0
        pairs.append({"a": a, "b": b, "theirs": theirs, "ours": c["mean_diff"], "ci": c["ci"],
                      "agree": same, "significant": c["significant"]})
    means = {r["family"]: r["mean"] for r in summary(results)}
    tau = kendalltau([SHAZEER_TABLE1[f][column] for f in fams], [means[f] for f in fams]).statistic
    return {"pairs": pairs, "n": len(pairs), "agree": sum(p["agree"] for p in pairs),
            "agree_significant": sum(p["agree"] and p["significant"] for p in pairs),
            "disagree_significant": sum((not p["agree"]) and p["significant"] for p in pairs),
            "kendall_tau": float(tau)}


def plateau_rows(results: dict, last_frac: float = 0.2) -> list[dict]:
    """Per family: how the runs ended. Fraction stopped on a plateau, median best step, and
    the mean improvement of the validation loss over the last ``last_frac`` of each run
    (best in the last stretch vs best before it; 0 when the best came earlier)."""
    import numpy as np

    rows = []
    for fam in results["config"]["families"]:
        runs = [r for r in results["runs"] if r["family"] == fam]
        gains = []
        for r in runs:
            steps, vals = np.array(r["curve"]["val_step"]), np.array(r["curve"]["val_loss"])
            cut = steps[-1] * (1 - last_frac)
            before, after = vals[steps <= cut], vals[steps > cut]
            gains.append(max(0.0, float(before.min() - after.min())) if len(after) else 0.0)
        rows.append({"family": fam, "n": len(runs), "plateau": sum(r["stopped"] == "plateau" for r in runs),
                     "median_best_step": float(np.median([r["best_step"] for r in runs])),
                     "max_steps": results["config"]["max_steps"], "late_gain": float(np.mean(gains))})
    return rows
