"""Tests of qkmlp.symmetry.group and .dimensions: measured vs predicted symmetry dimension, and more."""
import itertools

import pytest
import torch

from conftest import LAYERS, RANK_R
from qkmlp.costs import LAYER_TYPES
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
)
from qkmlp.symmetry import predicted_symmetry_dimension, relative_change, symmetry_dimension
from qkmlp.symmetry import (
    conserved_quantities,
    effective_parameter_count,
    factor_fiber_dimension,
    measure_symmetry,
    odd_sign_flip,
    slot_permuted,
    symmetry_breakdown,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny tensors: one thread avoids thread-synchronisation stalls on a busy machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# The layers the symmetry transforms are defined for (qkmlp.costs.LAYER_TYPES): all but
# SymmetrizedGatedMLP, the exchange-symmetric control, which they refuse by name.
MEASURED = tuple(c for c in LAYERS if c in LAYER_TYPES)
MEASURED_RANK_R = tuple(c for c in RANK_R if c in LAYER_TYPES)


def _layer(cls, act, d=5, m=2, d_out=3, rank=None, seed=0):
    torch.manual_seed(seed)
    kw = {} if rank is None else {"rank": rank}
    return cls(d, m, d_out, activation=act, **kw)


# --- closed forms, written out independently of the library's formulas ------------------

@pytest.mark.parametrize("m,d,d_out", [(2, 5, 3), (3, 4, 4)])
def test_key_value_linear_is_gl_m(m, d, d_out):
    # σ = identity, m ≤ min(d, d_out): f = x KᵀV and the fiber is GL(m), dimension m².
    layer = _layer(KeyValueMLP, "identity", d, m, d_out)
    assert symmetry_dimension(layer) == m * m
    assert predicted_symmetry_dimension(layer) == m * m


def test_key_value_linear_beyond_d():
    # m > d: KᵀV is any d×d_out matrix (rank d), so the fiber is m(d+d_out) − d·d_out.
    d, m, d_out = 3, 5, 4
    layer = _layer(KeyValueMLP, "identity", d, m, d_out)
    expected = m * (d + d_out) - d * d_out
    assert expected != m * m
    assert symmetry_dimension(layer) == expected == predicted_symmetry_dimension(layer)


@pytest.mark.parametrize("act,expected_per_slot", [("relu", 1), ("leaky_relu", 1), ("relu2", 1), ("silu", 0), ("tanh", 0), ("gelu", 0)])
def test_key_value_nonlinear(act, expected_per_slot):
    layer = _layer(KeyValueMLP, act, 4, 3, 2)
    assert symmetry_dimension(layer) == 3 * expected_per_slot == predicted_symmetry_dimension(layer)


def test_static_query_adds_gl_d():
    d, m = 4, 3
    for act, kv in [("silu", 0), ("relu", m)]:
        layer = _layer(StaticQueryMLP, act, d, m, 2)
        assert symmetry_dimension(layer) == d * d + kv == predicted_symmetry_dimension(layer)


def test_dense_antisymmetric_part_invisible():
    d, m = 4, 2
    for act, extra in [("silu", 0), ("relu", m), ("identity", m * m)]:
        layer = _layer(BilinearAttentionMLP, act, d, m, 3)
        assert symmetry_dimension(layer) == m * d * (d - 1) // 2 + extra == predicted_symmetry_dimension(layer)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_symmetric_form_is_o_r_r(r):
    # 2r ≤ d: per slot the fiber is O(r, r), dimension r(2r − 1) = 2r² − r, larger than GL(r)'s r² for r ≥ 2.
    d, m = 7, 2
    layer = _layer(SymmetricBilinearMLP, "silu", d, m, 2, rank=r)
    assert symmetry_dimension(layer) == m * (2 * r * r - r)
    if r >= 2:
        assert 2 * r * r - r > r * r


def test_symmetric_form_beyond_half_d():
    # 2r > d: sym(QᵀK) fills an open set of symmetric d×d matrices; fiber 2rd − d(d+1)/2.
    d, m, r = 4, 2, 3
    layer = _layer(SymmetricBilinearMLP, "silu", d, m, 2, rank=r)
    per_slot = 2 * r * d - d * (d + 1) // 2
    assert per_slot == 14 and per_slot < r * (2 * r - 1)
    assert symmetry_dimension(layer) == m * per_slot == predicted_symmetry_dimension(layer)
    assert factor_fiber_dimension(r, d) == per_slot


@pytest.mark.parametrize("act,per_slot", [("silu", lambda r: 1), ("tanh", lambda r: 1), ("relu", lambda r: 1 + r), ("relu2", lambda r: 1 + r)])
@pytest.mark.parametrize("r", [1, 2])
def test_gated_form(act, per_slot, r):
    m = 3
    layer = _layer(GatedMLP, act, 5, m, 2, rank=r)
    assert symmetry_dimension(layer) == m * per_slot(r) == predicted_symmetry_dimension(layer)


def test_gated_linear_equals_symmetric_linear():
    a = _layer(GatedMLP, "identity", 6, 2, 3, rank=2)
    b = _layer(SymmetricBilinearMLP, "identity", 6, 2, 3, rank=2)
    assert symmetry_dimension(a) == symmetry_dimension(b) == predicted_symmetry_dimension(a)
    assert predicted_symmetry_dimension(a) == 2 * (2 * 4 - 2) + 2  # O(2,2) per slot + one rescaling per slot


def test_predicted_matches_measured_grid():
    for act, r in itertools.product(["identity", "relu", "relu2", "silu", "gelu_tanh"], [1, 2]):
        for cls in MEASURED_RANK_R:
            layer = _layer(cls, act, 6, 2, 3, rank=r, seed=1)
            assert symmetry_dimension(layer) == predicted_symmetry_dimension(layer), (cls, act, r)


def test_effective_parameter_count():
    layer = _layer(GatedMLP, "silu", 5, 3, 2, rank=2)
    n = sum(p.numel() for p in layer.parameters())
    assert effective_parameter_count(layer) == n - 3


# --- the measurement itself ------------------------------------------------------------

def test_measurement_reports_a_clear_gap_and_does_not_touch_the_layer():
    layer = _layer(SymmetricBilinearMLP, "silu", 5, 2, 3, rank=2)
    before = [p.detach().clone() for p in layer.parameters()]
    res = measure_symmetry(layer)
    assert res.gap > 1e8
    assert res.smallest_kept > 1e-6 and res.largest_dropped < 1e-12
    assert res.singular_values.shape == (res.n_params,)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))
    assert next(layer.parameters()).dtype == torch.float32


def test_too_few_inputs_overcounts():
    layer = _layer(SymmetricBilinearMLP, "silu", 4, 3, 3, rank=1)
    assert symmetry_dimension(layer, n_inputs=3) > predicted_symmetry_dimension(layer)


def test_ambiguous_rank_raises():
    layer = _layer(KeyValueMLP, "silu", 4, 3, 2)
    with pytest.raises(RuntimeError, match="ambiguous"):
        measure_symmetry(layer, rtol=0.5, min_gap=1e4)


def test_dead_relu_slot_is_a_boundary_case():
    # A negative definite S_j makes slot j dead on every input: all its d² + d_out
    # parameters become free, instead of the generic d(d−1)/2 + 1.
    d, m, d_out = 4, 2, 3
    layer = _layer(BilinearAttentionMLP, "relu", d, m, d_out)
    with torch.no_grad():
        layer.interaction[0] = -torch.eye(d)
    extra = (d * d + d_out) - (d * (d - 1) // 2 + 1)
    generic = predicted_symmetry_dimension(layer, check_weights=False)
    assert generic == m * d * (d - 1) // 2 + m                    # the theorem's count
    assert symmetry_dimension(layer) == generic + extra
    # outside (G) the prediction refuses instead of returning the generic count
    with pytest.raises(ValueError, match=r"not indefinite for slot\(s\) \[0\]"):
        predicted_symmetry_dimension(layer)


def test_one_positive_definite_relu_slot_can_keep_the_generic_count():
    # A positive definite S_j makes a ReLU slot linear; alone among indefinite slots it mixes
    # with none, and the count here stays m·d(d−1)/2 + m = 12 (so "can be larger", not "is").
    d, m, d_out = 3, 3, 2
    torch.manual_seed(0)
    layer = BilinearAttentionMLP(d, m, d_out, activation="relu", dtype=torch.float64)
    assert not _definite_slots(layer)
    generic = symmetry_dimension(layer)
    assert generic == m * d * (d - 1) // 2 + m
    with torch.no_grad():
        layer.interaction[0] = torch.eye(d, dtype=torch.float64) + 0.1 * torch.randn(d, d, dtype=torch.float64)
    assert _definite_slots(layer) == [0]
    assert symmetry_dimension(layer) == generic


def _definite_slots(layer):
    A = (layer.interaction if hasattr(layer, "interaction") else layer.interactions()).detach().double()
    ev = torch.linalg.eigvalsh((A + A.transpose(1, 2)) / 2)
    return [j for j in range(ev.shape[0]) if ev[j, 0] > 0 or ev[j, -1] < 0]


def test_definite_s_j_at_library_init_raises_and_the_count_differs():
    # Under the library's own initialisation a definite S_j is common at
    # d = 2; there the dense ReLU count is not the theorem's m·d(d−1)/2 + m = 8.
    torch.manual_seed(0)
    layer = BilinearAttentionMLP(2, 4, 3, activation="relu")
    assert _definite_slots(layer)                                  # this draw has one
    assert predicted_symmetry_dimension(layer, check_weights=False) == 4 * 1 + 4
    assert symmetry_dimension(layer) == 13
    with pytest.raises(ValueError, match="indefinite"):
        predicted_symmetry_dimension(layer)
    # symmetric layer at r >= d: the same hypothesis is checked; at r < d it is automatic
    for seed in range(50):
        torch.manual_seed(seed)
        sym = SymmetricBilinearMLP(2, 2, 2, rank=2, activation="relu")
        if _definite_slots(sym):
            break
    else:
        pytest.fail("no definite S_j in 50 draws at d = r = 2")
    with pytest.raises(ValueError, match="indefinite"):
        predicted_symmetry_dimension(sym)
    assert predicted_symmetry_dimension(_layer(SymmetricBilinearMLP, "relu", 5, 3, 2, rank=2)) > 0
    # on the meta device the weights cannot be checked: refuse unless told to skip
    meta = BilinearAttentionMLP(3, 2, 2, activation="relu", device="meta")
    with pytest.raises(ValueError, match="meta"):
        predicted_symmetry_dimension(meta)
    assert predicted_symmetry_dimension(meta, check_weights=False) == 2 * 3 + 2


def _callable(fn):
    from qkmlp import get_activation
    return get_activation(fn)


def test_activations_outside_the_classes_can_change_a_count_and_the_prediction_refuses():
    # The counts need σ in one of the three classes of chapter 7; outside them a count can
    # change (below) or not (the next test).
    zlogz = _callable(lambda z: z * torch.log(z.abs().clamp_min(1e-300)))
    poly = _callable(lambda z: z + z * z)
    relu2z = _callable(lambda z: torch.relu(z) ** 2 + z)
    # z·log|z|: c zσ' + νσ = z for c = 1, ν = −1, so a key-value slot keeps one direction
    z = torch.linspace(-3, 3, 61, dtype=torch.float64)[torch.arange(61) != 30]
    assert torch.allclose(z * (torch.log(z.abs()) + 1) - z * torch.log(z.abs()), z)
    torch.manual_seed(0)
    assert symmetry_dimension(KeyValueMLP(2, 3, 1, activation=zlogz)) == 1       # theorem for SiLU: 0
    torch.manual_seed(0)
    assert symmetry_dimension(KeyValueMLP(2, 3, 1, activation="silu")) == 0
    torch.manual_seed(0)
    assert symmetry_dimension(KeyValueMLP(3, 8, 2, activation=poly)) == 22
    torch.manual_seed(0)
    assert symmetry_dimension(GatedMLP(2, 3, 1, activation=poly)) == 8          # m = 3 otherwise
    torch.manual_seed(2)
    dense = BilinearAttentionMLP(2, 4, 1, activation=relu2z)
    assert not _definite_slots(dense)                                           # every S_j indefinite
    assert symmetry_dimension(dense) == 5                                       # m·d(d−1)/2 = 4 otherwise
    for act in (zlogz, poly, relu2z):
        for layer in (KeyValueMLP(2, 3, 1, activation=act), GatedMLP(2, 3, 1, activation=act),
                      BilinearAttentionMLP(2, 4, 1, activation=act)):
            with pytest.raises(ValueError, match="named activations.*no count is claimed"):
                predicted_symmetry_dimension(layer)
    # a callable declared linear is linear: its count is proven
    from qkmlp import get_activation
    lin = get_activation(lambda z: 2 * z, is_linear=True)
    torch.manual_seed(0)
    kv = KeyValueMLP(4, 2, 3, activation=lin)
    assert predicted_symmetry_dimension(kv) == 4 == symmetry_dimension(kv)


def test_activations_outside_the_classes_can_also_keep_the_count_of_the_classes():
    # z·log|z| (zσ' − σ = z) and relu(z) + z² (zσ' − σ = z²) leave, in a key-value layer, the
    # directions δk_j = c_j k_j, δv_j = −c_j v_j with Σ_j c_j (x·k_j)^e v_j = 0: as many as the
    # linear relations among the m tensors k_j^⊗e ⊗ v_j (numpy's rank below), which is 0 when
    # m is at most their space's dimension: then the count is the strictly non-homogeneous 0.
    import numpy as np

    zlogz = _callable(lambda z: z * torch.log(z.abs().clamp_min(1e-300)))
    relu_z2 = _callable(lambda z: torch.relu(z) + z * z)
    z = torch.linspace(-3, 3, 61, dtype=torch.float64)
    assert torch.allclose(z * ((z > 0).double() + 2 * z) - relu_z2(z), z * z)
    for act, e in ((zlogz, 1), (relu_z2, 2)):
        for sizes, count in (((3, 2, 2), 0), ((4, 3, 2), 0), ((2, 3, 1), 1 if e == 1 else 0),
                             ((2, 4, 1), 2 if e == 1 else 1)):
            torch.manual_seed(0)
            layer = KeyValueMLP(*sizes, activation=act)
            K = layer.key.detach().double().numpy()
            V = layer.value.detach().double().numpy()
            rows = [np.kron(np.kron(K[j], K[j]) if e == 2 else K[j], V[j]) for j in range(len(K))]
            relations = len(K) - np.linalg.matrix_rank(np.array(rows))
            assert symmetry_dimension(layer) == relations == count, (act.name, sizes)
    torch.manual_seed(0)
    assert symmetry_dimension(GatedMLP(2, 3, 1, activation=zlogz)) == 3                 # = m, as SiLU


def test_bad_input():
    with pytest.raises(TypeError, match="qkmlp layers"):
        symmetry_dimension(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match="qkmlp layers"):
        predicted_symmetry_dimension(torch.nn.Linear(3, 3))
    layer = _layer(KeyValueMLP, "relu", 3, 2, 2)
    with pytest.raises(ValueError, match="n_inputs"):
        measure_symmetry(layer, n_inputs=0)
    with pytest.raises(ValueError, match="rtol"):
        measure_symmetry(layer, rtol=0.0)
    # outside the derived regime the prediction says so instead of guessing
    with pytest.raises(ValueError, match="no closed form"):
        predicted_symmetry_dimension(_layer(SymmetricBilinearMLP, "identity", 6, 6, 3, rank=1))


def test_breakdown_names_the_parts():
    parts = symmetry_breakdown(_layer(GatedMLP, "relu2", 5, 3, 2, rank=2))
    assert sorted(parts.values()) == [3, 6]


# --- discrete symmetries and conserved quantities -------------------------------------

def test_slot_permutation_is_a_symmetry_of_every_layer():
    x = torch.randn(16, 4)
    perm = [2, 0, 1]
    for cls in MEASURED:
        layer = _layer(cls, "silu", 4, 3, 2)
        assert relative_change(layer, slot_permuted(layer, perm), x) < 1e-6
    with pytest.raises(ValueError, match="permutation"):
        slot_permuted(layer, [0, 0, 1])


def test_odd_sign_flip_needs_odd_sigma():
    x = torch.randn(16, 4)
    for cls in MEASURED:
        assert relative_change(_layer(cls, "tanh", 4, 3, 2), odd_sign_flip(_layer(cls, "tanh", 4, 3, 2), 1), x) < 1e-6
        assert relative_change(_layer(cls, "silu", 4, 3, 2), odd_sign_flip(_layer(cls, "silu", 4, 3, 2), 1), x) > 1e-2
    with pytest.raises(ValueError, match="slot"):
        odd_sign_flip(_layer(KeyValueMLP, "tanh", 4, 3, 2), 3)


def test_conserved_quantities_under_small_step_gradient_descent():
    from qkmlp.training import fit

    def qk_gap(layer):  # |q|^2 - |k|^2 per component: conserved only where q -> cq, k -> k/c is a symmetry
        return (layer.query.double().pow(2).sum(-1) - layer.key.double().pow(2).sum(-1)).detach()

    torch.manual_seed(0)
    x = torch.randn(64, 4, dtype=torch.float64)
    drift = {}
    for cls in MEASURED_RANK_R:
        with torch.no_grad():
            y = 2 * cls(4, 3, 2, rank=2, activation="silu", dtype=torch.float64)(x)  # a teacher
        layer = cls(4, 3, 2, rank=2, activation="silu", dtype=torch.float64)
        c0, g0 = conserved_quantities(layer), qk_gap(layer)
        losses = fit(layer, x, y, steps=100, lr=0.05, optimizer="sgd")  # time lr·steps = 5
        c1, g1 = conserved_quantities(layer), qk_gap(layer)
        assert losses[-1] < 0.9 * losses[0]
        assert c0, cls
        for k in c0:
            assert (c1[k] - c0[k]).abs().max() < 1e-3 * (1 + c0[k].abs().max()), (cls, k)
        drift[cls] = float((g1 - g0).abs().max())
    # the symmetric form conserves it (it is the diagonal of QQt-KKt), the gated silu form does not
    assert drift[SymmetricBilinearMLP] < 1e-3
    assert drift[GatedMLP] > 10 * drift[SymmetricBilinearMLP]


def test_symmetric_homogeneous_rescaling_quantity_is_conserved():
    # S_j -> t S_j, v_j -> t^-p v_j (Q_j, K_j -> sqrt(t) Q_j, sqrt(t) K_j) is a symmetry of the
    # symmetric form for homogeneous σ only: (|Q_j|² + |K_j|²)/2 − p|v_j|² is conserved then.
    from qkmlp.training import fit

    torch.manual_seed(2)
    x = torch.randn(64, 4, dtype=torch.float64)
    key = "(|Q|^2+|K|^2)/2-p|v|^2"

    def drift(act):
        torch.manual_seed(3)
        with torch.no_grad():
            y = 2 * SymmetricBilinearMLP(4, 3, 2, rank=1, activation=act, dtype=torch.float64)(x)
        layer = SymmetricBilinearMLP(4, 3, 2, rank=1, activation=act, dtype=torch.float64)
        p = layer.activation.homogeneity_degree or 2   # the same formula for silu, as a control
        def c(layer):
            Q, K, V = layer.query.double(), layer.key.double(), layer.value.double()
            return 0.5 * (Q.pow(2).sum((-1, -2)) + K.pow(2).sum((-1, -2))) - p * V.pow(2).sum(-1)
        c0 = c(layer).detach()
        if act != "silu":
            assert torch.allclose(conserved_quantities(layer)[key], c0)
        losses = fit(layer, x, y, steps=500, lr=0.02, optimizer="sgd")   # time lr·steps = 10
        assert losses[-1] < 0.9 * losses[0], (act, losses[0], losses[-1])
        return float((c(layer).detach() - c0).abs().max() / c0.abs().max())

    assert key not in conserved_quantities(SymmetricBilinearMLP(4, 3, 2, activation="silu"))
    assert key not in conserved_quantities(SymmetricBilinearMLP(4, 3, 2, activation="identity"))
    relu, relu2, silu = drift("relu"), drift("relu2"), drift("silu")
    assert relu < 2e-3 and relu2 < 2e-3          # the O(lr) drift of gradient descent
    assert silu > 10 * max(relu, relu2)


def test_definite_slots_break_the_homogeneous_count_when_rank_ge_d():
    # the homogeneous count assumes every S_j indefinite; for r >= d a positive definite S_j
    # makes a ReLU slot linear, and two such slots mix like the linear case (GL(2), not 2 scalings)
    torch.manual_seed(0)
    layer = SymmetricBilinearMLP(3, 2, 3, rank=3, activation="relu", dtype=torch.float64)
    with torch.no_grad():
        layer.query.copy_(torch.eye(3, dtype=torch.float64) + 0.1 * torch.randn(2, 3, 3, dtype=torch.float64))
        layer.key.copy_(layer.query)
        S = layer.query.transpose(-1, -2) @ layer.key
    assert torch.linalg.eigvalsh(S + S.transpose(-1, -2)).min() > 0
    assert symmetry_dimension(layer) == predicted_symmetry_dimension(layer, check_weights=False) + 2 * 2 - 2
    with pytest.raises(ValueError, match="indefinite"):
        predicted_symmetry_dimension(layer)


def test_dimension_formulas_reject_bad_sizes():
    from qkmlp.symmetry import low_rank_dimension, symmetric_low_rank_dimension

    assert factor_fiber_dimension(2, 7) == 2 * 3 and factor_fiber_dimension(3, 4) == 24 - 10
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            factor_fiber_dimension(bad, 4)
        with pytest.raises(ValueError, match="positive integer"):
            symmetric_low_rank_dimension(4, bad)
        with pytest.raises(ValueError, match="positive integer"):
            low_rank_dimension(3, bad, 2)


def test_weight_decay_shrinks_conserved_quantity_geometrically():
    from qkmlp.training import fit

    torch.manual_seed(1)
    x = torch.randn(64, 4, dtype=torch.float64)
    y = torch.randn(64, 2, dtype=torch.float64)
    layer = GatedMLP(4, 3, 2, rank=1, activation="silu", dtype=torch.float64)
    lr, wd, steps = 0.01, 0.5, 100
    c0 = conserved_quantities(layer)["|K|^2-|v|^2"]
    fit(layer, x, y, steps=steps, lr=lr, optimizer="sgd", weight_decay=wd)
    c1 = conserved_quantities(layer)["|K|^2-|v|^2"]
    # one SGD step with decay: C -> (1 - lr·wd)² C + O(lr²)
    expected = (1 - lr * wd) ** (2 * steps)
    assert expected < 0.5
    assert torch.allclose(c1, expected * c0, atol=1e-3, rtol=1e-2)


# --- gauge_symmetry_dimension ---------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3])
def test_gauge_symmetry_dimension_follows_the_gauge_theorems(rank):
    """Symmetric: every generator; gated ReLU: the diagonals; gated SiLU/GELU: none."""
    from qkmlp.symmetry import gauge_symmetry_dimension

    torch.manual_seed(rank)
    m = 3
    cases = [(SymmetricBilinearMLP, "silu", m * rank * rank), (SymmetricBilinearMLP, "relu", m * rank * rank),
             (GatedMLP, "relu", m * rank), (GatedMLP, "leaky_relu", m * rank),
             (GatedMLP, "silu", 0), (GatedMLP, "gelu", 0), (GatedMLP, "identity", m * rank * rank)]
    for cls, act, want in cases:
        got = gauge_symmetry_dimension(cls(7, m, rank=rank, activation=act))
        assert got == want, (cls.__name__, act, rank, got, want)


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_gauge_symmetry_dimension_finds_the_narrow_cells_of_a_piecewise_gate(act):
    """At d = 2 the kinks cut the plane into narrow cones; on 44 fixed Gaussian inputs (the
    old default) about one layer in seven of these counted 7 or 8 symmetries for 6. The
    default inputs, added around the kinks until the rank settles, give m·r on each."""
    from qkmlp.symmetry import gauge_symmetry_dimension

    x = torch.randn(44, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fixed = []
    for seed in range(20, 45):
        torch.manual_seed(seed)
        layer = GatedMLP(2, 3, rank=2, activation=act)
        assert gauge_symmetry_dimension(layer) == 6, (act, seed)
        fixed.append(gauge_symmetry_dimension(layer, x))
    assert any(n > 6 for n in fixed) and min(fixed) == 6          # the fixed inputs miss cells


def test_gauge_symmetry_dimension_bad_input():
    from qkmlp.symmetry import gauge_symmetry_dimension

    with pytest.raises(TypeError, match="rank-r factors"):
        gauge_symmetry_dimension(KeyValueMLP(4, 3))
    with pytest.raises(ValueError, match="eps"):
        gauge_symmetry_dimension(GatedMLP(4, 3), eps=0.0)
