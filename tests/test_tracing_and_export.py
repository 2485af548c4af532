"""``torch.jit.trace``, ``torch.fx`` and ``torch.export`` of the layers, and the name of the
custom op ``torch.compile`` calls, each against eager outputs: a trace holds for every input
with the traced number of dimensions, ``torch.fx.symbolic_trace`` records a layer as one leaf
module (or names the fix), an exported program holds ATen ops only and loads without qkmlp.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from conftest import FUSED, LAYERS, RANK_R
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

F64 = torch.float64


def _layer(cls, d=8, m=6, o=5, dtype=F64, **kw):
    torch.manual_seed(0)
    if cls in RANK_R:
        kw.setdefault("rank", 2)
    return cls(d, m, o, dtype=dtype, **kw)



# --- torch.jit.trace is shape-generic ---------------------------------------------------

@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning",
                            "ignore::FutureWarning")
@pytest.mark.parametrize("traced_shape,new_shapes", [
    ((2, 3, 8), [(3, 2, 8), (4, 5, 8), (1, 1, 8)]),
    ((2, 1, 3, 8), [(1, 4, 2, 8), (3, 2, 5, 8)]),
], ids=["3d", "4d"])
@pytest.mark.parametrize("cls", LAYERS)
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


# --- torch.export: ATen ops only, loads without qkmlp; a stable op name ----------------------

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
@pytest.mark.parametrize("cls", FUSED)
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


# --- torch.fx ------------------------------------------------------------------------------

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
