"""Scale-out with torchrun: one grid's (cell, seed) jobs sharded across processes and machines.

``torchrun --nproc_per_node N -m qkmlp.experiments --task ...`` (add ``--nnodes M
--node_rank k --rdzv_endpoint host:port`` for several machines) starts N·M processes.
Each takes the jobs i with i mod world = rank, the tuning records are gathered by every
rank (all need the chosen learning rates), and rank 0 gathers the evaluation records and
writes the one results file. Runs are deterministic given their seed, so the file equals
a single process's, apart from the rank, host and wall time of each run.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["launched_by_torchrun", "init", "finish"]


def launched_by_torchrun() -> bool:
    """Whether this process was started by torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def init(device: str) -> tuple[int, int, Optional[object], str]:
    """Initialise torch.distributed when launched by torchrun.

    Returns (rank, world, group, device): gloo on CPU, NCCL on CUDA (each process then
    takes the GPU of its LOCAL_RANK). Without torchrun: (0, 1, None, device).
    """
    if not launched_by_torchrun():
        return 0, 1, None, device
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return rank, world, dist.group.WORLD, device


def finish() -> None:
    """Wait for every rank, then tear the process group down (no-op without one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
