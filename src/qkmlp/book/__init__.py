"""The book's support: what the chapters import and a user of the layers does not need.

- One module for each of chapters 1-4, holding that chapter's constructed and synthetic
  examples: :mod:`~qkmlp.book.ch01_key_value`, :mod:`~qkmlp.book.ch02_dynamic_query`,
  :mod:`~qkmlp.book.ch03_bilinear_attention`, :mod:`~qkmlp.book.ch04_rank_one`;
  ``python -m qkmlp.book static-query|product --out FILE`` reruns the stored studies of
  chapters 2 and 3.
- :mod:`~qkmlp.book.ch07_symmetry_group`: the conditions the theorems of chapter 7 put on
  weights and activations, checked at given weights.
- :mod:`~qkmlp.book.ch10_cost`: chapter 10's verdict tables, laid out for a phone.
- :mod:`qkmlp.book.schematic`: the picture of the argument (attention head, key-value,
  bilinear, symmetric rank-1 and gated units, with where σ sits).
- :mod:`qkmlp.book.why_evidence`: the why page's picture of the from-scratch evidence
  (SwiGLU's lead at each declared budget, with the declared tests' intervals).
- :mod:`qkmlp.book.figures`: the one plotting recipe (panels that read on every screen,
  SVG rows that wrap, HTML tables).
- :mod:`qkmlp.book.prose`: numbers in a chapter's prose, shown by MyST's ``{eval}`` role on
  the website and in JupyterLab alike.
- :mod:`qkmlp.book.widgets`: the live symmetry explorer of chapter 5;
  :mod:`qkmlp.book.static_explorer`, its kernel-free HTML twin;
  :mod:`qkmlp.book.explorer_model`, what both measure and draw.
- :mod:`qkmlp.book.source_archive`: the book's source as the archive the website ships
  (``qkmlp-source.tar.gz``), written by the site's build.

Import the modules by name (``from qkmlp.book import figures``); this package imports
none of them, so each pulls in only what it needs (matplotlib and ipywidgets are loaded
when a figure or widget is drawn).
"""
