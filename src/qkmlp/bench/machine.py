"""The machine and the provenance of a stored result: CPU, versions, load, commit."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from typing import Optional

import torch

from .memory import allocator_settings

__all__ = ["machine_info"]


def _loadavg() -> Optional[list]:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> Optional[str]:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except Exception:
        return None


def _library_changed() -> Optional[bool]:
    """Whether the library's own files differ from the commit (uncommitted changes), if known."""
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # src/qkmlp
        out = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "."], capture_output=True,
                             text=True, timeout=5)
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except Exception:
        return None


def machine_info(device="cpu") -> dict:
    """Machine, versions and date, for the provenance of stored results."""
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "git_commit": _git_commit(),
        "library_uncommitted_changes": _library_changed(),
        "allocator": allocator_settings(),
    }
    if _loadavg() is not None:
        info["loadavg"] = _loadavg()
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
