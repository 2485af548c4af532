"""Typography of numbers and words in the book's tables and prose, so that they read on a
390 px phone: a true minus sign, non-breaking spaces inside a number with its interval, and
soft hyphens in the long words of narrow table columns."""
from __future__ import annotations

from typing import Sequence

__all__ = ["NBSP", "MINUS", "SHY", "signed", "interval", "breakable"]

#: A non-breaking space: joins what a line must not split ("0.12 ± 0.03").
NBSP = "\u00a0"
#: The minus sign (U+2212), not the hyphen-minus.
MINUS = "\u2212"
#: A soft hyphen: invisible unless a narrow column breaks the word there.
SHY = "\u00ad"
#: Long words of the book's tables, with the places a phone may hyphenate them (soft
#: hyphens): a table column is as narrow as its longest unbreakable word.
HYPHENS = {"symmetrised": "sym-met-rised", "symmetrized": "sym-met-rized", "symmetric": "sym-met-ric",
           "comparison": "com-par-ison", "replication": "rep-li-ca-tion"}


def signed(x: float, digits: int, scale: float = 1.0) -> str:
    """``x * scale`` with its sign (a true minus sign), ``digits`` decimals: "+0.005", "−0.012"."""
    v = round(x * scale, digits)
    if v == 0:
        v = 0.0                                  # no "−0.000"
    s = f"{v:+.{digits}f}"
    return s.replace("-", MINUS)


def interval(ci: Sequence[float], digits: int, scale: float = 1.0) -> str:
    """A confidence interval on one line: "[−0.012, +0.022]" (no break inside)."""
    lo, hi = ci
    return f"[{signed(lo, digits, scale)},{NBSP}{signed(hi, digits, scale)}]"


def breakable(text: str) -> str:
    """``text`` with soft hyphens in the long words of ``HYPHENS`` (invisible unless a
    narrow column breaks the word there)."""
    for word, parts in HYPHENS.items():
        for w, p in ((word, parts), (word.capitalize(), parts.capitalize())):
            text = text.replace(w, p.replace("-", SHY))
    return text
