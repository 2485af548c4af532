"""Deprecated: the examples of chapters 1-4 moved to one module per chapter,
:mod:`qkmlp.book.ch01_key_value`, :mod:`qkmlp.book.ch02_dynamic_query`,
:mod:`qkmlp.book.ch03_bilinear_attention` and :mod:`qkmlp.book.ch04_rank_one`. This
module re-exports their names and warns; ``python -m qkmlp.examples`` runs
``python -m qkmlp.book``."""
from ._moved import warn_moved
from .book import ch01_key_value as _ch01, ch02_dynamic_query as _ch02
from .book import ch03_bilinear_attention as _ch03, ch04_rank_one as _ch04
from .book.ch01_key_value import *  # noqa: F401,F403
from .book.ch02_dynamic_query import *  # noqa: F401,F403
from .book.ch03_bilinear_attention import *  # noqa: F401,F403
from .book.ch04_rank_one import *  # noqa: F401,F403

__all__ = [*_ch01.__all__, *_ch02.__all__, *_ch03.__all__, *_ch04.__all__]

warn_moved("qkmlp.examples")

if __name__ == "__main__":
    import runpy

    runpy.run_module("qkmlp.book", run_name="__main__", alter_sys=True)
