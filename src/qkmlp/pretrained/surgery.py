"""Swap a gated model's MLPs for qkmlp layers, and build the chapter's interventions.

A decoder layer of a ``transformers`` model with gated MLPs (Llama, Qwen2, Mistral, Gemma,
OLMo-2, Phi-3, ...) has ``.mlp`` computing ``down(σ(gate(x)) * up(x))``: a rank-1
:class:`~qkmlp.GatedMLP` with query = gate, key = up, value = downᵀ. Two layouts of the
weights are read (:func:`mlp_weights`): separate ``gate_proj``, ``up_proj`` and
``down_proj`` (Llama and most others) and a fused ``gate_up_proj`` whose first half of
rows is the gate and second half the up projection, with ``down_proj`` (Phi-3).
:func:`gated_mlps` converts every layer (copies of the weights) and checks each
conversion on random inputs against the module it came from; :func:`replace_mlps` puts
any modules in their place, in the model, and returns the ones it took out, so that
:func:`mlps_replaced` can put them back.

:func:`variant` turns one converted layer into the layers the chapter compares with it
(each maps (..., d) to (..., d), with the same weights unless said otherwise):

=========== ===================================================================
kind        per hidden unit j, with a = x·q_j and b = x·k_j
=========== ===================================================================
gated       σ(a)·b (the layer itself)
none        0 (the MLP removed: the scale of every other change)
swap        σ(b)·a (query and key exchanged)
rescale     σ(αa)·b/α (inverse scaling by ``alpha``; α < 0 allowed)
toward_swap (1 − t)·σ(a)·b + t·σ(b)·a (the straight path to the exchange in function
            space, ``alpha`` = t in (0, 1]: t = ½ is ``symmetrized``, t = 1 ``swap``)
identity    a·b (σ replaced by the identity: the bilinear layer)
linear      σ'(0)·a·b (σ replaced by its tangent at 0: a·b/2 for SiLU)
symmetrized ½[σ(a)·b + σ(b)·a] (:class:`~qkmlp.SymmetrizedGatedMLP`)
symmetric   σ(a·b) (:class:`~qkmlp.SymmetricBilinearMLP`, σ outside the product)
=========== ===================================================================

Every variant is stated in the weights' own gauge. A gated unit has an exact symmetry
for any σ, k_j → c·k_j, v_j → v_j/c (the up/down gauge): ``rescale`` commutes with it
(q → αq, k → k/α is q → αq, v → v/α), but ``swap``, ``toward_swap``, ``symmetrized``
and ``symmetric`` do not: applied in the gauge c they are the stored-gauge variant of
the layer (q, c·k, v/c), a different function. :func:`gauge_balanced` fixes the gauge
‖k_j‖ = ‖v_j‖.
"""
from __future__ import annotations

import functools
import warnings
from contextlib import contextmanager
from typing import Mapping, Optional

import torch
from torch import nn

from .. import symmetry
from ..activations import get_activation
from ..layers import GatedMLP, SymmetricBilinearMLP, SymmetrizedGatedMLP

__all__ = ["VARIANTS", "PARAMETRISED", "NoMLP", "decoder_layers", "mlp_weights", "gated_mlps",
           "replace_mlps", "mlps_replaced", "use_gated_mlps", "tangent_slope", "variant",
           "gauge_balanced", "declared_activation", "Q4_BLOCK", "q4_steps", "with_q4_noise"]

#: The kinds :func:`variant` builds, in the order the chapter shows them.
VARIANTS = ("gated", "none", "swap", "rescale", "toward_swap", "identity", "linear", "symmetrized",
            "symmetric")
#: The kinds that take a parameter (``alpha``): α of ``rescale``, t of ``toward_swap``.
PARAMETRISED = ("rescale", "toward_swap")


class NoMLP(nn.Module):
    """The MLP removed: returns zeros of the input's shape, (..., d) -> (..., d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def decoder_layers(model) -> nn.ModuleList:
    """The decoder layers of a ``transformers`` causal LM (``model.model.layers``), each
    with an ``mlp`` (see :func:`mlp_weights` for the layouts that convert)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise TypeError("expected a transformers causal LM with decoder layers at "
                        f"model.model.layers (Llama, Qwen2, Mistral, Gemma, OLMo-2, Phi-3, ...); "
                        f"got {type(model).__name__}")
    return layers


def declared_activation(model) -> tuple[Optional[str], Optional[str]]:
    """``(attribute, name)`` of the activation ``model.config`` declares: ``hidden_activation``
    (Gemma 2, VaultGemma, Gemma 3n), then ``hidden_act`` (Llama, Qwen2, Gemma, Phi-3, ...),
    the order :func:`~qkmlp.activations.activation_of_mlp` (``GatedMLP.from_mlp``) reads;
    ``(None, None)`` when neither is a string."""
    config = getattr(model, "config", None)
    for attr in ("hidden_activation", "hidden_act"):
        v = getattr(config, attr, None)
        if isinstance(v, str):
            return attr, v
    return None, None


def _hidden_act(model) -> str:
    attr, act = declared_activation(model)
    if act is None:
        raise ValueError("model.config declares no activation (neither hidden_activation nor hidden_act "
                         "is set): pass activation= explicitly")
    try:
        return get_activation(act).name
    except ValueError as e:
        raise ValueError(f"model.config.{attr} = {act!r}: {e}; pass activation= explicitly") from None


def _linear(mlp, name):
    lin = getattr(mlp, name, None)
    return lin if isinstance(lin, nn.Linear) else None


def mlp_weights(mlp: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(gate, up, down)`` weights of a gated MLP module: gate and up (m, d), down (d, m).

    Reads ``gate_proj``, ``up_proj``, ``down_proj`` (Llama, Qwen2, Mistral, Gemma, OLMo-2)
    or a fused ``gate_up_proj`` (2m, d) whose rows 0..m−1 are the gate and m..2m−1 the up
    projection, with ``down_proj`` (Phi-3, which splits its output with ``chunk(2)``).
    The tensors are the module's own (no copy). Raises ``TypeError`` naming both layouts
    for anything else, and ``ValueError`` when a projection has a bias.
    """
    down = _linear(mlp, "down_proj")
    split = [_linear(mlp, n) for n in ("gate_proj", "up_proj")]
    fused = _linear(mlp, "gate_up_proj")
    if down is not None and all(lin is not None for lin in split):
        lins = split + [down]
        gate, up = split[0].weight, split[1].weight
    elif down is not None and fused is not None:
        lins = [fused, down]
        if fused.weight.shape[0] % 2:
            raise ValueError(f"gate_up_proj has an odd number of rows ({fused.weight.shape[0]}); "
                             "expected the gate rows then as many up rows")
        gate, up = fused.weight.chunk(2, dim=0)
    else:
        raise TypeError(f"mlp is a {type(mlp).__name__}, not a gated MLP: expected nn.Linear "
                        "gate_proj, up_proj and down_proj, or a fused gate_up_proj and down_proj")
    for lin in lins:
        if lin.bias is not None:
            raise ValueError(f"{type(mlp).__name__} has a bias in a projection; GatedMLP has none "
                             "(append a constant coordinate to x instead)")
    return gate, up, down.weight


@torch.no_grad()
def _check_conversion(mlp: nn.Module, g: GatedMLP, index: int) -> None:
    """Compare ``g`` with the module it came from on random inputs; raise if they differ."""
    w = g.value
    if w.device.type == "meta":
        return
    gen = torch.Generator().manual_seed(index)
    x = torch.randn(4, g.d_model, generator=gen, dtype=torch.float64).to(w.device, w.dtype)
    ref, got = mlp(x), g(x)
    tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(w.dtype, 2e-2)
    scale = float(ref.abs().max()) + 1e-30
    err = float((got - ref).abs().max())
    if not err <= tol * scale:
        raise ValueError(f"layer {index}: the converted GatedMLP differs from the model's "
                         f"{type(mlp).__name__} by {err:.3g} (largest output {scale:.3g}); the "
                         f"activation {g.activation.name!r} (from the config or activation=) "
                         "or the weight layout does not match the module")


def _checked_activation(model, activation, check: bool) -> str:
    """The activation name to convert with: the one ``model.config`` declares
    (``hidden_activation``, else ``hidden_act``), or ``activation`` when given. A given
    activation that differs from the declared one is
    warned about: with ``check`` the comparison with the module's own output then decides
    (and raises if the module does not compute it); ``check=False`` is the explicit
    override (a deliberate other σ on the model's weights, as the book's experiments use)."""
    if activation is None:
        return _hidden_act(model)
    act = get_activation(activation).name
    attr, declared = declared_activation(model)
    try:
        declared_name = get_activation(declared).name if isinstance(declared, str) else None
    except ValueError:                      # a name qkmlp does not know: nothing to compare
        declared_name = None
    if declared_name is not None and declared_name != act:
        if not check:
            warnings.warn(
                f"activation={activation!r} ({act}) differs from the model's config.{attr} = "
                f"{declared!r} ({declared_name}) and check=False: the converted layers compute {act} on "
                f"the model's weights, not the model's MLPs (drop activation= to convert the model as "
                f"it is)", UserWarning, stacklevel=3)
            return act
        warnings.warn(
            f"activation={activation!r} ({act}) differs from the model's config.{attr} = {declared!r} "
            f"({declared_name}); each converted layer is compared with the model's own MLP, which "
            f"raises if the module does not compute {act}", UserWarning, stacklevel=3)
    return act


def _source_params(mlp: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The parameters behind (gate, up, down) of :func:`mlp_weights`: the fused
    ``gate_up_proj.weight`` twice for Phi-3's layout (its requires_grad is the one to keep)."""
    if _linear(mlp, "gate_proj") is not None and _linear(mlp, "up_proj") is not None:
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    else:
        gate = up = mlp.gate_up_proj.weight
    return gate, up, mlp.down_proj.weight


def _mlp_layout(mlp: nn.Module) -> str:
    """"split" (gate_proj, up_proj, down_proj) or "fused" (Phi-3's gate_up_proj, down_proj)."""
    return "split" if _linear(mlp, "gate_proj") is not None and _linear(mlp, "up_proj") is not None else "fused"


def _save_as_hf(layout: str, activation: str, module, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook of a converted layer: its weights under the keys of the module it
    replaced (``gate_proj``/``up_proj``/``down_proj``, or Phi-3's fused ``gate_up_proj``), so
    ``save_pretrained`` writes a checkpoint that ``from_pretrained`` loads into the original
    architecture with these weights (and :class:`~qkmlp.GatedMLP` loads those keys back)."""
    if module.rank != 1 or module.activation.name != activation:
        raise RuntimeError(
            f"{prefix or 'this layer'}: a converted GatedMLP saves under the Hugging Face MLP's keys, which "
            f"hold a rank-1 layer with activation {activation!r}; this one has rank {module.rank} and "
            f"activation {module.activation.name!r}, which from_pretrained would not reproduce. Save it "
            f"with torch.save, or put back a layer the architecture can hold")
    q, k, v = (state_dict.pop(prefix + n) for n in ("query_weight", "key_weight", "value"))
    if layout == "fused":
        state_dict[prefix + "gate_up_proj.weight"] = torch.cat([q, k])
    else:
        state_dict[prefix + "gate_proj.weight"] = q
        state_dict[prefix + "up_proj.weight"] = k
    state_dict[prefix + "down_proj.weight"] = v.T.contiguous()


def _unsaveable_mlps(model, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook of a model whose MLPs :func:`replace_mlps` replaced: warns when a
    decoder layer's MLP has keys Hugging Face's architecture does not hold (``from_pretrained``
    would initialise that MLP at random and only its load report would say so)."""
    known = {"gate_proj.weight", "up_proj.weight", "down_proj.weight", "gate_up_proj.weight"}
    bad = []
    for i, layer in enumerate(decoder_layers(model)):
        head = f"{prefix}model.layers.{i}.mlp."
        own = {k[len(head):] for k in state_dict if k.startswith(head)}
        if not own <= known or not own:
            bad.append(f"layer {i} ({type(layer.mlp).__name__})")
    if bad:
        warnings.warn(
            f"the state dict of this model holds MLPs that its Hugging Face architecture cannot load: "
            f"{', '.join(bad)}; from_pretrained on a checkpoint saved from it (save_pretrained) would "
            f"initialise those MLPs at random. Put the original MLPs back first (replace_mlps(model, "
            f"returned)), or converted GatedMLPs from use_gated_mlps / gated_mlps, which save under the "
            f"original keys", UserWarning, stacklevel=2)


def gated_mlps(model, *, activation: Optional[str] = None, check: bool = True) -> list[GatedMLP]:
    """One :class:`~qkmlp.GatedMLP` per decoder layer, converted from its MLP (either
    layout of :func:`mlp_weights`; copies, the model is not changed).

    ``activation`` defaults to the one ``model.config`` declares: ``hidden_activation``
    (Gemma 2, VaultGemma, Gemma 3n), else ``hidden_act`` (``silu`` for SmolLM2), read in the
    order ``GatedMLP.from_mlp`` reads them. With
    ``check`` (default) each converted layer is compared with the model's own MLP on four
    random inputs, whether ``activation`` was given or read from the config, and a
    mismatch (a wrong activation, an unknown layout) larger than the dtype's tolerance
    (largest difference over largest output: 1e-9 in float64, 1e-4 in float32, 2e-2 in
    half precision) raises ``ValueError``. In half precision a σ close to the right one can
    pass (GELU's tanh approximation for exact GELU differs by about 5e-3), and on the meta
    device nothing is compared. A given ``activation`` that differs from the declared one
    warns (``UserWarning``) and is then compared like any other; ``check=False`` with such
    an activation is the explicit override that builds layers computing another σ on the
    model's weights on purpose (warned about, not compared). A layer whose MLP is not a
    gated MLP raises ``TypeError``.

    Each layer keeps what its module had: ``query_weight``, ``key_weight`` and ``value``
    require grad as the module's gate, up and down weights do (both halves of a fused
    ``gate_up_proj`` as it does), and the layer is in training mode when the module was.
    A frozen model (``requires_grad_(False)``) gives frozen layers.

    Each layer's ``state_dict()`` names its weights as the module it replaced does
    (``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight``, or Phi-3's fused
    ``gate_up_proj.weight``; down = ``value``ᵀ), so a model holding these layers saves with
    ``save_pretrained`` a checkpoint that ``from_pretrained`` loads into the original
    architecture with the same logits; the layer loads those keys back (``load_state_dict``).
    """
    act = _checked_activation(model, activation, check)
    out = []
    for i, layer in enumerate(decoder_layers(model)):
        try:
            gate, up, down = mlp_weights(layer.mlp)
        except (TypeError, ValueError) as e:
            raise type(e)(f"layer {i}: {e}") from None
        lin = [nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta") for w in (gate, up, down)]
        for li, w in zip(lin, (gate, up, down)):
            li.weight = nn.Parameter(w.detach(), requires_grad=False)
        g = GatedMLP.from_linear(*lin, activation=act).train(layer.mlp.training)
        for p, src in zip((g.query_weight, g.key_weight, g.value), _source_params(layer.mlp)):
            p.requires_grad_(src.requires_grad)
        if check:
            _check_conversion(layer.mlp, g, i)
        g.register_state_dict_post_hook(functools.partial(_save_as_hf, _mlp_layout(layer.mlp), act))
        out.append(g)
    return out


def replace_mlps(model, mlps: Mapping[int, nn.Module]) -> dict[int, nn.Module]:
    """Set ``model.model.layers[i].mlp = mlps[i]`` for every i given, in place.

    Returns the modules taken out, ``{i: old}``, so ``replace_mlps(model, old)`` undoes it.
    From then on ``model.state_dict()`` (and so ``save_pretrained``) warns while an MLP holds
    keys the Hugging Face architecture cannot load (a variant, a layer of rank > 1): a
    checkpoint saved so would reload with that MLP at random. Converted layers
    (:func:`gated_mlps`) save under the original keys and pass.
    """
    layers = decoder_layers(model)
    for i, m in mlps.items():
        if not isinstance(i, int) or not 0 <= i < len(layers):
            raise IndexError(f"layer index must be an int in [0, {len(layers)}), got {i!r}")
        if not isinstance(m, nn.Module):
            raise TypeError(f"layer {i}: expected an nn.Module, got {type(m).__name__}")
    old = {}
    for i, m in mlps.items():
        old[i] = layers[i].mlp
        layers[i].mlp = m
    if not getattr(model, "_qkmlp_save_check", False):
        model.register_state_dict_post_hook(_unsaveable_mlps)
        model._qkmlp_save_check = True
    return old


@contextmanager
def mlps_replaced(model, mlps: Mapping[int, nn.Module]):
    """Context manager: :func:`replace_mlps` on entry, the old MLPs put back on exit."""
    old = replace_mlps(model, mlps)
    try:
        yield model
    finally:
        replace_mlps(model, old)


def use_gated_mlps(model, *, activation: Optional[str] = None) -> dict[int, nn.Module]:
    """Replace every MLP of ``model`` by its :class:`~qkmlp.GatedMLP`, in place
    (:func:`gated_mlps`: checked against each module; each new layer keeps its module's
    ``requires_grad`` and training mode, so a trainable model stays trainable).

    Returns the original MLPs (``replace_mlps(model, returned)`` restores the model).

    **Saving.** The converted model's state dict names the MLP weights as the original
    architecture does (``mlp.gate_proj.weight``, ``mlp.up_proj.weight``,
    ``mlp.down_proj.weight``, or Phi-3's fused ``mlp.gate_up_proj.weight``), so
    ``model.save_pretrained(folder)`` writes a Hugging Face checkpoint:
    ``AutoModelForCausalLM.from_pretrained(folder)`` builds the original architecture with
    the same weights and logits; call ``use_gated_mlps`` on it again to convert. A
    :class:`~qkmlp.GatedMLP` loads those keys, so ``model.load_state_dict(sd)`` works
    strictly on a converted model too. An MLP put in with :func:`replace_mlps` that the
    architecture cannot hold (a variant, rank > 1) makes ``state_dict()`` warn; a converted
    layer whose rank or activation was changed afterwards makes it raise.
    """
    return replace_mlps(model, dict(enumerate(gated_mlps(model, activation=activation))))


@torch.no_grad()
def _with_weights(cls, g: GatedMLP, activation, value_scale: float = 1.0):
    new = cls(g.d_model, g.d_hidden, g.d_out, rank=g.rank, activation=activation,
              device=g.value.device, dtype=g.value.dtype)
    new.query.copy_(g.query)
    new.key.copy_(g.key)
    new.value.copy_(g.value * value_scale)
    return new.eval().requires_grad_(False)


def tangent_slope(activation) -> float:
    """σ'(0), for σ with σ(0) = 0 (then σ(z) ≈ σ'(0)·z near 0), by autograd in float64."""
    act = get_activation(activation)
    with torch.enable_grad():
        z = torch.zeros((), dtype=torch.float64, requires_grad=True)
        y = act(z)
        if y.item() != 0.0:
            raise ValueError(f"the tangent at 0 of {act.name} is not linear: σ(0) = {y.item()} ≠ 0")
        (slope,) = torch.autograd.grad(y, z)
    return float(slope)


def variant(g: GatedMLP, kind: str, alpha: Optional[float] = None) -> nn.Module:
    """The layer of ``kind`` (see :data:`VARIANTS` and the module's table) built from
    ``g``'s weights. ``alpha`` is the kind's parameter, required for the kinds of
    :data:`PARAMETRISED` and refused otherwise: α ≠ 0 (finite) for ``rescale``, t in
    (0, 1] for ``toward_swap``. ``g`` is left untouched ("gated" returns ``g`` itself)."""
    if not isinstance(g, GatedMLP):
        raise TypeError(f"variant needs a GatedMLP, got {type(g).__name__}")
    if kind not in VARIANTS:
        raise ValueError(f"unknown variant {kind!r}; expected one of {', '.join(VARIANTS)}")
    if (alpha is not None) != (kind in PARAMETRISED):
        raise ValueError(f"alpha is required for kind in {PARAMETRISED} and only for them; "
                         f"got kind={kind!r}, alpha={alpha!r}")
    if kind == "gated":
        return g
    if kind == "none":
        return NoMLP()
    if kind == "swap":
        return symmetry.swapped(g).eval().requires_grad_(False)
    if kind == "rescale":
        return symmetry.rescaled(g, alpha).eval().requires_grad_(False)
    if kind == "toward_swap":
        return _toward_swap(g, alpha)
    if kind == "identity":
        return _with_weights(GatedMLP, g, "identity")
    if kind == "linear":
        return _with_weights(GatedMLP, g, "identity", tangent_slope(g.activation))
    if kind == "symmetrized":
        return _with_weights(SymmetrizedGatedMLP, g, g.activation)
    return _with_weights(SymmetricBilinearMLP, g, g.activation)


@torch.no_grad()
def _toward_swap(g: GatedMLP, t: float) -> GatedMLP:
    """(1 − t)·g + t·swap(g) as one GatedMLP of twice the rank: per unit and slot s the
    pairs (q, (1 − t)k) and (k, t·q), sharing v (σ(a)(1 − t)b + σ(b)·t·a)."""
    t = float(t)
    if not 0.0 < t <= 1.0:
        raise ValueError(f"t (alpha of toward_swap) must be in (0, 1], got {t!r}")
    r = g.rank
    new = GatedMLP(g.d_model, g.d_hidden, g.d_out, rank=2 * r, activation=g.activation,
                   device=g.value.device, dtype=g.value.dtype)
    new.query[:, :r].copy_(g.query)
    new.key[:, :r].copy_(g.key * (1.0 - t))
    new.query[:, r:].copy_(g.key)
    new.key[:, r:].copy_(g.query * t)
    new.value.copy_(g.value)
    return new.eval().requires_grad_(False)


@torch.no_grad()
def gauge_balanced(g: GatedMLP) -> GatedMLP:
    """The same function in the gauge ‖k_j‖ = ‖v_j‖: per unit k_j → c_j·k_j, v_j → v_j/c_j
    with c_j = √(‖v_j‖/‖k_j‖) (rank 1; a unit with k_j = 0 or v_j = 0 is left as it is).

    The up/down gauge is an exact symmetry of a gated unit for every σ, so ‖k_j‖ alone
    says nothing about the function; statistics of the balance between gate and up rows
    mean something only once the gauge is fixed (this one, or any other stated one).
    """
    if not isinstance(g, GatedMLP) or g.rank != 1:
        raise TypeError("gauge_balanced needs a rank-1 GatedMLP")
    nk = g.key[:, 0].norm(dim=1)
    nv = g.value.norm(dim=1)
    ok = (nk > 0) & (nv > 0)
    c = torch.where(ok, (nv / torch.where(ok, nk, torch.ones_like(nk))).sqrt(), torch.ones_like(nk))
    out = _with_weights(GatedMLP, g, g.activation)
    out.key.mul_(c.view(-1, 1, 1))
    out.value.div_(c.view(-1, 1))
    return out


#: Block length of the Q4_1 format: 32 consecutive weights of a stored row share one
#: step d and offset (``ggml``'s ``QK4_1``).
Q4_BLOCK = 32


def q4_steps(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of :data:`Q4_BLOCK` along the last dimension of ``weight`` (as stored in
    the ``.gguf``: a row of an ``nn.Linear`` weight): the Q4_1 step d = (max − min)/15
    and the number of distinct values. Two tensors of shape (rows, cols // 32).

    A Q4_1 block holds min + d·i with i ∈ {0, …, 15}: at most 16 distinct values.
    """
    rows, cols = weight.shape
    if cols % Q4_BLOCK:
        raise ValueError(f"the last dimension ({cols}) is not a multiple of {Q4_BLOCK}")
    blocks = weight.detach().reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15
    srt = blocks.sort(-1).values
    distinct = 1 + (srt[..., 1:] != srt[..., :-1]).sum(-1)
    return step, distinct


@torch.no_grad()
def with_q4_noise(g: GatedMLP, generator: Optional[torch.Generator] = None) -> GatedMLP:
    """A copy of ``g`` with every weight moved by uniform noise in [−d/2, d/2], d the
    Q4_1 step of its block: one more rounding error of the size the 4-bit file already
    carries. Blocks run along the stored rows: gate and up rows (over d), down rows
    (over m, i.e. along ``value``'s first dimension)."""
    if not isinstance(g, GatedMLP) or g.rank != 1:
        raise TypeError("with_q4_noise needs a rank-1 GatedMLP")
    out = _with_weights(GatedMLP, g, g.activation)

    def noisy(w):                                # w as stored: (rows, cols), blocks along cols
        step, _ = q4_steps(w)
        u = (torch.rand(w.shape, generator=generator, dtype=torch.float64) - 0.5).to(w.device)
        return w + (u * step.double().repeat_interleave(Q4_BLOCK, dim=1)).to(w.dtype)

    out.query.copy_(noisy(g.query[:, 0]).unsqueeze(1))
    out.key.copy_(noisy(g.key[:, 0]).unsqueeze(1))
    out.value.copy_(noisy(g.value.T).T)
    return out
