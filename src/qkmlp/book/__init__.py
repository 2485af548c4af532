"""The book's support: what the chapters import and a user of the layers does not need.

- :mod:`qkmlp.book.examples`: the constructed and synthetic examples of chapters 1-4.
- :mod:`qkmlp.book.figures`: the one plotting recipe (panels that read on every screen,
  SVG rows that wrap, HTML tables).
- :mod:`qkmlp.book.widgets`: the live symmetry explorer of chapter 5 and the
  measurements behind it; :mod:`qkmlp.book.static_explorer`, its kernel-free HTML twin.

Import the modules by name (``from qkmlp.book import figures``); this package imports
none of them, so each pulls in only what it needs (matplotlib and ipywidgets are loaded
when a figure or widget is drawn).
"""
