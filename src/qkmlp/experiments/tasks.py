"""The four tasks: data generators, the tiny transformer, and one training run per cell.

Every task is a :class:`Task` with a default config, the grid of cells it runs
(``cells(cfg)``: one dict per cell, always with a ``"family"`` key) and ``run(cell,
seed, cfg, device)``, which trains one model and returns one JSON-ready record. The seed
fixes everything: the data (split, teacher, fact table), the initial weights (built on
the CPU, then moved, so CPU and CUDA start from the same weights) and the minibatches.

Tasks (all data generated or bundled, no downloads):

- ``digits``: scikit-learn's bundled 8×8 digits, 10 classes; the layer maps the 64
  pixels straight to 10 logits.
- ``digits_bias``: the same with a constant 1 appended to the pixels. Without it the
  symmetric forms σ((x·q)(x·k)) are even functions of x (f(−x) = f(x)); the constant
  coordinate lifts that restriction, which separates parity from the q ↔ k exchange.
- ``modadd``: a + b mod p from one-hot(a) ⊕ one-hot(b) to p logits, 70 % of the p² pairs
  for training (the grokking set-up of Power et al. 2022, at a small scale: 70 % of the pairs, AdamW).
- ``teacher``: regression on Gaussian inputs where the target is a randomly initialised
  layer of one family (the teacher) and every family in turn is the student.
- ``recall``: a one-block transformer that must recall a fact f(subject, relation) from
  a fixed random table; subject and relation sit at random positions among filler
  tokens. Attention has to gather the two tokens and, because the readout of a sum of
  two embeddings is additive, only the feed-forward block can store the table. Only
  the feed-forward block changes between families.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F

from ..costs import parameter_count
from ..symmetry import relative_change, swapped
from ..training import fit
from .families import family_names, get_family, kv_budget, make_layer

__all__ = [
    "Task", "TASKS", "get_task", "digits_data", "modadd_data", "teacher_data", "parity_floor", "recall_data",
    "TinyTransformer",
]


# --- small helpers -------------------------------------------------------------------

def _sub(values, n: int) -> list[float]:
    """At most n roughly evenly spaced entries of values, always keeping the last."""
    if len(values) <= n:
        return list(values)
    idx = sorted({round(i * (len(values) - 1) / (n - 1)) for i in range(n)})
    return [values[i] for i in idx]


def _swap_change(layer: nn.Module, x: torch.Tensor):
    """relative_change(layer, swapped(layer), x) for factored layers, else None."""
    if hasattr(layer, "query") and hasattr(layer, "rank"):
        return relative_change(layer, swapped(layer), x)
    return None


def _qk_norms(layer: nn.Module):
    if hasattr(layer, "query") and hasattr(layer, "rank"):
        return float(layer.query.detach().norm()), float(layer.key.detach().norm())
    return None


@torch.no_grad()
def _accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1) == y).float().mean())


def _train_and_eval(model, ffn, xtr, ytr, xte, yte, ffn_inputs, cfg, seed, loss):
    """Train ``model`` with :func:`qkmlp.training.fit`; return metrics, curves, swap change.

    ``ffn`` is the compared layer inside ``model``; ``ffn_inputs()`` returns the inputs it
    sees on the test set (for the swap measurement).
    """
    swap_init = _swap_change(ffn, ffn_inputs())
    norms_init = _qk_norms(ffn)
    eval_every = max(1, cfg["steps"] // cfg.get("n_evals", 10))
    curve_steps, curve_metric = [], []

    def evaluate():
        with torch.no_grad():
            out = model(xte)
            if loss == "cross_entropy":
                return _accuracy(out, yte), float(F.cross_entropy(out, yte))
            return None, float(F.mse_loss(out, yte))

    def callback(step, _model, _loss):
        if (step + 1) % eval_every == 0 or step == 0:
            acc, lval = evaluate()
            curve_steps.append(step + 1)
            curve_metric.append(acc if acc is not None else lval)

    history = fit(
        model, xtr, ytr, steps=cfg["steps"], lr=cfg["lr"], loss=loss,
        optimizer=cfg.get("optimizer", "adam"), weight_decay=cfg.get("weight_decay", 0.0),
        batch_size=cfg.get("batch_size"), seed=seed, callback=callback,
    )
    acc, test_loss = evaluate()
    rec = {
        "train_loss": history[-1],
        "test_loss": test_loss,
        "curve": {
            "step": curve_steps,
            "test": curve_metric,
            "train_loss_step": _sub(list(range(1, len(history) + 1)), cfg.get("n_curve", 25)),
            "train_loss": _sub(history, cfg.get("n_curve", 25)),
        },
        "swap_init": swap_init,
        "swap_trained": _swap_change(ffn, ffn_inputs()),
        "qk_norm_init": norms_init,
        "qk_norm_trained": _qk_norms(ffn),
    }
    if acc is not None:
        rec["test_acc"] = acc
        rec["train_acc"] = _accuracy(model(xtr), ytr) if xtr.shape[0] <= 20000 else None
    return rec


def _build(family, d_in, d_out, budget, seed, device):
    torch.manual_seed(seed)
    layer = make_layer(family, d_in, d_out, budget)
    return layer.to(device)


# --- task definitions ------------------------------------------------------------------

@dataclass
class Task:
    """A task: its name, default config, the cells of its grid and a run function."""

    name: str
    defaults: dict
    quick: dict
    cells: Callable[[dict], list]
    run: Callable[..., dict]
    metric: str
    higher_is_better: bool
    description: str = ""


def digits_data(seed: int, test_frac: float = 0.3, device="cpu", bias: bool = False):
    """scikit-learn's digits, pixels scaled to [0, 1] and centred on the training mean.

    Returns x_train (N, 64), y_train (N,), x_test, y_test; the split depends on ``seed``.
    With ``bias=True`` a constant 1 is appended to every input (width 65): the layers
    have no biases, and this is how they get one.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_frac * len(y)))
    te, tr = perm[:n_test], perm[n_test:]
    mu = x[tr].mean(0)
    x = x - mu
    if bias:
        x = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    return x[tr].to(device), y[tr].to(device), x[te].to(device), y[te].to(device)


def _digits_cells(cfg):
    return [{"family": f} for f in cfg["families"]]


def _digits_run(cell, seed, cfg, device):
    xtr, ytr, xte, yte = digits_data(seed, cfg["test_frac"], device, bias=cfg.get("bias", False))
    d_in = xtr.shape[1]
    budget = kv_budget(d_in, 10, cfg["m_kv"])
    layer = _build(cell["family"], d_in, 10, budget, 1000 + seed, device)
    rec = _train_and_eval(layer, layer, xtr, ytr, xte, yte, lambda: xte, cfg, seed, "cross_entropy")
    rec.update(params=parameter_count(layer), d_hidden=layer.d_hidden)
    return rec


def modadd_data(p: int, train_frac: float, seed: int, device="cpu"):
    """All p² pairs (a, b) as one-hot(a) ⊕ one-hot(b) (width 2p), label (a + b) mod p.

    Returns x_train, y_train, x_test, y_test; a fraction ``train_frac`` of the pairs,
    chosen by ``seed``, is for training.
    """
    if not (isinstance(p, int) and p >= 2):
        raise ValueError(f"p must be an integer >= 2, got {p!r}")
    if not 0 < train_frac < 1:
        raise ValueError(f"train_frac must be in (0, 1), got {train_frac!r}")
    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    x = torch.cat([F.one_hot(a, p), F.one_hot(b, p)], dim=1).float()
    y = (a + b) % p
    perm = torch.randperm(p * p, generator=torch.Generator().manual_seed(seed))
    n_tr = int(round(train_frac * p * p))
    tr, te = perm[:n_tr], perm[n_tr:]
    return x[tr].to(device), y[tr].to(device), x[te].to(device), y[te].to(device)


def _modadd_run(cell, seed, cfg, device):
    p = cfg["p"]
    xtr, ytr, xte, yte = modadd_data(p, cfg["train_frac"], seed, device)
    budget = kv_budget(2 * p, p, cfg["m_kv"])
    layer = _build(cell["family"], 2 * p, p, budget, 1000 + seed, device)
    rec = _train_and_eval(layer, layer, xtr, ytr, xte, yte, lambda: xte, cfg, seed, "cross_entropy")
    rec.update(params=parameter_count(layer), d_hidden=layer.d_hidden)
    return rec


@torch.no_grad()
def teacher_data(teacher_family, d: int, m_kv: int, n_train: int, n_test: int, seed: int, device="cpu"):
    """Gaussian inputs (N, d) and targets from a random teacher of ``teacher_family``.

    The teacher is built at the same parameter budget as the students; its outputs are
    divided by their standard deviation on the training inputs, so a student that
    predicts 0 has test MSE ≈ 1 whatever the teacher.
    """
    x, teacher, scale = _teacher(teacher_family, d, m_kv, n_train, n_test, seed)
    y = teacher(x) / scale
    return (x[:n_train].to(device), y[:n_train].to(device),
            x[n_train:].to(device), y[n_train:].to(device))


def _teacher(teacher_family, d, m_kv, n_train, n_test, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_test, d, generator=gen)
    torch.manual_seed(2000 + seed)
    teacher = make_layer(teacher_family, d, d, kv_budget(d, d, m_kv))
    return x, teacher, teacher(x)[:n_train].std()


@torch.no_grad()
def parity_floor(teacher_family, d: int, m_kv: int, n_train: int, n_test: int, seed: int) -> float:
    """Mean squared odd part of the (normalised) teacher on the test inputs.

    The odd part is (f(x) − f(−x))/2. A student that is an even function of x (every
    symmetric form without a constant input coordinate) cannot fit it: for inputs
    distributed symmetrically about 0 its expected MSE is at least this number.
    """
    x, teacher, scale = _teacher(teacher_family, d, m_kv, n_train, n_test, seed)
    xt = x[n_train:]
    odd = (teacher(xt) - teacher(-xt)) / (2 * scale)
    return float(odd.pow(2).mean())


def _teacher_cells(cfg):
    return [{"teacher": t, "family": s} for t in cfg["families"] for s in cfg["families"]]


def _teacher_run(cell, seed, cfg, device):
    d = cfg["d"]
    xtr, ytr, xte, yte = teacher_data(cell["teacher"], d, cfg["m_kv"], cfg["n_train"], cfg["n_test"], seed, device)
    layer = _build(cell["family"], d, d, kv_budget(d, d, cfg["m_kv"]), 1000 + seed, device)
    rec = _train_and_eval(layer, layer, xtr, ytr, xte, yte, lambda: xte, cfg, seed, "mse")
    rec.update(params=parameter_count(layer), d_hidden=layer.d_hidden)
    return rec


def recall_data(n_subjects: int, n_relations: int, n_values: int, n_filler: int, seq_len: int,
                n_seq: int, table: torch.Tensor, seed: int):
    """Sequences for the fact-recall task and their answers.

    Token ids: subjects [0, S), relations [S, S+R), fillers [S+R, S+R+F), and the query
    token S+R+F at the last position. Subject and relation sit at two random distinct
    positions among the first seq_len − 1; the answer is ``table[s, r]`` in [0, n_values).
    Returns tokens (n_seq, seq_len) long and answers (n_seq,) long.
    """
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 (subject, relation, query), got {seq_len}")
    if table.shape != (n_subjects, n_relations):
        raise ValueError(f"table must have shape ({n_subjects}, {n_relations}), got {tuple(table.shape)}")
    gen = torch.Generator().manual_seed(seed)
    S, R = n_subjects, n_relations
    s = torch.randint(0, S, (n_seq,), generator=gen)
    r = torch.randint(0, R, (n_seq,), generator=gen)
    tokens = torch.randint(S + R, S + R + n_filler, (n_seq, seq_len), generator=gen)
    tokens[:, -1] = S + R + n_filler
    pos = torch.rand(n_seq, seq_len - 1, generator=gen).argsort(dim=1)[:, :2]
    rows = torch.arange(n_seq)
    tokens[rows, pos[:, 0]] = s
    tokens[rows, pos[:, 1]] = S + r
    return tokens, table[s, r]


class TinyTransformer(nn.Module):
    """One pre-norm transformer block (single-head attention + ``ffn``), read out at the last token.

    tokens (B, L) long -> logits (B, n_out). Because there is one block and only the last
    position is read out, attention is computed for the last query only: the output is
    exactly that of the full block at the last position.
    """

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_out: int, ffn: nn.Module):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = ffn
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out, bias=False)
        self.d_model = d_model

    def _residual(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"expected tokens of shape (B, L) and dtype long, got {tuple(tokens.shape)} {tokens.dtype}")
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        a = self.ln1(h)
        q = self.q(a[:, -1:])                                   # (B, 1, d)
        att = (q @ self.k(a).transpose(1, 2)) / math.sqrt(self.d_model)
        mixed = att.softmax(-1) @ self.v(a)                     # (B, 1, d)
        return h[:, -1] + self.o(mixed[:, 0])                   # (B, d)

    def ffn_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """What the feed-forward block sees at the last position: (B, d)."""
        return self.ln2(self._residual(tokens))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self._residual(tokens)
        h = h + self.ffn(self.ln2(h))
        return self.head(self.ln_f(h))


def _recall_cells(cfg):
    """Every family at every size in ``sizes``; rank > 1 families only at ``rank_r_sizes``."""
    rank_r_sizes = cfg.get("rank_r_sizes", cfg["sizes"])
    return [{"family": f, "m_kv": m} for m in cfg["sizes"] for f in cfg["families"]
            if get_family(f).rank == 1 or m in rank_r_sizes]


def _recall_run(cell, seed, cfg, device):
    S, R, V, Fi, L, d = (cfg[k] for k in ("n_subjects", "n_relations", "n_values", "n_filler", "seq_len", "d"))
    table = torch.randint(0, V, (S, R), generator=torch.Generator().manual_seed(seed))
    xtr, ytr = recall_data(S, R, V, Fi, L, cfg["n_train"], table, seed=10_000 + seed)
    xte, yte = recall_data(S, R, V, Fi, L, cfg["n_test"], table, seed=20_000 + seed)
    xtr, ytr, xte, yte = (t.to(device) for t in (xtr, ytr, xte, yte))
    torch.manual_seed(1000 + seed)
    ffn = make_layer(cell["family"], d, d, kv_budget(d, d, cell["m_kv"]))
    torch.manual_seed(3000 + seed)     # the rest of the model starts identical across families
    model = TinyTransformer(S + R + Fi + 1, L, d, V, ffn).to(device)
    rec = _train_and_eval(model, model.ffn, xtr, ytr, xte, yte,
                          lambda: model.ffn_inputs(xte).detach(), cfg, seed, "cross_entropy")
    rec.update(params=parameter_count(model.ffn), model_params=parameter_count(model),
               d_hidden=model.ffn.d_hidden)
    return rec


# --- registry ---------------------------------------------------------------------------

_ALL = family_names()
_R1 = family_names(max_rank=1)

TASKS: dict[str, Task] = {
    "digits": Task(
        "digits",
        defaults=dict(families=_ALL, m_kv=28, steps=400, lr=1e-2, test_frac=0.3, n_evals=10),
        quick=dict(families=["kv-relu", "gated1-silu"], m_kv=16, steps=20, lr=1e-2, test_frac=0.3, n_evals=4),
        cells=_digits_cells, run=_digits_run, metric="test_acc", higher_is_better=True,
        description="digits classification, 64 pixels -> 10 logits, full-batch Adam",
    ),
    "digits_bias": Task(
        "digits_bias",
        defaults=dict(families=_ALL, m_kv=28, steps=400, lr=1e-2, test_frac=0.3, n_evals=10, bias=True),
        quick=dict(families=["sym1-silu", "gated1-silu"], m_kv=16, steps=20, lr=1e-2, test_frac=0.3, n_evals=4,
                   bias=True),
        cells=_digits_cells, run=_digits_run, metric="test_acc", higher_is_better=True,
        description="digits with a constant input coordinate (a bias), otherwise as digits",
    ),
    "modadd": Task(
        "modadd",
        defaults=dict(families=_ALL, p=23, train_frac=0.7, m_kv=64, steps=3000, lr=1e-2,
                      optimizer="adamw", weight_decay=1.0, n_evals=15),
        quick=dict(families=["kv-relu", "gated1-silu"], p=7, train_frac=0.5, m_kv=16, steps=20, lr=1e-2,
                   optimizer="adamw", weight_decay=0.1, n_evals=4),
        cells=_digits_cells, run=_modadd_run, metric="test_acc", higher_is_better=True,
        description="a + b mod p, one-hot inputs, 70 % of the pairs for training, AdamW",
    ),
    "teacher": Task(
        "teacher",
        defaults=dict(families=_R1, d=16, m_kv=32, n_train=1024, n_test=1024, steps=400, lr=1e-2, n_evals=8, n_curve=12),
        quick=dict(families=["kv-relu", "gated1-silu"], d=4, m_kv=4, n_train=64, n_test=64, steps=20, lr=1e-2, n_evals=4),
        cells=_teacher_cells, run=_teacher_run, metric="test_loss", higher_is_better=False,
        description="teacher-student regression, Gaussian inputs, normalised targets, full-batch Adam",
    ),
    "recall": Task(
        "recall",
        defaults=dict(families=_ALL, sizes=[6, 12, 24], rank_r_sizes=[12], n_subjects=64, n_relations=8, n_values=32,
                      n_filler=16, seq_len=6, d=32, n_train=8192, n_test=2048, steps=1000,
                      batch_size=128, lr=5e-3, n_evals=10),
        quick=dict(families=["kv-relu", "gated1-silu"], sizes=[4], n_subjects=4, n_relations=2, n_values=4,
                   n_filler=3, seq_len=4, d=8, n_train=64, n_test=32, steps=20, batch_size=16, lr=1e-2, n_evals=4),
        cells=_recall_cells, run=_recall_run, metric="test_acc", higher_is_better=True,
        description="one-block transformer recalling facts f(subject, relation); only the FFN changes",
    ),
}


def get_task(name) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}")
    return TASKS[name]
