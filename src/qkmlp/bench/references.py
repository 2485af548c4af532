"""The reference candidates the layers are timed against.

- :class:`LlamaMLP`: what a user would otherwise write (Hugging Face's ``LlamaMLP``).
- :class:`SiLUMul` and :func:`liger_style_mlp`: the Llama MLP's function with
  Liger-Kernel's saved set, in plain PyTorch; Liger-Kernel's own fused SiLU·mul where it
  is importable (CUDA only).
- :class:`ResidualBlock` and :func:`make_mlp`: the pre-norm residual block of the stack
  suite and the MLP kinds it is built from.
- The bare GEMMs of a rank-1 layer, forward and forward + backward: the floor.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import GatedMLP, SymmetricBilinearMLP

__all__ = ["LlamaMLP", "SiLUMul", "liger_style_mlp", "liger_swiglu", "ResidualBlock", "make_mlp", "floor_gemms"]


class LlamaMLP(nn.Module):
    """What a user would otherwise write (HF ``LlamaMLP``): down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, d_hidden: int, *, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype, "bias": False}
        self.gate_proj = nn.Linear(d_model, d_hidden, **fk)
        self.up_proj = nn.Linear(d_model, d_hidden, **fk)
        self.down_proj = nn.Linear(d_hidden, d_model, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SiLUMul(torch.autograd.Function):
    """Liger-Kernel's SwiGLU memory rule in PyTorch ops: silu(a)·b that saves a and b only
    and recomputes silu(a) in backward (Hsu et al., 2024), so a Llama MLP built on it
    keeps x, a, b and the product for backward, d + 3m numbers per token against the
    plain MLP's d + 4m. ``SiLUMul.apply(a, b)``: a, b of one shape -> silu(a)·b."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        if torch.is_grad_enabled():        # create_graph: the derivative in autograd ops
            sig = torch.sigmoid(a)
            return grad * b * sig * (1 + a * (1 - sig)), grad * F.silu(a)
        return torch.ops.aten.silu_backward(grad * b, a), grad * F.silu(a)


def liger_style_mlp(llama: LlamaMLP) -> Callable[[torch.Tensor], torch.Tensor]:
    """x ↦ down(SiLUMul(gate(x), up(x))) with ``llama``'s three linears: the Llama MLP's
    function with Liger-Kernel's saved set (:class:`SiLUMul`), in plain PyTorch."""

    def f(x):
        return llama.down_proj(SiLUMul.apply(llama.gate_proj(x), llama.up_proj(x)))

    return f


def liger_swiglu(llama: LlamaMLP) -> Optional[Callable]:
    """Liger-Kernel's fused SiLU·mul between the same three linears, if importable (CUDA only)."""
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction  # type: ignore
    except Exception:
        return None

    def f(x):
        return llama.down_proj(LigerSiLUMulFunction.apply(llama.gate_proj(x), llama.up_proj(x)))

    return f


class ResidualBlock(nn.Module):
    """x + mlp(RMSNorm(x)): one pre-norm residual block without attention."""

    def __init__(self, mlp: nn.Module, d: int, **fk):
        super().__init__()
        self.norm = nn.RMSNorm(d, **fk)
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def make_mlp(kind: str, d: int, m: int, **fk) -> nn.Module:
    """A ``LlamaMLP``, rank-1 ``GatedMLP`` or ``SymmetricBilinearMLP`` of widths d, m by name."""
    if kind == "llama_mlp":
        return LlamaMLP(d, m, **fk)
    if kind == "gated_mlp":
        return GatedMLP(d, m, **fk)
    if kind == "symmetric_mlp":
        return SymmetricBilinearMLP(d, m, **fk)
    raise ValueError(f"kind must be llama_mlp, gated_mlp or symmetric_mlp, got {kind!r}")


def floor_gemms(x, gy, h, ga, gb, w_q, w_k, v):
    """The bare GEMMs of (ch10-eq-two-gemms) as two closures: forward (x·Qᵀ and x·Kᵀ by
    halves, H·V) and forward + backward (also dH, dW_qk by halves, dX, dV). Shapes: x, gy
    (N, d); h, ga, gb (N, m); w_q, w_k (m, d); v (m, d)."""
    def floor():
        x @ w_q.T
        x @ w_k.T
        h @ v

    def floor_fwd_bwd():
        floor()
        gy @ v.T
        ga.T @ x
        gb.T @ x
        (ga @ w_q).addmm_(gb, w_k)
        h.T @ gy

    return floor, floor_fwd_bwd
