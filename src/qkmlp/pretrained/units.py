"""Per-unit exchange: which units of a layer the model can afford to swap, one at a time.

Exchanging q_j ↔ k_j in unit j alone changes the layer's output on token t by
Δ_tj·v_j with Δ_tj = σ(b_tj)a_tj − σ(a_tj)b_tj. Pricing each of a layer's m units with a
forward pass of its own is too slow for m = 1536, so the held-out loss change is first
estimated to first order (the gradient of the loss with respect to the layer's output,
:func:`mlp_output_grads`, dotted with the change; :func:`unit_swap_costs`), and the
estimate is then checked where it matters with exact forward passes of groups of
units swapped together (:func:`partially_swapped`).

The chapter's own claim under test: a unit whose two projections are nearly equal on
the tokens it sees changes little under the exchange, and among weight pairs that is an
aligned and balanced pair, q_j ≈ k_j. :func:`pair_distance` measures that,
d_j = ‖q_j − k_j‖ / (‖q_j‖ + ‖k_j‖) ∈ [0, 1], 0 exactly when q_j = k_j (in the stored
gauge, the one the exchange acts in).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..layers import GatedMLP
from .heldout import nll_from_hidden
from .surgery import decoder_layers

__all__ = ["pair_distance", "alignment_rank", "mlp_output_grads", "unit_swap_costs", "partially_swapped"]


def _qk(layer: GatedMLP):
    if not isinstance(layer, GatedMLP) or layer.rank != 1:
        raise TypeError("expected a rank-1 GatedMLP")
    return layer.query[:, 0].detach(), layer.key[:, 0].detach()


def pair_distance(layer: GatedMLP) -> torch.Tensor:
    """d_j = ‖q_j − k_j‖ / (‖q_j‖ + ‖k_j‖) per unit, (m,) float64."""
    q, k = (t.double() for t in _qk(layer))
    return (q - k).norm(dim=1) / (q.norm(dim=1) + k.norm(dim=1))


def alignment_rank(layer: GatedMLP, unit: int) -> int:
    """Where ``unit``'s |cos(q_j, k_j)| ranks among its layer's m units: 1 = most aligned
    (ties share the better rank)."""
    q, k = (t.double() for t in _qk(layer))
    if not 0 <= unit < q.shape[0]:
        raise IndexError(f"unit {unit} out of range for a layer of {q.shape[0]} units")
    c = torch.nn.functional.cosine_similarity(q, k, dim=-1).abs()
    return int((c > c[unit]).sum()) + 1


def mlp_output_grads(model, ids: torch.Tensor, layers: Sequence[int], *, batch_size: int = 4) -> dict:
    """∂L_i/∂(output of layer l's MLP) for every window i and each l in ``layers``, with
    L_i the window's mean next-token NLL: ``{l: (n, length, d) float32 tensor}``.

    The model is run as it is (no weights change; nothing is left on it): a zero tensor
    that requires grad is added to each MLP's output by a forward hook, and the loss of
    each batch of windows is differentiated with respect to those zeros.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError("ids must be an int64 (n_windows, length) tensor")
    dl = decoder_layers(model)
    layers = [int(l) for l in layers]
    for l in layers:
        if not 0 <= l < len(dl):
            raise IndexError(f"layer must be in [0, {len(dl)}), got {l}")
    out = {l: [] for l in layers}
    for chunk in ids.split(batch_size):
        zeros, hooks = {}, []

        def add_zero(i):
            def hook(module, args, output):
                z = torch.zeros_like(output, requires_grad=True)
                zeros[i] = z
                return output + z
            return hook

        for l in layers:
            hooks.append(dl[l].mlp.register_forward_hook(add_zero(l)))
        try:
            with torch.enable_grad():
                hidden = model.model(input_ids=chunk, use_cache=False).last_hidden_state
                loss = nll_from_hidden(model, hidden, chunk, grad=True).sum()
                grads = torch.autograd.grad(loss, [zeros[l] for l in layers])
        finally:
            for h in hooks:
                h.remove()
        for l, gr in zip(layers, grads):
            out[l].append(gr.float())
    return {l: torch.cat(v) for l, v in out.items()}


@torch.no_grad()
def unit_swap_costs(layer: GatedMLP, x: torch.Tensor, grad: torch.Tensor) -> dict:
    """Per unit j of a rank-1 gated layer, on its inputs x (n, L, d) with the loss
    gradient ``grad`` (n, L, d) of :func:`mlp_output_grads`:

    - ``predicted`` (m,): the first-order change of the mean window loss when unit j alone
      is exchanged, mean_i Σ_t grad_it·v_j Δ_itj;
    - ``predicted_windows`` (n, m): the same per window;
    - ``local`` (m,) and ``local_rest`` (m,): ‖Δ[·, j]‖·‖v_j‖ / ‖f(x)‖, the size of unit j's
      change relative to the layer's output, over all positions and over positions ≥ 1.
    """
    q, k = _qk(layer)
    if x.dim() != 3 or grad.shape != x.shape or x.shape[-1] != layer.d_model:
        raise ValueError(f"x and grad must be (n, L, {layer.d_model}) tensors of one shape, got "
                         f"{tuple(x.shape)} and {tuple(grad.shape)}")
    x, grad = x.detach().double(), grad.detach().double()
    v = layer.value.detach().double()
    q, k = q.double(), k.double()
    a, b = x @ q.T, x @ k.T                                   # (n, L, m)
    delta = layer.activation(b) * a - layer.activation(a) * b
    gv = grad @ v.T                                           # (n, L, m): grad · v_j
    per_window = (gv * delta).sum(1)                          # (n, m)
    f = (layer.activation(a) * b) @ v
    vn = v.norm(dim=1)
    return {"predicted": per_window.mean(0), "predicted_windows": per_window,
            "local": delta.pow(2).sum((0, 1)).sqrt() * vn / f.norm(),
            "local_rest": delta[:, 1:].pow(2).sum((0, 1)).sqrt() * vn / f[:, 1:].norm()}


@torch.no_grad()
def partially_swapped(layer: GatedMLP, units) -> GatedMLP:
    """A copy of ``layer`` with q_j ↔ k_j exchanged for the units given (any index
    sequence or boolean mask), the other units untouched."""
    if not isinstance(layer, GatedMLP):
        raise TypeError(f"expected a GatedMLP, got {type(layer).__name__}")
    idx = torch.as_tensor(units)
    if idx.dtype == torch.bool:
        if idx.shape != (layer.d_hidden,):
            raise ValueError(f"a unit mask must have shape ({layer.d_hidden},), got {tuple(idx.shape)}")
        idx = idx.nonzero().flatten()
    idx = idx.long().flatten()
    if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < layer.d_hidden):
        raise IndexError(f"unit indices must be in [0, {layer.d_hidden})")
    out = GatedMLP(layer.d_model, layer.d_hidden, layer.d_out, rank=layer.rank, activation=layer.activation,
                   device=layer.value.device, dtype=layer.value.dtype)
    out.query.copy_(layer.query)
    out.key.copy_(layer.key)
    out.value.copy_(layer.value)
    out.query[idx] = layer.key[idx]
    out.key[idx] = layer.query[idx]
    return out.eval().requires_grad_(False)
