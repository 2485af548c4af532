"""Tables and figures of stored results, for the experiments chapter.

Comparisons are oriented so that a positive ``gain`` always means "the first family is
better": a − b for accuracies, b − a for losses.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .families import get_family
from .runner import cell_key, compare, summary
from .stats import mean_sd

__all__ = ["gain", "gated_vs_symmetric", "comparison_rows", "format_rows", "family_color",
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
