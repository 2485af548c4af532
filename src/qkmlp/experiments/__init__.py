"""Experiments: does breaking the q ↔ k symmetry matter when you train?

Families of layers at matched parameter counts (:mod:`.families`), four tasks plus a
digits-with-bias control (:mod:`.tasks`), a grid runner that stores JSON results (:mod:`.runner`) and paired
statistics across seeds (:mod:`.stats`). Run the full grid with
``python -m qkmlp.experiments --task all --device cpu``.
"""
from .families import FAMILIES, Family, family_names, get_family, hidden_width, kv_budget, make_layer
from .runner import compare, load_results, rerun, run_cell, run_grid, save_results, summary, values_by_seed
from .stats import mean_sd, paired_comparison, sign_test, t_interval
from .tasks import TASKS, TinyTransformer, get_task

__all__ = [
    "FAMILIES", "Family", "family_names", "get_family", "hidden_width", "kv_budget", "make_layer",
    "compare", "load_results", "rerun", "run_cell", "run_grid", "save_results", "summary", "values_by_seed",
    "mean_sd", "paired_comparison", "sign_test", "t_interval", "TASKS", "TinyTransformer", "get_task",
]
