"""Gemma 2, VaultGemma and Gemma 3n declare their activation as ``config.hidden_activation``
(``hidden_act`` is unset): the converters (``use_gated_mlps``, ``gated_mlps``) read it as
``GatedMLP.from_mlp`` does, and convert with the logits of Hugging Face's own model."""
from __future__ import annotations

import types

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp import GatedMLP  # noqa: E402
from qkmlp.pretrained import gated_mlps, use_gated_mlps  # noqa: E402

from test_pretrained_models import COMMON  # noqa: E402

IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
ARCHS = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8}),
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM", {"head_dim": 8}),
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM", {"head_dim": 8, "num_kv_shared_layers": 0}),
}


def _tiny(arch, **extra):
    cfg_name, model_name, kw = ARCHS[arch]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**COMMON, **kw, **extra)
    model = getattr(transformers, model_name)(cfg).to(torch.float64).eval()
    with torch.no_grad():                          # larger gate/up weights: σ's curvature shows
        for layer in model.model.layers:
            layer.mlp.gate_proj.weight.mul_(40.0)
            layer.mlp.up_proj.weight.mul_(40.0)
    return model


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


@pytest.mark.parametrize("arch", list(ARCHS))
def test_models_that_declare_hidden_activation_convert_exactly(arch):
    torch.set_num_threads(1)
    model = _tiny(arch)
    assert getattr(model.config, "hidden_act", None) is None
    assert model.config.hidden_activation == "gelu_pytorch_tanh"
    ref = _logits(model)
    layers = gated_mlps(model)
    for g, block in zip(layers, model.model.layers):       # the two entry points agree
        assert g.activation is GatedMLP.from_mlp(block.mlp).activation
        assert g.activation.name == "gelu_tanh"
    use_gated_mlps(model)
    assert all(isinstance(block.mlp, GatedMLP) for block in model.model.layers)
    torch.testing.assert_close(_logits(model), ref, rtol=1e-12, atol=1e-12)


def test_the_declared_activation_is_read_in_from_mlp_s_order():
    from qkmlp.pretrained.surgery import declared_activation

    def model(**config):
        return types.SimpleNamespace(config=types.SimpleNamespace(**config))

    assert declared_activation(model(hidden_activation="gelu_pytorch_tanh", hidden_act="silu")) == (
        "hidden_activation", "gelu_pytorch_tanh")
    assert declared_activation(model(hidden_activation=None, hidden_act="silu")) == ("hidden_act", "silu")
    assert declared_activation(model()) == (None, None)
    assert declared_activation(types.SimpleNamespace()) == (None, None)      # no config at all


def test_gemma3n_activation_sparsity_is_refused_not_converted():
    # a Gemma 3n layer with activation sparsity keeps only the top gate values before σ:
    # not a GatedMLP, and the conversion check says so
    model = _tiny("gemma3n", activation_sparsity_pattern=[0.95, 0.0, 0.0])
    with pytest.raises(ValueError, match="layer 0: the converted GatedMLP differs from the model's Gemma3nTextMLP"):
        use_gated_mlps(model)


def test_a_model_that_declares_no_activation_names_both_attributes():
    class Bare(torch.nn.Module):                   # a model whose config names no activation
        def __init__(self, inner):
            super().__init__()
            self.model, self.config = inner, types.SimpleNamespace()

    model = Bare(_tiny("gemma2").model)
    with pytest.raises(ValueError, match="neither hidden_activation nor hidden_act"):
        gated_mlps(model)
    assert gated_mlps(model, activation="gelu_tanh")[0].activation.name == "gelu_tanh"


def test_the_conversion_check_resolves_what_the_dtype_allows():
    """A module that computes GELU's tanh approximation under a config that declares exact
    GELU: float32 catches it, half precision's tolerance (2e-2) lets it pass, as
    ``gated_mlps``'s docstring says."""
    from test_retrain import tiny_llama

    caught = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_llama().to(dtype)
        model.config.hidden_act = "gelu"
        for layer in model.model.layers:
            layer.mlp.act_fn = torch.nn.GELU(approximate="tanh")
        try:
            g = gated_mlps(model)
        except ValueError as e:
            caught[dtype] = "differs from the model's LlamaMLP" in str(e)
            continue
        caught[dtype] = False
        x = 3 * torch.randn(64, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
        with torch.no_grad():
            ref = model.model.layers[0].mlp(x).float()
            gap = float((g[0](x).float() - ref).abs().max() / ref.abs().max())
        assert 1e-3 < gap < 2e-2                     # wrong, by less than the tolerance
    assert caught == {torch.float32: True, torch.bfloat16: False}
