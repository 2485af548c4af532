"""Old module paths kept as aliases of the modules that moved (see the README's Layout)."""
from __future__ import annotations

import importlib
import sys
import warnings

#: old path -> where it moved (qkmlp.examples was split into the four chapter modules).
MOVED = {
    "qkmlp.figures": "qkmlp.book.figures",
    "qkmlp.widgets": "qkmlp.book.widgets",
    "qkmlp.static_explorer": "qkmlp.book.static_explorer",
    "qkmlp.examples": "qkmlp.book.ch01_key_value ... qkmlp.book.ch04_rank_one",
}


def _caller_level() -> int:
    """The ``stacklevel`` of the code that imported the old path: the first frame outside
    this module, the alias module, ``qkmlp/__init__`` and the import machinery (so that
    Python's default filters show the warning when that code is ``__main__``)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and (
            frame.f_code.co_filename.startswith("<frozen importlib")
            or frame.f_globals.get("__name__", "").split(".")[0] in ("importlib", "qkmlp")):
        frame = frame.f_back
        # warnings.warn does not count the import machinery's frames
        if frame is not None and not ("importlib" in frame.f_code.co_filename
                                      and "_bootstrap" in frame.f_code.co_filename):
            level += 1
    return level


def warn_moved(old: str) -> None:
    """A DeprecationWarning that ``old`` moved, naming the new path."""
    warnings.warn(f"{old} moved to {MOVED[old]}; import it from there (the old path will be removed)",
                  DeprecationWarning, stacklevel=_caller_level())


def alias(old: str):
    """Make the module ``old`` the module it moved to (the same object, private names
    included), with a DeprecationWarning naming the new path."""
    module = importlib.import_module(MOVED[old])
    sys.modules[old] = module
    warn_moved(old)
    return module
