"""Benchmarks of the factored layers against the GEMM floor and a Llama-style MLP.

Run ``python -m qkmlp.bench`` (or ``make bench``): it prints tables of medians and ratios
with the machine and versions, and ``--json PATH`` stores everything with provenance.

Suites, each timing its candidates *interleaved* (one repetition of every
candidate, then the next round) and reporting medians, so that load from other
processes hits every candidate alike:

- ``headline``: at one size (default d = 512, m = 1376, N = 2048, float32 on CPU),
  the bare GEMMs x·Qᵀ, x·Kᵀ and h·V (the floor; for forward + backward, those and the
  GEMMs of backward: dh, dW_qk by halves, dx, dV), a Llama-style MLP of three ``nn.Linear``
  ``down(silu(gate(x)) * up(x))``, Liger-Kernel's SwiGLU when importable, and the rank-1
  ``GatedMLP`` and ``SymmetricBilinearMLP``: forward, forward + backward, and the bytes
  saved for backward (measured with ``torch.autograd.graph.saved_tensors_hooks``).
  A second, independently initialised Llama-style MLP (``llama_mlp_copy``) runs as an
  A/A control: its ratio to the first shows how far two identical workloads drift apart
  in the same run. Ratios are also taken *paired*, round by round, with a distribution-
  free 95 % interval for their median (:func:`median_interval`), and each target gets a
  :func:`~qkmlp.bench.stats.verdict`: met, parity (the interval contains the goal) or not met.
- ``rank``: rank-r layers against the dense ``BilinearAttentionMLP`` they equal.
- ``size``: forward time against d for the dense form and the rank-1 / rank-8 forms
  (the dense form's d² wall).
- ``stack``: peak memory of a training step of residual blocks, one fresh process each.
- ``roofline`` (CPU): the measured GEMM rate (``torch.mm``) and elementwise bandwidth
  (``torch.add``, copy) at 1 and 2 threads, and each layer's achieved GEMM GFLOP/s, time
  ratio to the Llama-style MLP and elementwise share, over tokens N and width m
  (:func:`bench_roofline`).

Times are wall-clock seconds per call (CUDA: synchronised). No speed is asserted
anywhere: these are measurements, not tests.

One job a module, every public name re-exported here (``qkmlp.bench.saved_bytes``):
:mod:`~qkmlp.bench.references` (the Llama-style and Liger-style MLPs, the residual block,
the bare-GEMM floor), :mod:`~qkmlp.bench.timing` (the interleaved harness),
:mod:`~qkmlp.bench.stats` (median intervals, paired ratios, the A/A spread, verdicts),
:mod:`~qkmlp.bench.memory` (saved bytes, the allocator, stack peaks),
:mod:`~qkmlp.bench.ops` (profiler op counts), :mod:`~qkmlp.bench.roofline`,
:mod:`~qkmlp.bench.machine` (machine and provenance), :mod:`~qkmlp.bench.suites`,
:mod:`~qkmlp.bench.report` (tables; chapter 10 draws the figures, :mod:`qkmlp.book.ch10_cost`) and :mod:`~qkmlp.bench.cli` (the command).
"""
from __future__ import annotations

from .cli import main, store_path
from .machine import loadavg, machine_info
from .memory import (allocator_settings, bench_stack, compiled_saved_tensors, saved_bytes, set_allocator,
                     stack_ratios, stack_step_peak)
from .ops import CONVERSION_OPS, ELEMENTWISE_OPS, op_counts
from .references import LlamaMLP, ResidualBlock, SiLUMul, floor_gemms, liger_style_mlp, liger_swiglu, make_mlp
from .report import format_paired, format_report
from .roofline import (ROOFLINE_KINDS, bench_roofline, forward_bytes, gemm_flops, machine_peak, roofline_point,
                       roofline_rows)
from .stats import TARGETS, aa_spread, control_verdict, median_interval, paired_ratio, pooled_paired_ratio, verdict
from .suites import bench_headline, bench_rank, bench_size, headline_sizes, run
from .timing import time_interleaved

__all__ = [
    "LlamaMLP",
    "SiLUMul",
    "liger_style_mlp",
    "liger_swiglu",
    "floor_gemms",
    "saved_bytes",
    "compiled_saved_tensors",
    "time_interleaved",
    "median_interval",
    "paired_ratio",
    "pooled_paired_ratio",
    "format_paired",
    "verdict",
    "aa_spread",
    "control_verdict",
    "TARGETS",
    "bench_headline",
    "bench_rank",
    "bench_size",
    "run",
    "format_report",
    "machine_info",
    "loadavg",
    "set_allocator",
    "allocator_settings",
    "op_counts",
    "ELEMENTWISE_OPS",
    "CONVERSION_OPS",
    "ResidualBlock",
    "make_mlp",
    "stack_step_peak",
    "bench_stack",
    "stack_ratios",
    "headline_sizes",
    "store_path",
    "ROOFLINE_KINDS",
    "gemm_flops",
    "forward_bytes",
    "machine_peak",
    "roofline_point",
    "bench_roofline",
    "roofline_rows",
    "main",
]
