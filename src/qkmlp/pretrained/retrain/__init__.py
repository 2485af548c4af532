"""Retraining SmolLM2-135M without the broken symmetry (``python -m qkmlp.pretrained.retrain``).

Every MLP of the trained model is replaced by an arm's layer, initialised from its
trained gate (query), up (key) and down (value) weights, and the model is fine-tuned;
the question is whether the exchange-symmetric forms recover the loss of the gated
control, fine-tuned the same way.

- :mod:`~qkmlp.pretrained.retrain.core`: the arms
  (:data:`~qkmlp.pretrained.retrain.core.ARMS`), the data (training windows drawn per
  seed, fixed evaluation windows) and one run
  (:func:`~qkmlp.pretrained.retrain.core.train_run`: AdamW, warm-up, cosine decay,
  clipping, checkpoints);
- :mod:`~qkmlp.pretrained.retrain.grid`: the grid (rate tuned on the control, then every
  arm and seed), one committed JSON record per run,
  :func:`~qkmlp.pretrained.retrain.grid.assemble`;
- :mod:`~qkmlp.pretrained.retrain.matching`: the matched controls (the fraction of
  swapped units whose starting loss matches a symmetric arm's, the closest evaluated);
- :mod:`~qkmlp.pretrained.retrain.unitsearch`: the units whose exchange moves the start
  most (a screened, then exactly priced, forward-pass search);
- :mod:`~qkmlp.pretrained.retrain.distance`: every arm's start on each text and the
  per-layer change of its MLP outputs (distances beside the validation mean);
- reading a stored grid (paired gaps to the control per seed) and its figures are the
  book's: :mod:`qkmlp.book.ch11_report` and :mod:`qkmlp.book.ch11_plots` (chapter 11);
- ``python -m qkmlp.pretrained.retrain`` (``__main__``): the command.

Importing this package does not import ``transformers``.
"""
from .core import ARMS, TextData, build_arm, draw_starts, eval_points, train_loss, train_run
from .grid import CODE_VERSION, SIZES, Grid, assemble, choose_lr, config, job_name, run_key

__all__ = ["ARMS", "TextData", "build_arm", "draw_starts", "eval_points", "train_loss", "train_run",
           "CODE_VERSION", "SIZES", "Grid", "assemble", "choose_lr", "config", "job_name", "run_key"]
