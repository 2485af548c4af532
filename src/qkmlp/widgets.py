"""Deprecated alias of :mod:`qkmlp.book.widgets` (moved there); importing it warns."""
from ._moved import alias

alias("qkmlp.widgets")
