"""The six layers of the book, from the key-value MLP to the gated MLP and its symmetrised control.

Every layer maps tokens x of shape (..., d_model) to (..., d_out); m = d_hidden memory
slots, r = rank; no layer has biases (append a constant coordinate to x to get one).
The rank-r layers compute the formulas of :mod:`qkmlp.functional` (``gated_reference``
is SwiGLU's forward at rank 1) on the fused path it chooses. What every layer promises
(initialisation, inputs, dtypes, autocast, compile, export, tracing, the weight views,
state dicts, sharded weights) is in the API page's "Rules every layer follows"
(book/api.md). The plumbing behind it is in private modules: ``qkmlp._inputs`` (input
checks, autocast, jagged tensors), ``qkmlp._views``, ``qkmlp._sharding`` and
``qkmlp._interop`` (torch.fx, torch.jit.trace, Hugging Face MLPs).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from . import _inputs, _interop, _views
from . import functional
from ._checks import positive_int, rank_r_args, real_float_dtype
from ._sharding import need_full_weights
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
        real_float_dtype(dtype)
        self.d_model = positive_int(d_model, "d_model")
        self.d_hidden = positive_int(d_hidden, "d_hidden")
        self.d_out = self.d_model if d_out is None else positive_int(d_out, "d_out")
        self.activation: Activation = get_activation(activation)

    def _check_input(self, x: torch.Tensor) -> None:
        _inputs.check_input(self, x)

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"d_hidden={self.d_hidden}", f"d_out={self.d_out}"]
        if hasattr(self, "rank"):
            parts.append(f"rank={self.rank}")
        parts.append(f"activation={self.activation.name}")
        return ", ".join(parts)

    def _act(self, z: torch.Tensor) -> torch.Tensor:
        """σ(z), computed in float32 when z is float16 or bfloat16, returned in z's dtype."""
        cdt = functional.compute_dtype(z.dtype)
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
        need_full_weights(self, "StaticQueryMLP.absorbed()")
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
            return _inputs.on_jagged(x, self.scores)
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
            return _inputs.on_jagged(x, self.forward)
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

    _formula = None         # set by subclasses: the plain formula of qkmlp.functional
    _fused = None           # and the function that computes it on the fused path (if any)

    def __init__(self, d_model, d_hidden, d_out, rank, activation, device, dtype):
        super().__init__(d_model, d_hidden, d_out, activation, dtype)
        self.rank = positive_int(rank, "rank")
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
        return _views.view(self, "query")

    @property
    def key(self) -> torch.Tensor:
        """k_{j,s} as ``key[j, s]``: (m, r, d), a writable view of ``key_weight``."""
        return _views.view(self, "key")

    def __setattr__(self, name, value):
        if name in self._VIEWS and "_parameters" in self.__dict__:
            _views.assign(self, name, value)       # layer.query = t copies t in
        else:
            super().__setattr__(name, value)

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
            return _inputs.on_jagged(x, self.projections)
        mr = self.d_hidden * self.rank
        ab = x @ torch.cat([self.query_weight, self.key_weight]).T     # one GEMM for both
        shape = (*x.shape[:-1], self.d_hidden, self.rank)
        return ab[..., :mr].reshape(shape), ab[..., mr:].reshape(shape)

    @torch.no_grad()
    def interactions(self) -> torch.Tensor:
        r""":math:`A_j = \sum_s q_{j,s}^\top k_{j,s}` for every slot: (m, d, d)."""
        return torch.einsum("jsd,jse->jde", self.query, self.key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The class's formula (``_formula``, e.g. :func:`qkmlp.functional.gated_reference`)
        on every token of x, computed by ``_fused`` where there is one; the input checked,
        jagged tensors, tracing and autocast handled first."""
        if isinstance(x, torch.fx.Proxy):
            return _interop.fx_leaf(self, x)
        self._check_input(x)
        if x.is_nested:
            return _inputs.on_jagged(x, self.forward)
        x = _interop.traced_ndim(self, x)
        x2, q, k, v = _inputs.autocast(x.reshape(-1, self.d_model), self.query_weight, self.key_weight, self.value)
        if self.fused and self._fused is not None:
            y = self._fused(x2, q, k, v, self.activation)    # the plain formula where it must
        else:
            m, r = rank_r_args(x2, q, k, v)
            y = self._formula(x2, q, k, v, self.activation, m, r)
        return _inputs.fresh_reshape(y, (*x.shape[:-1], self.d_out))


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

    _formula = staticmethod(functional.symmetric_reference)
    _fused = staticmethod(functional.symmetric)

    @torch.no_grad()
    def to_dense(self) -> BilinearAttentionMLP:
        """The equal dense bilinear attention MLP (A_j materialised)."""
        need_full_weights(self, "SymmetricBilinearMLP.to_dense()")
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

    _formula = staticmethod(functional.gated_reference)
    _fused = staticmethod(functional.gated)

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
        _interop.check_llama_linears(gate_proj, up_proj, down_proj, activation)
        m, d = gate_proj.weight.shape
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
        linears = _interop.llama_linears_of(mlp)
        act = activation if activation is not None else activation_of_mlp(mlp)
        return cls.from_linear(*linears, activation=act)

    @torch.no_grad()
    def to_linear(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """``(gate_proj, up_proj, down_proj)``: bias-free ``nn.Linear`` layers with
        ``down(σ(gate(x)) * up(x))`` equal to this layer; the inverse of :meth:`from_linear`.

        Rank r gives m·r hidden units: unit j·r + s has gate :math:`q_{j,s}`, up :math:`k_{j,s}` and the
        down column v_j (each value repeated r times). Shapes: gate and up (m·r, d),
        down (d_out, m·r). The weights are copies, on this layer's device and dtype.
        """
        need_full_weights(self, "GatedMLP.to_linear()")
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

    _formula = staticmethod(functional.symmetrized_reference)
    _fused = None

