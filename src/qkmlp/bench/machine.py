"""The machine and the provenance of a stored result: CPU, versions, load, commit."""
from __future__ import annotations

import datetime as _dt
import os
from typing import Optional

import torch

from ..runbase.provenance import git_state, machine, versions
from .memory import allocator_settings

__all__ = ["machine_info", "loadavg"]


def loadavg() -> Optional[list]:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


def machine_info(device="cpu") -> dict:
    """Machine, versions and date, for the provenance of stored results."""
    git = git_state()
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **versions(),
        **{k: v for k, v in machine().items() if k != "host"},
        "git_commit": git["git_commit"],
        "library_uncommitted_changes": git["git_dirty"],
        "allocator": allocator_settings(),
    }
    if loadavg() is not None:
        info["loadavg"] = loadavg()
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
