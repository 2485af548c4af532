"""The five layers of the book, from the key-value MLP to the gated MLP.

Notation (see the book's introduction): a token is a row vector x of width d = d_model;
m = d_hidden memory slots; r = rank; d_out = output width (default d). No layer has
biases: append a constant coordinate to x to get one.

Initialisation (``reset_parameters``), chosen so that at d_out = d the output has the
scale of a default ``nn.Linear`` stack:

- ``key``, ``query`` (factors of a linear or bilinear score): U(-1/√d, 1/√d), like
  ``nn.Linear``'s weight with fan-in d;
- ``StaticQueryMLP.query`` (d, d): identity plus U(-1/√d, 1/√d)/√d, so that training
  starts near the plain key-value MLP;
- ``interaction`` A_j (d, d): U(-1/d, 1/d), the scale of a product q_jᵀk_j of two such
  vectors;
- ``value``: U(-1/√m, 1/√m), fan-in m of the down projection.

The rank-r layers (:class:`SymmetricBilinearMLP`, :class:`GatedMLP`,
:class:`SymmetrizedGatedMLP`) store query and key in ``nn.Linear``'s layout, as the
parameters ``query_weight`` and ``key_weight`` (m·r, d), and expose ``query`` and ``key``
(m, r, d) as writable views of them; ``value`` (m, d_out) is a parameter.
Their forward pass is the fused two-GEMM path of :mod:`qkmlp.functional`.
In float16 and bfloat16 every layer runs its matrix products in that dtype and σ (and
the factored layers' products) in float32.

Rules every layer follows:

- **Input.** A floating-point tensor of shape (..., d_model) on the layer's device, in the
  layer's dtype (outside ``torch.autocast``, which casts as usual); anything else raises
  a ``TypeError`` or ``ValueError`` that names what was expected. Sizes are integers
  (Python or NumPy) >= 1. The output is a tensor of its own, never a view.
- **Views of the weights** (rank-r layers). ``layer.query`` and ``layer.key`` are views:
  read them, write into them in place (``copy_``, ``nn.init.*_``, ``layer.query[0] = ...``)
  or assign ``layer.query = t`` (copies t in). Everything that concerns the parameter
  itself goes through ``query_weight`` and ``key_weight``: freezing the gate alone is
  ``layer.query_weight.requires_grad_(False)`` (``layer.query.requires_grad_`` raises, a
  view is not a leaf), and replacing storage is ``layer.query_weight = nn.Parameter(...)``
  or ``layer.query_weight.data = ...`` (``layer.query.data = ...`` would only rebind the
  temporary view: it changes nothing).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from . import functional as _fn
from ._checks import positive_int as _positive_int
from .activations import Activation, get_activation

__all__ = [
    "KeyValueMLP",
    "StaticQueryMLP",
    "BilinearAttentionMLP",
    "SymmetricBilinearMLP",
    "GatedMLP",
    "SymmetrizedGatedMLP",
]


class _QKMLPBase(nn.Module):
    """Shared plumbing: sizes, activation, input checks, repr."""

    def __init__(self, d_model: int, d_hidden: int, d_out: Optional[int], activation) -> None:
        super().__init__()
        self.d_model = _positive_int(d_model, "d_model")
        self.d_hidden = _positive_int(d_hidden, "d_hidden")
        self.d_out = self.d_model if d_out is None else _positive_int(d_out, "d_out")
        self.activation: Activation = get_activation(activation)

    def _layer_dtype_device(self):
        """(dtype, device) of the weights (every layer keeps all weights on one of each)."""
        w = self.value
        return w.dtype, w.device

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape (..., {self.d_model}), got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(
                f"expected a floating-point input (float16, bfloat16, float32 or float64), got {x.dtype}"
            )
        if x.dim() == 0 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"expected input of shape (..., d_model={self.d_model}), got {tuple(x.shape)}"
            )
        dtype, device = self._layer_dtype_device()
        if x.device != device:
            raise ValueError(
                f"input is on {x.device} but the layer's weights are on {device}; move one of them "
                f"(x.to({str(device)!r}) or layer.to({str(x.device)!r}))"
            )
        if x.dtype != dtype and not (
            torch.amp.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type)
        ):
            raise TypeError(
                f"input dtype {x.dtype} does not match the layer's dtype {dtype}; convert the input "
                f"(x.to({dtype})) or the layer (layer.to({x.dtype}))"
            )

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"d_hidden={self.d_hidden}", f"d_out={self.d_out}"]
        if hasattr(self, "rank"):
            parts.append(f"rank={self.rank}")
        parts.append(f"activation={self.activation.name}")
        return ", ".join(parts)

    def _act(self, z: torch.Tensor) -> torch.Tensor:
        """σ(z), computed in float32 when z is float16 or bfloat16, returned in z's dtype."""
        cdt = _fn.compute_dtype(z.dtype)
        return self.activation(z) if cdt == z.dtype else self.activation(z.to(cdt)).to(z.dtype)

    def _new_value(self, factory_kwargs) -> nn.Parameter:
        return nn.Parameter(torch.empty(self.d_hidden, self.d_out, **factory_kwargs))

    def _init_value(self) -> None:
        bound = 1.0 / math.sqrt(self.d_hidden)
        nn.init.uniform_(self.value, -bound, bound)


class KeyValueMLP(_QKMLPBase):
    """The transformer FFN read as memory: σ(xKᵀ)V = Σ_j σ(x·k_j) v_j.

    Parameters: ``key`` (m, d) = W₁, ``value`` (m, d_out) = W₂.
    Shapes: (..., d) -> (..., d_out).
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, activation="relu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, activation)
        fk = {"device": device, "dtype": dtype}
        self.key = nn.Parameter(torch.empty(self.d_hidden, self.d_model, **fk))
        self.value = self._new_value(fk)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.d_model)
        nn.init.uniform_(self.key, -bound, bound)
        self._init_value()

    def coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """Memory coefficients σ(xKᵀ): (..., d) -> (..., m)."""
        self._check_input(x)
        return self._act(x @ self.key.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.coefficients(x) @ self.value


class StaticQueryMLP(_QKMLPBase):
    """One global query map in front of the keys: σ(xQKᵀ)V.

    Parameters: ``query`` (d, d), ``key`` (m, d), ``value`` (m, d_out).
    ``absorbed()`` returns the equal :class:`KeyValueMLP` with keys K' = KQᵀ.
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, activation="relu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, activation)
        fk = {"device": device, "dtype": dtype}
        self.query = nn.Parameter(torch.empty(self.d_model, self.d_model, **fk))
        self.key = nn.Parameter(torch.empty(self.d_hidden, self.d_model, **fk))
        self.value = self._new_value(fk)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.d_model)
        nn.init.uniform_(self.key, -bound, bound)
        with torch.no_grad():
            nn.init.uniform_(self.query, -bound / math.sqrt(self.d_model), bound / math.sqrt(self.d_model))
            if self.query.device.type != "meta":
                self.query.add_(torch.eye(self.d_model, device=self.query.device, dtype=self.query.dtype))
        self._init_value()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self._act((x @ self.query) @ self.key.T) @ self.value

    @torch.no_grad()
    def absorbed(self) -> KeyValueMLP:
        """The key-value MLP with keys KQᵀ: same function, no query."""
        kv = KeyValueMLP(
            self.d_model, self.d_hidden, self.d_out, activation=self.activation,
            device=self.key.device, dtype=self.key.dtype,
        )
        kv.key.copy_(self.key @ self.query.T)
        kv.value.copy_(self.value)
        return kv


class BilinearAttentionMLP(_QKMLPBase):
    """Bilinear attention over memory slots: Σ_j σ(x A_j xᵀ) v_j, with A_j = Q_j K_jᵀ.

    Parameters: ``interaction`` (m, d, d) = A_j stored densely, ``value`` (m, d_out).
    This is the costly form: m·d² parameters and m·d² multiply-adds per token.
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, activation)
        fk = {"device": device, "dtype": dtype}
        self.interaction = nn.Parameter(torch.empty(self.d_hidden, self.d_model, self.d_model, **fk))
        self.value = self._new_value(fk)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / self.d_model
        nn.init.uniform_(self.interaction, -bound, bound)
        self._init_value()

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Bilinear scores x A_j xᵀ for every slot j: (..., d) -> (..., m)."""
        self._check_input(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_model)
        # (N, d) @ (d, m·d) -> (N, m, d), then contract the second index with x.
        xa = (x2 @ self.interaction.permute(1, 0, 2).reshape(self.d_model, -1)).view(
            -1, self.d_hidden, self.d_model
        )
        s = torch.einsum("nmd,nd->nm", xa, x2)
        return s.reshape(*lead, self.d_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._act(self.scores(x)) @ self.value


class _RankRBase(_QKMLPBase):
    """Rank-r factored forms: ``query`` and ``key`` (m, r, d), ``value`` (m, d_out).

    Storage: ``query_weight`` and ``key_weight`` (m·r, d) in ``nn.Linear``'s layout, row
    j·r + s holding q_{j,s} and k_{j,s} (at rank 1 exactly a Llama MLP's
    ``gate_proj.weight`` and ``up_proj.weight``), and ``value`` (m, d_out) = V. ``query``
    and ``key`` are (m, r, d) views of the first two. Generic initialisers
    (``for p in model.parameters(): nn.init.xavier_uniform_(p)``, ``normal_``,
    ``trunc_normal_``, ``orthogonal_``) then give a rank-1 layer the output scale they give
    a Llama MLP of the same size; an initialiser that reads fan-in from the shape
    (``kaiming_*`` with ``mode="fan_in"``) sees fan-in d_out for ``value`` where
    ``down_proj.weight`` (d_out, m) has m, so pass ``mode="fan_out"`` for ``value``.

    The forward pass uses the fused autograd functions of :mod:`qkmlp.functional` (two
    GEMMs, elementwise math in float32 for float16/bfloat16, only x and the
    pre-activations saved for backward) when the activation is a registered one and
    ``self.fused`` is true; otherwise, and wherever the fused path steps aside (``torch.func``
    transforms, forward-mode AD, tensor subclasses), the same formula in plain autograd.
    """

    _fused_fn = None        # set by subclasses: the qkmlp.functional fused function
    _reference_fn = None    # and its plain-autograd twin

    def __init__(self, d_model, d_hidden, d_out, rank, activation, device, dtype):
        super().__init__(d_model, d_hidden, d_out, activation)
        self.rank = _positive_int(rank, "rank")
        self.fused = True
        fk = {"device": device, "dtype": dtype}
        mr = self.d_hidden * self.rank
        self.query_weight = nn.Parameter(torch.empty(mr, self.d_model, **fk))
        self.key_weight = nn.Parameter(torch.empty(mr, self.d_model, **fk))
        self.value = self._new_value(fk)
        self.reset_parameters()

    _VIEWS = ("query", "key")

    @property
    def query(self) -> torch.Tensor:
        """q_{j,s} as ``query[j, s]``: (m, r, d), a writable view of ``query_weight``."""
        return self.query_weight.view(self.d_hidden, self.rank, self.d_model)

    @property
    def key(self) -> torch.Tensor:
        """k_{j,s} as ``key[j, s]``: (m, r, d), a writable view of ``key_weight``."""
        return self.key_weight.view(self.d_hidden, self.rank, self.d_model)

    def __setattr__(self, name, value):
        if name in self._VIEWS and "_parameters" in self.__dict__:
            self._assign_view(name, value)
        else:
            super().__setattr__(name, value)

    @torch.no_grad()
    def _assign_view(self, name: str, t) -> None:
        """``layer.query = t`` copies t's values into the parameter behind the view."""
        target = getattr(self, name)
        if isinstance(t, nn.Parameter):
            raise TypeError(
                f"layer.{name} is a view of the parameter {name}_weight; assign "
                f"layer.{name} = tensor to copy values in, or replace the parameter itself "
                f"(layer.{name}_weight = nn.Parameter(...), shape {tuple(getattr(self, name + '_weight').shape)})"
            )
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"layer.{name} takes a tensor of shape {tuple(target.shape)}, got {type(t).__name__}")
        if t.shape != target.shape:
            raise ValueError(f"layer.{name} has shape {tuple(target.shape)}, got a tensor of shape {tuple(t.shape)}")
        if (t.dtype, t.device) != (target.dtype, target.device):
            raise TypeError(f"layer.{name} is {target.dtype} on {target.device}, got {t.dtype} on {t.device}; "
                            f"convert first (nothing is cast silently)")
        target.copy_(t)

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.d_model)
        nn.init.uniform_(self.query_weight, -bound, bound)
        nn.init.uniform_(self.key_weight, -bound, bound)
        self._init_value()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Earlier layouts: query_key (2, m, r, d); query and key (m, r, d).
        m, r, d = self.d_hidden, self.rank, self.d_model
        old = {n: prefix + n for n in ("query_key", "query", "key")}
        new = {n: prefix + n + "_weight" for n in ("query", "key")}

        n_errors = len(error_msgs)

        def take(name, shape):
            t = state_dict.pop(old[name])
            if tuple(t.shape) != shape:
                error_msgs.append(f"size mismatch for {old[name]}: expected shape {shape} (the earlier "
                                  f"layout of this layer), got {tuple(t.shape)}")
                return None
            return t

        if old["query_key"] in state_dict and new["query"] not in state_dict:
            qk = take("query_key", (2, m, r, d))
            if qk is not None:
                state_dict[new["query"]], state_dict[new["key"]] = qk[0].reshape(m * r, d), qk[1].reshape(m * r, d)
        for n in ("query", "key"):
            if old[n] in state_dict and new[n] not in state_dict:
                t = take(n, (m, r, d))
                if t is not None:
                    state_dict[new[n]] = t.reshape(m * r, d)
        if len(error_msgs) > n_errors:
            return          # a malformed earlier layout: load nothing into this layer
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key projections x·q_{j,s}, x·k_{j,s}: (..., d) -> two (..., m, r)."""
        self._check_input(x)
        mr = self.d_hidden * self.rank
        ab = x @ torch.cat([self.query_weight, self.key_weight]).T     # one GEMM for both
        shape = (*x.shape[:-1], self.d_hidden, self.rank)
        return ab[..., :mr].reshape(shape), ab[..., mr:].reshape(shape)

    @torch.no_grad()
    def interactions(self) -> torch.Tensor:
        """The dense A_j = Σ_s q_{j,s}ᵀ k_{j,s}: (m, d, d)."""
        return torch.einsum("jsd,jse->jde", self.query, self.key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_model)
        q, k, v = self.query_weight, self.key_weight, self.value
        dev = x.device.type
        if torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
            # Autocast: GEMMs in the autocast dtype, elementwise math still in float32.
            dt = torch.get_autocast_dtype(dev)
            x2, q, k, v = x2.to(dt), q.to(dt), k.to(dt), v.to(dt)
        if self.fused and type(self)._fused_fn is not None and _fn.supports_fused(self.activation):
            y = type(self)._fused_fn(x2, q, k, v, self.activation.name)
        else:
            y = type(self)._reference_fn(x2, q, k, v, self.activation, self.d_hidden, self.rank)
        return _fresh_reshape(y, (*lead, self.d_out))


def _fresh_reshape(y: torch.Tensor, shape) -> torch.Tensor:
    """y reshaped to ``shape`` as a tensor of its own, not a view (as ``nn.Linear`` returns):
    an in-place op on the output (``y += x``) then needs no view bookkeeping, which FSDP2's
    hooks cannot follow. ``aten._unsafe_view`` is what ``torch.matmul`` itself returns."""
    return y if y.shape == shape else torch.ops.aten._unsafe_view(y, shape)


class SymmetricBilinearMLP(_RankRBase):
    """Symmetric rank-r bilinear MLP: Σ_j σ(Σ_s (x·q_{j,s})(x·k_{j,s})) v_j.

    σ sits outside the rank sum, so the layer equals :class:`BilinearAttentionMLP` with
    A_j = Σ_s q_{j,s}ᵀ k_{j,s} (``to_dense()``). Rank 1: σ((xQᵀ) ⊙ (xKᵀ))V.

    Weights: ``query`` and ``key`` (m, r, d) are writable views of the parameters
    ``query_weight`` and ``key_weight`` (m·r, d); ``value`` (m, d_out) is a parameter. The
    forward pass is two GEMMs (:mod:`qkmlp.functional`).
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, rank=1, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, rank, activation, device, dtype)

    _fused_fn = staticmethod(_fn.symmetric)
    _reference_fn = staticmethod(_fn.symmetric_reference)

    @torch.no_grad()
    def to_dense(self) -> BilinearAttentionMLP:
        """The equal dense bilinear attention MLP (A_j materialised)."""
        dense = BilinearAttentionMLP(
            self.d_model, self.d_hidden, self.d_out, activation=self.activation,
            device=self.value.device, dtype=self.value.dtype,
        )
        dense.interaction.copy_(self.interactions())
        dense.value.copy_(self.value)
        return dense


class GatedMLP(_RankRBase):
    """Gated rank-r MLP: Σ_j [Σ_s σ(x·q_{j,s})(x·k_{j,s})] v_j.

    Rank 1 is (σ(xQᵀ) ⊙ (xKᵀ))V: query = gate, key = up, value = downᵀ, so
    SwiGLU (silu), GEGLU (gelu), ReGLU (relu) and bilinear (identity) are all this layer.

    Weights: ``query`` and ``key`` (m, r, d) are writable views of the parameters
    ``query_weight`` and ``key_weight`` (m·r, d), which at rank 1 are exactly a Llama
    MLP's ``gate_proj.weight`` and ``up_proj.weight``; ``value`` (m, d_out) is
    ``down_proj.weight``ᵀ. The forward pass is two GEMMs (:mod:`qkmlp.functional`).
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, rank=1, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, rank, activation, device, dtype)

    _fused_fn = staticmethod(_fn.gated)
    _reference_fn = staticmethod(_fn.gated_reference)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear, *, activation="silu") -> "GatedMLP":
        """Load a Llama-style MLP ``down(σ(gate(x)) * up(x))`` as a rank-1 GatedMLP.

        gate_proj.weight (m, d) -> query[:, 0], up_proj.weight (m, d) -> key[:, 0],
        down_proj.weight (d_out, m) -> value = downᵀ (``query_weight`` and ``key_weight``
        get the first two as they are).
        The weights are copied. Biases are not supported; the three must share one dtype and
        device (TypeError otherwise; nothing is cast). On the meta device the layer is
        built on meta too, with no values to copy.
        """
        lins = (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj))
        for name, lin in lins:
            if not isinstance(lin, nn.Linear):
                raise TypeError(f"{name} must be an nn.Linear, got {type(lin).__name__}")
            if lin.bias is not None:
                raise ValueError(
                    f"{name} has a bias; GatedMLP has none (append a constant coordinate to x instead)"
                )
        kinds = {(lin.weight.dtype, lin.weight.device) for _, lin in lins}
        if len(kinds) != 1:
            raise TypeError(
                "gate_proj, up_proj and down_proj must share one dtype and device (nothing is cast); got "
                + ", ".join(f"{name} {lin.weight.dtype} on {lin.weight.device}" for name, lin in lins)
            )
        if not gate_proj.weight.is_floating_point():
            raise TypeError(f"the weights must be floating point, got {gate_proj.weight.dtype}")
        m, d = gate_proj.weight.shape
        if up_proj.weight.shape != (m, d):
            raise ValueError(f"up_proj.weight must have gate_proj's shape {(m, d)}, got {tuple(up_proj.weight.shape)}")
        if down_proj.weight.shape[1] != m:
            raise ValueError(f"down_proj must take {m} inputs (d_hidden), got {down_proj.weight.shape[1]}")
        w = gate_proj.weight
        layer = cls(d, m, down_proj.weight.shape[0], rank=1, activation=activation, device=w.device, dtype=w.dtype)
        layer.query.copy_(gate_proj.weight.unsqueeze(1))
        layer.key.copy_(up_proj.weight.unsqueeze(1))
        layer.value.copy_(down_proj.weight.T)
        return layer

    @torch.no_grad()
    def to_linear(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """``(gate_proj, up_proj, down_proj)``: bias-free ``nn.Linear``s with
        ``down(σ(gate(x)) * up(x))`` equal to this layer; the inverse of :meth:`from_linear`.

        Rank r gives m·r hidden units: unit j·r + s has gate q_{j,s}, up k_{j,s} and the
        down column v_j (each value repeated r times). Shapes: gate and up (m·r, d),
        down (d_out, m·r). The weights are copies, on this layer's device and dtype.
        """
        m, r, d = self.d_hidden, self.rank, self.d_model
        fk = {"device": self.value.device, "dtype": self.value.dtype}
        gate = nn.Linear(d, m * r, bias=False, **fk)
        up = nn.Linear(d, m * r, bias=False, **fk)
        down = nn.Linear(m * r, self.d_out, bias=False, **fk)
        gate.weight.copy_(self.query.reshape(m * r, d))
        up.weight.copy_(self.key.reshape(m * r, d))
        down.weight.copy_(self.value.repeat_interleave(r, dim=0).T)
        return gate, up, down


class SymmetrizedGatedMLP(_RankRBase):
    """The q ↔ k-symmetrised gated MLP: Σ_j [Σ_s ½(σ(x·q_{j,s})(x·k_{j,s})
    + σ(x·k_{j,s})(x·q_{j,s}))] v_j.

    The exact exchange-symmetric control of :class:`GatedMLP`: the same σ on the same
    linear forms and the same parameters, averaged over the swap q ↔ k, so swapping
    changes nothing for every σ. Same constructor and weights as :class:`GatedMLP`.
    Its forward pass is the plain formula in autograd (no fused path).
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, rank=1, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, rank, activation, device, dtype)

    _fused_fn = None
    _reference_fn = staticmethod(_fn.symmetrized_reference)
