"""Character-level language modelling on Shakespeare's plays: Shazeer's Table 1 in miniature.

A small decoder-only transformer (pre-norm blocks of causal multi-head attention and a
feed-forward block, learned positions, no biases, no dropout) reads characters and
predicts the next one. Only the feed-forward block changes between families, at a
matched parameter count (:mod:`.families`). The metric is the held-out log-perplexity:
the mean cross-entropy in nats per character on the test plays, every test character
predicted once (windows of ``ctx`` characters with stride ``ctx``).

Sizes (``SIZES``): ``excerpt`` trains on the committed excerpt in seconds (tests and the
book's live slice); ``cpu`` is the stored grid (see ``SIZES`` for why it is that
size); ``gpu`` is a larger model for an accelerator.
"""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from ..costs import parameter_count
from .families import kv_budget, make_layer
from .train import train

__all__ = ["CharTransformer", "Block", "SIZES", "VOCAB_SIZE", "lm_data", "lm_run", "window_loss"]

#: Newline and the 95 printable ASCII characters (``qkmlp.experiments.corpus.VOCAB``).
VOCAB_SIZE = 96


class Block(nn.Module):
    """Pre-norm transformer block: h + attn(ln1(h)), then h + ffn(ln2(h)). (B, L, d) -> (B, L, d)."""

    def __init__(self, d_model: int, n_head: int, ffn: nn.Module):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_head ({n_head})")
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d_model, bias=False)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model, bias=False)
        self.ffn = ffn

    def attention(self, a: torch.Tensor) -> torch.Tensor:
        B, L, d = a.shape
        q, k, v = self.qkv(a).view(B, L, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)        # (B, heads, L, d/heads)
        return self.out(y.transpose(1, 2).reshape(B, L, d))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.ln1(h))
        return h + self.ffn(self.ln2(h))


class CharTransformer(nn.Module):
    """Decoder-only transformer: tokens (B, L) long -> next-token logits (B, L, vocab).

    ``ffns`` is one feed-forward module per block (each maps (..., d) -> (..., d)).
    Weights other than the feed-forward blocks start from N(0, 0.02²) (the residual
    output projections from N(0, 0.02²/(2·n_layer)), as in GPT-2); the feed-forward
    blocks keep their own initialisation.
    """

    def __init__(self, vocab: int, ctx: int, d_model: int, n_head: int, ffns):
        super().__init__()
        self.ctx = ctx
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(ctx, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, f) for f in ffns)
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.head = nn.Linear(d_model, vocab, bias=False)
        std = 0.02
        for module in [self.tok, self.pos, self.head] + [b.qkv for b in self.blocks]:
            nn.init.normal_(module.weight, 0.0, std)
        for b in self.blocks:
            nn.init.normal_(b.out.weight, 0.0, std / math.sqrt(2 * len(self.blocks)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"expected tokens of shape (B, L) and dtype long, got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.shape[1] > self.ctx:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the context {self.ctx}")
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h))


# Sizes. ``cpu`` (the stored grid): d = 64, two blocks of four heads, context 64, batches
# of 12 x 64 characters, 600 steps (0.46 M characters, an eighth of a pass over the 3.9 M
# training characters). That is small: it was sized so that the stored grid (11 families
# x (3 learning rates + 10 seeds) = 143 runs, about 25 s each on a free core, an hour of
# one core) finishes in about two hours on two cores shared with five other jobs.
# ``gpu``: a 4-block d = 256 model, context 256, 20 000 steps. ``val_windows``:
# validation windows seen at every evaluation (early stopping); the learning rate is
# chosen on ``val_final_windows`` and the test loss read on ``test_windows`` (evenly
# spaced over the split; None: all of it).
_COMMON = dict(warmup_frac=0.05, schedule="cosine", optimizer="adamw", weight_decay=0.1, grad_clip=1.0)
SIZES = {
    "excerpt": dict(source="excerpt", d=32, n_layer=1, n_head=2, ctx=32, batch_size=16, m_kv=128,
                    max_steps=120, eval_every=20, patience=100, val_windows=32, val_final_windows=None,
                    test_windows=None, lrs=[3e-3, 1e-2], **_COMMON),
    "cpu": dict(source="cache", d=64, n_layer=2, n_head=4, ctx=64, batch_size=12, m_kv=256,
                max_steps=600, eval_every=60, patience=4, val_windows=64, val_final_windows=1024,
                test_windows=2048, lrs=[4e-3, 8e-3, 1.6e-2], **_COMMON),
    "gpu": dict(source="cache", d=256, n_layer=4, n_head=4, ctx=256, batch_size=64, m_kv=1024,
                max_steps=20000, eval_every=500, patience=4, val_windows=512, val_final_windows=None,
                test_windows=None, lrs=[5e-4, 1e-3, 2e-3], **_COMMON),
}


def _windows(ids: torch.Tensor, ctx: int) -> torch.Tensor:
    """Non-overlapping (ctx + 1)-windows with stride ctx: (n, ctx + 1); every token but the
    first is a target exactly once (a remainder shorter than a window is dropped)."""
    n = (len(ids) - 1) // ctx
    if n < 1:
        return ids.new_empty(0, ctx + 1)
    return ids[: n * ctx + 1].unfold(0, ctx + 1, ctx)


_DATA_CACHE: dict = {}


def lm_data(source: str, ctx: int):
    """(train stream (N,) long, validation windows (n, ctx+1), test windows (n, ctx+1)).

    ``source``: ``"cache"`` (Shakespeare's plays), ``"excerpt"`` (the committed excerpt of
    them) or ``"python_stdlib"`` (the pinned standard-library source, :mod:`qkmlp.experiments.pysource`).
    The training stream is the training plays (or files) joined by blank lines, in name
    order; validation and test windows are cut from each play (file) separately (no window
    spans two). Cached per process.
    """
    from .corpus import encode, load_plays     # imported here: `python -m ...corpus` stays clean

    key = (source, ctx)
    if key not in _DATA_CACHE:
        if source == "python_stdlib":
            from .pysource import load_modules

            plays = load_modules()
        else:
            plays = load_plays(source)
        train_ids = encode("\n\n".join(plays["train"][p] for p in sorted(plays["train"])))
        held = {s: torch.cat([_windows(encode(plays[s][p]), ctx) for p in sorted(plays[s])])
                for s in ("validation", "test")}
        _DATA_CACHE[key] = (train_ids, held["validation"], held["test"])
    return _DATA_CACHE[key]


@torch.no_grad()
def window_loss(model: nn.Module, windows: torch.Tensor, device, batch: int = 256) -> float:
    """Mean next-character cross-entropy (nats) over all targets of ``windows`` (n, ctx + 1)."""
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch].to(device)
        logits = model(w[:, :-1])
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum"))
        count += w[:, 1:].numel()
    return total / count


def _evenly(windows: torch.Tensor, n) -> torch.Tensor:
    """``n`` evenly spaced windows (all of them when n is None or not smaller)."""
    if n is None or len(windows) <= n:
        return windows
    idx = torch.linspace(0, len(windows) - 1, n).round().long()
    return windows[idx]


def lm_run(cell: dict, seed: int, cfg: dict, device, progress=None) -> dict:
    """Train one character model with ``cell["family"]`` as every feed-forward block.

    Validation (for early stopping) uses ``val_windows`` evenly spaced validation windows;
    the returned ``val_loss`` is on ``val_final_windows`` validation windows and
    ``test_loss`` on ``test_windows`` test windows, both at the restored (best) weights;
    the test set is read once, here.
    """
    d, ctx = cfg["d"], cfg["ctx"]
    train_ids, val_w, test_w = lm_data(cfg["source"], ctx)
    if len(train_ids) < ctx + 2:
        raise ValueError(f"the training text has {len(train_ids)} characters, fewer than ctx + 2 = {ctx + 2}")
    budget = kv_budget(d, d, cfg["m_kv"])
    torch.manual_seed(1000 + seed)
    ffns = [make_layer(cell["family"], d, d, budget) for _ in range(cfg["n_layer"])]
    torch.manual_seed(3000 + seed)         # the rest of the model starts identical across families
    model = CharTransformer(VOCAB_SIZE, ctx, d, cfg["n_head"], ffns).to(device)
    val_small = _evenly(val_w, cfg["val_windows"])
    B = cfg["batch_size"]
    offsets = torch.arange(ctx + 1)

    def batch(step, gen):
        starts = torch.randint(0, len(train_ids) - ctx - 1, (B,), generator=gen)
        return (train_ids[starts[:, None] + offsets].to(device),)

    def loss_fn(m, b):
        w = b[0]
        logits = m(w[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))

    rec = train(model, batch, loss_fn, lambda m: window_loss(m, val_small, device),
                lr=cfg["lr"], max_steps=cfg["max_steps"], eval_every=cfg["eval_every"], patience=cfg["patience"],
                seed=seed, optimizer=cfg["optimizer"], weight_decay=cfg["weight_decay"], schedule=cfg["schedule"],
                warmup=int(cfg["warmup_frac"] * cfg["max_steps"]), grad_clip=cfg["grad_clip"], progress=progress)
    val_w, test_w = _evenly(val_w, cfg["val_final_windows"]), _evenly(test_w, cfg["test_windows"])
    rec["val_loss"] = window_loss(model, val_w, device)
    rec["test_loss"] = window_loss(model, test_w, device)
    rec.update(params=parameter_count(model.blocks[0].ffn), model_params=parameter_count(model),
               d_hidden=model.blocks[0].ffn.d_hidden, train_chars=len(train_ids),
               val_chars=val_w[:, 1:].numel(), test_chars=test_w[:, 1:].numel())
    return rec
