"""Deprecated alias of :mod:`qkmlp.book.figures` (moved there); importing it warns."""
from ._moved import alias

alias("qkmlp.figures")
