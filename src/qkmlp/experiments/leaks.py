"""Can a test example sit in a tuning split? Measured, per task, for the chapter's audit.

The toy tasks that split one fixed data set (digits, modular addition) first drew every
split from the run's seed (task version 1, :func:`seeded_split`): the tuning seed's
validation split then held part of each evaluation seed's test split, and the learning
rate chosen on it had seen those examples. Since task version 2 every seed shares one test
split (``qkmlp.experiments.tasks.split3``). :func:`split_overlap` measures the share
for either split function. Fact recall draws its sequences from the seed and its own
fact table (:func:`recall_overlap` counts identical sequences, and says whether their
answers could carry over: they come from different tables).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["seeded_split", "split_overlap", "recall_overlap"]


def seeded_split(n: int, fracs: Sequence[float], seed: int):
    """The split of task version 1: one permutation of range(n) per ``seed``, cut into
    validation (first), test, then training indices. Kept to measure what it leaked."""
    n_va, n_te = int(round(fracs[1] * n)), int(round(fracs[2] * n))
    if min(n_va, n_te, n - n_va - n_te) < 1:
        raise ValueError(f"fractions {fracs} leave an empty split of {n} examples")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_va + n_te:], perm[:n_va], perm[n_va:n_va + n_te]


def split_overlap(split: Callable, n: int, fracs: Sequence[float], tune_seeds: Sequence[int],
                  seeds: Sequence[int]) -> dict:
    """For each evaluation seed, the share of its test examples that some tuning seed
    trained or validated on, under ``split(n, fracs, seed) -> (train, val, test)``.

    Returns ``{"in_tuning_val": {seed: share}, "in_tuning_any": {seed: share},
    "in_own_train_or_val": {seed: share}}`` (the last must be 0 for any sound split).
    """
    if not tune_seeds or not seeds:
        raise ValueError("expected at least one tuning seed and one evaluation seed")
    tune = [split(n, fracs, s) for s in tune_seeds]
    tune_val = set().union(*(set(v.tolist()) for _, v, _ in tune))
    tune_any = tune_val | set().union(*(set(t.tolist()) for t, _, _ in tune))
    out = {"in_tuning_val": {}, "in_tuning_any": {}, "in_own_train_or_val": {}}
    for s in seeds:
        tr, va, te = split(n, fracs, s)
        test = set(te.tolist())
        out["in_tuning_val"][s] = len(test & tune_val) / len(test)
        out["in_tuning_any"][s] = len(test & tune_any) / len(test)
        out["in_own_train_or_val"][s] = len(test & (set(tr.tolist()) | set(va.tolist()))) / len(test)
    return out


def recall_overlap(cfg: dict, tune_seeds: Sequence[int], seeds: Sequence[int]) -> dict:
    """Token sequences of each evaluation seed's test set that also occur in a tuning
    seed's training or validation set, or in the seed's own training set, for the
    fact-recall task with configuration ``cfg`` (the stored grid's), drawn by the task's
    own :func:`~qkmlp.experiments.tasks.recall_splits`.

    Returns ``{"in_tuning": {seed: count}, "in_own_train": {seed: count}, "n_test",
    "same_table": bool}``; ``same_table`` says whether any tuning seed shares an
    evaluation seed's fact table (the answers differ otherwise, even for an identical
    sequence).
    """
    from .tasks import recall_splits

    def rows(x) -> set:
        return {tuple(r) for r in x.tolist()}

    tuning, tables = set(), []
    for t in tune_seeds:
        tab, (xtr, _, xva, _, _, _) = recall_splits(cfg, t)
        tuning |= rows(xtr) | rows(xva)
        tables.append(tab)
    out = {"in_tuning": {}, "in_own_train": {}, "n_test": cfg["n_test"], "same_table": False}
    for s in seeds:
        tab, (xtr, _, _, _, xte, _) = recall_splits(cfg, s)
        own = rows(xtr)
        test = [tuple(r) for r in xte.tolist()]
        out["in_tuning"][s] = sum(r in tuning for r in test)
        out["in_own_train"][s] = sum(r in own for r in test)
        out["same_table"] |= any(torch.equal(tab, t) for t in tables)
    return out
