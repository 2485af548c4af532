"""What a user of torch and Hugging Face relies on: a fresh output
tensor, finite results at extreme pre-activations, initialisers that see Llama's fans,
the freezing rule, and clear errors for bad input anywhere in the
library (with nothing changed in place)."""
import copy
import importlib.util
import math

import numpy as np
import pytest
import torch
from torch import nn

import reference as R
from conftest import LAYERS, RANK_R
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
    activation_names,
    get_activation,
)
from qkmlp import lowrank as L
from qkmlp import symmetry as S

ALL = LAYERS
FORMULA = {GatedMLP: R.gated, SymmetricBilinearMLP: R.symmetric, SymmetrizedGatedMLP: R.symmetrized}
D, M, O = 6, 5, 4


def _make(cls, **kw):
    torch.manual_seed(0)
    if cls in RANK_R:
        kw.setdefault("rank", 2)
    return cls(D, M, O, **kw)


# --- item 4: the output is a tensor of its own -----------------------------------------

@pytest.mark.parametrize("lead", [(), (5,), (2, 3)])
@pytest.mark.parametrize("cls", ALL)
def test_output_is_not_a_view_and_an_inplace_residual_is_right(cls, lead):
    layer = _make(cls, dtype=torch.float64)
    x = torch.randn(*lead, D, dtype=torch.float64)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            assert layer(x)._base is None
    # y += x on the output: the same gradients as y = y + x
    grads = []
    for inplace in (True, False):
        layer.zero_grad()
        xg = x.clone().requires_grad_()
        y = layer(xg)
        if inplace:
            y += 2.0
        else:
            y = y + 2.0
        y.square().sum().backward()
        grads.append([xg.grad, *(p.grad for p in layer.parameters())])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- item 5: no opt-in kernels, finite results at extreme pre-activations ---------------

def test_the_opt_in_cpu_kernels_are_gone():
    assert importlib.util.find_spec("qkmlp.cpu_kernels") is None


@pytest.mark.parametrize("cls", RANK_R)
@pytest.mark.parametrize("act", activation_names())
def test_extreme_preactivations_float32_match_the_formula(cls, act):
    """Pre-activations from −120 to 120 in float32 (SiLU's exp overflows below −88.7):
    the output and gradients equal the formula's, and are finite wherever the formula's are."""
    layer = cls(1, 1, 1, rank=1, activation=act)
    with torch.no_grad():
        layer.query.fill_(1.0)
        layer.key.fill_(1.0 if cls is GatedMLP else 0.01)
        layer.value.fill_(1.0)
    z = torch.linspace(-120, 120, 241).unsqueeze(1)
    outs = []
    for f in (layer, lambda x: FORMULA[cls](x, layer.query, layer.key, layer.value, layer.activation)):
        layer.zero_grad()
        x = z.clone().requires_grad_()
        y = f(x)
        y.sum().backward()
        outs.append((y.detach(), x.grad, layer.query_weight.grad))
    for got, want in zip(*outs):
        assert torch.equal(got.isfinite(), want.isfinite())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


# --- item 6: initialisers, from_linear, freezing ------------------------------------------

class LlamaMLP(nn.Module):
    def __init__(self, d, m):
        super().__init__()
        self.gate_proj = nn.Linear(d, m, bias=False)
        self.up_proj = nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


INITS = {
    "xavier_uniform_": nn.init.xavier_uniform_,
    "xavier_normal_": nn.init.xavier_normal_,
    "normal_(std=0.02)": lambda p: nn.init.normal_(p, std=0.02),
    "trunc_normal_(std=0.02)": lambda p: nn.init.trunc_normal_(p, std=0.02),
    "orthogonal_": nn.init.orthogonal_,
}


@pytest.mark.parametrize("init", list(INITS))
def test_generic_initialisers_give_a_llama_mlps_output_scale(init):
    """``for p in model.parameters(): if p.dim() > 1: init(p)`` on a rank-1 GatedMLP and on
    a Llama MLP of the same size: output variances within 10 % (mean over 4 seeds)."""
    d, m, n = 64, 172, 2048
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    var = {}
    for name, make in (("gated", lambda: GatedMLP(d, m)), ("llama", lambda: LlamaMLP(d, m))):
        vs = []
        for seed in range(4):
            torch.manual_seed(seed)
            model = make()
            for p in model.parameters():
                if p.dim() > 1:
                    INITS[init](p)
            with torch.no_grad():
                vs.append(model(x).var().item())
        var[name] = sum(vs) / len(vs)
    assert abs(var["gated"] / var["llama"] - 1) < 0.10, var


def test_parameters_are_llamas_at_rank_one():
    """At rank 1 query_weight and key_weight are gate_proj.weight and up_proj.weight."""
    torch.manual_seed(1)
    llama = LlamaMLP(D, M)
    layer = GatedMLP.from_linear(llama.gate_proj, llama.up_proj, llama.down_proj, activation="silu")
    assert torch.equal(layer.query_weight, llama.gate_proj.weight)
    assert torch.equal(layer.key_weight, llama.up_proj.weight)
    assert torch.equal(layer.value, llama.down_proj.weight.T)
    assert {n: p.dim() for n, p in layer.named_parameters()} == {"query_weight": 2, "key_weight": 2, "value": 2}


@pytest.mark.parametrize("cls", RANK_R)
def test_freezing_and_reinitialising_the_gate_alone(cls):
    layer = _make(cls, dtype=torch.float64)
    frozen = layer.query_weight.detach().clone()
    with pytest.raises(RuntimeError, match="leaf"):
        layer.query.requires_grad_(False)                       # a view: torch refuses
    layer.query_weight.requires_grad_(False)                    # the documented way
    opt = torch.optim.SGD([p for p in layer.parameters() if p.requires_grad], lr=0.1)
    x = torch.randn(8, D, dtype=torch.float64, requires_grad=True)
    layer(x).square().sum().backward()
    assert layer.query_weight.grad is None and layer.key_weight.grad is not None
    # the input gradient is still the formula's
    want = torch.autograd.grad(FORMULA[cls](x, layer.query, layer.key, layer.value, layer.activation).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, want)
    opt.step()
    assert torch.equal(layer.query_weight, frozen)
    # re-initialising the gate alone: in place through the view, or by assignment (a copy)
    nn.init.zeros_(layer.query)
    assert layer.query_weight.abs().sum() == 0
    new = torch.randn(M, 2, D, dtype=torch.float64)
    layer.query = new
    assert torch.equal(layer.query, new) and layer.query_weight.data_ptr() != new.data_ptr()
    with pytest.raises(ValueError, match=r"shape \(5, 2, 6\)"):
        layer.key = torch.zeros(3)
    with pytest.raises(TypeError, match="query_weight = nn.Parameter"):
        layer.query = nn.Parameter(new)
    with pytest.raises(TypeError, match="is torch.float64 on cpu, got torch.float32 on cpu"):
        layer.query = new.float()
    assert torch.equal(layer.query, new)


# --- item 7: clear errors ---------------------------------------------------------------

@pytest.mark.parametrize("cls", ALL)
def test_input_dtype_must_match_the_layer(cls):
    layer = _make(cls)
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        with pytest.raises(TypeError, match=rf"input dtype {dt} does not match the layer's dtype torch.float32"):
            layer(torch.randn(3, D, dtype=dt))
    with torch.autocast("cpu", dtype=torch.bfloat16):             # autocast casts, as for nn.Linear
        assert layer(torch.randn(3, D, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("cls", ALL)
def test_input_device_must_match_the_layer(cls):
    layer = _make(cls)
    with pytest.raises(ValueError, match="input is on meta but the layer's weights are on cpu"):
        layer(torch.empty(3, D, device="meta"))
    meta = _make(cls, device="meta")
    with pytest.raises(ValueError, match="input is on cpu but the layer's weights are on meta"):
        meta(torch.randn(3, D))


@pytest.mark.parametrize("cls", ALL)
def test_an_activation_class_is_rejected_at_construction(cls):
    with pytest.raises(TypeError, match=r"class SiLU; pass an instance \(SiLU\(\)\) or a name"):
        _make(cls, activation=nn.SiLU)
    layer = _make(cls, activation=nn.SiLU(), dtype=torch.float64)     # an instance is a callable
    ref = _make(cls, activation="silu", dtype=torch.float64)
    x = torch.randn(4, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x), ref(x))


@pytest.mark.parametrize("cls", ALL)
def test_numpy_integer_sizes_are_accepted(cls):
    kw = {"rank": np.int64(2)} if cls in RANK_R else {}
    layer = cls(np.int64(D), np.int32(M), np.int64(O), **kw)
    assert (layer.d_model, layer.d_hidden, layer.d_out) == (D, M, O) and type(layer.d_model) is int
    assert layer(torch.randn(2, D)).shape == (2, O)
    for bad in (np.float64(3.0), np.bool_(True), 2.0, "8"):
        with pytest.raises(ValueError, match="d_hidden must be a positive integer"):
            cls(D, bad)


@pytest.mark.parametrize("tol", [-1e-3, float("nan"), float("inf"), "0.1", True])
def test_lowrank_rejects_bad_tolerances(tol):
    A = L.with_spectrum([2.0, -1.0, 0.0])
    with pytest.raises((TypeError, ValueError), match="tol must be"):
        L.inertia(A, tol=tol)
    with pytest.raises((TypeError, ValueError), match="tol must be"):
        L.factor_rank(A, tol=tol)
    layer = _make(GatedMLP, activation="relu", dtype=torch.float64)
    with pytest.raises((TypeError, ValueError), match="atol must be"):
        S.gauge_is_symmetry(layer, torch.eye(2), atol=tol)


def test_lowrank_rejects_nan_spectra_and_float_seeds():
    for bad in ([1.0, float("nan")], [float("inf"), 1.0]):
        with pytest.raises(ValueError, match="eigenvalues must be finite"):
            L.with_spectrum(bad)
    with pytest.raises(TypeError, match="eigenvalues must be real"):
        L.with_spectrum(torch.tensor([1 + 1j, 2.0]))
    for seed in (1.5, 2.0, True, "3"):
        with pytest.raises(TypeError, match="seed must be an integer"):
            L.with_spectrum([1.0, 2.0], seed=seed)
        with pytest.raises(TypeError, match="seed must be an integer"):
            L.fit_factors(torch.eye(3, dtype=torch.float64), 1, seed=seed)
    assert torch.equal(L.with_spectrum([1.0, 2.0], seed=np.int64(3)), L.with_spectrum([1.0, 2.0], seed=3))


@pytest.mark.parametrize("alpha", ["2", True, np.bool_(False), 1 + 2j, torch.tensor(True), torch.tensor(2j)])
def test_symmetry_rejects_strings_bools_and_complex_alpha(alpha):
    layer = _make(GatedMLP, dtype=torch.float64)
    before = copy.deepcopy(layer.state_dict())
    with pytest.raises(TypeError, match="alpha must be a real number"):
        S.rescaled(layer, alpha)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        S.rescaling_is_symmetry(layer, alpha)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        S.scalar_rescaling_commutes(get_activation("relu"), alpha)
    assert all(torch.equal(layer.state_dict()[n], t) for n, t in before.items())


def test_symmetry_rejects_complex_and_boolean_gauges():
    layer = _make(GatedMLP, dtype=torch.float64)
    for G in (torch.eye(2, dtype=torch.complex128), torch.eye(2, dtype=torch.bool), [[1j, 0], [0, 1]]):
        with pytest.raises(TypeError, match="G must be a real matrix"):
            S.gauge_transformed(layer, G)
        with pytest.raises(TypeError, match="G must be a real matrix"):
            S.gauge_is_symmetry(layer, G)


def test_float64_before_anything_overflows():
    """float32 inputs whose intermediate products overflow float32 but whose results do not."""
    big = 1e20
    q = torch.tensor([[big, 0.0], [big, 0.0]])           # two rank components, (r, d) = (2, 2)
    k = torch.tensor([[big, 0.0], [-big, 0.0]])          # q_1ᵀk_1 + q_2ᵀk_2 = 0 exactly
    assert torch.equal(L.factors_to_matrix(q, k), torch.zeros(2, 2))
    assert L.symmetric_error(torch.zeros(2, 2), q, k).item() == 0.0
    A = torch.full((2, 2), 3e38)                          # A + Aᵀ overflows float32
    assert torch.equal(L.symmetric_part(A), A)
    lam = L.rank_one_eigenvalues(torch.tensor([big, big]), torch.tensor([1 / big, -1 / big]))
    want = L.rank_one_eigenvalues(torch.tensor([big, big], dtype=torch.float64),
                                  torch.tensor([1 / big, -1 / big], dtype=torch.float64)).float()
    assert lam.isfinite().all()
    torch.testing.assert_close(lam, want)
    assert math.isclose(lam[0].item(), math.sqrt(2) * math.sqrt(2) / 2, rel_tol=1e-5)
    # relative_change: outputs near float32's largest value, their difference beyond it
    y = torch.tensor([3e38, -3e38])
    assert S.relative_change(lambda x: x, lambda x: -x, y) == pytest.approx(2.0)
