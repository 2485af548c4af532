"""Where the layers meet torch's other tools: ``torch.fx`` tracing and state dicts of
Hugging Face MLPs (private helpers of :mod:`qkmlp.layers`)."""
from __future__ import annotations

import torch
from torch import nn


def fx_method_message(layer) -> str:
    """The TypeError message for a layer's method called on an ``torch.fx`` Proxy."""
    return (
        f"got a torch.fx Proxy: torch.fx.symbolic_trace cannot trace into a {type(layer).__name__}'s "
        f"methods (their input checks and fused autograd functions need real tensors); calling the "
        f"layer, layer(x), inside a traced model records it as one call_module node (a leaf), "
        f"or trace with torch.jit.trace / torch.export.export, which run on real tensors"
    )


def fx_leaf(layer, x) -> torch.Tensor:
    """Under ``torch.fx.symbolic_trace`` (``x`` a Proxy): ``layer`` as one ``call_module``
    node, as the tracer records a leaf module; the traced graph then calls the layer on
    real tensors. The root of a trace cannot be recorded so: TypeError naming the fix."""
    tracer = x.tracer
    try:
        path = tracer.path_of_module(layer)
    except NameError:
        path = None
    if not path:
        raise TypeError(
            f"torch.fx.symbolic_trace cannot trace a bare {type(layer).__name__} (its input checks and "
            f"fused autograd functions need real tensors); trace a model that holds it (e.g. "
            f"nn.Sequential(layer)): inside a model each qkmlp layer is recorded as one call_module node, "
            f"a leaf module; or use torch.jit.trace / torch.export.export"
        )
    return tracer.create_proxy("call_module", path, (x,), {})


def llama_keys_to_gated(layer, state_dict, prefix: str) -> None:
    """Rewrite a Llama/Phi-3 MLP's keys under ``prefix`` in ``state_dict`` (load_state_dict's
    own copy) as ``layer``'s (a rank-1 GatedMLP's ``load_state_dict`` calls this)."""
    k = {n: prefix + n for n in ("gate_proj.weight", "up_proj.weight", "gate_up_proj.weight", "down_proj.weight")}
    if prefix + "query_weight" in state_dict or k["down_proj.weight"] not in state_dict:
        return
    if k["gate_up_proj.weight"] in state_dict:
        fused = state_dict[k["gate_up_proj.weight"]]
        if fused.dim() != 2 or fused.shape[0] % 2:
            raise ValueError(f"{k['gate_up_proj.weight']} has shape {tuple(fused.shape)}; expected (2m, d): "
                             "the gate rows, then as many up rows")
        gate, up = fused.chunk(2, dim=0)
        taken = ("gate_up_proj.weight", "down_proj.weight")
    elif k["gate_proj.weight"] in state_dict and k["up_proj.weight"] in state_dict:
        gate, up = state_dict[k["gate_proj.weight"]], state_dict[k["up_proj.weight"]]
        taken = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    else:
        return
    if layer.rank != 1:
        raise ValueError(f"{prefix or 'the state dict'}: a gate/up/down MLP's weights load into a rank-1 "
                         f"GatedMLP; this one has rank {layer.rank}")
    down = state_dict[k["down_proj.weight"]]
    for name in taken:
        del state_dict[k[name]]
    state_dict[prefix + "query_weight"] = gate
    state_dict[prefix + "key_weight"] = up
    state_dict[prefix + "value"] = down.T.contiguous() if down.dim() == 2 else down


def rank_mismatch(layer, state_dict, prefix: str) -> list[str]:
    """Messages for ``query_weight`` / ``key_weight`` in ``state_dict`` that hold m·r' rows of
    another rank r' than ``layer``'s (a rank-r layer's ``load_state_dict`` adds them to
    torch's own size-mismatch messages)."""
    out = []
    m, r, d = layer.d_hidden, layer.rank, layer.d_model
    for name in ("query_weight", "key_weight"):
        t = state_dict.get(prefix + name)
        rows = t.shape[0] if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == d else m * r
        if rows != m * r:
            other = f"a state dict of a rank-{rows // m} layer" if rows % m == 0 else "not a multiple of d_hidden"
            out.append(f"{prefix}{name} has {rows} rows ({other}, d_hidden {m}); this {type(layer).__name__} has "
                       f"rank {r}, so {m * r} rows: build the layer with the checkpoint's rank")
    return out


def _ndim_check(x: torch.Tensor, ndim: int, name: str) -> torch.Tensor:
    if x.dim() != ndim:
        raise RuntimeError(
            "this " + name + " was traced (torch.jit.trace) with an input of " + str(ndim)
            + " dimensions and is called with " + str(x.dim()) + ": a trace holds only for inputs with the "
            "traced number of dimensions; trace again with an input of " + str(x.dim()) + " dimensions")
    return x


_SCRIPTED_NDIM_CHECK = None


def traced_ndim(layer, x: torch.Tensor) -> torch.Tensor:
    """``x``, through a TorchScript check that ``torch.jit.trace`` records: the traced layer
    then refuses an input of another number of dimensions (which it would reshape to the
    traced one) with a torch.jit.Error naming both, instead of a silently flattened output.
    Outside tracing, ``x`` itself. (Scripted on first use: ``torch.jit.script`` is deprecated
    and warns; the warning is silenced for this one check.)"""
    global _SCRIPTED_NDIM_CHECK
    if not torch.jit.is_tracing():
        return x
    if _SCRIPTED_NDIM_CHECK is None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _SCRIPTED_NDIM_CHECK = torch.jit.script(_ndim_check)
    return _SCRIPTED_NDIM_CHECK(x, x.dim(), type(layer).__name__)


def check_llama_linears(gate_proj, up_proj, down_proj, activation) -> None:
    """TypeError or ValueError naming what was expected unless the three are bias-free
    ``nn.Linear`` layers of one floating dtype and device forming an MLP
    ``down(σ(gate(x)) * up(x))`` and ``activation`` is given (``GatedMLP.from_linear``)."""
    if activation is None:
        raise TypeError(
            "GatedMLP.from_linear needs activation=: the three nn.Linear do not say which σ sits "
            "between them (Llama, Mistral, Qwen2: 'silu'; Gemma: 'gelu_pytorch_tanh'); pass "
            "activation=config.hidden_act, or GatedMLP.from_mlp(mlp), which reads it from the MLP module"
        )
    lins = (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj))
    for name, lin in lins:
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"{name} must be an nn.Linear, got {type(lin).__name__}")
        if lin.bias is not None:
            raise ValueError(
                f"{name} has a bias; GatedMLP has none (append a constant coordinate to x instead)"
            )
    kinds = {(lin.weight.dtype, lin.weight.device) for _, lin in lins}
    if len(kinds) != 1:
        raise TypeError(
            "gate_proj, up_proj and down_proj must share one dtype and device (nothing is cast); got "
            + ", ".join(f"{name} {lin.weight.dtype} on {lin.weight.device}" for name, lin in lins)
        )
    if not gate_proj.weight.is_floating_point():
        raise TypeError(f"the weights must be floating point, got {gate_proj.weight.dtype}")
    m, d = gate_proj.weight.shape
    if up_proj.weight.shape != (m, d):
        raise ValueError(f"up_proj.weight must have gate_proj's shape {(m, d)}, got {tuple(up_proj.weight.shape)}")
    if down_proj.weight.shape[1] != m:
        raise ValueError(f"down_proj must take {m} inputs (d_hidden), got {down_proj.weight.shape[1]}")


def llama_linears_of(mlp) -> tuple:
    """(gate_proj, up_proj, down_proj) of a Llama-style MLP module, or TypeError naming
    what it lacks (and the way for Phi-3's fused ``gate_up_proj``) (``GatedMLP.from_mlp``)."""
    parts = {n: getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")}
    missing = [n for n, lin in parts.items() if not isinstance(lin, nn.Linear)]
    if missing and isinstance(getattr(mlp, "gate_up_proj", None), nn.Linear):
        raise TypeError(
            f"this {type(mlp).__name__} fuses gate and up into one gate_up_proj (Phi-3's layout); "
            f"from_mlp reads separate gate_proj, up_proj, down_proj. qkmlp.pretrained.surgery reads the "
            f"fused layout: use_gated_mlps(model) / gated_mlps(model) convert a whole model, and "
            f"gate, up, down = qkmlp.pretrained.mlp_weights(mlp) split one module (rows 0..m-1 the gate), "
            f"then GatedMLP.from_linear on nn.Linear layers holding them, with activation="
        )
    if missing:
        raise TypeError(f"expected an MLP module with nn.Linear gate_proj, up_proj and down_proj; "
                        f"this {type(mlp).__name__} has no nn.Linear {', '.join(missing)}")
    return tuple(parts.values())
