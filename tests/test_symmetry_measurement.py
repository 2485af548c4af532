"""``symmetry_dimension`` with its default arguments counts what the theorems predict, on
the two counterexamples where 2·n_params + 20 random inputs overcounted, and on random
small layers of the five layer types with each of the ten named activations (wherever the
predictor applies: it raises outside the theorems' hypotheses). An ill-conditioned draw may
be refused (``RuntimeError``: the rank is ambiguous), never silently miscounted. The prediction is the
closed form of chapter 7 (``predicted_symmetry_dimension``), computed from the sizes and
σ's class, not from a Jacobian."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import LAYERS, RANK_R
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
    activation_names,
)
from qkmlp.symmetry import measure_symmetry, predicted_symmetry_dimension, symmetry_dimension

F64 = torch.float64


def test_a_dense_relu_layer_with_a_narrow_positive_cone_counts_four():
    # 42 Gaussian inputs counted 5 here (gap 2.5e14): one direction seen only inside the cone
    torch.manual_seed(30)
    layer = BilinearAttentionMLP(3, 1, 2, activation="relu", dtype=F64)
    assert predicted_symmetry_dimension(layer) == 3 + 1       # antisymmetric part + rescaling
    assert symmetry_dimension(layer) == 4


@pytest.mark.parametrize("seed", [0, 1, 4, 9, 15, 24])
def test_a_gated_leaky_relu_layer_with_narrow_sectors_counts_fifteen(seed):
    # d = 2, m = 3, rank 4: twelve kink lines through 0 cut the plane into 24 sectors; 128
    # Gaussian inputs counted 16 to 21 at these seeds, with gaps of 1e8 to 1e12
    torch.manual_seed(seed)
    layer = GatedMLP(2, 3, rank=4, activation="leaky_relu")
    assert predicted_symmetry_dimension(layer) == 3 + 3 * 4   # key-value + per component
    assert symmetry_dimension(layer) == 15


def test_a_weak_direction_far_above_round_off_is_refused_not_counted():
    # StaticQueryMLP, tanh, d = 2, m = 3, d_out = 2: a singular value at 3e-9 of the largest
    # (a weak direction of the function, not a symmetry: those sit at round-off, 1e-16)
    rng = random.Random("StaticQueryMLP/tanh")
    for _ in range(3):
        d, m, d_out = rng.randint(2, 4), rng.randint(1, 3), rng.randint(1, 3)
        torch.manual_seed(rng.randrange(10**6))
    layer = StaticQueryMLP(d, m, d_out, activation="tanh", dtype=F64)
    assert (d, m, d_out) == (2, 3, 2)
    res = measure_symmetry(layer, min_gap=0)
    assert 1e-12 < res.largest_dropped < res.rtol            # the case: below rtol, above round-off
    assert res.dimension == predicted_symmetry_dimension(layer) + 1
    with pytest.raises(RuntimeError, match="far above float64 round-off"):
        symmetry_dimension(layer)


def test_a_fixed_number_of_inputs_is_still_taken_as_given():
    torch.manual_seed(0)
    layer = GatedMLP(2, 3, rank=4, activation="leaky_relu")
    res = measure_symmetry(layer, n_inputs=128, min_gap=0)
    assert res.n_inputs == 128 and res.dimension > 15          # the undercount the default avoids
    assert measure_symmetry(layer).n_inputs > 128


TYPES = tuple(c for c in LAYERS if c is not SymmetrizedGatedMLP)    # the theorems cover these five


@pytest.mark.parametrize("act", activation_names())
@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_measured_equals_predicted_on_random_small_layers(cls, act):
    rng = random.Random(f"{cls.__name__}/{act}")
    checked = 0
    for draw in range(3):
        d, m, d_out = rng.randint(2, 4), rng.randint(1, 3), rng.randint(1, 3)
        kw = {"rank": rng.randint(1, 3)} if cls in RANK_R else {}
        torch.manual_seed(rng.randrange(10**6))
        layer = cls(d, m, d_out, activation=act, dtype=F64, **kw)
        try:
            want = predicted_symmetry_dimension(layer)
        except ValueError:              # outside the theorems' hypotheses: nothing predicted
            continue
        try:
            got = symmetry_dimension(layer)
        except RuntimeError as e:       # an ill-conditioned draw is refused loudly, never miscounted
            assert "ambiguous Jacobian rank" in str(e)
            continue
        assert got == want, (d, m, d_out, kw)
        checked += 1
    assert checked or act == "identity" and cls is SymmetricBilinearMLP
