"""The tolerance of the code-version guards, measured (see tools/kernel_spread.py).

The guards (tests/test_run_reference.py, tests/test_retrain.py) compare a few tiny training
runs with stored references, so a change of what runs compute cannot slip past the version
that keys stored records. Floats are compared at the relative tolerance ``REL_TOL``.

Measured on 2026-12-03 (``python tools/kernel_spread.py``, AMD EPYC, torch 2.13.0, one
thread): the largest relative difference of any stored number between kernel sets is
7.1e-7 (retraining reference, DEFAULT vs AVX2) and 5.3e-7 (experiments reference), and
5.9e-7 / 2.7e-7 against the stored files, written on a machine of another kernel set. A
deliberate change moves the same numbers by 5.1e-4 (AdamW eps 1e-8 → 1e-7) and 0.19 (one
more warm-up step): ``REL_TOL`` = 1e-5 sits 14 times above the kernel spread and 51 times
below the smallest of those changes. A change that only reorders a reduction (the loss
summed in another order: 9.5e-8) is what another CPU does and lies inside the spread: no
tolerance that passes on every CPU can see it, and records computed by such code are as
good as records from another CPU.
"""
from __future__ import annotations

REL_TOL = 1e-5
ABS_TOL = 1e-12


def perturbed_retrain_runs(change: str) -> dict:
    """The retraining reference runs with one deliberate change of the numerics:
    ``adamw_eps`` (1e-7 instead of 1e-8), ``warmup`` (one more warm-up step) or
    ``loss_order`` (the mean loss summed in reverse order)."""
    import torch
    import torch.nn.functional as F

    import test_retrain
    from qkmlp.pretrained.retrain import core

    saved = {"adamw": torch.optim.AdamW, "lr_at": core.lr_at, "train_loss": core.train_loss}
    if change == "adamw_eps":
        torch.optim.AdamW = lambda *a, **k: saved["adamw"](*a, **{**k, "eps": 1e-7})
    elif change == "warmup":
        core.lr_at = lambda step, lr, sched, steps, warmup, final: saved["lr_at"](step, lr, sched, steps,
                                                                                   warmup + 1, final)
    elif change == "loss_order":
        def train_loss(model, ids):
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
            per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1),
                                  reduction="none")
            return per.flip(0).sum() / per.numel()
        core.train_loss = train_loss
    else:
        raise ValueError(f"unknown change {change!r}")
    try:
        return test_retrain.reference_runs()
    finally:
        torch.optim.AdamW, core.lr_at, core.train_loss = saved["adamw"], saved["lr_at"], saved["train_loss"]
