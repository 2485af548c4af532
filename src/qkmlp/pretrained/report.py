"""Read the stored SmolLM2 analysis: loss changes with their standard errors, and the
live rerun of one slice of it.

A loss change is paired by window: δ_i = L_i(intervention) − L_i(base), i = 1..n, with
L_i the mean next-token NLL of window i (nats). Reported: the mean δ̄ (equal windows, so
it is the change of the mean loss) and its standard error s_δ/√n.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch

from ..runbase.stats import holm_rejects, paired_t
from .textrun import key as _key

__all__ = ["save_results", "load_results", "key", "text_results", "loss_change", "layer_changes", "all_changes",
           "compare_layers", "rerun_slice", "stored_windows", "summary_lines"]


def _round(obj, digits: int = 7):
    if isinstance(obj, float):
        return obj if obj == 0.0 or not math.isfinite(obj) else float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v, digits) for v in obj]
    return obj


def save_results(result: dict, path) -> None:
    """Write ``result`` as JSON (floats to 7 significant digits), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_round(result), indent=1) + "\n")


def load_results(path) -> dict:
    """Read a results file written by :func:`save_results`."""
    return json.loads(Path(path).read_text())


def key(kind: str, alpha: Optional[float] = None) -> str:
    """The results key of an intervention: ``"swap"``, ``"rescale:2"``, ``"toward_swap:0.25"``
    (``alpha`` is the kind's parameter)."""
    return _key(kind, alpha)


def text_results(results: dict, text: Optional[str] = None) -> dict:
    """The stored measurements on one held-out text (default: the run's main text)."""
    name = results["config"]["main_text"] if text is None else text
    try:
        return results["texts"][name]
    except KeyError:
        raise KeyError(f"no text {name!r} in the results; stored: {', '.join(results['texts'])}") from None


def _mean_se(deltas: list[float]) -> tuple[float, float]:
    n = len(deltas)
    mean = sum(deltas) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1)) if n > 1 else float("nan")
    return mean, sd / math.sqrt(n)


def loss_change(base: list[float], other: list[float]) -> tuple[float, float]:
    """(mean, standard error) of the paired per-window change ``other − base``."""
    if len(base) != len(other) or not base:
        raise ValueError(f"need two equally long, non-empty per-window lists; got {len(base)} and {len(other)}")
    return _mean_se([o - b for o, b in zip(other, base)])


def layer_changes(results: dict, kind: str, alpha: Optional[float] = None, *,
                  text: Optional[str] = None) -> list[Optional[tuple[float, float]]]:
    """Per layer, (mean, se) of the loss change of ``kind`` applied to that layer alone
    (``None`` for layers the run skipped), on ``text`` (default: the main text)."""
    t = text_results(results, text)
    rows = t["layer"][key(kind, alpha)]
    return [None if r is None else loss_change(t["base"], r) for r in rows]


def all_changes(results: dict, kind: str, alpha: Optional[float] = None, *,
                text: Optional[str] = None) -> tuple[float, float]:
    """(mean, se) of the loss change of ``kind`` applied to every layer at once."""
    t = text_results(results, text)
    return loss_change(t["base"], t["all"][key(kind, alpha)])


def compare_layers(results: dict, kind_a: str, kind_b: str, level: float = 0.05, *,
                   text: Optional[str] = None) -> list[dict]:
    """Per layer, the paired comparison of two stored per-layer interventions (results
    keys, e.g. ``"none"`` and ``"swap"``) on ``text``: :func:`paired_t` of b − a over the
    windows, with ``significant`` from :func:`holm` across the layers the run covered."""
    t = text_results(results, text)
    rows_a = t["layer"][kind_a]
    rows_b = t["layer"][kind_b]
    layers = [l for l in range(len(rows_a)) if rows_a[l] is not None and rows_b[l] is not None]
    tests = [paired_t(rows_a[l], rows_b[l]) | {"layer": l} for l in layers]
    for t, rej in zip(tests, holm_rejects([t["p"] for t in tests], level)):
        t["significant"] = rej
    return tests


@torch.no_grad()
def rerun_slice(model, tokenizer, results: dict, layer: int, kind: str, alpha: Optional[float] = None,
                window: int = 0, windows: Optional[torch.Tensor] = None, *, text: Optional[str] = None) -> dict:
    """Recompute one stored number the simple way: the loss of held-out ``window`` of
    ``text`` with every MLP a :class:`~qkmlp.GatedMLP` (the base) and with ``kind`` in
    ``layer``, each by a full forward pass (the runner used the recorded residual stream).

    ``windows`` may pass the text's windows already made with the stored run's settings
    (:func:`stored_windows`), to skip tokenising the text again. Returns
    ``{"base": (stored, live), "intervention": (stored, live)}``.
    """
    from .heldout import window_losses
    from .surgery import gated_mlps, mlps_replaced, variant

    t = text_results(results, text)
    if windows is None:
        windows = stored_windows(tokenizer, results, text)
    cfg = results["config"]
    if tuple(windows.shape) != (cfg["n_windows"], cfg["length"]):
        raise ValueError(f"windows must have the stored shape {(cfg['n_windows'], cfg['length'])}, "
                         f"got {tuple(windows.shape)}")
    stored = t["layer"][key(kind, alpha)][layer]
    if stored is None:
        raise ValueError(f"the stored run skipped layer {layer}")
    ids = windows[window:window + 1]
    g = gated_mlps(model)
    with mlps_replaced(model, dict(enumerate(g))):
        base = float(window_losses(model, ids)[0])
        with mlps_replaced(model, {layer: variant(g[layer], kind, alpha)}):
            live = float(window_losses(model, ids)[0])
    return {"base": (t["base"][window], base), "intervention": (stored[window], live)}


def stored_windows(tokenizer, results: dict, text: Optional[str] = None) -> torch.Tensor:
    """The held-out windows of ``text`` exactly as the stored run made them: the text is
    rebuilt and checked against its pinned SHA-256 (a custom text cannot be rebuilt), and
    the windows against the stored checksum of their token ids (``ValueError`` if they
    differ: another tokenizer or other settings)."""
    import hashlib

    from .heldout import heldout_windows
    from .texts import text as named_text

    t = text_results(results, text)
    info = t["text"]
    if info.get("role") == "custom":
        raise ValueError(f"text {info['name']!r} was given to the run as a string; it cannot be rebuilt here")
    cfg = results["config"]
    s = named_text(info["name"])
    ids = heldout_windows(tokenizer, cfg["n_windows"], cfg["length"], s, bos=cfg["bos"])
    found = hashlib.sha256(ids.numpy().tobytes()).hexdigest()
    if found != info["windows_sha256"]:
        raise ValueError(f"the windows of {info['name']!r} made here differ from the stored run's "
                         f"(token ids hash {found[:16]}..., stored {info['windows_sha256'][:16]}...)")
    return ids


def summary_lines(results: dict, text: Optional[str] = None) -> list[str]:
    """A short plain-text summary of a stored analysis (what ``python -m qkmlp.pretrained``
    prints): the conversion check, then on ``text`` (default: the main text) the held-out
    loss, the change of loss (nats/token, mean over windows) when every MLP at once is
    replaced, and per layer the removal, the exchange q <-> k and alpha = -1 where stored."""
    name = results["config"]["main_text"] if text is None else text
    t = text_results(results, name)
    m = results.get("model", {})
    out = [f"model: {m.get('architecture', '?')}, {m.get('n_layers', '?')} layers, d_model {m.get('d_model', '?')}, "
           f"d_hidden {m.get('d_hidden', '?')}, {m.get('hidden_act', '?')}"]
    for dtype, c in results.get("logits", {}).items():
        out.append(f"GatedMLP conversion, {dtype}: largest logit difference {c['max_abs_diff']:.2g} "
                   f"(largest logit {c['max_abs_logit']:.3g}), argmax {'agrees' if c['argmax_agree'] else 'DIFFERS'}")
    base = t["base"]
    out.append(f"text {name!r}: {len(base)} windows, loss {sum(base) / len(base):.3f} nats/token")
    every = [k for k in ("none", "swap", "symmetrized", "symmetric", "identity", "rescale:-1", "rescale:2")
             if k in t.get("all", {})]
    if every:
        out.append("every MLP at once, loss change (nats/token, mean ± se over windows):")
        for k in every:
            mean, se = loss_change(base, t["all"][k])
            out.append(f"  {k:<14} {mean:+8.3f} ± {se:.3f}")
    kinds = [k for k in ("none", "swap", "rescale:-1") if k in t.get("layer", {})]
    if kinds:
        out.append("one layer at a time, loss change (nats/token):")
        out.append("  layer " + "".join(f"{k:>12}" for k in kinds))
        n = len(t["layer"][kinds[0]])
        for layer in range(n):
            cells = []
            for k in kinds:
                rows = t["layer"][k][layer]
                cells.append(f"{loss_change(base, rows)[0]:+12.4f}" if rows is not None else f"{'-':>12}")
            out.append(f"  {layer:>5} " + "".join(cells))
    out.append("read it in Python: qkmlp.pretrained.report (load_results, layer_changes, all_changes, "
               "compare_layers); the book's readers: qkmlp.book.ch09_findings, ch09_plots_costs")
    return out
