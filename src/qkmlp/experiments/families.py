"""The layer families the experiments compare, built at matched parameter counts.

A family is a layer class, a rank and an activation. Kinds: ``kv`` (key-value MLP
σ(xKᵀ)V), ``sym`` (symmetric σ(Σ_s (x·q)(x·k))), ``gated`` (Σ_s σ(x·q)(x·k)) and ``symgated``
(the symmetrised gated layer Σ_s ½[σ(x·q)(x·k) + σ(x·k)(x·q)], :class:`~qkmlp.SymmetrizedGatedMLP`:
the exact q ↔ k-symmetric control of the gated layer, same σ on the same linear forms). The **matching rule**: every family
gets the hidden width m that brings its parameter count closest to a budget B, where B is
the parameter count of the key-value MLP of width ``m_kv``:

- key-value MLP:            params = m (d_in + d_out)
- symmetric / gated rank r: params = m (2 r d_in + d_out)

so for d_in = d_out = d a rank-1 layer gets m = 2 m_kv / 3, Shazeer's 2/3 rule for
two-projection layers (Shazeer 2020, "GLU Variants Improve Transformer"), and rank r gets m = 2 m_kv / (2r + 1).
Widths are rounded to the nearest integer (at least 1); the actual counts are recorded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from .._checks import positive_int
from ..layers import GatedMLP, KeyValueMLP, SymmetricBilinearMLP, SymmetrizedGatedMLP

__all__ = ["Family", "FAMILIES", "family_names", "get_family", "hidden_width", "make_layer", "kv_budget"]


@dataclass(frozen=True)
class Family:
    """One layer family: ``kind`` in {"kv", "sym", "gated", "symgated"}, a rank and an activation name."""

    name: str
    kind: str
    rank: int
    activation: str
    label: str

    @property
    def rows_per_slot(self) -> int:
        """Input projections per hidden unit: 1 for key-value, 2r for the factored forms."""
        return 1 if self.kind == "kv" else 2 * self.rank


def _fam(name, kind, rank, act, label):
    return name, Family(name, kind, rank, act, label)


FAMILIES: dict[str, Family] = dict([
    _fam("kv-relu", "kv", 1, "relu", "key-value ReLU"),
    _fam("kv-gelu", "kv", 1, "gelu", "key-value GELU"),
    _fam("kv-silu", "kv", 1, "silu", "key-value Swish"),
    _fam("sym1-silu", "sym", 1, "silu", "symmetric SiLU"),
    _fam("sym1-gelu", "sym", 1, "gelu", "symmetric GELU"),
    _fam("sym1-relu", "sym", 1, "relu", "symmetric ReLU"),
    _fam("sym1-identity", "sym", 1, "identity", "symmetric identity"),
    _fam("gated1-silu", "gated", 1, "silu", "SwiGLU"),
    _fam("gated1-gelu", "gated", 1, "gelu", "GEGLU"),
    _fam("gated1-relu", "gated", 1, "relu", "ReGLU"),
    _fam("gated1-identity", "gated", 1, "identity", "bilinear"),
    _fam("gated1-sigmoid", "gated", 1, "sigmoid", "GLU"),
    _fam("symgated1-silu", "symgated", 1, "silu", "symmetrised SwiGLU"),
    _fam("symgated1-gelu", "symgated", 1, "gelu", "symmetrised GEGLU"),
    _fam("symgated1-relu", "symgated", 1, "relu", "symmetrised ReGLU"),
    _fam("symgated1-sigmoid", "symgated", 1, "sigmoid", "symmetrised GLU"),
    _fam("sym2-silu", "sym", 2, "silu", "symmetric SiLU r=2"),
    _fam("sym4-silu", "sym", 4, "silu", "symmetric SiLU r=4"),
    _fam("gated2-silu", "gated", 2, "silu", "SwiGLU r=2"),
    _fam("gated4-silu", "gated", 4, "silu", "SwiGLU r=4"),
    _fam("symgated2-silu", "symgated", 2, "silu", "symmetrised SwiGLU r=2"),
])


def family_names(kinds: Optional[tuple[str, ...]] = None, max_rank: Optional[int] = None) -> list[str]:
    """Family names in the canonical order, optionally filtered by kind and rank."""
    return [
        n for n, f in FAMILIES.items()
        if (kinds is None or f.kind in kinds) and (max_rank is None or f.rank <= max_rank)
    ]


def get_family(name) -> Family:
    if isinstance(name, Family):
        return name
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def kv_budget(d_in: int, d_out: int, m_kv: int) -> int:
    """Parameter budget B = m_kv (d_in + d_out): the key-value MLP of width m_kv."""
    for v, n in ((d_in, "d_in"), (d_out, "d_out"), (m_kv, "m_kv")):
        positive_int(v, n)
    return m_kv * (d_in + d_out)


def hidden_width(family, d_in: int, d_out: int, budget: int) -> int:
    """The width m whose parameter count m (rows_per_slot·d_in + d_out) is closest to ``budget``."""
    fam = get_family(family)
    positive_int(budget, "budget")
    per_unit = fam.rows_per_slot * d_in + d_out
    return max(1, round(budget / per_unit))


def make_layer(family, d_in: int, d_out: int, budget: int, *, device=None, dtype=None) -> nn.Module:
    """Build the layer of ``family`` mapping (..., d_in) -> (..., d_out) at ``budget`` parameters.

    Uses the global torch RNG for the initialisation (seed it first).
    """
    fam = get_family(family)
    m = hidden_width(fam, d_in, d_out, budget)
    fk = {"device": device, "dtype": dtype}
    if fam.kind == "kv":
        return KeyValueMLP(d_in, m, d_out, activation=fam.activation, **fk)
    cls = {"sym": SymmetricBilinearMLP, "gated": GatedMLP, "symgated": SymmetrizedGatedMLP}[fam.kind]
    return cls(d_in, m, d_out, rank=fam.rank, activation=fam.activation, **fk)

