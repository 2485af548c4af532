"""Run a task's protocol over its grid and store the results as compact JSON.

The protocol, for every cell (a family, and the teacher or size where the task has one):

1. **Tune**: train once per learning rate in ``cfg["lrs"]`` and tuning seed in
   ``cfg["tune_seeds"]`` (seeds disjoint from the evaluation seeds); choose the learning
   rate with the lowest mean validation loss. When that is the smallest or largest rate
   tried, try one more past that edge (the grid's own ratio), up to
   ``cfg["lr_extensions"]`` (default 2) times. The choice and every validation loss are
   stored (``results["tuning"]``).
2. **Evaluate**: train with the chosen rate for each evaluation seed 0 … n − 1, each run
   stopping early when its validation loss stops improving (or at its step budget, which
   the record says), and read the test split once at the best weights.

Jobs are sharded by index over ``world`` workers (``rank`` takes jobs i with
i mod world = rank): torchrun ranks (:mod:`.dist`) or independent parts of one grid
(``part``) that share a folder of per-job records (``cache``). A part (or a resumed run)
skips the jobs whose records are already in the folder, so a grid runs in pieces that
merge; a part that has finished its share takes over the jobs the others have not
started (a claim file per job), so no part idles while another has a queue. Each run
records the rank and host that computed it.

A larger step budget need not retrain everything: with a constant learning rate (lowered
on plateaus only, ``lr_drops``) and no warmup, a run that stopped before its budget (on a
plateau, or diverged) is the same run under any larger budget. ``cfg["reuse_budgets"]``
lists earlier budgets whose cached records of such runs are reused (the record says
``reused_from_budget``); runs that hit their budget are trained again.

A results file is ``{"meta", "config", "tuning", "runs", "tune_runs"}``: ``runs`` holds
the evaluation runs (cell, seed, lr, metrics, curves with at most 41 evaluations, swap
changes), ``tune_runs`` the tuning runs without curves, ``meta`` the library
version, git commit and whether the checkout had uncommitted changes, the versions of
torch, numpy, scipy and scikit-learn, the hardware, the command, the wall time of this
process and ``run_wall_s_total``, the sum of every run's own wall time (the honest cost
of a grid assembled from cached records; ``runs_computed_here`` says how many runs this
process trained itself).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import platform
import socket
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from .. import __version__
from ..runbase.provenance import IMPORT_GIT, machine, run_machine, versions
from ..runbase.rates import choose_rate, grid_ratio, next_rate
from ..runbase.records import RecordFolder, load_record, run_jobs, save_record
from ..runbase.stats import mean_sd, paired_comparison
from .tasks import get_task

__all__ = ["RUN_CODE_VERSION", "run_grid", "run_cell", "rerun", "save_results", "load_results", "summary", "compare",
           "values_by_seed", "cell_key", "choose_lr", "tuned_lr", "strip_provenance", "late_gain",
           "unrounded"]

_CELL_FIELDS = ("teacher", "family", "m_kv")
# Fields that say where, when, how fast and by which code a run was computed, not what it computed.
_PROVENANCE = ("wall_s", "rank", "host", "machine", "reused_from_budget", "git_commit", "git_dirty",
               "code_version", "task_version")

#: The version of the code every run shares (the training loop, the layers, their
#: initialisation). It and the task's own ``Task.version`` (its data and model) are part of
#: the cache key (the folder of per-run records), so records trained by other numerics are
#: never reused, and every record carries both. Bump this one when a change alters the
#: numbers of runs of every task, a task's version when only that task's change (records from
#: before versions existed count as 1); then regenerate ``tests/data/run_reference.json``
#: (``python tests/run_reference.py``). ``tests/test_run_reference.py`` reruns tiny runs of
#: every task and language-model family and fails when their numbers changed but no version did.
RUN_CODE_VERSION = 2


def cell_key(cell: dict) -> tuple:
    """A hashable key for a cell: its (teacher, family, m_kv) entries that are present."""
    return tuple((k, cell[k]) for k in _CELL_FIELDS if k in cell)


def _cell(rec: dict) -> dict:
    return {k: rec[k] for k in _CELL_FIELDS if k in rec}


IMPORT_COMMIT = IMPORT_GIT["git_commit"] or "unknown"
IMPORT_DIRTY = IMPORT_GIT["git_dirty"]


def _round(obj, digits: int = 5):
    """Round floats to ``digits`` significant digits, recursively (keeps the JSON small)."""
    if isinstance(obj, float):
        if obj == 0.0 or not math.isfinite(obj):
            return obj
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v, digits) for v in obj]
    return obj


def _resolve_device(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch.cuda.is_available() is False")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")
    return dev


def run_cell(task: str, cell: dict, seed: int, config: Optional[dict] = None, device="cpu",
             progress: Optional[str] = None) -> dict:
    """Train one model of ``task`` for ``cell`` and ``seed`` at ``config["lr"]``; returns its record.

    ``config`` overrides the task's default config key by key.
    """
    t = get_task(task)
    cfg = {**t.defaults, **(config or {})}
    t.check_config(cfg)
    if "lr" not in cfg:
        raise ValueError("config must give the learning rate 'lr' (run_grid tunes it per cell)")
    dev = _resolve_device(device)
    start = time.perf_counter()
    rec = t.run(cell, seed, cfg, dev, progress)
    return {**cell, "seed": seed, "lr": cfg["lr"], **rec, "wall_s": time.perf_counter() - start,
            "host": socket.gethostname(), "machine": run_machine(), "git_commit": IMPORT_COMMIT,
            "git_dirty": IMPORT_DIRTY, "code_version": RUN_CODE_VERSION, "task_version": t.version}


def choose_lr(tune_runs: list[dict], cell: dict, lrs: list) -> dict:
    """The tuning row of ``cell``: mean validation loss per learning rate and the chosen one
    (:func:`qkmlp.runbase.rates.choose_rate`: a diverged run counts as +inf, ties go to the
    earlier rate in ``lrs``, ``at_edge`` when the choice is the smallest or largest tried)."""
    key = cell_key(cell)
    losses = {lr: [r["val_loss"] if not r.get("diverged") else math.inf
                   for r in tune_runs if cell_key(r) == key and r["lr"] == lr] for lr in lrs}
    missing = [lr for lr, v in losses.items() if not v]
    if missing:
        raise KeyError(f"no tuning runs for {cell} at lr {missing[0]}")
    return {**cell, **choose_rate(losses, lrs)}


def _config_hash(task: str, cfg: dict) -> str:
    """The cache key of a run configuration: task, config, :data:`RUN_CODE_VERSION` and the
    task's own version (left out while it is 1, so keys from before task versions stay)."""
    version = get_task(task).version
    blob = json.dumps({"task": task, "cfg": cfg, "code_version": RUN_CODE_VERSION,
                       **({"task_version": version} if version != 1 else {})}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _job_name(phase: str, cell: dict, lr: float, seed: int) -> str:
    parts = [phase] + [str(v) for _, v in cell_key(cell)] + [f"lr{lr!r}", f"s{seed}"]
    return "_".join(parts).replace("/", "-") + ".json"


class _Exchange:
    """How workers share records: alone, through torch.distributed, or through a folder."""

    def __init__(self, rank: int, world: int, folder: Optional[Path], dist_group=None, poll_s: float = 20.0):
        self.rank, self.world, self.dist, self.poll_s = rank, world, dist_group, poll_s
        self.folder = RecordFolder(folder) if folder is not None else None
        self.computed = 0       # runs this worker trained (the others came from the folder or other ranks)
        self.reused = 0         # runs this worker took from an earlier budget's folder
        self._announced = False

    def gather(self):
        """The collective exchange of records under torch.distributed (None otherwise)."""
        if self.dist is None or self.world == 1:
            return None

        def gather(mine: dict) -> dict:
            import torch.distributed as dist

            gathered = [None] * self.world
            dist.all_gather_object(gathered, mine)
            out = {}
            for part in gathered:
                out.update(part)
            return out
        return gather

    def wait_note(self, n_missing: int) -> None:
        """Say once per phase that this part waits for runs the other parts are computing."""
        if not self._announced:
            print(f"part {self.rank + 1}/{self.world}: waiting for {n_missing} runs of the other parts "
                  f"in {self.folder.folder}", flush=True)
            self._announced = True


def _earlier_budget_record(name: str, earlier: list) -> Optional[dict]:
    """The record of job ``name`` in a folder of an earlier budget, if that run stopped
    before its budget (so it is the same run under the larger one); else None."""
    for budget, old_folder in earlier:
        path = old_folder / name
        if path.exists():
            rec = load_record(path)
            if rec["stopped"] in ("plateau", "diverged") and rec["steps"] <= budget:
                return {**rec, "reused_from_budget": budget}
    return None


def _run_jobs(task, jobs, cfg_for, dev, exchange: _Exchange, folder: Optional[Path], bar, wait=True,
              earlier: tuple = ()):
    """Run this worker's share of ``jobs`` (name, cell, seed, lr) with
    :func:`qkmlp.runbase.records.run_jobs`, reusing stored records (of this config, or of
    an earlier budget in ``earlier``: (budget, folder) pairs). Every run is determined by
    its job, so who computes it changes only its ``rank`` and ``host``."""
    def compute(i: int) -> dict:
        name, cell, seed, lr = jobs[i]
        if folder is not None and (rec := _earlier_budget_record(name, earlier)) is not None:
            exchange.reused += 1
            return rec
        label = f"{' '.join(str(v) for _, v in cell_key(cell))} lr={lr:g} s{seed}"
        rec = run_cell(task, cell, seed, {**cfg_for, "lr": lr}, dev, progress=label if bar is not None else None)
        rec["rank"] = exchange.rank
        exchange.computed += 1
        return rec

    def tick(own: bool):
        if bar is not None:
            if not own and bar.n >= bar.total:
                bar.total += 1
            bar.update(1)

    return run_jobs([j[0] for j in jobs], compute, folder=exchange.folder, rank=exchange.rank,
                    world=exchange.world, wait=wait, gather=exchange.gather(), poll_s=exchange.poll_s,
                    on_wait=exchange.wait_note, on_done=tick)


def run_grid(task: str, seeds: Optional[Iterable[int]] = None, config: Optional[dict] = None, device="cpu",
             progress: bool = True, quick: bool = False, size: Optional[str] = None, cells: Optional[list] = None,
             cache: Optional[Path] = None, rank: int = 0, world: int = 1, dist_group=None,
             poll_s: float = 20.0) -> Optional[dict]:
    """Run the protocol of ``task`` (module docstring); returns the results dict on rank 0.

    ``size`` picks one of the task's configs (default ``"default"``; ``quick=True`` is
    ``size="quick"``); ``config`` overrides it key by key; ``seeds`` the evaluation seeds
    (default ``range(cfg["seeds"])``, or ``cfg["seeds"]`` itself when it is a list);
    ``cells`` restricts the grid. ``cache``: a folder for per-job records (resume, parts).
    ``rank``/``world``: this worker's share; with ``dist_group`` (torch.distributed
    initialised) records are gathered collectively, otherwise through ``cache`` (where a
    part also takes over unclaimed jobs of the others). Workers other than rank 0 return
    None.
    """
    t = get_task(task)
    size = "quick" if quick and size is None else (size or "default")
    cfg = {**t.config(size), **(config or {})}
    t.check_config(cfg)
    if seeds is None:    # the config gives a count (seeds 0 … n − 1) or the seeds themselves
        seeds = list(range(cfg["seeds"])) if isinstance(cfg["seeds"], int) else list(cfg["seeds"])
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must not be empty (at least one evaluation seed)")
    if any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be non-negative integers, got {seeds}")
    lrs, tune_seeds = list(cfg["lrs"]), list(cfg["tune_seeds"])
    if not lrs or not tune_seeds:
        raise ValueError("the config needs at least one learning rate ('lrs') and one tuning seed ('tune_seeds')")
    if set(tune_seeds) & set(seeds):
        raise ValueError(f"tuning seeds {tune_seeds} must be disjoint from the evaluation seeds")
    if not (0 <= rank < world):
        raise ValueError(f"rank must be in [0, world), got rank {rank}, world {world}")
    if world > 1 and dist_group is None and cache is None:
        raise ValueError("independent parts (world > 1 without torch.distributed) need a shared cache folder")
    dev = _resolve_device(device)
    grid = cells if cells is not None else t.cells(cfg)
    run_cfg = {k: v for k, v in cfg.items()
               if k not in ("seeds", "lrs", "tune_seeds", "families", "teachers", "lr_extensions", "reuse_budgets",
                            "records_of")}
    budgets = list(cfg.get("reuse_budgets", []))
    if budgets:
        if cfg.get("schedule", "constant") != "constant" or cfg.get("warmup_frac", 0) or cfg.get("warmup", 0):
            raise ValueError("reuse_budgets needs a constant learning rate without warmup (otherwise the "
                             "schedule depends on the budget and an earlier run is not the same run)")
        bad = [b for b in budgets if not (isinstance(b, int) and 0 < b < cfg["max_steps"]
                                          and b % cfg["eval_every"] == 0)]
        if bad:
            raise ValueError(f"reuse_budgets must be smaller than max_steps ({cfg['max_steps']}) and multiples "
                             f"of eval_every ({cfg['eval_every']}); got {bad}")
    folder, earlier = None, []
    if cache is not None:
        # a size that adds seeds to another size's grid shares that size's folder of records
        home = cfg.get("records_of", size)
        folder = Path(cache) / f"{task}-{home}-{_config_hash(task, run_cfg)}"
        folder.mkdir(parents=True, exist_ok=True)
        earlier = [(b, Path(cache) / f"{task}-{home}-{_config_hash(task, {**run_cfg, 'max_steps': b})}")
                   for b in sorted(budgets, reverse=True)]
    exchange = _Exchange(rank, world, folder, dist_group, poll_s)

    start = time.perf_counter()
    tune_jobs = [(_job_name("tune", c, lr, s), c, s, lr) for c in grid for lr in lrs for s in tune_seeds]
    n_eval = len(grid) * len(seeds)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        share = (len(tune_jobs) + n_eval + world - 1 - rank) // world
        bar = tqdm(total=share, desc=f"{task} [{rank + 1}/{world}]" if world > 1 else task, unit="run",
                   mininterval=5.0)
    tune_recs = _run_jobs(task, tune_jobs, run_cfg, dev, exchange, folder, bar, earlier=earlier)
    tune_runs = [tune_recs[j[0]] for j in tune_jobs]
    cell_lrs = {cell_key(c): list(lrs) for c in grid}
    tuning = [choose_lr(tune_runs, c, cell_lrs[cell_key(c)]) for c in grid]
    # A best rate at the edge of the grid is not a tuned rate: extend the grid past that
    # edge by the grid's own ratio, up to lr_extensions times.
    factor = grid_ratio(lrs)
    for _ in range(cfg.get("lr_extensions", 2) if len(lrs) > 1 else 0):
        extra = []
        for c, row in zip(grid, tuning):
            tried = cell_lrs[cell_key(c)]
            if row["at_edge"]:
                new_lr = next_rate(row["lr"], tried, factor)
                tried.append(new_lr)
                extra += [(_job_name("tune", c, new_lr, s), c, s, new_lr) for s in tune_seeds]
        if not extra:
            break
        if bar is not None:
            bar.total += (len(extra) + world - 1 - rank) // world
        more = _run_jobs(task, extra, run_cfg, dev, exchange, folder, bar, earlier=earlier)
        tune_jobs += extra
        tune_runs += [more[j[0]] for j in extra]
        tuning = [choose_lr(tune_runs, c, cell_lrs[cell_key(c)]) for c in grid]
    lr_of = {cell_key(row): row["lr"] for row in tuning}
    # seed-major order: an interrupted grid has whole seeds of every cell, so it can be cut to
    # fewer seeds without losing pairs
    eval_jobs = [(_job_name("eval", c, lr_of[cell_key(c)], s), c, s, lr_of[cell_key(c)]) for s in seeds for c in grid]
    eval_recs = _run_jobs(task, eval_jobs, run_cfg, dev, exchange, folder, bar, wait=(rank == 0),
                          earlier=earlier)
    if bar is not None:
        bar.close()
    if rank != 0:
        return None
    order = {cell_key(c): i for i, c in enumerate(grid)}
    runs = sorted((eval_recs[j[0]] for j in eval_jobs), key=lambda r: (order[cell_key(r)], r["seed"]))
    runs = [dict(_compact_curve(r), phase="eval") for r in runs]
    tune_runs = [dict({k: v for k, v in r.items() if k != "curve"}, phase="tune") for r in tune_runs]
    meta = {
        "task": task, "size": size, "description": t.description, "metric": t.metric,
        "higher_is_better": t.higher_is_better, "qkmlp_version": __version__,
        "git_commit": IMPORT_COMMIT, "git_uncommitted_changes": IMPORT_DIRTY,
        "versions": versions("scipy", "scikit-learn"),
        "torch_version": torch.__version__, "python": platform.python_version(), "device": str(dev),
        "hardware": machine(dev), "seeds": seeds, "tune_seeds": tune_seeds, "lrs": lrs, "world_size": world,
        "wall_s": time.perf_counter() - start, "run_wall_s_total": sum(r["wall_s"] for r in runs + tune_runs),
        "runs_computed_here": exchange.computed, "runs_reused_from_budgets_here": exchange.reused,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return {"meta": meta, "config": cfg, "tuning": tuning, "runs": runs, "tune_runs": tune_runs}


def late_gain(steps: list, losses: list, last_frac: float = 0.2) -> float:
    """How much the best validation loss improved during the last ``last_frac`` of a run's
    steps: best before the cut − best after it, or 0 when the best came before."""
    cut = steps[-1] * (1 - last_frac)
    before = [v for s, v in zip(steps, losses) if s <= cut]
    after = [v for s, v in zip(steps, losses) if s > cut]
    return max(0.0, min(before) - min(after)) if after and before else 0.0


def _compact_curve(rec: dict, n: int = 41) -> dict:
    """The record with ``late_gain`` (from the full validation curve) and the curve
    subsampled to at most n evaluations (first and last kept), so the stored file stays
    small; the run itself is unchanged. A record read back from a stored file (a cache
    seeded from it) keeps its ``late_gain``: that one came from the full, unrounded curve."""
    from .train import sub_index

    curve = rec.get("curve")
    if not curve:
        return dict(rec)
    gain = rec["late_gain"] if "late_gain" in rec else late_gain(curve["val_step"], curve["val_loss"])
    out = {**rec, "late_gain": gain}
    if len(curve["val_step"]) > n:
        idx = sub_index(len(curve["val_step"]), n)
        out["curve"] = {**curve, "val_step": [curve["val_step"][i] for i in idx],
                        "val_loss": [curve["val_loss"][i] for i in idx]}
    return out


def tuned_lr(results: dict, cell: dict) -> float:
    """The learning rate the protocol chose for ``cell``."""
    rows = [r for r in results["tuning"] if cell_key(r) == cell_key(cell)]
    if len(rows) != 1:
        raise KeyError(f"no tuning row for {cell}")
    return rows[0]["lr"]


def strip_provenance(run: dict) -> dict:
    """A run without the fields that say where and how fast it ran (wall time, rank, host)."""
    return {k: v for k, v in run.items() if k not in _PROVENANCE}


def rerun(results: dict, cells: list, seeds: Iterable[int] = (0, 1), device="cpu") -> list[dict]:
    """Run some stored (cell, seed) pairs again with the stored config and tuned rate, and compare.

    Returns one row per pair: cell, seed, the task's metric live and stored, and
    ``rel_diff``, the larger relative difference of test_loss and the metric. Stored values
    are rounded to 5 significant digits, so an exact reproduction shows up to ~5e-5.
    """
    task, metric = results["meta"]["task"], results["meta"]["metric"]
    rows = []
    for cell in cells:
        for seed in seeds:
            stored = [r for r in results["runs"] if r["seed"] == seed and all(r.get(k) == v for k, v in cell.items())]
            if len(stored) != 1:
                raise KeyError(f"expected one stored run for {cell}, seed {seed}; found {len(stored)}")
            cfg = {**results["config"], "lr": stored[0]["lr"]}
            live = run_cell(task, cell, seed, cfg, device)
            rel = max(abs(live[k] - stored[0][k]) / max(abs(stored[0][k]), 1e-12) for k in ("test_loss", metric))
            rows.append({"cell": cell, "seed": seed, "metric": metric, "live": live[metric],
                         "stored": stored[0][metric], "rel_diff": rel})
    return rows


def save_results(results: dict, path) -> Path:
    """Write ``results`` as compact JSON (floats to 5 significant digits)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_round(results), separators=(",", ":")))
    return path


def load_results(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}; run `python -m qkmlp.experiments --task ...` first")
    return json.loads(path.read_text())


def unrounded(results: dict, folder, metrics: tuple = ("test_loss", "val_loss")) -> dict:
    """A copy of ``results`` whose evaluation runs carry ``metrics`` as their per-run records
    in ``folder`` hold them, unrounded.

    A results file rounds to 5 significant digits; that can tie a pair of runs and move a
    rank test (an exact Wilcoxon p of 0.025 from rounded losses is 0.027 from the records).
    Each run's record is ``folder/eval_<cell>_lr<lr>_s<seed>.json``; a missing record, or
    one that disagrees with the file beyond its rounding, raises."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder of run records at {folder}")
    out = copy.deepcopy(results)
    for r in out["runs"]:
        path = folder / _job_name("eval", _cell(r), r["lr"], r["seed"])
        if not path.exists():
            raise FileNotFoundError(f"no record {path.name} in {folder} for the run {_cell(r)}, seed {r['seed']}")
        rec = json.loads(path.read_text())
        for m in metrics:
            if m not in r:
                continue
            if not math.isclose(float(f"{rec[m]:.5g}"), r[m], rel_tol=1e-9, abs_tol=0.0):
                raise ValueError(f"{path.name}: {m} {rec[m]!r} does not round to the results file's {r[m]!r}")
            r[m] = rec[m]
    return out


# --- reading results ---------------------------------------------------------------------

def values_by_seed(results: dict, metric: Optional[str] = None, **cell) -> dict:
    """{seed: value} of ``metric`` (default: the task's metric) for the runs matching ``cell``."""
    metric = metric or results["meta"]["metric"]
    out = {}
    for r in results["runs"]:
        if all(r.get(k) == v for k, v in cell.items()):
            if r["seed"] in out:
                raise ValueError(f"cell {cell} matches more than one run per seed; give more of the cell")
            out[r["seed"]] = r[metric]
    if not out:
        raise KeyError(f"no runs match {cell}")
    return out


def summary(results: dict, metric: Optional[str] = None) -> list[dict]:
    """One row per cell: the cell, n, mean, sd, and the values in seed order."""
    metric = metric or results["meta"]["metric"]
    groups: dict[tuple, dict] = {}
    for r in results["runs"]:
        key = cell_key(r)
        groups.setdefault(key, {})[r["seed"]] = r[metric]
    rows = []
    for key, by_seed in groups.items():
        vals = [v for v in (by_seed[s] for s in sorted(by_seed)) if v is not None]
        if not vals:
            continue
        mu, sd = mean_sd(vals)
        rows.append({**dict(key), "n": len(vals), "mean": mu, "sd": sd, "values": vals})
    return rows


def compare(results: dict, a: dict, b: dict, metric: Optional[str] = None, level: float = 0.95) -> dict:
    """Paired comparison (a − b) of ``metric`` between two cells over their common seeds."""
    va = values_by_seed(results, metric, **a)
    vb = values_by_seed(results, metric, **b)
    seeds = sorted(set(va) & set(vb))
    if len(seeds) < 2:
        raise ValueError(f"cells {a} and {b} share {len(seeds)} seeds; a paired comparison needs >= 2")
    out = paired_comparison([va[s] for s in seeds], [vb[s] for s in seeds], level)
    out["seeds"] = seeds
    return out
