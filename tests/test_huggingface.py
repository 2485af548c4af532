"""Round trips with Hugging Face ``transformers``: a tiny random LlamaForCausalLM (no
download) with every MLP swapped for ``GatedMLP.from_linear``, then back with
``to_linear`` through ``save_pretrained`` / ``from_pretrained``; and ``GatedMLP.from_mlp``
reading σ from Llama, Gemma and Gemma 2 MLP modules."""
import copy
import importlib

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

from qkmlp import GatedMLP  # noqa: E402

F64 = torch.float64


def _tiny(hidden_act="silu", intermediate=24, seed=0):
    cfg = LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      hidden_act=hidden_act, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(F64).eval()


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 61, (2, 9), generator=g)
    return ids


def _swap_mlps(model, **kw):
    for block in model.model.layers:
        mlp = block.mlp
        block.mlp = GatedMLP.from_linear(mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                                         activation=model.config.hidden_act, **kw)
    return model


def _put_back(model, intermediate):
    """Every GatedMLP back to Llama's own MLP module through to_linear."""
    from transformers.models.llama.modeling_llama import LlamaMLP
    model.config.intermediate_size = intermediate
    for block in model.model.layers:
        gate, up, down = block.mlp.to_linear()
        mlp = LlamaMLP(model.config).to(F64)
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = gate, up, down
        block.mlp = mlp
    return model


def test_llama_with_gated_mlps_equals_llama_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = _batch()
    llama = _tiny()
    swapped = _swap_mlps(copy.deepcopy(llama))
    assert all(isinstance(b.mlp, GatedMLP) for b in swapped.model.layers)

    out, out_s = llama(ids, labels=ids), swapped(ids, labels=ids)
    torch.testing.assert_close(out_s.logits, out.logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_s.loss, out.loss, rtol=1e-12, atol=1e-12)

    out.loss.backward()
    out_s.loss.backward()
    theirs = dict(llama.named_parameters())
    mine = dict(swapped.named_parameters())
    others = [n for n in theirs if ".mlp." not in n]
    assert len(others) == len(theirs) - 3 * 2
    for n in others:                                           # every other parameter
        torch.testing.assert_close(mine[n].grad, theirs[n].grad, rtol=1e-10, atol=1e-12, msg=n)
    for i in range(2):                                         # and the MLPs' own
        p = f"model.layers.{i}.mlp."
        for a, b in (("query_weight", "gate_proj.weight"), ("key_weight", "up_proj.weight")):
            torch.testing.assert_close(mine[p + a].grad, theirs[p + b].grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(mine[p + "value"].grad, theirs[p + "down_proj.weight"].grad.T,
                                   rtol=1e-10, atol=1e-12)

    back = _put_back(swapped, 24)
    back.save_pretrained(tmp_path / "back")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "back", dtype=F64, local_files_only=True)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, out.logits, rtol=1e-12, atol=1e-12)


def test_rank_two_layers_save_as_a_wider_llama(tmp_path, monkeypatch):
    """Rank r: to_linear gives m·r hidden units; transformers reloads the same function."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = _batch()
    model = _tiny(intermediate=12)
    torch.manual_seed(3)
    for block in model.model.layers:
        block.mlp = GatedMLP(16, 12, rank=2, dtype=F64)
    with torch.no_grad():
        want = model(ids).logits
    _put_back(model, 24).save_pretrained(tmp_path / "r2")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "r2", dtype=F64, local_files_only=True)
    assert reloaded.config.intermediate_size == 24
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("hidden_act", ["silu", "swish", "gelu_new", "gelu_pytorch_tanh", "gelu", "relu"])
def test_config_hidden_act_names_give_the_same_model(hidden_act):
    """``activation=config.hidden_act`` reproduces transformers' own ACT2FN[hidden_act]."""
    ids = _batch()
    llama = _tiny(hidden_act)
    swapped = _swap_mlps(copy.deepcopy(llama))
    with torch.no_grad():
        torch.testing.assert_close(swapped(ids).logits, llama(ids).logits, rtol=1e-12, atol=1e-12)
    z = torch.linspace(-8, 8, 201, dtype=F64)
    torch.testing.assert_close(swapped.model.layers[0].mlp.activation(z), ACT2FN[hidden_act](z))


# --- GatedMLP.from_mlp reads σ from a Hugging Face MLP module -------------------------------

D, M = 8, 5


def _hf_mlp(arch: str, hidden_act: str, **extra):
    cfg = {"llama": transformers.LlamaConfig, "gemma": transformers.GemmaConfig,
           "gemma2": transformers.Gemma2Config}[arch](
        hidden_size=D, intermediate_size=M, hidden_act=hidden_act, num_attention_heads=2,
        num_key_value_heads=1, head_dim=4, **extra)
    mod = {"llama": "transformers.models.llama.modeling_llama",
           "gemma": "transformers.models.gemma.modeling_gemma",
           "gemma2": "transformers.models.gemma2.modeling_gemma2"}[arch]
    cls = getattr(importlib.import_module(mod), {"llama": "LlamaMLP", "gemma": "GemmaMLP", "gemma2": "Gemma2MLP"}[arch])
    torch.manual_seed(5)
    return cls(cfg).double()


@pytest.mark.parametrize("arch,hidden_act,expect", [
    ("llama", "silu", "silu"),
    ("gemma", "gelu_pytorch_tanh", "gelu_tanh"),     # the case: SiLU gave 0.178 error here
    ("llama", "gelu", "gelu"),
    ("llama", "relu", "relu"),
])
def test_from_mlp_reads_sigma_and_equals_the_hugging_face_mlp(arch, hidden_act, expect):
    mlp = _hf_mlp(arch, hidden_act)
    layer = GatedMLP.from_mlp(mlp)
    assert layer.activation.name == expect
    x = torch.randn(2, 4, D, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mlp(x), rtol=1e-12, atol=1e-12)
        silu = GatedMLP.from_linear(mlp.gate_proj, mlp.up_proj, mlp.down_proj, activation="silu")
        if expect != "silu":                 # what the old silent default gave: another function
            assert (silu(x) - mlp(x)).norm() > 1e-3 * mlp(x).norm()


def test_from_mlp_reads_gemma2s_hidden_activation():
    mlp = _hf_mlp("gemma2", "gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
    layer = GatedMLP.from_mlp(mlp)
    x = torch.randn(5, D, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mlp(x), rtol=1e-12, atol=1e-12)


class _Doubler(nn.Module):
    def forward(self, z):
        return 2 * z


def test_from_mlp_prefers_what_act_fn_computes_and_refuses_a_guess():
    mlp = _hf_mlp("llama", "silu")
    x = torch.randn(5, D, dtype=F64)
    mlp.act_fn = nn.ReLU()                       # replaced after construction: config still says silu
    with torch.no_grad():
        torch.testing.assert_close(GatedMLP.from_mlp(mlp)(x), mlp(x), rtol=1e-12, atol=1e-12)
    mlp.act_fn = _Doubler()                      # something qkmlp cannot confirm
    with pytest.raises(ValueError, match=r"cannot read the activation of this LlamaMLP \(act_fn is a "
                                         r"_Doubler that qkmlp cannot confirm; config.hidden_act = 'silu'\)"):
        GatedMLP.from_mlp(mlp)
    # an explicit activation always wins (here the callable itself, run as given)
    layer = GatedMLP.from_mlp(mlp, activation=mlp.act_fn)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mlp(x), rtol=1e-12, atol=1e-12)


def test_from_mlp_catches_a_config_that_does_not_match_act_fn():
    mlp = _hf_mlp("llama", "gelu")
    mlp.config.hidden_act = "gelu_pytorch_tanh"  # says tanh-GELU, act_fn computes exact GELU
    with pytest.raises(ValueError, match="cannot read the activation"):
        GatedMLP.from_mlp(mlp)
