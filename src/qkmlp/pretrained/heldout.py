"""Held-out text and the per-window loss of a causal language model on it.

The text is Python's own reference documentation as plain text, the module
``pydoc_data.topics`` that every Python installation ships (what ``help("assert")``
prints): 79 topics, about 465,000 characters in Python 3.11, English prose with code.
It needs no download and no dependency. Its limits: it is one narrow genre (technical
documentation), and Python's documentation is on the web, so the model may well have
seen much of it during training in some other form; the chapter measures *changes* of
the loss under interventions, which this matters less for than the loss itself.

Windows are equally long, evenly spread over the tokenised text, and scored as the mean
next-token negative log-likelihood (nats) over their last ``length - 1`` tokens.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .surgery import decoder_layers

__all__ = ["pydoc_topics_text", "heldout_windows", "window_losses", "layer_inputs", "tail_losses",
           "nll_from_hidden"]


def pydoc_topics_text() -> str:
    """The topics of ``pydoc_data.topics`` in sorted order, joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def heldout_windows(tokenizer, n_windows: int, length: int, text: Optional[str] = None, *,
                    bos: bool = False) -> torch.Tensor:
    """``n_windows`` windows of ``length`` token ids, evenly spread over the tokenised
    ``text`` (default :func:`pydoc_topics_text`): a (n_windows, length) int64 tensor.

    Window i starts at token ⌊i·(T − n)/(n_windows − 1)⌋ of the T tokens, with n the text
    tokens per window (the first window at 0, the last ending at the end of the text).
    With ``bos`` each window is the tokenizer's beginning-of-sequence token followed by
    n = ``length`` − 1 text tokens, as a document starts in use; else n = ``length``.
    """
    for name, v in (("n_windows", n_windows), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if length < 2:
        raise ValueError(f"length must be at least 2 (one token to predict), got {length}")
    prefix = []
    if bos:
        b = getattr(tokenizer, "bos_token_id", None)
        if b is None:
            raise ValueError("bos=True needs a tokenizer with a bos_token_id; this one has none")
        prefix = [int(b)]
    n = length - len(prefix)
    ids = tokenizer(text if text is not None else pydoc_topics_text(), add_special_tokens=False)["input_ids"]
    T = len(ids)
    if T < n:
        raise ValueError(f"the text has {T} tokens, fewer than one window of {n}")
    starts = [0] if n_windows == 1 else [i * (T - n) // (n_windows - 1) for i in range(n_windows)]
    return torch.tensor([prefix + ids[s:s + n] for s in starts], dtype=torch.long)


def nll_from_hidden(model, hidden: torch.Tensor, ids: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
    """Mean next-token NLL per window from the final hidden states (after the final norm).

    hidden (B, L, d), ids (B, L) -> (B,) float64. Logits are made one window at a time
    (a window's (L, vocab) logits are 25 MB at L = 128), in the model's dtype (float32
    for float16 and bfloat16). With ``grad`` the result can be differentiated.
    """
    out = []
    head = model.get_output_embeddings()
    with torch.set_grad_enabled(grad):
        for h, t in zip(hidden, ids):
            logits = head(h[:-1])
            t = t.to(logits.device)              # the head may sit on another device (device_map)
            if logits.dtype in (torch.float16, torch.bfloat16):
                logits = logits.float()
            out.append(F.cross_entropy(logits, t[1:], reduction="mean").double())
    return torch.stack(out)


@torch.no_grad()
def window_losses(model, ids: torch.Tensor, *, batch_size: int = 4) -> torch.Tensor:
    """Mean next-token NLL (nats) of each window: (n, L) ids -> (n,) float64."""
    check_ids(ids)
    out = []
    for chunk in ids.to(input_device(model)).split(batch_size):
        hidden = model.model(input_ids=chunk, use_cache=False).last_hidden_state
        out.append(nll_from_hidden(model, hidden, chunk))
    return torch.cat(out)


def input_device(model) -> torch.device:
    """The device of the model's input embedding: where its token ids go (with a
    ``device_map``, accelerate moves the activations between the layers' devices)."""
    return model.get_input_embeddings().weight.device


def check_ids(ids) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(f"ids must be an int64 tensor of shape (n_windows, length), got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")


@torch.no_grad()
def layer_inputs(model, ids: torch.Tensor, *, mlp_inputs: bool = False):
    """Run ``model`` on ``ids`` and record what enters each decoder layer.

    Returns ``(hidden, inputs, mlp_in)``: ``hidden`` the final hidden states (B, L, d),
    ``inputs[l]`` the residual stream entering layer l (B, L, d), and, with
    ``mlp_inputs=True``, ``mlp_in[l]`` what layer l's MLP receives (after its norm),
    else ``None``.
    """
    check_ids(ids)
    layers = decoder_layers(model)
    inputs: list = [None] * len(layers)
    mlp_in: list = [None] * len(layers)
    hooks = []

    def keep(store, i):
        def hook(module, args, kwargs):
            store[i] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return hook

    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(keep(inputs, i), with_kwargs=True))
        if mlp_inputs:
            hooks.append(layer.mlp.register_forward_pre_hook(keep(mlp_in, i), with_kwargs=True))
    try:
        hidden = model.model(input_ids=ids.to(input_device(model)), use_cache=False).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
    return hidden, inputs, (mlp_in if mlp_inputs else None)


@contextmanager
def _layers_from(model, start: int):
    """Temporarily keep only decoder layers ``start:`` (the model's own forward then runs
    them on whatever ``inputs_embeds`` it is given)."""
    inner = model.model
    full = inner.layers
    inner.layers = nn.ModuleList(list(full)[start:])
    try:
        yield
    finally:
        inner.layers = full


@torch.no_grad()
def tail_losses(model, start_input: torch.Tensor, start: int, ids: torch.Tensor) -> torch.Tensor:
    """Per-window NLL when the forward pass starts at decoder layer ``start`` from the
    recorded residual stream ``start_input`` (B, L, d) (from :func:`layer_inputs`).

    Equal to :func:`window_losses` of the full model whenever nothing before layer
    ``start`` changed: a change in layer ``start`` or later then costs only the layers
    from ``start`` on (about half a forward pass on average).
    """
    check_ids(ids)
    n = len(decoder_layers(model))
    if not 0 <= start < n:
        raise IndexError(f"start must be in [0, {n}), got {start}")
    if start_input.shape[:2] != ids.shape:
        raise ValueError(f"start_input {tuple(start_input.shape)} does not match ids {tuple(ids.shape)}")
    with _layers_from(model, start):
        hidden = model.model(inputs_embeds=start_input, use_cache=False).last_hidden_state
    return nll_from_hidden(model, hidden, ids)
