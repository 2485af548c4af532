"""Weight-space probes of a gated layer: where the gate's bias lives, and the up/down gauge.

A trained gated layer has no bias vector, but it can learn one: when its inputs x share
a mean direction x̄ (RMSNorm does not centre them), the gate pre-activation of unit j
has mean x̄·q_j over the tokens, a per-unit offset. :func:`weight_probes` and
:func:`mean_input_probes` look for that offset in the weights themselves:

- ``mean_row``: ‖mean_j w_j‖ / √(mean_j ‖w_j‖²) for the gate rows q_j, the up rows k_j
  and the down columns v_j; for m rows with independent random directions it is about
  1/√m (``chance``), and a larger value means the rows share a common direction;
- against the mean input: the share of units with x̄·q_j < 0 (the gate of unit j is
  closed on the average token) and the same for the up rows, where symmetry under
  k → −k (with v → −v, an exact symmetry of the function for any σ) makes 1/2 the
  only value that says nothing; and the same share with the normalisation gain γ
  (x = γ ⊙ n for the normalised stream n) replaced by its mean, which tells whether the
  gain or the rows carry the offset.

The up/down gauge: k_j → c·k_j, v_j → v_j/c (c > 0) leaves every gated unit unchanged
for any σ, so ‖k_j‖ alone is not a property of the function. :func:`gauge_statistics`
measures how the trained weights sit on that orbit (the correlation of log‖k_j‖ and
log‖v_j‖) and the gauge-invariant balance

    β̃_j = log‖q_j‖ − ½·log(‖k_j‖·‖v_j‖),

which equals log(‖q_j‖/‖k_j‖) in the gauge ‖k_j‖ = ‖v_j‖
(:func:`~qkmlp.pretrained.surgery.gauge_balanced`), against a shuffled baseline that
pairs q_j with the (k, v) of another unit.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..layers import GatedMLP
from .anatomy import summarise

__all__ = ["mean_row_ratio", "weight_probes", "mean_input_probes", "gauge_statistics", "norm_gain"]


def mean_row_ratio(rows: torch.Tensor) -> float:
    """‖mean of the rows‖ / √(mean squared row norm) of an (m, d) matrix: 1 when all rows
    are equal, about 1/√m for independent random directions, 0 when they cancel."""
    if rows.dim() != 2 or rows.shape[0] < 2:
        raise ValueError(f"expected an (m, d) matrix with m >= 2, got shape {tuple(rows.shape)}")
    r = rows.detach().double()
    return float(r.mean(0).norm() / r.pow(2).sum(1).mean().sqrt())


def _qkv(layer: GatedMLP):
    if not isinstance(layer, GatedMLP) or layer.rank != 1:
        raise TypeError("expected a rank-1 GatedMLP")
    return (layer.query[:, 0].detach().double(), layer.key[:, 0].detach().double(),
            layer.value.detach().double())


def norm_gain(decoder_layer) -> Optional[torch.Tensor]:
    """The gain γ of the normalisation in front of a decoder layer's MLP
    (``post_attention_layernorm.weight`` of Llama-style layers), or ``None`` when the
    layer has none (OLMo-2 normalises after its MLP) or stores it another way (Gemma's
    norm multiplies by 1 + weight: then ``None`` too, rather than a wrong γ)."""
    norm = getattr(decoder_layer, "post_attention_layernorm", None)
    w = getattr(norm, "weight", None)
    if w is None or "Gemma" in type(norm).__name__:
        return None
    return w.detach().double()


def weight_probes(layer: GatedMLP) -> dict:
    """``mean_row`` of the gate rows, up rows and down columns (value rows), and
    ``chance`` = 1/√m, from the weights alone."""
    q, k, v = _qkv(layer)
    return {"mean_row": {"gate": mean_row_ratio(q), "up": mean_row_ratio(k), "down": mean_row_ratio(v)},
            "chance": 1.0 / math.sqrt(q.shape[0])}


@torch.no_grad()
def mean_input_probes(layer: GatedMLP, x: torch.Tensor, gain: Optional[torch.Tensor] = None) -> dict:
    """How the rows meet the mean input x̄ of the inputs x (N, d):

    - ``frac_gate_against`` / ``frac_up_against``: share of units with x̄·q_j < 0 / x̄·k_j < 0;
    - ``cos_mean_gate_row``: cosine of the mean gate row with x̄;
    - ``mean_share``: ‖x̄‖² / mean ‖x_t‖², the share of the inputs' energy in their mean;
    - ``gate_offset``: mean over units of x̄·q_j / sd_t(x_t·q_j), the gate's offset in units
      of its spread (the up projection's ``up_offset`` alike);
    - with ``gain`` (γ, (d,)): ``frac_gate_against_flat_gain``, the share with γ replaced
      by its mean (x̄ = γ ⊙ n̄ becomes mean(γ)·n̄).
    """
    q, k, _ = _qkv(layer)
    x = x.detach().reshape(-1, layer.d_model).double()
    if x.shape[0] < 2:
        raise ValueError("mean_input_probes needs at least two input rows")
    xbar = x.mean(0)
    a, b = x @ q.T, x @ k.T
    out = {
        "frac_gate_against": float((q @ xbar < 0).double().mean()),
        "frac_up_against": float((k @ xbar < 0).double().mean()),
        "cos_mean_gate_row": float(q.mean(0) @ xbar / (q.mean(0).norm() * xbar.norm())),
        "mean_share": float(xbar.pow(2).sum() / x.pow(2).sum(1).mean()),
        "gate_offset": float((a.mean(0) / a.std(0)).mean()),
        "up_offset": float((b.mean(0) / b.std(0)).mean()),
    }
    if gain is not None:
        gain = gain.detach().double()
        if gain.shape != (layer.d_model,) or bool((gain == 0).any()):
            raise ValueError(f"gain must be a ({layer.d_model},) tensor without zeros")
        flat = xbar / gain * gain.mean()
        out["frac_gate_against_flat_gain"] = float((q @ flat < 0).double().mean())
    return out


def _corr(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


def gauge_statistics(layer: GatedMLP, generator: Optional[torch.Generator] = None) -> dict:
    """The up/down gauge of a rank-1 gated layer, from the weights:

    - ``corr_log_k_log_v``: correlation over units of log‖k_j‖ and log‖v_j‖ (near 1 when
      training left each unit at a fixed point of the gauge orbit, e.g. ‖k_j‖ ∝ ‖v_j‖);
      ``corr_log_q_log_v`` and ``corr_log_q_log_k`` for comparison;
    - ``log_k_over_v``: :func:`~qkmlp.pretrained.anatomy.summarise` of log(‖k_j‖/‖v_j‖);
    - ``balance``: the stored-gauge β_j = log(‖q_j‖/‖k_j‖); ``balance_fixed``: the
      gauge-invariant β̃_j (module docstring); ``shuffled_balance_fixed``: β̃ with q_j
      paired with the (k, v) of unit π(j), π a random m-cycle.
    """
    q, k, v = _qkv(layer)
    m = q.shape[0]
    if m < 2:
        raise ValueError("gauge_statistics needs at least two units")
    lq, lk, lv = q.norm(dim=1).log(), k.norm(dim=1).log(), v.norm(dim=1).log()
    order = torch.randperm(m, generator=generator)
    perm = torch.empty_like(order)
    perm[order] = order.roll(-1)          # one random m-cycle: π(j) ≠ j
    return {
        "corr_log_k_log_v": _corr(lk, lv), "corr_log_q_log_v": _corr(lq, lv), "corr_log_q_log_k": _corr(lq, lk),
        "log_k_over_v": summarise(lk - lv),
        "balance": summarise(lq - lk),
        "balance_fixed": summarise(lq - 0.5 * (lk + lv)),
        "shuffled_balance_fixed": summarise(lq - 0.5 * (lk[perm] + lv[perm])),
    }
