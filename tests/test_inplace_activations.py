"""Every layer with an in-place ``torch.nn`` activation module (``inplace=True``) computes
the plain formula with the out-of-place function, in inference and in training, and leaves
its input alone. The reference is written here in plain torch, from the notation of the
book (no qkmlp code), with the out-of-place ``torch.nn.functional`` twin of each module."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import LAYERS, RANK_R
from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)
from qkmlp.activations import without_overwrite

F64 = torch.float64
ALL = LAYERS

# (in-place module, the out-of-place function it computes)
INPLACE = {
    "ReLU": (lambda: nn.ReLU(inplace=True), F.relu),
    "SiLU": (lambda: nn.SiLU(inplace=True), F.silu),
    "LeakyReLU": (lambda: nn.LeakyReLU(0.1, inplace=True), lambda z: F.leaky_relu(z, 0.1)),
    "Hardtanh": (lambda: nn.Hardtanh(-0.5, 0.5, inplace=True), lambda z: F.hardtanh(z, -0.5, 0.5)),
    "ELU": (lambda: nn.ELU(inplace=True), F.elu),
}


def _plain(layer, x, f):
    """The layer's function from its weights, in plain torch (einsum over the notation)."""
    if isinstance(layer, KeyValueMLP):
        return f(x @ layer.key.T) @ layer.value
    if isinstance(layer, StaticQueryMLP):
        return f(x @ layer.query @ layer.key.T) @ layer.value
    if isinstance(layer, BilinearAttentionMLP):
        return f(torch.einsum("nd,jde,ne->nj", x, layer.interaction, x)) @ layer.value
    a = torch.einsum("nd,jsd->njs", x, layer.query)
    b = torch.einsum("nd,jsd->njs", x, layer.key)
    if isinstance(layer, SymmetricBilinearMLP):
        h = f((a * b).sum(-1))
    elif isinstance(layer, SymmetrizedGatedMLP):
        h = (0.5 * (f(a) * b + f(b) * a)).sum(-1)
    else:
        h = (f(a) * b).sum(-1)
    return h @ layer.value


def _layer(cls, act, rank):
    torch.manual_seed(3)
    kw = {"rank": rank} if cls in RANK_R else {}
    layer = cls(5, 7, 4, activation=act, dtype=F64, **kw)
    if cls is BilinearAttentionMLP:         # scores of order one, so σ's kinks are crossed
        with torch.no_grad():
            layer.interaction.mul_(5.0)
    return layer


CASES = [(cls, act, rank) for cls in ALL for act in INPLACE for rank in ((1, 3) if cls in RANK_R else (1,))]


@pytest.mark.parametrize("cls,act,rank", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_an_inplace_activation_gives_the_plain_formula(cls, act, rank):
    module, f = INPLACE[act]
    layer = _layer(cls, module(), rank)
    x = torch.randn(11, 5, dtype=F64, generator=torch.Generator().manual_seed(4)) * 2
    x_before = x.clone()
    params = [p for p in layer.parameters()]
    with torch.no_grad():
        want = _plain(layer, x, f)
        got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, x_before), "the layer wrote into its input"

    # training: the output and every gradient against the plain formula's
    xg = x.clone().requires_grad_(True)
    y = layer(xg)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [xg, *params], gy)
    xr = x.clone().requires_grad_(True)
    yr = _plain(layer, xr, f)
    want_grads = torch.autograd.grad(yr, [xr, *params], gy)
    torch.testing.assert_close(y.detach(), yr.detach(), rtol=1e-12, atol=1e-12)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_without_overwrite_keeps_registered_functions_and_copies_for_others():
    from qkmlp import get_activation

    silu = get_activation("silu")
    assert without_overwrite(silu) is silu
    assert without_overwrite(F.relu) is F.relu
    relu_ = nn.ReLU(inplace=True)
    z = torch.tensor([-1.0, 2.0])
    out = without_overwrite(relu_)(z)
    assert torch.equal(z, torch.tensor([-1.0, 2.0]))
    assert torch.equal(out, torch.tensor([0.0, 2.0]))
