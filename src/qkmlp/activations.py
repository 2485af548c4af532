"""Activation registry: name -> callable with the properties the symmetry theorems need.

Every activation is a :class:`Activation`: a callable ``σ(z)`` (elementwise, any shape)
carrying three facts used by :mod:`qkmlp.symmetry`:

- ``is_linear``: σ(z) = c·z for a constant c (then every symmetry of the bilinear form
  survives gating);
- ``homogeneity_degree``: the p with σ(c·z) = cᵖ·σ(z) for every c > 0, or ``None``;
- ``is_odd``: σ(−z) = −σ(z) (then the gated form keeps the sign flip q → −q, k → −k).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F

__all__ = ["Activation", "get_activation", "ACTIVATIONS", "ALIASES", "activation_names", "activation_of_mlp",
           "without_overwrite"]


@dataclass(frozen=True)
class Activation:
    """An elementwise activation σ with the properties the theorems depend on."""

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor] = field(repr=False, compare=False)
    is_linear: bool = False
    homogeneity_degree: Optional[float] = None
    is_odd: bool = False

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return self.fn(z)

    def __reduce__(self):
        # A registered activation copies (deepcopy, pickle, torch.save) to the registry's
        # own object, so a copied layer keeps its fused path; others copy field by field.
        if ACTIVATIONS.get(self.name) is self:
            return (get_activation, (self.name,))
        return (Activation, (self.name, self.fn, self.is_linear, self.homogeneity_degree, self.is_odd))


def _relu2(z: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(z))


def _gelu_tanh(z: torch.Tensor) -> torch.Tensor:
    return F.gelu(z, approximate="tanh")


def _softplus(z: torch.Tensor) -> torch.Tensor:
    """log(1 + eᶻ) for every z, computed stably as logaddexp(z, 0). F.softplus returns z
    itself above its threshold 20 (a jump of about 2e-9 there, and σ(z) − z ≡ 0 beyond it,
    which chapter 7's hypotheses exclude); in float32 the two round to the same numbers
    above the threshold, in float64 this one keeps the e⁻ᶻ tail."""
    return torch.logaddexp(z, torch.zeros((), dtype=z.dtype, device=z.device))


# Each as torch.nn.functional defines it, with its default arguments (leaky_relu:
# negative_slope=0.01), except softplus, which has no threshold (_softplus).
ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in [
        Activation("identity", lambda z: z, is_linear=True, homogeneity_degree=1, is_odd=True),
        Activation("relu", F.relu, homogeneity_degree=1),
        Activation("leaky_relu", F.leaky_relu, homogeneity_degree=1),
        Activation("gelu", F.gelu),
        Activation("gelu_tanh", _gelu_tanh),
        Activation("silu", F.silu),
        Activation("tanh", torch.tanh, is_odd=True),
        Activation("sigmoid", torch.sigmoid),
        Activation("softplus", _softplus),
        Activation("relu2", _relu2, homogeneity_degree=2),
    ]
}


#: Hugging Face's names (``config.hidden_act``) for the same functions.
ALIASES: dict[str, str] = {
    "swish": "silu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}


def activation_names() -> list[str]:
    """The registered activation names, in registry order."""
    return list(ACTIVATIONS)


def get_activation(
    activation: Union[str, Activation, Callable[[torch.Tensor], torch.Tensor]],
    *,
    is_linear: bool = False,
    homogeneity_degree: Optional[float] = None,
    is_odd: bool = False,
) -> Activation:
    """Return the :class:`Activation` for a registry name, or wrap a callable.

    Hugging Face's names ``swish``, ``gelu_new`` and ``gelu_pytorch_tanh`` are aliases
    (:data:`ALIASES`): they return the registered ``silu`` and ``gelu_tanh`` objects.

    A plain callable has unknown properties; the keyword arguments declare them (they
    default to the conservative "no symmetry": not linear, not homogeneous, not odd).
    They are ignored for registry names and :class:`Activation` instances. A class (such
    as ``nn.SiLU``) is rejected: pass an instance (``nn.SiLU()``) or a name (``"silu"``).

    >>> get_activation("relu").homogeneity_degree
    1
    """
    if isinstance(activation, Activation):
        return activation
    if isinstance(activation, str):
        try:
            return ACTIVATIONS[ALIASES.get(activation, activation)]
        except KeyError:
            raise ValueError(
                f"unknown activation {activation!r}; expected one of "
                f"{', '.join(ACTIVATIONS)} (aliases: {', '.join(ALIASES)}) or a callable"
            ) from None
    if isinstance(activation, type):
        raise TypeError(
            f"activation must be a name or a callable instance, got the class {activation.__name__}; "
            f"pass an instance ({activation.__name__}()) or a name ({', '.join(ACTIVATIONS)})"
        )
    if callable(activation):
        name = getattr(activation, "__name__", None) or type(activation).__name__
        if homogeneity_degree is None and is_linear:
            homogeneity_degree = 1
        return Activation(
            name,
            activation,
            is_linear=is_linear,
            homogeneity_degree=homogeneity_degree,
            is_odd=is_odd or is_linear,
        )
    raise TypeError(
        f"activation must be a name ({', '.join(ACTIVATIONS)}) or a callable, "
        f"got {type(activation).__name__}"
    )


def without_overwrite(activation: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``activation`` as a callable that leaves its argument as it was.

    The registered functions (and an :class:`Activation` wrapping one) are returned as they
    are: none writes its input. Any other callable may (``nn.ReLU(inplace=True)``,
    ``nn.SiLU(inplace=True)``, ``nn.ELU(inplace=True)``, ...): it is applied to a copy, so a
    formula that reads z again after σ(z) (the symmetrised gated layer reads a in σ(b)·a
    after σ(a)) reads z, not σ(z). The copy changes no value and no gradient."""
    fn = getattr(activation, "fn", activation) if isinstance(activation, Activation) else activation
    if any(fn is a.fn for a in ACTIVATIONS.values()):
        return activation
    return lambda z: activation(z.clone())


# --- reading σ off a module that carries it (GatedMLP.from_mlp) -------------------------

def _nn_module_name(fn) -> Optional[str]:
    """The registered name of a ``torch.nn`` activation module (or registered function) that
    computes exactly that activation, else None. Nothing is inferred from behaviour."""
    from torch import nn

    for name, act in ACTIVATIONS.items():
        if fn is act.fn:
            return name
    simple = {nn.SiLU: "silu", nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Identity: "identity"}
    t = type(fn)
    if t in simple:
        return simple[t]
    if t is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(fn.approximate)
    if t is nn.LeakyReLU and fn.negative_slope == 0.01:
        return "leaky_relu"
    if t is nn.Softplus and fn.beta == 1 and fn.threshold == 20:
        return "softplus"
    return None


def _computes(fn, act: Activation) -> bool:
    """Whether ``fn`` agrees with ``act`` to 1e-6 on 257 points of [-8, 8] in float64 (a check
    of a declared name against the module that was built from it, never a search)."""
    z = torch.linspace(-8.0, 8.0, 257, dtype=torch.float64)
    try:
        with torch.no_grad():
            got = fn(z)
    except Exception:       # noqa: BLE001 - a module that cannot run on this probe is not confirmed
        return False
    want = act(z)
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.to(torch.float64), want, rtol=1e-6, atol=1e-6))


def activation_of_mlp(mlp) -> Activation:
    """The activation σ of a gate/up/down MLP module, read from what the module carries.

    - ``mlp.act_fn`` a ``torch.nn`` module computing a registered activation exactly
      (``nn.SiLU``, ``nn.ReLU``, ``nn.GELU``, ``nn.Tanh``, ``nn.Sigmoid``, ``nn.Identity``,
      ``nn.LeakyReLU(0.01)``, ``nn.Softplus()``) or a registered function (``F.silu``): that one;
    - else a name in ``mlp.config`` (Hugging Face: ``hidden_activation``, then ``hidden_act``):
      the first one that ``mlp.act_fn``, when the module has one, is checked to compute
      (to 1e-6 on [-8, 8]; a replaced or mismatched ``act_fn`` is caught here).

    Anything else raises ValueError asking for ``activation=``: σ is never guessed.
    """
    act_fn = getattr(mlp, "act_fn", None)
    name = _nn_module_name(act_fn) if act_fn is not None else None
    if name is not None:
        return ACTIVATIONS[name]
    config = getattr(mlp, "config", None)
    declared = [(attr, v) for attr in ("hidden_activation", "hidden_act")
                if isinstance(v := getattr(config, attr, None), str)]
    what = type(mlp).__name__
    for attr, v in declared:
        try:
            act = get_activation(v)
        except ValueError:
            continue
        if act_fn is None or _computes(act_fn, act):
            return act
    said = ", ".join(f"config.{a} = {v!r}" for a, v in declared) or "no config.hidden_act"
    has = f"act_fn is a {type(act_fn).__name__} that qkmlp cannot confirm" if act_fn is not None else "no act_fn"
    raise ValueError(
        f"cannot read the activation of this {what} ({has}; {said}); pass activation= "
        f"explicitly (one of {', '.join(ACTIVATIONS)}, a Hugging Face alias, or a callable "
        f"such as activation=mlp.act_fn, which then runs as given)"
    )
