"""Sphinx helpers for this book's website (loaded from _config.yml, `local_extensions`).

1. API page: resolve short and re-exported names of ``qkmlp``. Docstrings say
   :class:`KeyValueMLP` or :func:`measure_symmetry`, and type hints name objects by the
   path they are imported through (``qkmlp.KeyValueMLP``), while the API page documents
   each object under a module (``qkmlp.layers.KeyValueMLP``). On a reference Sphinx cannot
   resolve, link to the documented ``qkmlp`` object with that last name component,
   preferring the one documented under the module that defines it; anything else stays
   unresolved (and ``-n`` reports it).
2. Docstrings write absolute values and norms as |λ| or |x|, which reST reads as an
   (undefined) substitution reference: outside inline literals and roles, escape such bars
   so the page shows the text as written. Likewise a bullet list followed directly by an
   unindented line (Markdown habit) gets the blank line reST needs to end the list.
3. Scripts: sphinx-thebe registers its inline configuration script twice under
   jupyter-book, which throws "Identifier 'THEBE_JS_URL' has already been declared" in
   every page; drop exact duplicate scripts from each page.
"""
from __future__ import annotations

import importlib
import re

from sphinx.util.nodes import make_refnode


def _defined_here(name: str) -> bool:
    """Whether the documented name ``pkg.mod.obj`` is where ``obj`` is defined."""
    modname, _, attr = name.rpartition(".")
    try:
        obj = getattr(importlib.import_module(modname), attr)
    except (ImportError, AttributeError):
        return False
    return getattr(obj, "__module__", None) == modname


def _resolve_qkmlp(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    modname = node.get("py:module") or ""
    if not (target.startswith("qkmlp") or modname.startswith("qkmlp")):
        return None
    short = target.split(".")[-1]
    objects = env.get_domain("py").objects
    matches = [n for n, o in objects.items()
               if n.startswith("qkmlp.") and n.split(".")[-1] == short and not o.aliased]
    if len(matches) > 1:
        matches = [n for n in matches if _defined_here(n)] or matches
    if len(matches) != 1:
        return None
    obj = objects[matches[0]]
    return make_refnode(app.builder, node["refdoc"], obj.docname, obj.node_id, contnode, matches[0])


_BACKTICKS = re.compile(r"(``.*?``|:[\w:+-]+:`[^`]*`|`[^`]*`_{0,2})")
_BARS = re.compile(r"(?<![\\|\w])\|([^|\s`][^|`]*?)\|(?![_|\w])")


def _escape_bars(line: str) -> str:
    """Escape |text| outside backtick spans: reST would read it as a substitution."""
    parts = _BACKTICKS.split(line)
    return "".join(p if i % 2 else _BARS.sub(r"\\|\1\\|", p) for i, p in enumerate(parts))


_BULLET = re.compile(r"^(\s*)[-*+] \S")


def _end_bullet_lists(lines: list[str]) -> list[str]:
    """Insert a blank line where a bullet list runs straight into an unindented line."""
    out: list[str] = []
    bullet_indent = None  # indent of the current list's bullets, None outside a list
    for line in lines:
        m = _BULLET.match(line)
        indent = len(line) - len(line.lstrip())
        if m:
            bullet_indent = len(m.group(1))
        elif not line.strip():
            bullet_indent = None
        elif bullet_indent is not None and indent <= bullet_indent:
            out.append("")
            bullet_indent = None
        out.append(line)
    return out


def _process_docstring(app, what, name, obj, options, lines):
    if name.startswith("qkmlp"):
        lines[:] = _end_bullet_lists([_escape_bars(line) for line in lines])


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        # the copies differ only in filename None vs "" (both: an inline script)
        key = (str(getattr(js, "filename", js) or ""), tuple(sorted(getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def setup(app):
    app.connect("missing-reference", _resolve_qkmlp)
    app.connect("autodoc-process-docstring", _process_docstring)
    # late: other handlers add page scripts while the page context is built
    app.connect("html-page-context", _dedupe_scripts, priority=1000)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

