"""The layers against their formulas (tests/reference.py), conversions, dtypes, devices."""
import copy
import math

import pytest
import torch
from torch import nn

import qkmlp
from conftest import FUSED, LAYERS, RANK_R, layer_cases
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
    get_activation,
)

import reference as ref

D, M, O = 6, 5, 4
F64 = torch.float64


def make(cls, rank=None, activation=None, d_out=O, dtype=F64, **kw):
    kwargs = dict(dtype=dtype, **kw)
    if rank is not None:
        kwargs["rank"] = rank
    if activation is not None:
        kwargs["activation"] = activation
    torch.manual_seed(0)
    return cls(D, M, d_out, **kwargs)


def reference_output(layer, x):
    return ref.layer_formula(layer, x)


ALL = layer_cases((1, 3))
IDS = [f"{c.__name__}-r{r}" for c, r in ALL]


@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
@pytest.mark.parametrize("activation", ["relu", "silu", "gelu_tanh", "identity", "relu2", "tanh"])
@pytest.mark.parametrize("lead", [(), (7,), (2, 3)])
def test_forward_matches_formula(cls, rank, activation, lead):
    layer = make(cls, rank, activation)
    x = torch.randn(*lead, D, dtype=F64)
    y = layer(x)
    assert y.shape == (*lead, O)
    torch.testing.assert_close(y, reference_output(layer, x), rtol=1e-10, atol=1e-12)


def test_the_tests_list_of_layers_is_the_library_s():
    """tests/conftest.py's LAYERS, which every test module uses, holds every public layer
    class of qkmlp.layers, RANK_R those that take rank= and FUSED those with a fused path."""
    import inspect

    public = {getattr(qkmlp.layers, n) for n in qkmlp.layers.__all__}
    assert set(LAYERS) == public and len(LAYERS) == len(public)
    takes_rank = {c for c in public if "rank" in inspect.signature(c).parameters}
    assert set(RANK_R) == takes_rank
    assert set(FUSED) == {c for c in RANK_R if c._fused is not None}


def test_parameter_shapes_follow_the_contract():
    r = 3
    assert make(KeyValueMLP).key.shape == (M, D)
    assert make(KeyValueMLP).value.shape == (M, O)
    sq = make(StaticQueryMLP)
    assert (sq.query.shape, sq.key.shape, sq.value.shape) == ((D, D), (M, D), (M, O))
    ba = make(BilinearAttentionMLP)
    assert (ba.interaction.shape, ba.value.shape) == ((M, D, D), (M, O))
    for cls in RANK_R:
        layer = make(cls, r)
        assert (layer.query.shape, layer.key.shape, layer.value.shape) == ((M, r, D), (M, r, D), (M, O))
        assert layer.rank == r
    # parameters are trainable: every weight receives a gradient
    for cls, rank in ALL:
        layer = make(cls, rank)
        layer(torch.randn(3, D, dtype=F64)).square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_default_d_out_is_d_model_and_default_activations():
    assert KeyValueMLP(D, M).d_out == D
    assert KeyValueMLP(D, M).activation.name == "relu"
    assert StaticQueryMLP(D, M).activation.name == "relu"
    assert BilinearAttentionMLP(D, M).activation.name == "silu"
    assert SymmetricBilinearMLP(D, M).activation.name == "silu"
    assert GatedMLP(D, M).activation.name == "silu"
    assert GatedMLP(D, M).rank == 1


def test_initialisation_is_the_documented_one():
    torch.manual_seed(1)
    d, m = 64, 96
    kv = KeyValueMLP(d, m, dtype=F64)
    assert kv.key.abs().max() <= 1 / math.sqrt(d) and kv.key.abs().max() > 0.9 / math.sqrt(d)
    assert kv.value.abs().max() <= 1 / math.sqrt(m) and kv.value.abs().max() > 0.9 / math.sqrt(m)
    g = GatedMLP(d, m, rank=2, dtype=F64)
    assert g.query.abs().max() <= 1 / math.sqrt(d) and g.key.abs().max() <= 1 / math.sqrt(d)
    ba = BilinearAttentionMLP(d, 8, dtype=F64)
    assert ba.interaction.abs().max() <= 1 / d
    sq = StaticQueryMLP(d, m, dtype=F64)
    off = sq.query - torch.eye(d, dtype=F64)
    assert off.abs().max() <= 1 / d


def test_extra_repr_names_sizes_rank_and_activation():
    text = repr(GatedMLP(8, 12, 3, rank=2, activation="gelu"))
    for piece in ("d_model=8", "d_hidden=12", "d_out=3", "rank=2", "activation=gelu"):
        assert piece in text
    assert "rank" not in repr(KeyValueMLP(8, 12))


def test_coefficients_are_sigma_of_scores():
    layer = make(KeyValueMLP, activation="relu")
    x = torch.randn(9, D, dtype=F64)
    torch.testing.assert_close(layer.coefficients(x), torch.relu(x @ layer.key.T))
    torch.testing.assert_close(layer(x), ref.key_value(x, layer.key, layer.value, torch.relu))


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh"])
def test_static_query_absorbed_equals(activation):
    layer = make(StaticQueryMLP, activation=activation)
    with torch.no_grad():
        layer.query.copy_(torch.randn(D, D, dtype=F64))
    kv = layer.absorbed()
    assert isinstance(kv, KeyValueMLP)
    x = torch.randn(11, D, dtype=F64)
    torch.testing.assert_close(kv(x), layer(x))
    # the absorbed copy shares no memory with the original
    storages = lambda mod: {p.untyped_storage().data_ptr() for p in mod.parameters()}
    assert not storages(kv) & storages(layer)


@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("activation", ["silu", "relu", "identity"])
def test_symmetric_to_dense_equals(rank, activation):
    layer = make(SymmetricBilinearMLP, rank, activation)
    dense = layer.to_dense()
    assert isinstance(dense, BilinearAttentionMLP)
    expected = sum(torch.einsum("jd,je->jde", layer.query[:, s], layer.key[:, s]) for s in range(rank))
    torch.testing.assert_close(dense.interaction, expected)
    x = torch.randn(4, 3, D, dtype=F64)
    torch.testing.assert_close(dense(x), layer(x))


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_from_linear_loads_a_llama_mlp(activation):
    torch.manual_seed(3)
    gate, up, down = nn.Linear(D, M, bias=False), nn.Linear(D, M, bias=False), nn.Linear(M, O, bias=False)
    gate, up, down = gate.double(), up.double(), down.double()
    act = get_activation(activation)
    layer = GatedMLP.from_linear(gate, up, down, activation=activation)
    assert (layer.d_model, layer.d_hidden, layer.d_out, layer.rank) == (D, M, O, 1)
    x = torch.randn(2, 5, D, dtype=F64)
    torch.testing.assert_close(layer(x), down(act(gate(x)) * up(x)))
    assert layer.query.dtype == F64
    # a copy, not shared storage
    with torch.no_grad():
        gate.weight.zero_()
    assert layer.query.abs().sum() > 0


@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
def test_gradcheck(cls, rank):
    layer = make(cls, rank, activation="tanh")
    x = torch.randn(3, D, dtype=F64, requires_grad=True)
    params = tuple(layer.parameters())

    def f(x, *ps):
        return torch.func.functional_call(layer, {n: p for (n, _), p in zip(layer.named_parameters(), ps)}, (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)])
def test_low_precision_dtypes(cls, rank, dtype, tol):
    layer64 = make(cls, rank, activation="silu")
    layer = copy.deepcopy(layer64).to(dtype)
    x64 = torch.randn(16, D, dtype=F64)
    y = layer(x64.to(dtype))
    assert y.dtype == dtype
    expected = layer64.to(dtype).double()(x64.to(dtype).double())
    err = (y.double() - expected).norm() / expected.norm()
    assert err < tol


@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
def test_factory_kwargs_and_meta_device(cls, rank):
    kw = {} if rank is None else {"rank": rank}
    layer = cls(D, M, O, device="meta", dtype=torch.float32, **kw)
    assert all(p.device.type == "meta" for p in layer.parameters())
    y = layer(torch.empty(2, 3, D, device="meta"))
    assert y.shape == (2, 3, O) and y.device.type == "meta"
    assert qkmlp.costs.parameter_count(layer) == sum(p.numel() for p in layer.parameters())
    layer = cls(D, M, O, dtype=torch.float64, **kw)
    assert all(p.dtype == torch.float64 for p in layer.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
def test_cuda_matches_cpu(cls, rank):
    layer = make(cls, rank, dtype=torch.float32)
    x = torch.randn(8, D)
    gpu = copy.deepcopy(layer).to("cuda")
    torch.testing.assert_close(gpu(x.cuda()).cpu(), layer(x), rtol=1e-4, atol=1e-5)


def test_any_callable_activation():
    layer = make(GatedMLP, 2, activation=lambda z: torch.sin(z))
    x = torch.randn(5, D, dtype=F64)
    torch.testing.assert_close(layer(x), ref.gated(x, layer.query, layer.key, layer.value, torch.sin))


# --- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
def test_wrong_last_dimension_is_rejected(cls, rank):
    layer = make(cls, rank)
    with pytest.raises(ValueError, match=rf"d_model={D}"):
        layer(torch.randn(3, D + 1, dtype=F64))
    with pytest.raises(ValueError, match=rf"d_model={D}"):
        layer(torch.tensor(1.0, dtype=F64))


@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
def test_integer_input_is_rejected(cls, rank):
    layer = make(cls, rank)
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(3, D, dtype=torch.int64))


@pytest.mark.parametrize("cls", LAYERS)
def test_unknown_activation_is_rejected_with_the_valid_names(cls):
    with pytest.raises(ValueError, match="silu"):
        cls(D, M, activation="swishy")


@pytest.mark.parametrize("cls", RANK_R)
@pytest.mark.parametrize("rank", [0, -1, 1.5, True])
def test_bad_rank_is_rejected(cls, rank):
    with pytest.raises(ValueError, match="rank"):
        cls(D, M, rank=rank)


@pytest.mark.parametrize("bad", [0, -3, 2.0, "8"])
def test_bad_sizes_are_rejected(bad):
    with pytest.raises(ValueError, match="d_model"):
        KeyValueMLP(bad, M)
    with pytest.raises(ValueError, match="d_hidden"):
        GatedMLP(D, bad)
    with pytest.raises(ValueError, match="d_out"):
        SymmetricBilinearMLP(D, M, bad)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("activation", ["silu", "relu", "gelu_tanh"])
def test_to_linear_computes_the_layer_and_inverts_from_linear(rank, activation):
    layer = make(GatedMLP, rank, activation)
    gate, up, down = layer.to_linear()
    assert all(isinstance(t, nn.Linear) and t.bias is None for t in (gate, up, down))
    assert gate.weight.shape == up.weight.shape == (M * rank, D) and down.weight.shape == (O, M * rank)
    x = torch.randn(9, D, dtype=F64)
    act = get_activation(activation)
    torch.testing.assert_close(down(act(gate(x)) * up(x)), reference_output(layer, x), rtol=1e-10, atol=1e-12)
    if rank == 1:
        back = GatedMLP.from_linear(gate, up, down, activation=activation)
        for name in ("query", "key", "value"):
            assert torch.equal(getattr(back, name), getattr(layer, name))


@pytest.mark.parametrize("alias,name", [("swish", "silu"), ("gelu_new", "gelu_tanh"),
                                        ("gelu_pytorch_tanh", "gelu_tanh")])
def test_hugging_face_activation_names_are_aliases(alias, name):
    assert get_activation(alias) is get_activation(name)
    layer = GatedMLP(D, M, activation=alias)
    assert layer.activation.name == name
    z = torch.linspace(-6, 6, 101, dtype=F64)
    # Hugging Face's "gelu_new" written out (transformers.activations.NewGELUActivation)
    if alias == "gelu_new":
        hf = 0.5 * z * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
        torch.testing.assert_close(get_activation(alias)(z), hf)


def test_symmetrized_gated_is_swap_invariant_and_differs_from_gated():
    from qkmlp.symmetry import relative_change, swapped
    layer = make(SymmetrizedGatedMLP, 2, "silu")
    x = torch.randn(16, D, dtype=F64)
    assert relative_change(layer, swapped(layer), x) < 1e-14
    gated = make(GatedMLP, 2, "silu")
    gated.load_state_dict(layer.state_dict())
    assert relative_change(gated, layer, x) > 1e-2


# --- numerics are pinned: the documented initialisation, draw by draw ---------------------

def _recipe(cls, d, m, o, r, dtype):
    """The documented initialisation drawn from the global generator in the documented
    order (``reset_parameters``), into freshly made tensors of the documented shapes."""
    u = lambda shape, b: torch.empty(shape, dtype=dtype).uniform_(-b, b)
    bd, bm = 1 / math.sqrt(d), 1 / math.sqrt(m)
    if cls is KeyValueMLP:
        return {"key": u((m, d), bd), "value": u((m, o), bm)}
    if cls is StaticQueryMLP:
        key = u((m, d), bd)
        query = u((d, d), bd / math.sqrt(d)) + torch.eye(d, dtype=dtype)
        return {"query": query, "key": key, "value": u((m, o), bm)}
    if cls is BilinearAttentionMLP:
        return {"interaction": u((m, d, d), 1 / d), "value": u((m, o), bm)}
    return {"query": u((m, r, d), bd), "key": u((m, r, d), bd), "value": u((m, o), bm)}


@pytest.mark.parametrize("cls,rank", ALL, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_fresh_layer_holds_the_documented_draws_bit_for_bit(cls, rank, dtype):
    """Same torch seed, same weights as the recipe: stored results stay reproducible."""
    for seed in (0, 7):
        torch.manual_seed(seed)
        layer = make_sized = cls(D, M, O, dtype=dtype, **({} if rank is None else {"rank": rank}))
        torch.manual_seed(seed)
        want = _recipe(cls, D, M, O, rank, dtype)
        for name, w in want.items():
            assert torch.equal(getattr(make_sized, name), w), (name, seed)
        assert layer.value.dtype == dtype
