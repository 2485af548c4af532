"""A model converted with ``use_gated_mlps`` / ``gated_mlps`` saves with ``save_pretrained`` a
checkpoint that Hugging Face's own ``from_pretrained`` loads into the original architecture
with equal logits (the reference is the unconverted Hugging Face model), offline; an MLP that
the architecture cannot hold makes saving loud."""
from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp import GatedMLP, SymmetrizedGatedMLP  # noqa: E402
from qkmlp.pretrained import gated_mlps, replace_mlps, use_gated_mlps, variant  # noqa: E402

from test_pretrained_models import tiny  # noqa: E402  (tiny random models in float64)

IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


def _reload(folder):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float64, output_loading_info=True)
    return model.eval(), info


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3", "gemma"])
def test_a_converted_model_saves_and_reloads_with_the_same_logits(arch, tmp_path):
    model = tiny(arch)
    # the reference: the unconverted model through Hugging Face's own save and reload (Gemma's
    # embed_scale buffer is rebuilt in float64 on reload, 1e-7 away from the float32-built one)
    model.save_pretrained(tmp_path / "hf")
    ref = _logits(_reload(tmp_path / "hf")[0])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    use_gated_mlps(model)
    assert all(isinstance(layer.mlp, GatedMLP) for layer in model.model.layers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # a converted model saves without a warning
        model.save_pretrained(tmp_path / "converted")
    back, info = _reload(tmp_path / "converted")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(back.model.layers[0].mlp).__name__ == type(tiny(arch).model.layers[0].mlp).__name__
    got = back.state_dict()
    assert got.keys() == weights.keys()
    for k, v in weights.items():                      # every weight, the MLPs' included, exactly
        assert torch.equal(got[k], v), k
    torch.testing.assert_close(_logits(back), ref, rtol=1e-12, atol=1e-12)
    use_gated_mlps(back)                              # and converts again
    torch.testing.assert_close(_logits(back), ref, rtol=1e-12, atol=1e-12)


def test_trained_converted_weights_are_what_reloads(tmp_path):
    # a change made to the converted layers (as training makes) reaches the checkpoint
    model = tiny("phi3")
    use_gated_mlps(model)
    with torch.no_grad():
        g = model.model.layers[1].mlp
        g.query_weight.mul_(0.5)
        g.key_weight.add_(0.01)
        g.value.mul_(-2.0)
    changed = _logits(model)
    model.save_pretrained(tmp_path)
    back, _ = _reload(tmp_path)
    mlp = back.model.layers[1].mlp                    # Phi-3's fused gate_up_proj, rows: gate, then up
    torch.testing.assert_close(mlp.gate_up_proj.weight, torch.cat([g.query_weight, g.key_weight]), rtol=0, atol=0)
    torch.testing.assert_close(mlp.down_proj.weight, g.value.T, rtol=0, atol=0)
    torch.testing.assert_close(_logits(back), changed, rtol=1e-12, atol=1e-12)


def test_layers_from_gated_mlps_put_in_by_hand_save_too(tmp_path):
    model = tiny("llama")
    ref = _logits(model)                              # Llama's buffers reload as they were built
    replace_mlps(model, dict(enumerate(gated_mlps(model))))
    model.save_pretrained(tmp_path)
    back, info = _reload(tmp_path)
    assert not info["missing_keys"]
    torch.testing.assert_close(_logits(back), ref, rtol=1e-12, atol=1e-12)
    # the converted model's state dict loads strictly into the converted and the original model
    assert not tiny("llama", seed=5).load_state_dict(model.state_dict(), strict=True).missing_keys


def test_an_mlp_the_architecture_cannot_hold_makes_saving_loud(tmp_path):
    model = tiny("llama")
    g = gated_mlps(model)
    replace_mlps(model, dict(enumerate(g)))
    replace_mlps(model, {1: variant(g[1], "symmetrized")})
    assert isinstance(model.model.layers[1].mlp, SymmetrizedGatedMLP)
    with pytest.warns(UserWarning, match=r"layer 1 \(SymmetrizedGatedMLP\).*initialise those MLPs at random"):
        model.save_pretrained(tmp_path)
    # a converted layer whose activation was changed cannot be saved under the original keys
    model = tiny("llama")
    use_gated_mlps(model)
    model.model.layers[0].mlp.activation = model.model.layers[0].mlp.activation.__class__(
        "relu", torch.relu, homogeneity_degree=1)
    with pytest.raises(RuntimeError, match="activation 'silu'.*activation 'relu'"):
        model.state_dict()
