"""Numbers in a chapter's prose: values its markdown shows with MyST's ``{eval}`` role.

A chapter computes a number from a stored file in a code cell and binds it, as
:class:`Text`, to a name that starts with ``txt_``; the markdown below that cell writes
``{eval}`txt_name```. The website evaluates the name while it builds the page (MyST-NB's
inline execution, set per notebook by its ``mystnb`` metadata); JupyterLab evaluates it
when the markdown cell runs (jupyterlab-myst). Both show the value's plain-text form, so a
:class:`Text` reads exactly as written, with no quotes, in both places. The prefix keeps
the shown numbers apart from the chapter's own variables.

The two evaluate at different moments: the website when the page reaches the sentence,
JupyterLab after *Run All* has queued every code cell (it sees the kernel's state at the
end of the notebook). A name bound once, to one value, reads the same in both; that is why
:func:`bind` refuses a second, different value for a name.
"""
from __future__ import annotations

import re

__all__ = ["PREFIX", "Text", "bind"]

PREFIX = "txt_"
# MyST-NB evaluates a name only if it matches this (no attribute access, no calls)
_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*")


class Text(str):
    """A string shown as itself (no quotes) wherever Jupyter displays a value."""

    def __repr__(self) -> str:
        return str.__str__(self)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str.__str__(self))


def bind(namespace: dict, name: str, text: str) -> Text:
    """Bind ``Text(text)`` to ``PREFIX + name`` in ``namespace`` (a notebook's
    ``globals()``), for the markdown's ``{eval}`txt_name```.

    A name bound twice must show the same text both times (a number stated in an answer
    box and again in its section is one number); a name already used for anything but a
    :class:`Text` is refused, so a shown number never overwrites a chapter's variable.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be a Python identifier that starts with a letter "
                         f"(MyST-NB's {{eval}} reads no other), got {name!r}")
    if not isinstance(text, str):
        raise TypeError(f"text must be the string the prose shows, got {type(text).__name__}")
    key, shown = PREFIX + name, Text(text)
    old = namespace.get(key)
    if old is not None and not isinstance(old, Text):
        raise ValueError(f"{key!r} is already a {type(old).__name__} in this namespace; "
                         f"the prose's numbers need names of their own")
    if old is not None and old != shown:
        raise ValueError(f"{key!r} is shown as {str(old)!r} above and as {text!r} here: "
                         f"one number, two values")
    namespace[key] = shown
    return shown
