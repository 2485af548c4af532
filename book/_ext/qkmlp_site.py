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
3. The site on every screen: the book's own CSS and script (book/_static/qkmlp-site.*:
   wide math and code scroll visibly, one search box, signatures and indexes that fit a
   phone, math in search snippets, no snippet fetches over file://) and templates
   (book/_templates: no fontawesome.js, no search index on every page).
4. No Thebe: jupyter-book always loads sphinx-thebe, which puts a Binder configuration
   (pointing to online services) and its script into every page although this book has
   no live-code button. Its event handlers and stylesheet are removed.
5. Proof index ("Theorems and definitions"): entries read "Theorem 5.2  The gated form
   breaks the exchange", grouped by chapter, in the book's order, instead of raw labels
   sorted alphabetically.
6. Bibliography: labels in the author-year form the text cites ("Breslow, 2026"), and an
   arXiv entry shows its arXiv link once, not also as a bare URL.
7. Footer: links to the general index, the module index and the proof index on every
   page (Sphinx builds them, but nothing linked to them).
8. Page weight: sphinx-design's CSS and script only on pages that use it.
9. Icon font: the icon stylesheet rules and font glyphs the site does not draw are cut
   (after the build).
10. The source with the site: the build writes ``qkmlp-source.tar.gz`` (what ``make book``
   and ``make test`` need; :mod:`qkmlp.book.source_archive`) beside ``index.html``; the
   download menu of every page's header and the footer link to it, and the role
   ``{source-archive}`\`text\``` links to it from a page, with its size.
11. Identifiers break only at dots, underscores and slashes: inline code of the text gets
   a ``<wbr>`` after each, so the stylesheet need not let a name break anywhere (which
   made table columns shrink and cut ``StaticQueryMLP.query`` mid-word); in tables only
   after dots.
12. Inline math keeps its punctuation: a formula and the punctuation written against it
   (``$x$,`` or ``($x$)``) sit in one ``span.qk-nobr`` that does not wrap inside, so a
   comma never starts the next line.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

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


# ------------------------------------------------------------------ 3. site assets

BOOK = Path(__file__).resolve().parents[1]


def _add_site_files(app, config):
    config.html_static_path.append(str(BOOK / "_static"))
    config.templates_path.append(str(BOOK / "_templates"))


# ------------------------------------------------------------------ 4. no Thebe

def _drop_thebe(app, config):
    """Disconnect sphinx-thebe (loaded by jupyter-book whether or not a book uses it)."""
    for listeners in app.events.listeners.values():
        for listener in list(listeners):
            if getattr(listener.handler, "__module__", "").startswith("sphinx_thebe"):
                app.disconnect(listener.id)
    app.registry.css_files[:] = [(f, a) for f, a in app.registry.css_files if f != "sphinx-thebe.css"]


# ------------------------------------------------------------------ 5. proof index

_GREEK = {name: chr(code) for name, code in [
    ("alpha", 0x3B1), ("beta", 0x3B2), ("gamma", 0x3B3), ("delta", 0x3B4), ("epsilon", 0x3B5),
    ("varepsilon", 0x3B5), ("zeta", 0x3B6), ("eta", 0x3B7), ("theta", 0x3B8), ("kappa", 0x3BA),
    ("lambda", 0x3BB), ("mu", 0x3BC), ("nu", 0x3BD), ("xi", 0x3BE), ("pi", 0x3C0), ("rho", 0x3C1),
    ("sigma", 0x3C3), ("tau", 0x3C4), ("phi", 0x3C6), ("varphi", 0x3C6), ("chi", 0x3C7),
    ("psi", 0x3C8), ("omega", 0x3C9), ("Gamma", 0x393), ("Delta", 0x394), ("Lambda", 0x39B),
    ("Sigma", 0x3A3), ("Phi", 0x3A6), ("Omega", 0x3A9)]}
_SYMBOLS = {"top": "\u22a4", "times": "\u00d7", "cdot": "\u00b7", "odot": "\u2299", "le": "\u2264",
            "leq": "\u2264", "ge": "\u2265", "geq": "\u2265", "neq": "\u2260", "to": "\u2192",
            "in": "\u2208", "infty": "\u221e", "ldots": "\u2026", "dots": "\u2026"}
_SUP = dict(zip("0123456789+-=()abcdefghijklmnoprstuvwxyzT\u22a4",
                "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207a\u207b\u207c\u207d\u207e"
                "\u1d43\u1d47\u1d9c\u1d48\u1d49\u1da0\u1d4d\u02b0\u2071\u02b2\u1d4f\u02e1\u1d50\u207f\u1d52"
                "\u1d56\u02b3\u02e2\u1d57\u1d58\u1d5b\u02b7\u02e3\u02b8\u1dbb\u1d40\u1d40"))
_SUB = dict(zip("0123456789+-=()aehijklmnoprstuvx",
                "\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089\u208a\u208b\u208c\u208d\u208e"
                "\u2090\u2091\u2095\u1d62\u2c7c\u2096\u2097\u2098\u2099\u2092\u209a\u1d63\u209b\u209c\u1d64\u1d65\u2093"))


def _script(text: str, table: dict, mark: str) -> str:
    text = text.replace(" ", "")
    if all(c in table for c in text):
        return "".join(table[c] for c in text)
    return f"{mark}({text})" if len(text) > 1 else mark + text


def tex_to_text(tex: str) -> str:
    """Short inline TeX (a title's math) as plain Unicode text: $\\alpha^{p-1}$ -> α^(p-1)."""
    tex = re.sub(r"\\(?:mathrm|operatorname|text|mathbf|mathit|mathcal|boldsymbol)\s*\{([^{}]*)\}", r"\1", tex)
    tex = re.sub(r"\\[,;:! ]", " ", tex)
    tex = re.sub(r"\\([A-Za-z]+)", lambda m: _GREEK.get(m[1]) or _SYMBOLS.get(m[1]) or m[1], tex)
    tex = re.sub(r"\^\{([^{}]*)\}|\^(\S)", lambda m: _script(m[1] or m[2], _SUP, "^"), tex)
    tex = re.sub(r"_\{([^{}]*)\}|_(\S)", lambda m: _script(m[1] or m[2], _SUB, "_"), tex)
    tex = tex.replace("{", "").replace("}", "").replace("-", "\u2212")
    return re.sub(r"\s+", " ", tex).strip()


def _plain_title(node) -> str:
    """A title node's text with its math as plain Unicode (index entries are plain text)."""
    from docutils import nodes as dn

    parts = []
    for child in node.findall(lambda n: isinstance(n, (dn.Text, dn.math))):
        if isinstance(child, dn.math):
            parts.append(tex_to_text(child.astext()))
        elif not any(isinstance(a, dn.math) for a in _ancestors(child)):
            parts.append(child.astext())
    return re.sub(r"\s+", " ", "".join(parts)).strip()


def _ancestors(node):
    node = node.parent
    while node is not None:
        yield node
        node = node.parent


def _proof_index_by_chapter(index_cls):
    from sphinx.domains import IndexEntry
    from sphinx.locale import _ as translate

    class ProofIndexByChapter(index_cls):
        """Theorems, definitions, ... grouped by chapter in the book's order, each entry
        "Theorem 5.2" linking to the statement, with its title beside it."""

        localname = "Theorems and definitions"

        def generate(self, docnames=None):
            env = self.domain.env
            proofs = getattr(env, "proof_list", {})
            titles: dict[str, str] = {}
            order: dict[str, int] = {}  # place of each statement in its page
            for docname in sorted({p["docname"] for p in proofs.values()}):
                doctree = env.get_doctree(docname)
                for node in doctree.findall(lambda n: hasattr(n, "get") and n.get("realtype")
                                            and n.get("label") in proofs):
                    title = next(iter(node.findall(lambda n: n.tagname == "title")), None)
                    text = _plain_title(title) if title is not None else ""
                    titles[node["label"]] = re.sub(r"^\((.*)\)$", r"\1", text)  # " (%t)" format
                    order[node["label"]] = len(order)
            groups: dict[str, list] = {}
            keys: dict[str, tuple] = {}
            for label, p in proofs.items():
                docname = p["docname"]
                if docnames and docname not in docnames:
                    continue
                chapter = env.toc_secnumbers.get(docname, {}).get("", ())
                heading = env.titles[docname].astext() if docname in env.titles else docname
                group = f"{'.'.join(map(str, chapter))}. {heading}" if chapter else heading
                number = () if p["nonumber"] else \
                    env.toc_fignumbers.get(docname, {}).get(p["countertype"], {}).get(label, ())
                kind = translate(p["realtype"].title())
                name = f"{kind} {'.'.join(map(str, number))}" if number else kind
                keys[group] = (chapter or (10**6,), heading)
                groups.setdefault(group, []).append(
                    (order.get(label, 10**6), IndexEntry(name, 0, docname, label, "", "", titles.get(label, ""))))
            content = [(g, [e for _, e in sorted(groups[g], key=lambda t: t[0])])
                       for g in sorted(groups, key=lambda g: keys[g])]
            return content, False

    return ProofIndexByChapter


# ------------------------------------------------------------------ 6. bibliography

def _register_bibliography_style():
    """pybtex style "qkmlp": labels "Breslow, 2026" (as {cite:p} shows them), sorted by
    author, year and title; one link per arXiv paper."""
    import codecs
    from collections import Counter

    import latexcodec  # noqa: F401  (registers the "ulatex" codec; a sphinxcontrib-bibtex dependency)

    from pybtex.plugin import register_plugin
    from pybtex.style.formatting.alpha import Style as AlphaStyle
    from pybtex.style.labels import BaseLabelStyle
    from pybtex.style.template import optional, sentence

    def last_name(person) -> str:
        text = " ".join(person.prelast_names + person.last_names)
        return codecs.decode(text, "ulatex").replace("{", "").replace("}", "")

    class AuthorYearLabels(BaseLabelStyle):
        def format_labels(self, sorted_entries):
            labels = [self.format_label(e) for e in sorted_entries]
            count, seen = Counter(labels), Counter()
            for label in labels:
                if count[label] == 1:
                    yield label
                else:
                    yield label + chr(ord("a") + seen[label])
                    seen[label] += 1

        def format_label(self, entry) -> str:
            people = entry.persons.get("author") or entry.persons.get("editor") or []
            if not people:
                names = entry.fields.get("key", entry.key)
            elif len(people) == 1:
                names = last_name(people[0])
            elif len(people) == 2:
                names = f"{last_name(people[0])} and {last_name(people[1])}"
            else:
                names = f"{last_name(people[0])} et al."
            year = entry.fields.get("year", "")
            return f"{names}, {year}" if year else names

    class BookStyle(AlphaStyle):
        default_label_style = "qkmlp-author-year"

        def format_web_refs(self, e):
            if "eprint" in e.fields:  # the arXiv link is the paper's URL: show it once
                return sentence[optional[self.format_eprint(e)], optional[self.format_doi(e)]]
            return super().format_web_refs(e)

    register_plugin("pybtex.style.labels", "qkmlp-author-year", AuthorYearLabels, force=True)
    register_plugin("pybtex.style.formatting", "qkmlp", BookStyle, force=True)


# ------------------------------------------------------------------ 7. footer links

_INDEXES = [("genindex", "General index"), ("py-modindex", "Python module index"),
            ("prf-prf", "Index of theorems and definitions")]


def _footer_index_links(app, pagename, templatename, context, doctree):
    builder = app.builder
    built = {name for name, *_ in getattr(builder, "domain_indices", [])}
    if getattr(builder, "use_index", False):
        built.add("genindex")
    pathto = context.get("pathto")
    if pathto is None:
        return
    links = [f'<a href="{pathto(name)}">{title}</a>' for name, title in _INDEXES if name in built]
    if links:
        context["theme_extra_footer"] = (context.get("theme_extra_footer") or "") + \
            '<p class="qk-indexes">' + " \u00b7 ".join(links) + "</p>"


# ------------------------------------------------------------------ 8. unused page assets

_DESIGN_ASSETS = ("sphinx-design.min.css", "design-tabs.js")


def _drop_unused_assets(app, pagename, templatename, context, doctree):
    """sphinx-design (loaded by jupyter-book) on pages that use none of its components."""
    if 'class="sd-' in context.get("body", ""):
        return
    for key in ("css_files", "script_files"):
        files = context.get(key)
        if files:
            files[:] = [f for f in files
                        if not str(getattr(f, "filename", f) or "").split("?")[0].endswith(_DESIGN_ASSETS)]


# ------------------------------------------------------------------ 9. icon font

_FA_RULE = re.compile(r'((?:\.fa-[\w-]+:{1,2}before,)*\.fa-[\w-]+:{1,2}before)\{content:"[^"]*"\}')
_FA_CLASS = re.compile(r"\bfa-[a-z0-9-]+")
_FA_FONT = "vendor/fontawesome/webfonts/fa-solid-900"


def _icon_codepoints(css: str) -> set[int]:
    """Private-use code points a stylesheet draws: "\\f0c9" escapes and literal characters."""
    points = {int(h, 16) for h in re.findall(r"\\([0-9a-fA-F]{4,6})", css)}
    points |= {ord(c) for c in css if 0xE000 <= ord(c) <= 0xF8FF}
    return {p for p in points if 0xE000 <= p <= 0xF8FF}


def _trim_icons(app, exception):
    """Keep only the Font Awesome icons the site draws: the theme's stylesheet defines
    about 1,900 ``.fa-*:before`` rules (87 kB) and its solid font holds every icon (156 kB
    as WOFF2). Rules for classes that no page or script names are dropped, and the font is
    cut to the glyphs the remaining styles use (a WOFF of a few kB, from the theme's TTF).
    Without fontTools (a matplotlib dependency) the font is left whole."""
    if exception is not None or getattr(app.builder, "format", "") != "html":
        return
    static = Path(app.outdir) / "_static"
    css_path = static / "styles" / "pydata-sphinx-theme.css"
    if not css_path.is_file():
        return
    used: set[str] = set()
    for path in list(Path(app.outdir).rglob("*.html")) + list(static.rglob("*.js")):
        if "fontawesome" not in path.name:
            used |= set(_FA_CLASS.findall(path.read_text(errors="replace")))
    css = css_path.read_text()

    def keep(m):
        names = {s.split(":")[0][1:] for s in m[1].split(",")}
        return m[0] if names & used else ""

    css = _FA_RULE.sub(keep, css)
    ttf = static / f"{_FA_FONT}.ttf"
    try:
        from fontTools import subset
    except ImportError:
        subset = None
    if subset is not None and ttf.is_file():
        points = set()
        for other in static.rglob("*.css"):
            points |= _icon_codepoints(css if other == css_path else other.read_text(errors="replace"))
        options = subset.Options()
        options.flavor = "woff"
        options.layout_features = []
        font = subset.load_font(str(ttf), options)
        subsetter = subset.Subsetter(options)
        subsetter.populate(unicodes=sorted(points))
        subsetter.subset(font)
        subset.save_font(font, str(static / f"{_FA_FONT}.subset.woff"), options)
        name = _FA_FONT.rsplit("/", 1)[1]
        css = re.sub(rf'url\(\.\./vendor/fontawesome/webfonts/{name}\.woff2\) format\("woff2"\),'
                     rf'url\(\.\./vendor/fontawesome/webfonts/{name}\.ttf\) format\("truetype"\)',
                     f'url(../vendor/fontawesome/webfonts/{name}.subset.woff) format("woff")', css)
    css_path.write_text(css)


# ------------------------------------------------------------------ 10. source archive

def _prepare_source_archive(app):
    """Make the archive's bytes before the pages are written (their links show its size)."""
    from qkmlp.book import source_archive

    app.qk_source_archive = None
    if getattr(app.builder, "format", "") != "html":
        return
    data = source_archive.archive_bytes(app.srcdir)
    app.qk_source_archive = data


def _archive_size(app) -> str:
    data = getattr(app, "qk_source_archive", None)
    if not data:
        return ""
    return f"{len(data) / 1e6:.1f} MB" if len(data) >= 1e6 else f"{len(data) / 1e3:.0f} kB"


def _archive_uri(docname: str) -> str:
    import posixpath

    from qkmlp.book.source_archive import ARCHIVE_NAME

    return posixpath.relpath(ARCHIVE_NAME, posixpath.dirname(docname) or ".")


def _source_archive_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{source-archive}`\`the source\``` : a link to the archive, its size after it."""
    from docutils import nodes as dn

    env = inliner.document.settings.env
    size = _archive_size(env.app)
    label = f"{text} ({size})" if size else text
    return [dn.reference(rawtext, label, refuri=_archive_uri(env.docname),
                         classes=["qk-source-archive"])], []


def _source_archive_links(app, pagename, templatename, context, doctree):
    """The archive in the header's download menu and in the footer, on every page."""
    from qkmlp.book.source_archive import ARCHIVE_NAME

    if not getattr(app, "qk_source_archive", None) or "pathto" not in context:
        return
    url = context["pathto"](ARCHIVE_NAME, 1)
    size = _archive_size(app)
    for button in context.get("header_buttons") or []:
        if button.get("label") == "download-buttons":
            button["tooltip"] = "Download this page, or the book's source"
            button["buttons"].append({
                "type": "link", "url": url, "text": f"book source ({size})",
                "tooltip": "The book's source (.tar.gz): run every chapter locally",
                "icon": "fas fa-file-zipper", "label": "download-book-source-button"})
    context["theme_extra_footer"] = (context.get("theme_extra_footer") or "") + \
        f'<p class="qk-source"><a href="{url}">The book\'s source ({ARCHIVE_NAME}, {size})</a>: ' \
        f'unpack it and run <code>make book</code> or <code>make test</code>.</p>'


def _write_source_archive(app, exception):
    from qkmlp.book.source_archive import ARCHIVE_NAME

    data = getattr(app, "qk_source_archive", None)
    if exception is None and data:
        (Path(app.outdir) / ARCHIVE_NAME).write_bytes(data)


# ------------------------------------------------------------------ 11, 12. line breaks

_LITERAL = re.compile(r'(<code class="[^"]*\bliteral\b[^"]*">)(.*?)(</code>)', re.S)
_TAG_OR_TEXT = re.compile(r"(<[^>]*>)")
# after a run of dots, underscores or slashes between a name character and a letter (so
# not inside a number such as 0.5)
_BREAK_AFTER = re.compile(r"(?<=[A-Za-z0-9)\]])([._/]+)(?=[A-Za-z(])")


_TABLE = re.compile(r"(<table\b.*?</table>)", re.S)


_BREAK_AFTER_DOT = re.compile(r"(?<=[A-Za-z0-9)\]])(\.+)(?=[A-Za-z(])")


def break_at_separators(html: str) -> str:
    """``<wbr>`` after the dots, underscores and slashes inside names in inline code:
    ``StaticQueryMLP.query`` may break before ``query``, never inside a word. In a table,
    after dots only (``d_model`` stays whole; a table that is too wide scrolls)."""
    def breaker(pattern):
        def literal(m):
            parts = _TAG_OR_TEXT.split(m[2])
            inner = "".join(p if i % 2 else pattern.sub(r"\1<wbr>", p) for i, p in enumerate(parts))
            return m[1] + inner + m[3]
        return literal

    text, table = breaker(_BREAK_AFTER), breaker(_BREAK_AFTER_DOT)
    pieces = _TABLE.split(html)
    return "".join(_LITERAL.sub(table if i % 2 else text, p) for i, p in enumerate(pieces))


_MATH_SPAN = r'<span class="math notranslate nohighlight">[^<]*</span>'
_MATH_PUNCT = re.compile(rf"([(\[\u201c\u2018]?)({_MATH_SPAN})((?:-[A-Za-z]+)?[.,;:!?)\]\u201d\u2019]*)")


def keep_math_with_punctuation(html: str) -> str:
    """Wrap an inline formula and the punctuation against it (an opening bracket or
    quote before it; closing ones, ``.,;:!?`` and a hyphenated suffix such as ``-th``
    after it) in ``span.qk-nobr``."""
    def wrap(m):
        if not (m[1] or m[3]):
            return m[0]
        return f'<span class="qk-nobr">{m[1]}{m[2]}{m[3]}</span>'

    return _MATH_PUNCT.sub(wrap, html)


def _line_breaks(app, pagename, templatename, context, doctree):
    body = context.get("body")
    if body:
        context["body"] = keep_math_with_punctuation(break_at_separators(body))


def setup(app):
    app.connect("missing-reference", _resolve_qkmlp)
    app.connect("autodoc-process-docstring", _process_docstring)
    app.connect("config-inited", _add_site_files)
    app.connect("config-inited", _drop_thebe)
    app.connect("html-page-context", _footer_index_links)
    app.connect("html-page-context", _drop_unused_assets)
    app.connect("build-finished", _trim_icons)
    app.connect("builder-inited", _prepare_source_archive)
    app.connect("html-page-context", _source_archive_links, priority=600)
    app.connect("html-page-context", _line_breaks)
    app.connect("build-finished", _write_source_archive)
    app.add_role("source-archive", _source_archive_role)
    app.add_css_file("qkmlp-site.css")
    app.add_js_file("qkmlp-site.js")
    from sphinx_proof.domain import ProofDomain, ProofIndex

    ProofDomain.indices = [_proof_index_by_chapter(ProofIndex)]
    _register_bibliography_style()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
