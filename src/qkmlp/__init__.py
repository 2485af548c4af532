"""qkmlp: gated MLPs as symmetry-broken rank-1 bilinear attention.

Layers (all map (..., d_model) -> (..., d_out)):
:class:`KeyValueMLP`, :class:`StaticQueryMLP`, :class:`BilinearAttentionMLP`,
:class:`SymmetricBilinearMLP`, :class:`GatedMLP`, :class:`SymmetrizedGatedMLP`.
Activations: :func:`get_activation`.
Symmetry transforms and theorems: :mod:`qkmlp.symmetry`.
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
from . import costs, figures, functional, symmetry, training

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
    "figures",
    "symmetry",
    "training",
    "__version__",
]
