"""Round trips with Hugging Face ``transformers``: a tiny random LlamaForCausalLM (no
download) with every MLP swapped for ``GatedMLP.from_linear``, then back with
``to_linear`` through ``save_pretrained`` / ``from_pretrained``; and ``GatedMLP.from_mlp``
reading σ from Llama, Gemma and Gemma 2 MLP modules; and models converted by
``qkmlp.pretrained`` (tiny random Llama, Gemma, Phi-3, ...): a given activation checked
against the model, requires_grad and the training mode kept, Phi-3's fused layout, and a
checkpoint of the original model loading strictly into the converted one."""
import copy
import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

from qkmlp import GatedMLP  # noqa: E402
from qkmlp.pretrained import gated_mlps, mlp_weights, use_gated_mlps  # noqa: E402

from test_pretrained_models import tiny  # noqa: E402  (tiny random Llama, Gemma, Phi-3, ... in float64)

ROOT = Path(__file__).resolve().parents[1]
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
    ("gemma", "gelu_pytorch_tanh", "gelu_tanh"),     # SiLU here once gave a 0.178 error
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


# --- converted models (tiny random Llama, Gemma, Phi-3, ... of test_pretrained_models) -------

IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


# --- a given activation is checked against the model --------------------------------------

def test_a_given_activation_that_the_model_does_not_compute_is_refused():
    model = tiny("gemma")                         # config.hidden_act = gelu_pytorch_tanh
    with pytest.warns(UserWarning, match="differs from the model's config.hidden_act"):
        with pytest.raises(ValueError, match="differs from the model's GemmaMLP"):
            gated_mlps(model, activation="silu")
    # another σ on purpose needs the explicit override, and is warned about
    with pytest.warns(UserWarning, match="config.hidden_act = 'gelu_pytorch_tanh'.*check=False"):
        on_purpose = gated_mlps(model, activation="silu", check=False)
    assert all(g.activation.name == "silu" for g in on_purpose)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="differs from the model's GemmaMLP"):
        use_gated_mlps(model, activation="silu")
    ref = _logits(model)                            # nothing was replaced by the refused calls
    assert all(type(layer.mlp).__name__ == "GemmaMLP" for layer in model.model.layers)
    # the config's own activation, given by one of its names, converts exactly
    use_gated_mlps(model, activation="gelu_tanh")
    torch.testing.assert_close(_logits(model), ref, rtol=1e-12, atol=1e-12)


# --- converted MLPs keep requires_grad and the training mode -------------------------------

@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_converted_mlps_train_as_the_model_did(arch):
    torch.set_num_threads(1)
    model, ref = tiny(arch), tiny(arch)
    model.train()
    ref.train()
    use_gated_mlps(model)
    mlps = [layer.mlp for layer in model.model.layers]
    assert all(isinstance(g, GatedMLP) and g.training for g in mlps)
    assert all(p.requires_grad for g in mlps for p in g.parameters())
    # one backward pass: the MLP gradients are the Hugging Face model's own (dropout is 0)
    for mod in (model, ref):
        mod.zero_grad()
        mod(input_ids=IDS, labels=IDS, use_cache=False).loss.backward()
    for g, layer in zip(mlps, ref.model.layers):
        mlp = layer.mlp
        if arch == "phi3":
            want_qk = mlp.gate_up_proj.weight.grad
            got_qk = torch.cat([g.query_weight.grad, g.key_weight.grad])
        else:
            want_qk = torch.cat([mlp.gate_proj.weight.grad, mlp.up_proj.weight.grad])
            got_qk = torch.cat([g.query_weight.grad, g.key_weight.grad])
        torch.testing.assert_close(got_qk, want_qk, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(g.value.grad, mlp.down_proj.weight.grad.T, rtol=1e-9, atol=1e-12)


def test_converted_mlps_keep_a_frozen_or_partly_frozen_module_as_it_was():
    model = tiny("llama")
    model.requires_grad_(False)
    model.model.layers[1].mlp.up_proj.weight.requires_grad_(True)
    g = gated_mlps(model)
    assert not any(p.requires_grad for p in g[0].parameters()) and not g[0].training
    assert [p.requires_grad for p in (g[1].query_weight, g[1].key_weight, g[1].value)] == [False, True, False]



# --- Phi-3's fused gate_up_proj ----------------------------------------------------------

def test_from_mlp_of_a_fused_phi3_mlp_points_to_the_surgery():
    model = tiny("phi3")
    mlp = model.model.layers[0].mlp
    with pytest.raises(TypeError, match="gate_up_proj.*use_gated_mlps.*mlp_weights"):
        GatedMLP.from_mlp(mlp)
    # the path the message names computes what the module computes
    gate, up, down = mlp_weights(mlp)
    lins = [nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=F64) for w in (gate, up, down)]
    with torch.no_grad():
        for lin, w in zip(lins, (gate, up, down)):
            lin.weight.copy_(w)
    g = GatedMLP.from_linear(*lins, activation=model.config.hidden_act)
    x = torch.randn(5, 32, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(g(x), mlp(x), rtol=1e-12, atol=1e-12)



# --- a Hugging Face checkpoint into a converted model; the interop notes --------------------

@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_a_checkpoint_of_the_original_model_loads_strictly_into_a_converted_one(arch):
    torch.set_num_threads(1)
    converted, other = tiny(arch, seed=0), tiny(arch, seed=1)
    use_gated_mlps(converted)
    assert not torch.allclose(_logits(converted), _logits(other))
    result = converted.load_state_dict(other.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    torch.testing.assert_close(_logits(converted), _logits(other), rtol=1e-12, atol=1e-12)
    # the converted model's own state dict still loads into a converted model
    again = tiny(arch, seed=2)
    use_gated_mlps(again)
    again.load_state_dict(converted.state_dict(), strict=True)
    torch.testing.assert_close(_logits(again), _logits(other), rtol=1e-12, atol=1e-12)


def test_a_gate_up_down_checkpoint_into_a_higher_rank_layer_is_refused():
    g = GatedMLP(4, 3, rank=2)
    sd = {"gate_proj.weight": torch.zeros(3, 4), "up_proj.weight": torch.zeros(3, 4),
          "down_proj.weight": torch.zeros(4, 3)}
    with pytest.raises(ValueError, match="rank-1 GatedMLP; this one has rank 2"):
        g.load_state_dict(sd)


def test_the_interop_notes_say_what_peft_and_checkpoints_do():
    # the premise of the peft note, against nn.Linear: "all-linear" selects nn.Linear modules,
    # and a converted MLP holds none
    model = tiny("llama")
    before = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".mlp." in n}
    use_gated_mlps(model)
    after = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".mlp." in n}
    assert len(before) == 3 * model.config.num_hidden_layers and after == set()
    api = (ROOT / "book" / "api.md").read_text()
    notes = api.split("**Interop notes.**", 1)[1].split("\n## ", 1)[0]
    for phrase in ('target_modules="all-linear"', "merge_and_unload", "use_gated_mlps",
                   "load_state_dict", "from_pretrained", "torch.export", "qkmlp::fused_forward_v1"):
        assert phrase in notes, phrase
