"""Issue 42, the layers round four: what a client suite still found, each item against an
independent computation (eager outputs, ``nn.Linear`` under the same parametrization, the
Hugging Face model's own outputs, gradients and config).

1. ``torch.jit.trace`` holds for every input with the traced number of dimensions;
2. ``layer.query = t`` under a parametrization reaches it as ``nn.Linear.weight = t`` does;
3. ``surgery.gated_mlps(model, activation=...)`` is checked against the model;
4. converted MLPs keep their module's ``requires_grad`` and training mode;
5. ``torch.export`` gives a program of ATen ops that loads without qkmlp; the compile op has
   a stable name;
6. clear errors: ``torch.fx.symbolic_trace``, ``from_mlp`` of a fused Phi-3 MLP, mixed-dtype
   weights of every rank-r layer;
7. a Hugging Face checkpoint loads strictly into a converted model; the interop notes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.nn.utils import parametrize

from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)
from qkmlp import _fused_op
from qkmlp import functional as fn

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64
ALL = (KeyValueMLP, StaticQueryMLP, BilinearAttentionMLP, SymmetricBilinearMLP, GatedMLP, SymmetrizedGatedMLP)
RANK_R = (SymmetricBilinearMLP, GatedMLP, SymmetrizedGatedMLP)


def _layer(cls, d=8, m=6, o=5, dtype=F64, **kw):
    torch.manual_seed(0)
    if cls in RANK_R:
        kw.setdefault("rank", 2)
    return cls(d, m, o, dtype=dtype, **kw)


# --- 1. torch.jit.trace is shape-generic ---------------------------------------------------

@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning",
                            "ignore::FutureWarning")
@pytest.mark.parametrize("traced_shape,new_shapes", [
    ((2, 3, 8), [(3, 2, 8), (4, 5, 8), (1, 1, 8)]),
    ((2, 1, 3, 8), [(1, 4, 2, 8), (3, 2, 5, 8)]),
], ids=["3d", "4d"])
@pytest.mark.parametrize("cls", ALL)
def test_jit_trace_equals_eager_on_other_shapes(cls, traced_shape, new_shapes):
    layer = _layer(cls, activation="gelu")
    traced = torch.jit.trace(layer, torch.randn(*traced_shape, dtype=F64))
    for shape in new_shapes:
        x = torch.randn(*shape, dtype=F64, requires_grad=True)
        y, want = traced(x), layer(x)
        assert y.shape == want.shape == (*shape[:-1], 5)
        torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
        assert y._base is None                                # a tensor of its own, as eager
        gy = torch.randn_like(want)
        got_g = torch.autograd.grad(y, [x, *layer.parameters()], gy)
        want_g = torch.autograd.grad(want, [x, *layer.parameters()], gy)
        for g, w in zip(got_g, want_g):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


# --- 2. assigning a view under a parametrization ---------------------------------------------

class _Double(nn.Module):
    """A custom parametrization with a right inverse."""

    def forward(self, w):
        return 2.0 * w

    def right_inverse(self, w):
        return w / 2.0


class _Square(nn.Module):
    """A custom parametrization without one (nn.Linear's assignment raises)."""

    def forward(self, w):
        return w * w


PARAMETRIZATIONS = {
    "weight_norm": lambda mod, name: P.weight_norm(mod, name=name),
    "spectral_norm": lambda mod, name: P.spectral_norm(mod, name=name),
    "orthogonal": lambda mod, name: P.orthogonal(mod, name=name),
    "custom": lambda mod, name: parametrize.register_parametrization(mod, name, _Double()),
}


def _originals(mod, name):
    return {k: v.clone() for k, v in mod.parametrizations[name].state_dict().items()}


@pytest.mark.parametrize("view", ["query", "key"])
@pytest.mark.parametrize("kind", list(PARAMETRIZATIONS))
def test_assigning_a_view_under_a_parametrization_acts_as_on_nn_linear(kind, view):
    m, d = 12, 16
    g = PARAMETRIZATIONS[kind](_layer(GatedMLP, d, m, rank=1), view + "_weight")
    torch.manual_seed(1)
    lin = PARAMETRIZATIONS[kind](nn.Linear(d, m, bias=False, dtype=F64), "weight")
    g.eval()                                               # spectral_norm: no power iteration per read
    lin.eval()
    t = torch.randn(m, d, dtype=F64, generator=torch.Generator().manual_seed(2))
    if kind == "orthogonal":                               # orthogonal admits orthonormal rows only
        t = torch.linalg.qr(t.T)[0].T.contiguous()
    before = getattr(g, view + "_weight").clone()
    setattr(g, view, t.unsqueeze(1))
    lin.weight = t
    now = getattr(g, view + "_weight")
    assert not torch.equal(now, before)                    # the assignment took effect
    got, want = _originals(g, view + "_weight"), _originals(lin, "weight")
    assert got.keys() == want.keys()
    for k in want:
        if k.startswith("original") and kind != "orthogonal":   # orthogonal keeps a base of its own
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    if kind != "spectral_norm":                            # its power-iteration state is per module
        torch.testing.assert_close(now, lin.weight, rtol=0, atol=0)
        torch.testing.assert_close(now, t, rtol=1e-12, atol=1e-12)
    # and the layer computes with the new weight: y equals the formula with t in place
    x = torch.randn(3, d, dtype=F64)
    q, k = g.query_weight, g.key_weight
    torch.testing.assert_close(g(x), (torch.nn.functional.silu(x @ q.T) * (x @ k.T)) @ g.value)


def test_assigning_under_a_parametrization_without_right_inverse_raises_as_nn_linear():
    g = parametrize.register_parametrization(_layer(GatedMLP, rank=1), "query_weight", _Square())
    lin = parametrize.register_parametrization(nn.Linear(8, 6, bias=False, dtype=F64), "weight", _Square())
    t = torch.randn(6, 8, dtype=F64)
    with pytest.raises(RuntimeError, match="right_inverse") as want:
        lin.weight = t
    with pytest.raises(RuntimeError, match="right_inverse") as got:
        g.query = t.unsqueeze(1)
    assert str(got.value) == str(want.value)


# --- the tiny Hugging Face models ----------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp.pretrained import gated_mlps, mlp_weights, use_gated_mlps  # noqa: E402

from test_pretrained_models import tiny  # noqa: E402  (tiny random Llama, Gemma, Phi-3, ... in float64)


IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


# --- 3. a given activation is checked against the model --------------------------------------

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


# --- 4. converted MLPs keep requires_grad and the training mode -------------------------------

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


# --- 5. torch.export: ATen ops only, loads without qkmlp; a stable op name ----------------------

_BLOCK_QKMLP = textwrap.dedent("""
    import importlib.abc, sys
    class _NoQkmlp(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "qkmlp" or name.startswith("qkmlp."):
                raise ImportError("qkmlp is blocked in this process")
            return None
    sys.meta_path.insert(0, _NoQkmlp())
    import torch
    ep = torch.export.load(sys.argv[1])
    x = torch.load(sys.argv[2])
    torch.save(ep.module()(x), sys.argv[3])
    assert "qkmlp" not in sys.modules
""")


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("cls", [GatedMLP, SymmetricBilinearMLP])
def test_an_exported_program_holds_aten_ops_and_loads_without_qkmlp(cls, grad, tmp_path):
    torch.set_num_threads(1)
    layer = _layer(cls, dtype=torch.float32, rank=1)
    x = torch.randn(2, 3, 8)
    with torch.set_grad_enabled(grad):
        ep = torch.export.export(layer, (x,))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets and not [t for t in targets if "qkmlp" in t]
    torch.export.save(ep, tmp_path / "p.pt2")
    torch.save(x, tmp_path / "x.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    subprocess.run([sys.executable, "-c", _BLOCK_QKMLP, str(tmp_path / "p.pt2"), str(tmp_path / "x.pt"),
                    str(tmp_path / "y.pt")], check=True, env=env, cwd=tmp_path, timeout=300)
    with torch.no_grad():
        want = layer(x)                                     # eager, float32: bit for bit
    assert torch.equal(torch.load(tmp_path / "y.pt"), want)


def test_the_compile_op_has_a_stable_name_versioned_by_semantics():
    assert fn.FUSED_OP_NAME == f"qkmlp::fused_forward_v{fn.FUSED_OP_VERSION}"
    assert _fused_op.source_tag() not in fn.FUSED_OP_NAME        # not the file's bytes
    op = getattr(torch.ops.qkmlp, fn.FUSED_OP_NAME.split("::")[1])
    layer = _layer(GatedMLP, rank=2)
    x = torch.randn(4, 8, dtype=F64)
    with torch.no_grad():
        want = layer(x)                                     # eager
    for tag in (_fused_op.source_tag(), "any other tag"):         # the tag keys caches, not values
        y, _ = op(x, layer.query_weight, layer.key_weight, layer.value, "gated", "silu", 6, 2, tag)
        torch.testing.assert_close(y, want, rtol=0, atol=0)


# --- 6. clear errors ------------------------------------------------------------------------

def test_fx_symbolic_trace_records_the_layers_as_leaf_modules():
    torch.manual_seed(0)
    model = nn.Sequential(
        GatedMLP(8, 6, 7, dtype=F64), nn.Tanh(), SymmetricBilinearMLP(7, 5, dtype=F64, rank=2),
        SymmetrizedGatedMLP(7, 4, dtype=F64), KeyValueMLP(7, 6, dtype=F64), StaticQueryMLP(7, 3, dtype=F64),
        BilinearAttentionMLP(7, 3, 4, dtype=F64))
    gm = torch.fx.symbolic_trace(model)
    called = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert called == [str(i) for i in range(7)]
    x = torch.randn(2, 3, 8, dtype=F64)
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)


def test_fx_symbolic_trace_of_a_bare_layer_or_a_method_names_the_fix():
    with pytest.raises(TypeError, match=r"nn\.Sequential\(layer\).*call_module"):
        torch.fx.symbolic_trace(GatedMLP(8, 6))

    class UsesAMethod(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = GatedMLP(8, 6)

        def forward(self, x):
            return self.g.projections(x)[0]

    with pytest.raises(TypeError, match="layer\\(x\\), inside a traced model records it as one call_module"):
        torch.fx.symbolic_trace(UsesAMethod())


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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cls", RANK_R)
def test_mixed_dtype_weights_get_the_library_error_on_every_rank_r_layer(cls, fused):
    layer = _layer(cls, dtype=torch.float32)
    layer.fused = fused
    layer.query_weight = nn.Parameter(layer.query_weight.detach().double())
    with pytest.raises(TypeError, match="must share one dtype and device; got .*query torch.float64"):
        layer(torch.randn(3, 8))


# --- 7. a Hugging Face checkpoint into a converted model; the interop notes --------------------

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
