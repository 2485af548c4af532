"""Unit tests of the constructed examples of chapters 1-4 (qkmlp.book.ch01_key_value ... ch04_rank_one)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from qkmlp import BilinearAttentionMLP, GatedMLP, KeyValueMLP, SymmetricBilinearMLP
from qkmlp.book.ch01_key_value import (
    BiasCoordinate,
    FactTask,
    capital_facts,
    decode,
    fact_memory,
    key_value_from_mlp,
    with_bias_coordinate,
)
from qkmlp.book.ch02_dynamic_query import static_versus_key_value, teacher_data
from qkmlp.book.ch03_bilinear_attention import (
    antisymmetric_part,
    bilinear_from_key_value,
    compare_on_product,
    fit_stacked,
    matrix_of_quadratic_form,
    product_data,
    product_layer,
    relative_mse,
    symmetric_part,
)
from qkmlp.book.ch04_rank_one import directional_derivative, gated_as_bilinear_attention, gradient_jump


def test_with_bias_coordinate_appends_one():
    x = torch.randn(3, 2, 5)
    xb = with_bias_coordinate(x)
    assert xb.shape == (3, 2, 6)
    assert torch.equal(xb[..., :5], x)
    assert torch.all(xb[..., 5] == 1)
    assert torch.equal(BiasCoordinate()(x), xb)


def test_with_bias_coordinate_rejects_integers():
    with pytest.raises(TypeError, match="floating"):
        with_bias_coordinate(torch.ones(2, 3, dtype=torch.long))


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "tanh"])
@pytest.mark.parametrize("bias2", [True, False])
def test_key_value_from_mlp_equals_mlp_with_biases(activation, bias2):
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(5, 7, dtype=torch.float64), nn.Linear(7, 3, bias=bias2, dtype=torch.float64)
    act = {"relu": torch.relu, "gelu": nn.functional.gelu, "silu": nn.functional.silu, "tanh": torch.tanh}[activation]
    kv = key_value_from_mlp(fc1, fc2, activation)
    assert (kv.d_model, kv.d_hidden, kv.d_out) == (6, 8, 3)
    x = torch.randn(11, 5, dtype=torch.float64)
    torch.testing.assert_close(kv(with_bias_coordinate(x)), fc2(act(fc1(x))))


def test_key_value_from_mlp_bad_input():
    with pytest.raises(TypeError, match="nn.Linear"):
        key_value_from_mlp(nn.Linear(2, 3), nn.ReLU())
    with pytest.raises(ValueError, match="3 outputs"):
        key_value_from_mlp(nn.Linear(2, 3), nn.Linear(4, 1))
    zero_at_one = lambda z: z - 1  # noqa: E731  σ(1) = 0
    with pytest.raises(ValueError, match="σ\\(1\\) = 0"):
        key_value_from_mlp(nn.Linear(2, 3), nn.Linear(3, 1), zero_at_one)


def test_capital_facts_shapes_and_norms():
    task = capital_facts(d=16, seed=3)
    assert task.embeddings.shape == (len(task.words), 16)
    torch.testing.assert_close(task.embeddings.norm(dim=1), torch.ones(len(task.words)))
    assert task.facts.shape == (5, 2)
    assert task.words[task.facts[0, 0]] == "Paris" and task.words[task.facts[0, 1]] == "France"
    with pytest.raises(ValueError, match="d must be"):
        capital_facts(d=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fact_memory_recalls_every_fact_and_nothing_else(seed):
    task = capital_facts(d=32, seed=seed)
    mem = fact_memory(task)
    x = with_bias_coordinate(task.embeddings)
    out = mem(x)
    # Each subject recalls exactly its answer's embedding ...
    torch.testing.assert_close(out[task.subjects], task.embeddings[task.answers])
    assert torch.equal(decode(out[task.subjects], task.embeddings), task.answers)
    # ... through exactly its own slot; every other word fires no slot.
    c = mem.coefficients(x)
    fired = c > 0
    expected = torch.zeros_like(fired)
    expected[task.subjects, torch.arange(len(task.subjects))] = True
    assert torch.equal(fired, expected)


def test_fact_memory_rejects_bad_threshold():
    task = capital_facts(d=32)
    with pytest.raises(ValueError, match="threshold"):
        fact_memory(task, threshold=1.5)
    with pytest.raises(ValueError, match="threshold"):
        fact_memory(task, threshold=-0.9)


def test_fact_memory_rejects_tasks_outside_the_theorem():
    task = capital_facts(d=32)
    scaled = FactTask(task.words, 2 * task.embeddings, task.facts)
    with pytest.raises(ValueError, match="norm 1"):
        fact_memory(scaled)
    repeated = FactTask(task.words, task.embeddings, torch.cat([task.facts, task.facts[:1, [0, 0]]]))
    with pytest.raises(ValueError, match="distinct"):
        fact_memory(repeated)


def test_decode_checks_width():
    with pytest.raises(ValueError, match="last dimension"):
        decode(torch.randn(2, 3), torch.randn(4, 5))
    with pytest.raises(ValueError, match="shape \\(n, d\\)"):
        decode(torch.randn(2, 3), torch.randn(3))


def test_teacher_data_is_deterministic():
    torch.manual_seed(0)
    teacher = KeyValueMLP(3, 4, 2)
    x1, y1 = teacher_data(teacher, 10, 3, seed=5)
    x2, y2 = teacher_data(teacher, 10, 3, seed=5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    torch.testing.assert_close(y1, teacher(x1))
    with pytest.raises(ValueError, match="n must"):
        teacher_data(teacher, 0, 3)
    with pytest.raises(ValueError, match="d must"):
        teacher_data(teacher, 5, 0)


def test_product_data():
    x, y = product_data(100, 3, seed=1)
    assert x.shape == (100, 3) and y.shape == (100, 1)
    assert x.abs().max() <= 1
    torch.testing.assert_close(y[:, 0], x[:, 0] * x[:, 1])
    with pytest.raises(ValueError, match="d must"):
        product_data(10, 1)


def test_relative_mse():
    x, y = product_data(200, 2)
    zero = lambda t: torch.zeros(t.shape[0], 1)  # noqa: E731
    mean = lambda t: torch.full((t.shape[0], 1), float(y.mean()))  # noqa: E731
    assert relative_mse(mean, x, y) == pytest.approx(1.0)
    assert relative_mse(lambda t: y, x, y) == 0.0
    assert relative_mse(zero, x, y) >= 1.0
    with pytest.raises(ValueError, match="shape"):
        relative_mse(lambda t: torch.zeros(t.shape[0]), x, y)
    with pytest.raises(ValueError, match="constant"):
        relative_mse(zero, x, torch.ones_like(y))


@pytest.mark.parametrize("i,k", [(0, 1), (2, 0), (1, 3)])
def test_product_layer_is_exact(i, k):
    layer = product_layer(4, i, k, dtype=torch.float64)
    x = torch.randn(50, 4, dtype=torch.float64) * 3
    torch.testing.assert_close(layer(x)[:, 0], x[:, i] * x[:, k])


def test_product_layer_bad_coordinates():
    with pytest.raises(ValueError, match="two different"):
        product_layer(3, 1, 1)
    with pytest.raises(ValueError, match="two different"):
        product_layer(3, 0, 3)


def test_symmetric_and_antisymmetric_parts():
    torch.manual_seed(0)
    layer = BilinearAttentionMLP(5, 3, 2, dtype=torch.float64)
    x = torch.randn(20, 5, dtype=torch.float64)
    before = layer.interaction.detach().clone()
    sym, anti = symmetric_part(layer), antisymmetric_part(layer)
    torch.testing.assert_close(sym.interaction + anti.interaction, layer.interaction)
    torch.testing.assert_close(sym.interaction, sym.interaction.transpose(1, 2))
    torch.testing.assert_close(anti.interaction, -anti.interaction.transpose(1, 2))
    torch.testing.assert_close(sym(x), layer(x))
    torch.testing.assert_close(anti.scores(x), torch.zeros(20, 3, dtype=torch.float64))
    # the input is left untouched and the copies do not share its storage
    assert torch.equal(layer.interaction, before)
    assert not torch.allclose(layer.interaction, sym.interaction)
    assert sym.interaction.data_ptr() != layer.interaction.data_ptr()
    assert anti.interaction.data_ptr() != layer.interaction.data_ptr()
    with torch.no_grad():
        sym.interaction.zero_()
    assert torch.equal(layer.interaction, before)
    with pytest.raises(TypeError, match="BilinearAttentionMLP"):
        symmetric_part(KeyValueMLP(2, 2))


def test_compare_on_product_small():
    res = compare_on_product(2, seeds=[0], steps=300)
    assert set(res) == {"key_value", "bilinear", "key_value_params", "bilinear_params"}
    assert res["key_value_params"] == [2 * (4 + 1) + 2]
    assert res["bilinear_params"] == [2 * 16 + 2]
    assert res["bilinear"][0] < res["key_value"][0]
    with pytest.raises(ValueError, match="seeds"):
        compare_on_product(2, seeds=[])


def test_matrix_of_quadratic_form_recovers_symmetric_part():
    torch.manual_seed(1)
    layer = BilinearAttentionMLP(5, 3, dtype=torch.float64)
    S = matrix_of_quadratic_form(layer.scores, 5)
    assert S.shape == (3, 5, 5)
    torch.testing.assert_close(S, symmetric_part(layer).interaction)
    A = torch.randn(4, 4, dtype=torch.float64)
    single = matrix_of_quadratic_form(lambda x: ((x @ A) * x).sum(-1), 4)
    torch.testing.assert_close(single, (A + A.T) / 2)
    with pytest.raises(ValueError, match="score must map"):
        matrix_of_quadratic_form(lambda x: x.sum(), 3)


# ---------------------------------------------------------------- chapters 2-4 additions

F64 = torch.float64


@pytest.mark.parametrize("activation", ["relu", "gelu", "sigmoid"])
def test_bilinear_from_key_value_equals_mlp_with_biases(activation):
    # against the plain nn.Linear -> σ -> nn.Linear with biases, not against kv itself
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(5, 7, dtype=F64), nn.Linear(7, 3, dtype=F64)
    act = {"relu": torch.relu, "gelu": nn.functional.gelu, "sigmoid": torch.sigmoid}[activation]
    bi = bilinear_from_key_value(key_value_from_mlp(fc1, fc2, activation))
    assert isinstance(bi, BilinearAttentionMLP) and bi.d_model == 6
    x = torch.randn(20, 5, dtype=F64)
    torch.testing.assert_close(bi(with_bias_coordinate(x)), fc2(act(fc1(x))))
    # every A_j has rank one
    assert (torch.linalg.matrix_rank(bi.interaction) <= 1).all()


def test_bilinear_from_key_value_is_even_off_the_constant_coordinate():
    torch.manual_seed(1)
    kv = KeyValueMLP(4, 6, 2, activation="relu", dtype=F64)
    bi = bilinear_from_key_value(kv)
    x = torch.randn(30, 4, dtype=F64)
    torch.testing.assert_close(bi(-x), bi(x))
    with pytest.raises(TypeError, match="KeyValueMLP"):
        bilinear_from_key_value(nn.Linear(2, 2))


def test_static_versus_key_value_matches_fit_one_model_at_a_time():
    # the batched loop against qkmlp.training.fit on each model separately
    from qkmlp import StaticQueryMLP
    from qkmlp.training import fit

    torch.manual_seed(0)
    teacher = KeyValueMLP(4, 6, 2)
    x, y = teacher_data(teacher, 64, 4, seed=0)
    res = static_versus_key_value(x, y, 3, seeds=[0, 5], steps=25)
    assert res["key_value"].shape == res["static_query"].shape == (2, 25)
    for i, seed in enumerate((0, 5)):
        torch.manual_seed(seed)
        kv = KeyValueMLP(4, 3, 2)
        sq = StaticQueryMLP(4, 3, 2)
        with torch.no_grad():
            sq.query.copy_(torch.eye(4))
            sq.key.copy_(kv.key)
            sq.value.copy_(kv.value)
        a = torch.tensor(fit(kv, x, y, steps=25))
        b = torch.tensor(fit(sq, x, y, steps=25))
        torch.testing.assert_close(res["key_value"][i], a, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(res["static_query"][i], b, rtol=1e-4, atol=1e-6)
    # same function at step 0, different losses after training
    torch.testing.assert_close(res["key_value"][:, 0], res["static_query"][:, 0])
    assert not torch.allclose(res["key_value"][:, -1], res["static_query"][:, -1])
    with pytest.raises(ValueError, match="seeds"):
        static_versus_key_value(x, y, 3, seeds=[])
    with pytest.raises(ValueError, match="shapes"):
        static_versus_key_value(x, y[:5], 3, seeds=[0])


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("activation", ["silu", "relu", "gelu"])
def test_gated_as_bilinear_attention_equals_the_plain_formula(rank, activation):
    torch.manual_seed(2)
    layer = GatedMLP(5, 4, 3, rank=rank, activation=activation, dtype=F64)
    lifted = gated_as_bilinear_attention(layer)
    x = torch.randn(2, 7, 5, dtype=F64)
    act = {"relu": torch.relu, "gelu": nn.functional.gelu, "silu": nn.functional.silu}[activation]
    Q, K, V = layer.query.detach(), layer.key.detach(), layer.value.detach()
    a = torch.einsum("...d,jsd->...js", x, Q)      # x·q_{j,s}
    b = torch.einsum("...d,jsd->...js", x, K)      # x·k_{j,s}
    plain = (act(a) * b).sum(-1) @ V
    torch.testing.assert_close(lifted(x), plain)
    z = lifted.lift(x)
    assert z.shape == (2, 7, 5 + 4 * rank)
    assert lifted.bilinear.activation.is_linear
    assert (torch.linalg.matrix_rank(lifted.bilinear.interaction) <= rank).all()
    with pytest.raises(ValueError, match="shape"):
        lifted(torch.randn(3, 4, dtype=F64))
    with pytest.raises(TypeError, match="GatedMLP"):
        gated_as_bilinear_attention(SymmetricBilinearMLP(5, 4))


def test_directional_derivative_of_polynomials():
    x = torch.randn(6, 3, dtype=F64)
    u = torch.randn(6, 3, dtype=F64)
    cube = lambda t: (t ** 3).sum(-1, keepdim=True)  # noqa: E731
    # d/dt (x+tu)^3 = 3 u (x+tu)^2; second: 6 u^2 (x+tu); third: 6 u^3; fourth: 0
    torch.testing.assert_close(directional_derivative(cube, x, u, 1), (3 * u * x ** 2).sum(-1, keepdim=True))
    torch.testing.assert_close(directional_derivative(cube, x, u, 2), (6 * u ** 2 * x).sum(-1, keepdim=True))
    torch.testing.assert_close(directional_derivative(cube, x, u, 3), (6 * u ** 3).sum(-1, keepdim=True))
    torch.testing.assert_close(directional_derivative(cube, x, u, 4), torch.zeros(6, 1, dtype=F64))
    with pytest.raises(ValueError, match="order"):
        directional_derivative(cube, x, u, 0)


def test_gradient_jump_of_relu_products():
    q, k = torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.3, 1.0], dtype=F64)
    f = lambda x: torch.relu(x @ q) * (x @ k)  # noqa: E731
    x0 = torch.tensor([0.0, 2.0], dtype=F64)   # on the gate line x·q = 0, x·k = 2
    # the gradient is (x·k) q on the side x·q > 0 and 0 on the other
    torch.testing.assert_close(gradient_jump(f, x0, q), 2.0 * q, atol=1e-6, rtol=0)
    smooth = lambda x: (x @ q) * (x @ k)  # noqa: E731
    torch.testing.assert_close(gradient_jump(smooth, x0, q), torch.zeros(2, dtype=F64), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="eps"):
        gradient_jump(f, x0, q, eps=0.0)


def test_fit_stacked_equals_fit_on_each_model():
    from qkmlp.training import fit

    x, y = product_data(64, 3, seed=4)
    models, alone = [], []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        models.append(nn.Sequential(BiasCoordinate(), KeyValueMLP(4, 5, 1, activation="relu")))
        torch.manual_seed(seed)
        alone.append(nn.Sequential(BiasCoordinate(), KeyValueMLP(4, 5, 1, activation="relu")))
    hist = fit_stacked(models, x, y, steps=30, lr=1e-2)
    assert hist.shape == (3, 30)
    for i, model in enumerate(alone):
        ref = torch.tensor(fit(model, x, y, steps=30, lr=1e-2))
        torch.testing.assert_close(hist[i], ref, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(models[i][1].key, model[1].key, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(models[i][1].value, model[1].value, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="at least one"):
        fit_stacked([], x, y)
    with pytest.raises(ValueError, match="rows"):
        fit_stacked(models, x, y[:3])


def test_book_command_stores_a_study_with_its_provenance(tmp_path):
    """``python -m qkmlp.book static-query`` (its main, in process) writes chapter 2's
    study: the losses of a direct static_versus_key_value call on the chapter's task, the
    recorded steps, and the command that made it."""
    import json

    from qkmlp.book.__main__ import main
    from qkmlp.book.ch02_dynamic_query import STATIC_QUERY_SETTINGS as C, static_query_task

    out = tmp_path / "ch02.json"
    n = torch.get_num_threads()
    try:
        main(["static-query", "--seeds", "2", "--steps", "5", "--out", str(out)])
    finally:
        torch.set_num_threads(n)
    data = json.loads(out.read_text())
    assert data["provenance"]["command"] == f"python -m qkmlp.book static-query --seeds 2 --steps 5 --out {out}"
    assert data["settings"]["seeds"] == [0, 1] and data["record_steps"] == [0, 4]
    x, y = static_query_task()
    direct = static_versus_key_value(x, y, C["width"], [0, 1], activation=C["activation"], steps=5, lr=C["lr"])
    for k in ("key_value", "static_query"):
        assert torch.allclose(torch.tensor(data[k]), direct[k][:, [0, 4]].to(torch.float32), rtol=1e-5)
