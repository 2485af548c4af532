"""Experiments: does breaking the q ↔ k symmetry matter when you train?

Families of layers at matched parameter counts (:mod:`.families`), toy tasks and a
character-level language model on Shakespeare (:mod:`.tasks`, :mod:`.lm`, :mod:`.corpus`),
one training loop with early stopping (:mod:`.train`), the protocol runner (learning rate
tuned per cell on a validation split, then evaluation seeds; :mod:`.runner`), torchrun
sharding (:mod:`.dist`) and paired statistics with Holm's correction (:mod:`qkmlp.runbase.stats`).
Run every grid with ``python -m qkmlp.experiments --task all``.
"""
from .families import FAMILIES, Family, family_names, get_family, hidden_width, kv_budget, make_layer
from .runner import (choose_lr, compare, load_results, rerun, run_cell, run_grid, save_results, strip_provenance,
                     summary, tuned_lr, unrounded, values_by_seed)
from ..runbase.stats import detectable_difference, holm, mean_sd, paired_comparison, sign_test, t_interval, t_test
from .tasks import TASKS, TinyTransformer, get_task

__all__ = [
    "FAMILIES", "Family", "family_names", "get_family", "hidden_width", "kv_budget", "make_layer",
    "choose_lr", "compare", "load_results", "rerun", "run_cell", "run_grid", "save_results", "strip_provenance",
    "summary", "tuned_lr", "unrounded", "values_by_seed",
    "detectable_difference", "holm", "mean_sd", "paired_comparison", "sign_test", "t_interval", "t_test",
    "TASKS", "TinyTransformer", "get_task",
]
