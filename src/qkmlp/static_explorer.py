"""Deprecated alias of :mod:`qkmlp.book.static_explorer` (moved there); importing it warns."""
from ._moved import alias

alias("qkmlp.static_explorer")
