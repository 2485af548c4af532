"""Run a task's grid of (cell, seed) and store the results as compact JSON.

A results file is ``{"meta": ..., "config": ..., "runs": [...]}``; each run carries its
cell (family, and the teacher or size where the task has one), its seed, its metrics,
subsampled learning curves and the q ↔ k swap change before and after training.
``meta`` records the library version, git commit, hardware, torch version, device,
thread count and wall time.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Iterable, Optional

import torch

from .. import __version__
from ..bench import _git_commit
from .stats import mean_sd, paired_comparison
from .tasks import get_task

__all__ = ["run_grid", "run_cell", "rerun", "save_results", "load_results", "summary", "compare",
           "values_by_seed", "cell_key"]

_CELL_FIELDS = ("teacher", "family", "m_kv")


def cell_key(cell: dict) -> tuple:
    """A hashable key for a cell: its (teacher, family, m_kv) entries that are present."""
    return tuple((k, cell[k]) for k in _CELL_FIELDS if k in cell)


# The code a process runs is the code it imported: record the commit at import time (the
# checkout may move on while a long grid runs).
_IMPORT_COMMIT = _git_commit() or "unknown"


def _hardware(device: torch.device) -> dict:
    hw = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        hw["gpu"] = torch.cuda.get_device_name(device)
    return hw


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


def run_cell(task: str, cell: dict, seed: int, config: Optional[dict] = None, device="cpu") -> dict:
    """Train one model of ``task`` for ``cell`` and ``seed``; returns its record.

    ``config`` overrides the task's defaults key by key.
    """
    t = get_task(task)
    cfg = {**t.defaults, **(config or {})}
    dev = _resolve_device(device)
    start = time.perf_counter()
    rec = t.run(cell, seed, cfg, dev)
    return {**cell, "seed": seed, **rec, "wall_s": time.perf_counter() - start}


def run_grid(task: str, seeds: Iterable[int] = range(5), config: Optional[dict] = None, device="cpu",
             progress: bool = True, quick: bool = False, cells: Optional[list] = None) -> dict:
    """Run every (cell, seed) of ``task``; returns the results dict (see the module docstring).

    ``quick`` starts from the task's tiny test config instead of its defaults; ``config``
    overrides either; ``cells`` restricts the grid to the given cells.
    """
    t = get_task(task)
    cfg = {**(t.quick if quick else t.defaults), **(config or {})}
    dev = _resolve_device(device)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must not be empty")
    grid = cells if cells is not None else t.cells(cfg)
    jobs = [(c, s) for c in grid for s in seeds]
    start = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(jobs), desc=task, unit="run")
    runs = []
    for cell, seed in jobs:
        runs.append(run_cell(task, cell, seed, cfg, dev))
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{cell.get('family')} s{seed}")
    if bar is not None:
        bar.close()
    meta = {
        "task": task, "description": t.description, "metric": t.metric,
        "higher_is_better": t.higher_is_better, "qkmlp_version": __version__,
        "git_commit": _IMPORT_COMMIT, "torch_version": torch.__version__,
        "python": platform.python_version(), "device": str(dev), "hardware": _hardware(dev),
        "seeds": seeds, "wall_s": time.perf_counter() - start,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return {"meta": meta, "config": cfg, "runs": runs}


def rerun(results: dict, cells: list, seeds: Iterable[int] = (0, 1), device="cpu") -> list[dict]:
    """Run some stored (cell, seed) pairs again with the stored config and compare.

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
            live = run_cell(task, cell, seed, results["config"], device)
            rel = max(abs(live[k] - stored[0][k]) / abs(stored[0][k]) for k in ("test_loss", metric))
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
