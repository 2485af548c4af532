"""Optional fused C++ kernels for the elementwise middle of the rank-1 layers on CPU.

Eager PyTorch runs the middle of a fused layer as separate elementwise ops, each a pass
over an (N, m) block of memory: two in forward (σ(a), then ·b) and five in backward,
where σ(a) and h are recomputed. The kernels in ``csrc/fused_mlp.cpp`` do each in one
pass (see that file for the formulas); on CPUs that is the remaining cost of the
recomputation that halves the activations saved for backward (chapter 9).

They are **opt-in**, because they are compiled on first use (about 20 s, needs a C++
compiler and ninja; the build is cached under ``~/.cache/torch_extensions``)::

    import qkmlp
    qkmlp.cpu_kernels.enable()      # True when built and on; False (with a warning) if not

Once enabled, :func:`qkmlp.functional.gated` and :func:`~qkmlp.functional.symmetric` use
them for rank 1, float32 or float64, CPU tensors, activations in :data:`KERNEL_ACTIVATIONS`,
in eager mode; everything else (other ranks, dtypes or activations, CUDA, ``torch.compile``,
``torch.func`` transforms, double backward) takes the plain PyTorch path as before. Results
agree with that path to rounding (the kernels' exp and erf round differently from ATen's).
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

__all__ = ["KERNEL_ACTIVATIONS", "enable", "disable", "enabled", "available", "use", "build_error", "applies",
           "gated_forward", "gated_backward", "symmetric_forward", "symmetric_backward"]

#: Activation names the kernels implement (code passed to C++ in this order).
KERNEL_ACTIVATIONS: tuple[str, ...] = ("identity", "relu", "silu", "gelu")
_CODE = {name: i for i, name in enumerate(KERNEL_ACTIVATIONS)}

_SOURCE = Path(__file__).with_name("csrc") / "fused_mlp.cpp"
# -ffast-math lets gcc call glibc's vectorised exp/erf (libmvec); NaN is tested on the bits.
_FLAGS = ["-O3", "-fopenmp", "-ffast-math"]
# Instruction sets from the capability torch itself detected, not -march=native: the build
# cache may be shared with other machines, so the capability is also part of the name.
_ISA = {"AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"],
        "AVX2": ["-mavx2", "-mfma"]}

_ext = None          # the loaded extension module
_on = False
_error: str | None = None


def _load():
    global _ext, _error
    if _ext is None and _error is None:
        try:
            from torch.utils.cpp_extension import load
            cap = torch.backends.cpu.get_cpu_capability()
            _ext = load(name=f"qkmlp_fused_mlp_{cap.lower()}", sources=[str(_SOURCE)],
                        extra_cflags=_FLAGS + _ISA.get(cap, []), extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as e:                       # no compiler, no ninja, build error, ...
            _error = f"{type(e).__name__}: {e}"
    return _ext


def enable() -> bool:
    """Build (or load the cached build of) the kernels and use them; False if that failed."""
    global _on
    if _load() is None:
        warnings.warn(f"qkmlp.cpu_kernels could not be built; the layers use plain PyTorch. {_error}",
                      RuntimeWarning, stacklevel=2)
        return False
    _on = True
    return True


def disable() -> None:
    """Go back to the plain PyTorch elementwise ops."""
    global _on
    _on = False


def enabled() -> bool:
    """Whether the kernels are on."""
    return _on


def available() -> bool:
    """Build (or load) the kernels without turning them on; whether that worked."""
    return _load() is not None


@contextlib.contextmanager
def use(on: bool = True):
    """Within the block, the kernels are on (``on=True``; they must be :func:`available`) or
    off; the previous state is restored afterwards."""
    global _on
    if on and not available():
        raise RuntimeError(f"qkmlp.cpu_kernels are not available: {_error}")
    before, _on = _on, on
    try:
        yield
    finally:
        _on = before


def build_error() -> str | None:
    """Why the last build failed, or None."""
    return _error


def applies(name: str, *ts: torch.Tensor) -> bool:
    """Whether the kernels are on and cover activation ``name`` for these tensors
    (CPU, float32 or float64; the caller checks rank 1 and eager mode)."""
    t = ts[0]
    return (_on and name in _CODE and t.device.type == "cpu"
            and t.dtype in (torch.float32, torch.float64) and all(u.dtype == t.dtype for u in ts))


def gated_forward(a: torch.Tensor, b: torch.Tensor, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """h = σ(a)·b, all of one shape; ``out`` may be ``a`` itself."""
    out = torch.empty_like(a) if out is None else out
    _ext.gated_forward(a, b, out, _CODE[name])
    return out


def gated_backward(a, b, dh_db, da, h, name: str) -> None:
    """da = dh·b·σ'(a), db = dh·σ(a) written over dh, and h = σ(a)·b."""
    _ext.gated_backward(a, b, dh_db, da, h, _CODE[name])


def symmetric_forward(a: torch.Tensor, b: torch.Tensor, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """h = σ(a·b); ``out`` may be ``a`` itself."""
    out = torch.empty_like(a) if out is None else out
    _ext.symmetric_forward(a, b, out, _CODE[name])
    return out


def symmetric_backward(a, b, dh_db, da, h, name: str) -> None:
    """With p = a·b: da = dh·σ'(p)·b, db = dh·σ'(p)·a written over dh, and h = σ(p)."""
    _ext.symmetric_backward(a, b, dh_db, da, h, _CODE[name])
