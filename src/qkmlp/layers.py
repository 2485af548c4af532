"""The six layers of the book, from the key-value MLP to the gated MLP and its symmetrised control.

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

**Dtypes.** A layer holds float16, bfloat16, float32 or float64 weights (any other
``dtype=``, complex included, raises ``TypeError`` at construction). In float16 and
bfloat16 every layer runs its matrix products in that dtype. The rank-r layers run their
elementwise middle in it too, with a Llama MLP's op sequence (σ(a) rounded to the dtype,
then the product rounded to it; no float32 conversion): on CPU the rank-1 ``GatedMLP``
computes ``down(σ(gate(x)) * up(x))`` bit for bit (tests/test_bf16_parity.py). :class:`KeyValueMLP`, :class:`StaticQueryMLP`
and :class:`BilinearAttentionMLP` apply σ in float32 and round the result to the dtype.
At rank r > 1 the rank sum is formed in the dtype (the gated h_j = Σ_s σ(a_s) b_s before
the value GEMM, the symmetric Σ_s a_s b_s before σ). In float16 (largest finite number
65504) the gated h_j can therefore overflow where ``to_linear()``'s Llama MLP stays
finite: that MLP's down GEMM adds the m·r products in float32 and rounds only y
(tests/test_interop.py builds such a case). Keeping h_j in float32 would need a float32
value GEMM; this is documented, not changed.

**Modes.** Eager mode (training and inference) and ``torch.compile`` with a gradient
wanted run that op sequence. ``torch.compile`` of inference (no gradient) lets the
compiler fuse σ and the product into one kernel that computes in float32 and rounds
once, as it does for a compiled Llama MLP (bit-equal to it, and so a rounding away from
eager: 0.33 % relative in the bfloat16 case of tests/test_compile.py).
``torch.jit.trace`` records the plain formula (the same values in every grad mode), with
the input's sizes read at run time: the trace holds for every input with the traced
number of dimensions, and the rank-r and dense layers refuse another number of dimensions
(a ``torch.jit.Error`` naming both) rather than reshape it to the traced one.
``torch.export.export`` records the plain formula too, in every grad
mode: the exported program holds ATen ops only and loads with torch alone
(:mod:`qkmlp.functional`). ``torch.fx.symbolic_trace`` of a model records each layer as one
``call_module`` node (a leaf module: the graph calls the layer on real tensors); a bare
layer as the root of the trace, or a layer's method called on a Proxy, raises
``TypeError`` naming that. ``torch.jit.script`` is not supported: the layers call Python
objects TorchScript cannot compile (the activation registry, the ``autograd.Function``
classes, the checks that build their error messages); trace, or use ``torch.compile``.

Rules every layer follows:

- **Input.** A floating-point tensor of shape (..., d_model) on the layer's device, in the
  layer's dtype, or a jagged nested tensor of such tokens (``layout=torch.jagged``: each
  sequence gets what it would get alone; a strided nested tensor raises); anything else
  raises a ``TypeError`` or ``ValueError`` that names what was expected. Sizes are
  integers (Python or NumPy) >= 1. The output is a tensor of its own, never a view.
- **Autocast.** Under ``torch.autocast`` a layer casts what autocast casts for
  ``nn.Linear``: every floating input and weight but float64 goes to the autocast dtype,
  float64 is never cast, so a float64 layer stays float64 and a float64 input into a
  layer of another dtype raises (``TypeError``), as ``nn.Linear`` does.
- **Views of the weights** (rank-r layers). ``layer.query`` and ``layer.key`` are views:
  read them, write into them in place (``copy_``, ``nn.init.*_``, ``layer.query[0] = ...``)
  or assign ``layer.query = t`` (copies t in; under a parametrization of ``query_weight``,
  ``weight_norm``, ``spectral_norm``, ``orthogonal`` or one of ``torch.nn.utils.parametrize``,
  it assigns ``query_weight = t`` flattened, which runs the parametrization's
  ``right_inverse`` exactly as ``nn.Linear``'s ``lin.weight = t`` does, and raises where
  that raises; an in-place write into the view of a parametrized weight changes a computed
  copy only, as it does for ``nn.Linear``). An in-place write into a view needs
  ``torch.no_grad()``, as ``nn.Linear(...).weight[0] = ...`` does (autograd refuses to
  modify a leaf that requires grad in place); ``nn.init.*_`` and ``layer.query = t`` do
  that themselves. Everything that concerns the parameter
  itself goes through ``query_weight`` and ``key_weight``: freezing the gate alone is
  ``layer.query_weight.requires_grad_(False)`` (``layer.query.requires_grad_`` raises, a
  view is not a leaf), and replacing storage is ``layer.query_weight = nn.Parameter(...)``
  or ``layer.query_weight.data = ...`` (``layer.query.data = ...`` would only rebind the
  temporary view: it changes nothing).
- **State dicts.** A :class:`GatedMLP` loads its own keys and also a gate/up/down MLP's
  (``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight``, or Phi-3's fused
  ``gate_up_proj.weight``; rank 1), so a Hugging Face checkpoint loads strictly into a
  model whose MLPs were converted. A state dict of another rank raises, naming both ranks.
  The three rank-r classes share keys and shapes (``query_weight``, ``key_weight``,
  ``value``), and a state dict holds no class: a :class:`GatedMLP`'s loads into a
  :class:`SymmetricBilinearMLP` or :class:`SymmetrizedGatedMLP` without error. That
  transfer copies the weights q, k, v, not the function: the target computes its own form
  on them (σ(Σ a·b) or the symmetrised average instead of Σ σ(a)·b), which is exactly how
  the book builds its controls from a gated layer (:func:`qkmlp.pretrained.variant`);
  for the same function, load into the same class.
- **Sharded weights.** After FSDP2's ``fully_shard`` the forward pass works as usual;
  what needs the full weights (``to_linear``, ``to_dense``, ``absorbed``, a view of an
  unevenly sharded weight) raises ``RuntimeError`` naming the fix: ``.unshard()`` the
  sharded module first, or gather a full state dict.
"""
from __future__ import annotations

import math
import sys
from typing import Optional

import torch
from torch import nn
from torch.nn.utils import parametrize as _parametrize

from . import _interop
from . import functional as _fn
from ._checks import positive_int as _positive_int
from ._checks import real_float_dtype as _real_float_dtype
from .activations import Activation, activation_of_mlp, get_activation

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

    def __init__(self, d_model: int, d_hidden: int, d_out: Optional[int], activation, dtype=None) -> None:
        super().__init__()
        _real_float_dtype(dtype)
        self.d_model = _positive_int(d_model, "d_model")
        self.d_hidden = _positive_int(d_hidden, "d_hidden")
        self.d_out = self.d_model if d_out is None else _positive_int(d_out, "d_out")
        self.activation: Activation = get_activation(activation)

    def _layer_dtype_device(self):
        """(dtype, device) of the weights (every layer keeps all weights on one of each)."""
        w = self.value
        return w.dtype, w.device

    def _check_input(self, x: torch.Tensor) -> None:
        if isinstance(x, torch.fx.Proxy):
            raise TypeError(_interop.fx_method_message(self))
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape (..., {self.d_model}), got {type(x).__name__}")
        if x.is_nested and x.layout != torch.jagged:
            raise TypeError(
                f"expected a dense tensor or a jagged nested tensor (layout=torch.jagged), got a nested "
                f"tensor of layout {x.layout}; build it with torch.nested.nested_tensor(seqs, layout=torch.jagged)"
            )
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
        if x.dtype != dtype:
            _check_dtypes_meet(x.dtype, dtype, x.device.type)

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
        super().__init__(d_model, d_hidden, d_out, activation, dtype)
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
        if isinstance(x, torch.fx.Proxy):
            return _interop.fx_leaf(self, x)
        return self.coefficients(x) @ self.value


class StaticQueryMLP(_QKMLPBase):
    """One global query map W_Q in front of the keys: σ(x W_Q Kᵀ)V.

    Parameters: ``query`` = W_Q (d, d), ``key`` = K (m, d), ``value`` = V (m, d_out).
    ``absorbed()`` returns the equal :class:`KeyValueMLP` with keys K' = K W_Qᵀ.
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, activation="relu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, activation, dtype)
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
        if isinstance(x, torch.fx.Proxy):
            return _interop.fx_leaf(self, x)
        self._check_input(x)
        return self._act((x @ self.query) @ self.key.T) @ self.value

    @torch.no_grad()
    def absorbed(self) -> KeyValueMLP:
        """The key-value MLP with keys K W_Qᵀ: same function, no query."""
        _need_full_weights(self, "StaticQueryMLP.absorbed()")
        kv = KeyValueMLP(
            self.d_model, self.d_hidden, self.d_out, activation=self.activation,
            device=self.key.device, dtype=self.key.dtype,
        )
        kv.key.copy_(self.key @ self.query.T)
        kv.value.copy_(self.value)
        return kv


class BilinearAttentionMLP(_QKMLPBase):
    """Bilinear attention over memory slots: Σ_j σ(x A_j xᵀ) v_j, with A_j = Q_jᵀ K_j ∈ ℝ^{d×d}
    (Q_j, K_j ∈ ℝ^{r×d}, the book's convention; stored densely, so any A_j).

    Parameters: ``interaction`` (m, d, d) = A_j stored densely, ``value`` (m, d_out).
    This is the costly form: m·d² parameters and m·d² multiply-adds per token.
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, activation, dtype)
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
        if x.is_nested:
            return _on_jagged(x, self.scores)
        x = _interop.traced_ndim(self, x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_model)
        # (N, d) @ (d, m·d) -> (N, m, d), then contract the second index with x.
        xa = (x2 @ self.interaction.permute(1, 0, 2).reshape(self.d_model, -1)).view(
            -1, self.d_hidden, self.d_model
        )
        s = torch.einsum("nmd,nd->nm", xa, x2)
        return s.reshape(*lead, self.d_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.fx.Proxy):
            return _interop.fx_leaf(self, x)
        if isinstance(x, torch.Tensor) and x.is_nested:
            self._check_input(x)
            return _on_jagged(x, self.forward)
        return self._act(self.scores(x)) @ self.value


class _RankRBase(_QKMLPBase):
    """Rank-r factored forms: ``query`` and ``key`` (m, r, d), ``value`` (m, d_out).

    Storage: ``query_weight`` and ``key_weight`` (m·r, d) in ``nn.Linear``'s layout, row
    j·r + s holding :math:`q_{j,s}` and :math:`k_{j,s}` (at rank 1 exactly a Llama MLP's
    ``gate_proj.weight`` and ``up_proj.weight``), and ``value`` (m, d_out) = V. ``query``
    and ``key`` are (m, r, d) views of the first two. Generic initialisers
    (``for p in model.parameters(): nn.init.xavier_uniform_(p)``, ``normal_``,
    ``trunc_normal_``, ``orthogonal_``) then give a rank-1 layer the output scale they give
    a Llama MLP of the same size; an initialiser that reads fan-in from the shape
    (``kaiming_*`` with ``mode="fan_in"``) sees fan-in d_out for ``value`` where
    ``down_proj.weight`` (d_out, m) has m, so pass ``mode="fan_out"`` for ``value``.

    The forward pass uses the fused autograd functions of :mod:`qkmlp.functional` (two
    GEMMs, the elementwise middle in the input dtype with a Llama MLP's op sequence, only x
    and the pre-activations saved for backward) when the activation is a registered one and
    ``self.fused`` is true; otherwise, and wherever the fused path steps aside (``torch.func``
    transforms, forward-mode AD, ``torch.jit.trace``, tensor subclasses), the same formula
    in plain autograd.
    """

    _fused_fn = None        # set by subclasses: the qkmlp.functional fused function
    _reference_fn = None    # and its plain-autograd twin

    def __init__(self, d_model, d_hidden, d_out, rank, activation, device, dtype):
        super().__init__(d_model, d_hidden, d_out, activation, dtype)
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
        """:math:`q_{j,s}` as ``query[j, s]``: (m, r, d), a writable view of ``query_weight``."""
        return self._view("query")

    @property
    def key(self) -> torch.Tensor:
        """k_{j,s} as ``key[j, s]``: (m, r, d), a writable view of ``key_weight``."""
        return self._view("key")

    def _view(self, name: str) -> torch.Tensor:
        w = getattr(self, name + "_weight")
        try:
            return w.view(self.d_hidden, self.rank, self.d_model)
        except RuntimeError as e:        # an unevenly sharded DTensor cannot be unflattened
            _need_full_weights(self, f"layer.{name}", e)
            raise

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
        if _parametrize.is_parametrized(self, name + "_weight"):
            # Under torch.nn.utils.parametrize (weight_norm, spectral_norm, orthogonal, a custom
            # one) the view is a view of a freshly computed tensor: a copy into it would be
            # lost. Assign the parameter instead, which runs right_inverse as nn.Linear's
            # ``lin.weight = t`` does under the same parametrization.
            setattr(self, name + "_weight", t.reshape(self.d_hidden * self.rank, self.d_model))
            return
        target.copy_(t)

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.d_model)
        nn.init.uniform_(self.query_weight, -bound, bound)
        nn.init.uniform_(self.key_weight, -bound, bound)
        self._init_value()

    def _load_from_state_dict(self, state_dict, prefix, *args):
        """As ``nn.Module``'s, naming both ranks when the state dict holds another rank's rows."""
        args[-1].extend(_interop.rank_mismatch(self, state_dict, prefix))     # args[-1]: error_msgs
        super()._load_from_state_dict(state_dict, prefix, *args)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Query and key projections :math:`x\cdot q_{j,s}`, :math:`x\cdot k_{j,s}`: (..., d) -> two (..., m, r)."""
        self._check_input(x)
        if x.is_nested:
            return _on_jagged(x, self.projections)
        mr = self.d_hidden * self.rank
        ab = x @ torch.cat([self.query_weight, self.key_weight]).T     # one GEMM for both
        shape = (*x.shape[:-1], self.d_hidden, self.rank)
        return ab[..., :mr].reshape(shape), ab[..., mr:].reshape(shape)

    @torch.no_grad()
    def interactions(self) -> torch.Tensor:
        r""":math:`A_j = \sum_s q_{j,s}^\top k_{j,s}` for every slot: (m, d, d)."""
        return torch.einsum("jsd,jse->jde", self.query, self.key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.fx.Proxy):
            return _interop.fx_leaf(self, x)
        self._check_input(x)
        if x.is_nested:
            return _on_jagged(x, self.forward)
        x = _interop.traced_ndim(self, x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_model)
        q, k, v = self.query_weight, self.key_weight, self.value
        ac = _autocast_dtype(x.device.type)
        if ac is not None and x.dtype != torch.float64:
            # Autocast casts what it casts for nn.Linear: x and the weights to its dtype
            # (float64 never, and _check_input refused float64 mixed with another dtype);
            # the GEMMs and the elementwise middle then run in it, as in a Llama MLP.
            x2, q, k, v = x2.to(ac), q.to(ac), k.to(ac), v.to(ac)
        if self.fused and type(self)._fused_fn is not None and _fn.supports_fused(self.activation):
            y = type(self)._fused_fn(x2, q, k, v, self.activation.name)
        else:
            _fn._check_args(x2, q, k, v)    # mixed weights: the library's TypeError, as the fused path
            y = type(self)._reference_fn(x2, q, k, v, self.activation, self.d_hidden, self.rank)
        return _fresh_reshape(y, (*lead, self.d_out))


def _autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype when ``torch.autocast`` is on for ``device_type``, else None."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _check_dtypes_meet(x_dtype: torch.dtype, dtype: torch.dtype, device_type: str) -> None:
    """TypeError unless an input of ``x_dtype`` may meet weights of ``dtype`` (they differ).

    Outside autocast they never may. Under ``torch.autocast`` they may when autocast
    casts both to one dtype: in the ops it runs in low precision (``linear``, ``matmul``,
    ``mm``) it casts every floating dtype but float64 to its dtype and leaves float64 alone,
    so float64 meets only float64, as for ``nn.Linear`` (tests/test_autocast.py)."""
    if not dtype.is_floating_point:
        raise TypeError(f"the layer's weights are {dtype}, but the layers are real-valued; convert "
                        f"the layer to a floating dtype (layer.to(torch.float32))")
    ac = _autocast_dtype(device_type)
    if ac is None:
        raise TypeError(
            f"input dtype {x_dtype} does not match the layer's dtype {dtype}; convert the input "
            f"(x.to({dtype})) or the layer (layer.to({x_dtype}))"
        )
    if torch.float64 in (x_dtype, dtype):
        raise TypeError(
            f"under torch.autocast({device_type!r}, dtype={ac}) an input of {x_dtype} does not meet "
            f"weights of {dtype}: autocast casts every floating dtype but float64 to {ac} and never "
            f"casts float64 (nn.Linear raises here too); convert the input (x.to({dtype})) or the "
            f"layer (layer.to({x_dtype}))"
        )


def _on_jagged(x: torch.Tensor, f):
    """``f`` on the tokens of a jagged nested tensor ``x`` (``x.values()``, every sequence's
    tokens stacked), rewrapped with x's offsets: each sequence gets what ``f`` gives it alone
    (every layer acts on each token by itself). ``f`` may return a tuple."""
    def wrap(v):
        return torch.nested.nested_tensor_from_jagged(
            v, offsets=x.offsets(), lengths=x.lengths(), jagged_dim=x._ragged_idx)
    out = f(x.values())
    return tuple(map(wrap, out)) if isinstance(out, tuple) else wrap(out)


def _sharded(layer: nn.Module) -> list[str]:
    """Names of ``layer``'s own parameters that are DTensors (sharded by FSDP2's
    ``fully_shard``). Without torch.distributed.tensor imported there can be none."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None:
        return []
    return [n for n, p in layer.named_parameters(recurse=False) if isinstance(p, dtensor.DTensor)]


def _need_full_weights(layer: nn.Module, what: str, cause: Optional[BaseException] = None) -> None:
    """RuntimeError naming the fix when ``layer``'s parameters are FSDP2 shards."""
    names = _sharded(layer)
    if names:
        raise RuntimeError(
            f"{what} needs the full weights, but {', '.join(names)} are shards (DTensors) of FSDP2's "
            f"fully_shard; unshard first (.unshard() on the fully_shard-ed module that holds this "
            f"layer, .reshard() after) or gather a full state dict (torch.distributed.checkpoint."
            f"state_dict.get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))) "
            f"and load it into an unsharded copy"
        ) from cause


def _fresh_reshape(y: torch.Tensor, shape) -> torch.Tensor:
    """y reshaped to ``shape`` as a tensor of its own, not a view (as ``nn.Linear`` returns):
    an in-place op on the output (``y += x``) then needs no view bookkeeping, which FSDP2's
    hooks cannot follow. ``aten._unsafe_view`` is what ``torch.matmul`` itself returns.

    Under ``torch.jit.trace`` the sizes in ``shape`` are traced values, but a call through
    ``torch.ops`` records them as constants: the trace would then reshape every later
    input to the traced shape (or fail). There the reshape is ``Tensor.reshape``, which
    records the sizes as read from the input, followed by a copy (a tensor of its own)."""
    if y.shape == shape:
        return y
    if torch.jit.is_tracing():
        return y.reshape(shape).clone()
    return torch.ops.aten._unsafe_view(y, shape)


class SymmetricBilinearMLP(_RankRBase):
    r"""Symmetric rank-r bilinear MLP: :math:`\sum_j \sigma\big(\sum_s (x\cdot q_{j,s})(x\cdot k_{j,s})\big)\, v_j`.

    σ sits outside the rank sum, so the layer equals :class:`BilinearAttentionMLP` with
    :math:`A_j = \sum_s q_{j,s}^\top k_{j,s}` (``to_dense()``). Rank 1: σ((xQᵀ) ⊙ (xKᵀ))V.

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
        _need_full_weights(self, "SymmetricBilinearMLP.to_dense()")
        dense = BilinearAttentionMLP(
            self.d_model, self.d_hidden, self.d_out, activation=self.activation,
            device=self.value.device, dtype=self.value.dtype,
        )
        dense.interaction.copy_(self.interactions())
        dense.value.copy_(self.value)
        return dense


class GatedMLP(_RankRBase):
    r"""Gated rank-r MLP: :math:`\sum_j \big[\sum_s \sigma(x\cdot q_{j,s})\,(x\cdot k_{j,s})\big]\, v_j`.

    Rank 1 is (σ(xQᵀ) ⊙ (xKᵀ))V: query = gate, key = up, value = downᵀ, so
    SwiGLU (silu), GEGLU (gelu), ReGLU (relu) and bilinear (identity) are all this layer.

    Weights: ``query`` and ``key`` (m, r, d) are writable views of the parameters
    ``query_weight`` and ``key_weight`` (m·r, d), which at rank 1 are exactly a Llama
    MLP's ``gate_proj.weight`` and ``up_proj.weight``; ``value`` (m, d_out) is the
    transpose of ``down_proj.weight``. The forward pass is two GEMMs (:mod:`qkmlp.functional`).
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, rank=1, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, rank, activation, device, dtype)

    _fused_fn = staticmethod(_fn.gated)
    _reference_fn = staticmethod(_fn.gated_reference)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """``load_state_dict`` also takes the MLP's own keys (Hugging Face's), so a checkpoint of
        the unconverted model loads strictly into a model whose MLPs were converted: separate
        ``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight`` (Llama, Gemma, ...) or a
        fused ``gate_up_proj.weight`` (rows 0..m−1 the gate, Phi-3) with ``down_proj.weight``
        become ``query_weight``, ``key_weight`` and ``value`` = downᵀ (rank 1; the layer keeps
        its activation). A state dict with the layer's own keys loads as usual."""
        _interop.llama_keys_to_gated(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear, *, activation=None) -> "GatedMLP":
        """Load a Llama-style MLP ``down(σ(gate(x)) * up(x))`` as a rank-1 GatedMLP.

        gate_proj.weight (m, d) -> query[:, 0], up_proj.weight (m, d) -> key[:, 0],
        down_proj.weight (d_out, m) -> value = downᵀ (``query_weight`` and ``key_weight``
        get the first two as they are).
        ``activation`` is required (TypeError without it): three ``nn.Linear`` do not say
        which σ sits between them (Llama's is ``silu``, Gemma's ``gelu_pytorch_tanh``), so
        pass ``activation=config.hidden_act``, or load the MLP module with :meth:`from_mlp`,
        which reads σ from it.
        The weights are copied. Biases are not supported; the three must share one dtype and
        device (TypeError otherwise; nothing is cast). On the meta device the layer is
        built on meta too, with no values to copy.
        """
        if activation is None:
            raise TypeError(
                "GatedMLP.from_linear needs activation=: the three nn.Linear do not say which σ sits "
                "between them (Llama, Mistral, Qwen2: 'silu'; Gemma: 'gelu_pytorch_tanh'); pass "
                "activation=config.hidden_act, or GatedMLP.from_mlp(mlp), which reads it from the MLP module"
            )
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

    @classmethod
    def from_mlp(cls, mlp: nn.Module, *, activation=None) -> "GatedMLP":
        """Load a Llama-style MLP module (``nn.Linear`` ``gate_proj``, ``up_proj``,
        ``down_proj``: Llama, Mistral, Qwen2, Gemma, ...) as a rank-1 GatedMLP.

        σ is ``activation`` when given, else read from the module
        (:func:`~qkmlp.activations.activation_of_mlp`: its ``act_fn`` when that is a
        ``torch.nn`` activation qkmlp knows, else ``config.hidden_activation`` /
        ``config.hidden_act`` checked against ``act_fn``); ValueError when it cannot be read,
        never a guess. Otherwise as :meth:`from_linear`.
        """
        parts = {n: getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")}
        missing = [n for n, lin in parts.items() if not isinstance(lin, nn.Linear)]
        if missing and isinstance(getattr(mlp, "gate_up_proj", None), nn.Linear):
            raise TypeError(
                f"this {type(mlp).__name__} fuses gate and up into one gate_up_proj (Phi-3's layout); "
                f"from_mlp reads separate gate_proj, up_proj, down_proj. qkmlp.pretrained.surgery reads the "
                f"fused layout: use_gated_mlps(model) / gated_mlps(model) convert a whole model, and "
                f"gate, up, down = qkmlp.pretrained.mlp_weights(mlp) split one module (rows 0..m-1 the gate), "
                f"then GatedMLP.from_linear on nn.Linear layers holding them, with activation="
            )
        if missing:
            raise TypeError(f"expected an MLP module with nn.Linear gate_proj, up_proj and down_proj; "
                            f"this {type(mlp).__name__} has no nn.Linear {', '.join(missing)}")
        act = activation if activation is not None else activation_of_mlp(mlp)
        return cls.from_linear(*parts.values(), activation=act)

    @torch.no_grad()
    def to_linear(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """``(gate_proj, up_proj, down_proj)``: bias-free ``nn.Linear`` layers with
        ``down(σ(gate(x)) * up(x))`` equal to this layer; the inverse of :meth:`from_linear`.

        Rank r gives m·r hidden units: unit j·r + s has gate :math:`q_{j,s}`, up :math:`k_{j,s}` and the
        down column v_j (each value repeated r times). Shapes: gate and up (m·r, d),
        down (d_out, m·r). The weights are copies, on this layer's device and dtype.
        """
        _need_full_weights(self, "GatedMLP.to_linear()")
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
    r"""The q ↔ k-symmetrised gated MLP:
    :math:`\sum_j \big[\sum_s \tfrac12\big(\sigma(x\cdot q_{j,s})(x\cdot k_{j,s}) + \sigma(x\cdot k_{j,s})(x\cdot q_{j,s})\big)\big]\, v_j`.

    The exact exchange-symmetric control of :class:`GatedMLP`: the same σ on the same
    linear forms and the same parameters, averaged over the swap q ↔ k, so swapping
    changes nothing for every σ. Same constructor and weights as :class:`GatedMLP`.
    Its forward pass is the plain formula in autograd (no fused path).
    """

    def __init__(self, d_model, d_hidden, d_out=None, *, rank=1, activation="silu", device=None, dtype=None):
        super().__init__(d_model, d_hidden, d_out, rank, activation, device, dtype)

    _fused_fn = None
    _reference_fn = staticmethod(_fn.symmetrized_reference)
