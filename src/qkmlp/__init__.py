"""qkmlp: gated MLPs as symmetry-broken rank-1 bilinear attention.

Layers (all map (..., d_model) -> (..., d_out)):
:class:`KeyValueMLP`, :class:`StaticQueryMLP`, :class:`BilinearAttentionMLP`,
:class:`SymmetricBilinearMLP`, :class:`GatedMLP`, :class:`SymmetrizedGatedMLP`.
Activations: :func:`get_activation`.
Symmetry transforms and theorems: :mod:`qkmlp.symmetry`.

``import qkmlp`` loads the layer library only (torch and numpy; no plotting, widget,
transformers or scipy module). The subpackages are imported by name:
:mod:`qkmlp.experiments` (chapter 8's training experiments), :mod:`qkmlp.pretrained`
(chapter 9's SmolLM2-135M), :mod:`qkmlp.bench` (chapter 10's benchmarks) and
:mod:`qkmlp.book` (the chapters' constructed examples, figures and explorers).
"""
from .activations import ACTIVATIONS, ALIASES, Activation, activation_names, get_activation
from .layers import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)
from . import costs, functional, symmetry, training

__version__ = "0.1.0"


__all__ = [
    "ACTIVATIONS",
    "ALIASES",
    "Activation",
    "activation_names",
    "get_activation",
    "KeyValueMLP",
    "StaticQueryMLP",
    "BilinearAttentionMLP",
    "SymmetricBilinearMLP",
    "GatedMLP",
    "SymmetrizedGatedMLP",
    "costs",
    "functional",
    "symmetry",
    "training",
    "__version__",
]

