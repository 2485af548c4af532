"""Where, on what and by which code a stored result was computed.

Every stored run record and result file of the pipelines carries these fields, from here
alone: the git state of the checkout (commit, uncommitted changes), the versions of the
numerical stack, and the machine, including the CPU model and the vector instruction set
torch's kernels use (``cpu_capability``: ``AVX512``, ``AVX2`` or ``DEFAULT``; it can be
lowered with the environment variable ``ATEN_CPU_CAPABILITY``). Float results of the same
code and seed are bit-equal only on the same capability and thread count; elsewhere they
agree within a measured tolerance (the book states it where it reruns stored work).
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from typing import Optional

import torch

__all__ = ["git_state", "IMPORT_GIT", "versions", "cpu_model", "machine", "run_machine"]


def _git(here: str, *args) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(path: Optional[str] = None) -> dict:
    """``{"git_commit", "git_dirty"}`` of the checkout holding ``path`` (default: this
    package). Dirty means uncommitted changes to tracked files anywhere, or untracked files
    under ``src/``; both are None where git cannot answer (an installed copy, an archive)."""
    here = os.path.dirname(os.path.abspath(path or __file__))
    commit = (_git(here, "rev-parse", "HEAD") or "").strip() or None
    top = (_git(here, "rev-parse", "--show-toplevel") or "").strip()
    tracked = _git(here, "status", "--porcelain", "--untracked-files=no")
    src = _git(here, "status", "--porcelain", "--untracked-files=all", "--", os.path.join(top, "src")) if top else None
    dirty = None if commit is None or tracked is None or src is None else bool(tracked.strip() or src.strip())
    return {"git_commit": commit, "git_dirty": dirty}


#: The code a process runs is the code it imported: its git state taken at import time
#: (the checkout may move on while a long grid runs).
IMPORT_GIT = git_state()


def versions(*packages: str) -> dict:
    """Python, torch and numpy versions, and those of ``packages`` (None where absent)."""
    import numpy

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what Python's ``platform`` module says elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def run_machine() -> dict:
    """The fields every run record carries: CPU model, torch's CPU capability, the thread
    count and the torch / numpy versions (what decides whether a rerun is bit-equal)."""
    import numpy

    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "numpy": numpy.__version__}


def machine(device="cpu") -> dict:
    """The machine a result file was made on: host, platform, CPU (model, capability, core
    count), torch's thread count, and the GPU where ``device`` is CUDA."""
    info = {"host": socket.gethostname(), "platform": platform.platform(), "cpu": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
