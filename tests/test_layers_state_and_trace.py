"""State dicts across ranks and classes, ``torch.jit.trace`` at another number of
dimensions, and the provenance of ``python -m qkmlp.book``."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from conftest import LAYERS, RANK_R
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64
# The layers whose forward flattens the tokens to (N, d), the dense form and the rank-r ones:
# a trace of them is pinned to its number of dimensions. The key-value layers (one matmul on
# the last axis) trace for every number.
FLATTENING = (BilinearAttentionMLP,) + RANK_R
KEY_VALUE = tuple(c for c in LAYERS if c not in FLATTENING)


@pytest.mark.parametrize("cls", RANK_R, ids=lambda c: c.__name__)
def test_a_state_dict_of_another_rank_is_refused_naming_both_ranks(cls):
    two, three = cls(4, 3, rank=2), cls(4, 3, rank=3)
    with pytest.raises(RuntimeError, match=r"query_weight has 6 rows \(a state dict of a rank-2 layer, d_hidden 3\); "
                                           rf"this {cls.__name__} has rank 3, so 9 rows"):
        three.load_state_dict(two.state_dict())
    with pytest.raises(RuntimeError, match="rank-3 layer.*has rank 2"):
        two.load_state_dict(three.state_dict())
    with pytest.raises(RuntimeError, match="not a multiple of d_hidden"):
        two.load_state_dict({**two.state_dict(), "query_weight": torch.zeros(7, 4)})
    two.load_state_dict(cls(4, 3, rank=2).state_dict())          # the same rank loads as before


def test_a_gated_state_dict_in_another_rank_r_class_copies_the_weights_not_the_function():
    torch.manual_seed(0)
    g = GatedMLP(5, 4, 3, rank=2, activation="silu", dtype=F64)
    x = torch.randn(7, 5, dtype=F64)
    a = torch.einsum("nd,jsd->njs", x, g.query)
    b = torch.einsum("nd,jsd->njs", x, g.key)
    silu = torch.nn.functional.silu
    for cls, h in ((SymmetricBilinearMLP, silu((a * b).sum(-1))),
                   (SymmetrizedGatedMLP, (0.5 * (silu(a) * b + silu(b) * a)).sum(-1))):
        other = cls(5, 4, 3, rank=2, activation="silu", dtype=F64)
        other.load_state_dict(g.state_dict())                        # same keys and shapes: no error
        with torch.no_grad():
            torch.testing.assert_close(other(x), h @ g.value, rtol=1e-12, atol=1e-12)   # its own form
            assert (other(x) - g(x)).abs().max() > 1e-3                                 # not the gated one
    doc = " ".join((ROOT / "book" / "api.md").read_text().split())      # the layers' rules
    assert "That transfer copies the weights q, k, v, not the function" in doc


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning",
                            "ignore::FutureWarning")
@pytest.mark.parametrize("cls", FLATTENING, ids=lambda c: c.__name__)
@pytest.mark.parametrize("traced,called", [((6, 4), (2, 3, 4)), ((2, 3, 4), (6, 4)), ((2, 3, 4), (2, 2, 3, 4))])
def test_a_trace_called_at_another_number_of_dimensions_is_refused(cls, traced, called):
    torch.manual_seed(0)
    layer = cls(4, 5, 3)
    tr = torch.jit.trace(layer, torch.randn(*traced))
    x = torch.randn(*traced[:-1], 4)
    torch.testing.assert_close(tr(x), layer(x))                     # the traced shape still works
    with pytest.raises(torch.jit.Error, match=rf"traced \(torch.jit.trace\) with an input of {len(traced)} "
                                           rf"dimensions and is called with {len(called)}"):
        tr(torch.randn(*called))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning",
                            "ignore::FutureWarning")
@pytest.mark.parametrize("cls", KEY_VALUE, ids=lambda c: c.__name__)
def test_the_key_value_layers_trace_for_every_number_of_dimensions(cls):
    torch.manual_seed(0)
    layer = cls(4, 5, 3)
    tr = torch.jit.trace(layer, torch.randn(6, 4))
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(tr(x), layer(x))


def test_tracing_leaves_no_deprecation_warning_of_the_check():
    layer = GatedMLP(4, 5, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.trace(layer, torch.randn(6, 4))
    assert not [w for w in caught if "torch.jit.script" in str(w.message)]


def test_the_book_command_writes_the_run_base_provenance(tmp_path):
    from qkmlp.book.__main__ import main
    from qkmlp.runbase import provenance

    out = tmp_path / "ch03.json"
    n = torch.get_num_threads()
    try:
        main(["product", "--out", str(out)])
    finally:
        torch.set_num_threads(n)
    prov = json.loads(out.read_text())["provenance"]
    assert prov["command"] == f"python -m qkmlp.book product --out {out}"
    assert prov["git_commit"] == provenance.IMPORT_GIT["git_commit"]
    assert prov["git_dirty"] == provenance.IMPORT_GIT["git_dirty"]
    assert prov["versions"]["torch"] == torch.__version__
    assert prov["machine"]["cpu"] == provenance.cpu_model()
    assert prov["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
