"""qkmlp.costs against torch's own FLOP counter, and qkmlp.training.fit's behaviour."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import RANK_R
from qkmlp import BilinearAttentionMLP, GatedMLP, KeyValueMLP, StaticQueryMLP, SymmetricBilinearMLP
from qkmlp.costs import flops_per_token, parameter_count
from qkmlp.training import fit

D, M, O, N = 8, 6, 5, 7


def counted_matmul_flops(layer):
    x = torch.randn(N, D)
    with FlopCounterMode(display=False) as counter:
        layer(x)
    return counter.get_total_flops() / N


@pytest.mark.parametrize(
    "layer,elementwise",
    [
        (KeyValueMLP(D, M, O), 0),
        (StaticQueryMLP(D, M, O), 0),
        (BilinearAttentionMLP(D, M, O), 0),
        (SymmetricBilinearMLP(D, M, O, rank=3), 2 * M * 3),
        (GatedMLP(D, M, O, rank=2), 2 * M * 2),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, int) else "",
)
def test_flops_match_torch_flop_counter(layer, elementwise):
    # the counter sees matrix products only; flops_per_token adds the rank-sum products
    assert flops_per_token(layer) == counted_matmul_flops(layer) + elementwise


def test_parameter_counts_in_closed_form():
    r = 3
    assert parameter_count(KeyValueMLP(D, M, O)) == M * D + M * O
    assert parameter_count(StaticQueryMLP(D, M, O)) == D * D + M * D + M * O
    assert parameter_count(BilinearAttentionMLP(D, M, O)) == M * D * D + M * O
    for cls in RANK_R:
        assert parameter_count(cls(D, M, O, rank=r)) == 2 * M * r * D + M * O


def test_flops_rejects_other_modules():
    with pytest.raises(TypeError, match="GatedMLP"):
        flops_per_token(torch.nn.Linear(3, 3))


def test_fit_reduces_loss_and_is_deterministic():
    torch.manual_seed(0)
    x = torch.randn(128, 4, dtype=torch.float64)
    y = x[:, :1] * x[:, 1:2]
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        layer = GatedMLP(4, 8, 1, dtype=torch.float64)
        runs.append(fit(layer, x, y, steps=200, lr=1e-2, batch_size=32, seed=5))
    assert runs[0] == runs[1]
    assert runs[0][-1] < 0.1 * runs[0][0]


def test_fit_classification_and_callback():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    labels = (x[:, 0] > 0).long()
    layer = KeyValueMLP(4, 8, 2)
    seen = []
    fit(layer, x, labels, steps=50, loss="cross_entropy", optimizer="sgd", lr=0.5,
        callback=lambda step, model, loss: seen.append(step))
    assert seen == list(range(50))
    assert (layer(x).argmax(-1) == labels).float().mean() > 0.9


def test_fit_rejects_bad_arguments():
    layer, x = KeyValueMLP(4, 3), torch.randn(8, 4)
    with pytest.raises(ValueError, match="loss"):
        fit(layer, x, x, loss="hinge")
    with pytest.raises(ValueError, match="optimizer"):
        fit(layer, x, x, optimizer="lbfgs")
    with pytest.raises(ValueError, match="same number of rows"):
        fit(layer, x, x[:5])
    with pytest.raises(ValueError, match="steps"):
        fit(layer, x, x, steps=0)


def test_the_symmetrized_layer_has_a_parameter_count_and_no_flop_count():
    """As costs' docstring says: parameters of any module (q, k, v: 3·m·d here), FLOPs only
    for LAYER_TYPES."""
    from qkmlp import SymmetrizedGatedMLP
    from qkmlp.costs import flops_per_token, parameter_count

    layer = SymmetrizedGatedMLP(8, 4, device="meta")
    assert parameter_count(layer) == 3 * 4 * 8
    with pytest.raises(TypeError, match="flops_per_token is defined for KeyValueMLP"):
        flops_per_token(layer)


def test_parameter_count_counts_a_tied_parameter_once_and_two_views_twice():
    import torch
    from torch import nn
    from qkmlp.costs import parameter_count

    a, b = nn.Linear(3, 4, bias=False), nn.Linear(3, 4, bias=False)
    b.weight = a.weight                                   # tied: one Parameter
    assert parameter_count(nn.Sequential(a, b)) == 12
    c = nn.Linear(3, 4, bias=False)
    c.weight = nn.Parameter(a.weight.data)                # another Parameter over the same storage
    assert c.weight.data_ptr() == a.weight.data_ptr()
    assert parameter_count(nn.Sequential(a, c)) == 24
