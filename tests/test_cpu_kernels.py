"""The opt-in C++ kernels (qkmlp.cpu_kernels): same results as the plain PyTorch path, used
exactly where they apply, never elsewhere. Speed is measured by ``python -m qkmlp.bench
--kernels``, not here.
"""
import copy
import shutil

import pytest
import torch

from qkmlp import GatedMLP, SymmetricBilinearMLP, cpu_kernels
from qkmlp import functional as fn
from qkmlp.bench import bench_headline

LAYERS = [GatedMLP, SymmetricBilinearMLP]


@pytest.fixture(scope="module")
def kernels():
    """Build the extension once (about 20 s the first time; cached afterwards). Without a
    compiler or ninja there is nothing to build; a failing build with both present fails."""
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja on this machine: the kernels cannot be built")
    assert cpu_kernels.available(), cpu_kernels.build_error()
    yield
    cpu_kernels.disable()


class _Spy:
    """Stands in for the extension module and counts the calls of each kernel."""

    def __init__(self, ext):
        self.ext, self.calls = ext, {}

    def __getattr__(self, name):
        def call(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return getattr(self.ext, name)(*args)
        return call


@pytest.fixture
def spy(kernels, monkeypatch):
    s = _Spy(cpu_kernels._ext)
    monkeypatch.setattr(cpu_kernels, "_ext", s)
    return s.calls


def _run(layer, x, on):
    """Output, inference output and gradients of x and the weights, kernels on or off."""
    with cpu_kernels.use(on):
        y = layer(x)
        with torch.no_grad():
            y_inf = layer(x)
    gy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    return (y, y_inf, *torch.autograd.grad(y, [x, *layer.parameters()], gy))


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("act", cpu_kernels.KERNEL_ACTIVATIONS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_kernels_match_the_plain_path(kernels, spy, cls, act, dtype, tol):
    torch.manual_seed(0)
    layer = cls(24, 40, 16, activation=act, dtype=dtype)
    x = torch.randn(3, 11, 24, dtype=dtype, requires_grad=True)
    want = _run(layer, x, on=False)
    assert spy == {}
    got = _run(layer, x, on=True)
    kind = "gated" if cls is GatedMLP else "symmetric"
    assert spy == {f"{kind}_forward": 2, f"{kind}_backward": 1}     # training + inference forward
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("f", [fn.gated, fn.symmetric])
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_kernel_backward_gradcheck(kernels, spy, f, act):
    torch.manual_seed(1)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2 * 4, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    with cpu_kernels.use(True):
        assert torch.autograd.gradcheck(lambda x, w, v: f(x, w, v, act, 4, 1), (x, w, v))
    assert sum(k.endswith("backward") for k in spy) == 1 and all(n > 0 for n in spy.values())


def test_backward_follows_the_forward_choice(kernels, spy):
    layer = GatedMLP(8, 12)
    x = torch.randn(5, 8, requires_grad=True)
    with cpu_kernels.use(True):
        y = layer(x)
    y.sum().backward()                                  # kernels off by now
    assert spy == {"gated_forward": 1, "gated_backward": 1}
    with cpu_kernels.use(False):
        y = layer(x)
    with cpu_kernels.use(True):
        y.sum().backward()
    assert spy == {"gated_forward": 1, "gated_backward": 1}


@pytest.mark.parametrize("case", ["rank2", "bfloat16", "tanh", "compiled", "vmap", "double_backward"])
def test_kernels_are_not_used_where_they_do_not_apply(kernels, spy, case):
    torch.manual_seed(2)
    kw = {"rank": 2} if case == "rank2" else {"activation": "tanh"} if case == "tanh" else {}
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    layer = GatedMLP(8, 12, **kw, dtype=dtype)
    plain = copy.deepcopy(layer)
    x = torch.randn(5, 8, dtype=dtype, requires_grad=True)
    with cpu_kernels.use(True):
        if case == "compiled":
            y = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
        elif case == "vmap":
            y = torch.func.vmap(layer)(x.unsqueeze(1)).squeeze(1)
        else:
            y = layer(x)
        create = case == "double_backward"
        gx, = torch.autograd.grad(y.square().sum(), x, create_graph=create)
    assert spy.get("gated_backward", 0) == 0
    assert spy.get("gated_forward", 0) == (1 if case == "double_backward" else 0)
    gx_plain, = torch.autograd.grad(plain(x).square().sum(), x)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(gx, gx_plain, rtol=tol, atol=tol)


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("act", cpu_kernels.KERNEL_ACTIVATIONS)
def test_nan_and_inf_propagate_as_in_pytorch(kernels, cls, act):
    torch.manual_seed(3)
    layer = cls(4, 6, activation=act)
    x = torch.randn(5, 4)
    x[1, 2], x[3, 0], x[4, 1] = float("nan"), float("inf"), -float("inf")
    with torch.no_grad():
        want = layer(x)
        with cpu_kernels.use(True):
            got = layer(x)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, equal_nan=True)


def test_state_and_context_manager(kernels):
    assert cpu_kernels.enable() and cpu_kernels.enabled()
    with cpu_kernels.use(False):
        assert not cpu_kernels.enabled()
    assert cpu_kernels.enabled()
    cpu_kernels.disable()
    assert not cpu_kernels.enabled()
    with cpu_kernels.use(True):
        assert cpu_kernels.enabled()
    assert not cpu_kernels.enabled()


def test_kernels_reject_bad_tensors_with_clear_errors(kernels):
    a = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_kernels.gated_forward(a.T, a.T.contiguous(), "silu")
    with pytest.raises(RuntimeError, match="float32 or float64"):
        cpu_kernels.gated_forward(a.half(), a.half(), "silu")
    with pytest.raises(RuntimeError, match="24 numbers"):
        cpu_kernels.symmetric_forward(a, torch.randn(5, 6), "silu")
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_kernels.gated_forward(a, a.double(), "silu")


def test_bench_times_the_kernel_candidates(kernels):
    hl = bench_headline(16, 40, 32, reps=3, kernels=True)
    assert {"gated_mlp_kernels", "symmetric_mlp_kernels"} <= set(hl["forward_backward"])
    assert hl["saved_bytes"]["gated_mlp_kernels"] == hl["saved_bytes"]["gated_mlp"]
    assert set(hl["verdicts"]) == {"gated_mlp", "symmetric_mlp", "gated_mlp_kernels", "symmetric_mlp_kernels"}
    with pytest.raises(ValueError, match="device='cpu' and no compile_backend"):
        bench_headline(16, 40, 32, reps=3, kernels=True, compile_backend="aot_eager")
