"""The book builds as the README says (`jupyter-book build . -W -n --keep-going`), every
page of the table of contents is there, and the HTML asks for nothing from the internet.

The build itself (slow: it executes every notebook) is the session fixture `book_build`
in conftest.py, shared with test_browser.py.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from toc_notebooks import toc_files

pytestmark = [pytest.mark.book, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
REMOTE = re.compile(r"^(https?:)?//", re.I)
# Sphinx's own warnings ("file:line: WARNING: ..."), not the kernel's log lines on stderr.
SPHINX_PROBLEM = re.compile(r"(^|: )(WARNING|ERROR|CRITICAL|SEVERE): ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def toc_entries(toc: Path) -> list[str]:
    """Every file of a Jupyter Book toc (without suffix), root first."""
    return toc_files(toc)


def html_pages(html: Path) -> list[Path]:
    skip = {"_static", "_sources", "_images"}
    return sorted(p for p in html.rglob("*.html") if not skip & set(p.relative_to(html).parts))


class _Resources(HTMLParser):
    """Collect the URLs a page loads by itself (not the ones a reader may click)."""

    LOADS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "video": "src",
             "audio": "src", "embed": "src", "object": "data"}

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in self.LOADS and a.get(self.LOADS[tag]):
            self.urls.append(a[self.LOADS[tag]])
        if tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower()
            if any(r in rel for r in ("stylesheet", "preload", "icon", "modulepreload", "prefetch")):
                self.urls.append(a["href"])


def test_book_builds_with_warnings_as_errors(book_build):
    if book_build.returncode is None:
        pytest.skip(f"QKMLP_BOOK_HTML is set: reusing {book_build.html}, nothing was built")
    problems = [line for line in ANSI.sub("", book_build.log).splitlines() if SPHINX_PROBLEM.search(line)]
    assert book_build.returncode == 0, (
        f"jupyter-book build -W -n failed (exit {book_build.returncode}); full log in "
        f"test-artifacts/book/build.log. Warnings/errors:\n" + "\n".join(problems[:60])
        + ("\n" if problems else "\nlast lines:\n" + "\n".join(book_build.log.splitlines()[-40:]))
    )
    assert not problems, "\n".join(problems[:60])
    assert (book_build.html / "index.html").is_file()


# --- every notebook runs once in `make test`: in the build; its executed copy is checked here ---

NOTEBOOKS = [f for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]
EXECUTED = re.compile(r"(\S+\.ipynb): Executed notebook in ([0-9.]+) seconds")


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_notebook_ran_in_the_build_without_error(book_build, page):
    """The build executes every notebook (execute_notebooks: force, raise_on_error) and keeps
    the executed copy in _build/jupyter_execute: every code cell ran, none raised, and the
    executed cells are the committed ones. This replaces a second run under nbval (every
    assert of a chapter runs here once); `pytest --nbval-lax --nbval-current-env book/X.ipynb`
    still runs one notebook on its own while writing it."""
    import json

    if book_build.returncode is None:
        pytest.skip(f"QKMLP_BOOK_HTML is set: reusing {book_build.html}, nothing was executed")
    if page not in toc_entries(book_build.toc):
        pytest.skip(f"{page} is not in the toc this session built ({book_build.toc.name})")
    executed = book_build.html.parent / "jupyter_execute" / f"{page}.ipynb"
    log = ANSI.sub("", book_build.log)
    own = [ln for ln in log.splitlines() if f"{page}.ipynb" in ln]
    assert executed.is_file(), f"{page}: not executed by the build; its log lines:\n" + "\n".join(own[-20:])
    ran = json.loads(executed.read_text())
    source = json.loads((ROOT / f"{page}.ipynb").read_text())
    code = [c for c in ran["cells"] if c["cell_type"] == "code"]
    assert ["".join(c["source"]) for c in code] == [
        "".join(c["source"]) for c in source["cells"] if c["cell_type"] == "code"], f"{page}: stale executed copy"
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(code) for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{page}: cells raised {errors}"
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None and "".join(c["source"]).strip()]
    assert not unrun, f"{page}: code cells {unrun} did not run"
    times = [float(t) for nb, t in EXECUTED.findall(log) if nb.endswith(f"{page}.ipynb")]
    assert times, f"{page}: the build log does not say how long it ran"
    print(f"{page}: executed in {times[-1]:.1f} s")


def stderr_outputs(notebook: dict) -> list[tuple[int, str, str]]:
    """``(cell index, cell id, text)`` of every stream output written to stderr."""
    return [(i, c.get("id", "?"), "".join(o.get("text", "")))
            for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_notebook_wrote_nothing_to_stderr_in_the_build(book_build, page):
    """No warning reaches a reader: no cell of the executed notebook wrote to stderr (a
    Python warning, a library's log line, a progress bar), which JupyterLab shows in red
    and the website as output. Fix the cause; a warning filter for the whole notebook
    would hide the next one too. With QKMLP_BOOK_HTML set, the executed copies beside
    that folder (``../jupyter_execute``) are checked where they exist."""
    import json

    if page not in toc_entries(book_build.toc):
        pytest.skip(f"{page} is not in the toc this session built ({book_build.toc.name})")
    executed = book_build.html.parent / "jupyter_execute" / f"{page}.ipynb"
    if book_build.returncode is None and not executed.is_file():
        pytest.skip(f"QKMLP_BOOK_HTML is set and {executed} does not exist")
    assert executed.is_file(), f"{page}: not executed by the build"
    found = stderr_outputs(json.loads(executed.read_text()))
    assert not found, f"{page}: cells wrote to stderr:\n" + "\n".join(
        f"  cell {i} (id {cid}): {text.strip()[:400]}" for i, cid, text in found)


def test_every_toc_page_is_built(book_build):
    missing = [f for f in toc_entries(book_build.toc) if not (book_build.html / f"{f}.html").is_file()]
    assert not missing, f"pages of {book_build.toc.name} missing from the build: {missing}"


def test_pages_load_nothing_from_the_internet(book_build):
    """Static half of the offline proof (the browser test is the dynamic half)."""
    remote = {}
    pages = html_pages(book_build.html)
    assert pages, f"no HTML pages under {book_build.html}"
    for page in pages:
        parser = _Resources()
        parser.feed(page.read_text(errors="replace"))
        urls = [u for u in parser.urls if REMOTE.match(u)]
        if urls:
            remote[str(page.relative_to(book_build.html))] = urls
    for css in (book_build.html / "_static").rglob("*.css"):
        urls = re.findall(r"""(?:@import\s+|url\()\s*['"]?((?:https?:)?//[^'")\s]+)""", css.read_text(errors="replace"))
        if urls:
            remote[str(css.relative_to(book_build.html))] = urls
    assert not remote, f"resources loaded from other hosts: {remote}"


def test_mathjax_is_served_from_the_build(book_build):
    html = book_build.html
    script = html / "_static" / "mathjax" / "tex-chtml.js"
    assert script.is_file() and script.stat().st_size > 100_000, f"{script} missing or truncated"
    fonts = list((html / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) > 10, "MathJax CHTML web fonts are not in the build"
    for f in toc_entries(book_build.toc):
        text = (html / f"{f}.html").read_text()
        if 'class="math' in text:
            assert re.search(r'<script[^>]+src="[./]*_static/mathjax/tex-chtml\.js(\?[^"]*)?"', text), \
                f"{f}.html has math but does not load the bundled MathJax"


def test_notebook_pages_offer_the_notebook_for_download(book_build):
    notebooks = [f for f in toc_entries(book_build.toc) if (ROOT / f"{f}.ipynb").exists()]
    if not notebooks:
        pytest.skip(f"no notebook in {book_build.toc.name} yet")
    bad = []
    for f in notebooks:
        name = Path(f).name
        page = (book_build.html / f"{f}.html").read_text()
        link = re.search(rf'href="([./]*_sources/{re.escape(f)}\.ipynb)"[^>]*download', page) or \
            re.search(rf'href="([./]*_sources/{re.escape(f)}\.ipynb)"', page)
        source = book_build.html / "_sources" / f"{f}.ipynb"
        if not link or not source.is_file() or source.stat().st_size == 0:
            bad.append(name)
    assert not bad, f"no working .ipynb download button on: {bad}"


def test_landing_page_and_metadata(book_build):
    index = (book_build.html / "index.html").read_text()
    root = toc_entries(book_build.toc)[0]
    assert f"{root}.html" in index, "index.html must lead to the landing page"
    landing = (book_build.html / f"{root}.html").read_text()
    assert "reading path" in landing.lower(), "the landing page should give the reading path"
    assert re.search(r"©\s*Copyright\s*2026|&#169;\s*Copyright\s*2026|Copyright\s*2026", landing)
    assert "The qkmlp authors" in landing


def test_api_page_documents_every_public_module():
    """book/api.md lists an automodule for every public module of src/qkmlp (new modules too)."""
    src = ROOT / "src"
    modules = set()
    for path in (src / "qkmlp").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue  # private modules and __main__
        modules.add(".".join(parts))
    documented = set(re.findall(r"^\.\. automodule:: (\S+)", (ROOT / "book" / "api.md").read_text(), re.M))
    assert not modules - documented, f"modules missing from book/api.md: {sorted(modules - documented)}"
    assert not documented - modules, f"book/api.md documents modules that do not exist: {sorted(documented - modules)}"


def test_pages_carry_only_what_the_book_uses(book_build):
    """No Binder/Thebe configuration, no fontawesome.js, no search index outside the
    search page, sphinx-design only where a page uses it (book/_ext/qkmlp_site.py)."""
    bad = {}
    for page in html_pages(book_build.html):
        text = page.read_text(errors="replace")
        rel = page.relative_to(book_build.html).as_posix()
        if 'http-equiv="refresh"' in text.lower():
            continue
        found = [what for what, pattern in [
            ("Thebe/Binder configuration", r"x-thebe-config|THEBE_JS_URL|sphinx-thebe|binderOptions"),
            ("fontawesome.js", r"fontawesome\.js"),
            ("sphinx-design assets on a page without its components",
             r"sphinx-design\.min\.css|design-tabs\.js" if 'class="sd-' not in text else r"(?!)"),
            ("search index outside the search page",
             r"searchindex\.js|searchtools\.js" if rel != "search.html" else r"(?!)"),
        ] if re.search(pattern, text, re.I)]
        if found:
            bad[rel] = found
    assert not bad, bad
    assert not list((book_build.html / "_static").glob("sphinx-thebe*")), "sphinx-thebe files in _static"
    assert "searchindex.js" in (book_build.html / "search.html").read_text()


def test_indexes_are_linked_and_readable(book_build):
    """Every page links the general, module and proof indexes; the proof index lists
    "Theorem 5.2"-style entries under chapter headings, not raw labels."""
    html = book_build.html
    for f in toc_entries(book_build.toc):
        text = (html / f"{f}.html").read_text()
        for index in ("genindex.html", "py-modindex.html", "prf-prf.html"):
            assert re.search(rf'href="[./]*{re.escape(index)}"', text), f"{f}.html does not link {index}"
    proofs = (html / "prf-prf.html").read_text()
    names = re.findall(r'<code class="xref">([^<]*)</code>', proofs)
    assert names, "the proof index lists nothing"
    raw = [n for n in names if not re.fullmatch(
        r"(Theorem|Lemma|Proposition|Corollary|Definition|Remark|Example|Conjecture|Axiom|"
        r"Criterion|Algorithm|Property|Observation|Assumption|Notation)( \d+(\.\d+)*)?", n)]
    assert not raw, f"proof index entries that are not 'Kind number': {raw[:10]}"
    assert re.search(r"<strong>1\. ", proofs), "the proof index is not grouped by numbered chapter"


def test_bibliography_labels_are_author_year(book_build):
    """The bibliography's labels read as the text cites ("Breslow, 2026"), not "[Bre26]"."""
    text = (book_build.html / "book" / "bibliography.html").read_text()
    labels = re.findall(r'<span class="label"><span class="fn-bracket">\[</span>(?:<a[^>]*>)?([^<]*)', text)
    assert labels, "no bibliography entries"
    bad = [lab for lab in labels if not re.fullmatch(r"[^\d,]+, \d{4}[a-z]?", lab)]
    assert not bad, f"labels not in the author-year form: {bad}"


def test_the_site_ships_its_source_and_a_fresh_folder_can_run_make(book_build, tmp_path):
    """The build writes qkmlp-source.tar.gz beside index.html. Unpacked into a fresh folder
    (no .git, no .venv) it holds this checkout's source files, byte for byte: what
    `make book` and `make test` need, every page of the table of contents and the stored
    results under book/data; there `make -n book` and `make -n test` plan the README's
    commands (running the suite from it takes as long as the suite: not done here). Every
    page of the toc links the archive (header menu and footer), the run-locally page
    from its text."""
    from qkmlp.book.source_archive import ARCHIVE_NAME, TOP, source_files

    archive = book_build.html / ARCHIVE_NAME
    assert archive.is_file(), f"the build wrote no {ARCHIVE_NAME} into {book_build.html}"
    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    assert all(n.startswith(TOP + "/") for n in names), [n for n in names if not n.startswith(TOP + "/")][:5]
    top = tmp_path / TOP
    shipped = sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file())
    assert shipped == source_files(ROOT), "the archive's files are not this checkout's source files"
    changed = [rel for rel in shipped if (top / rel).read_bytes() != (ROOT / rel).read_bytes()]
    assert not changed, f"files that differ from the checkout: {changed[:10]}"
    needed = ["Makefile", "requirements.txt", "pyproject.toml", "_config.yml", "_toc.yml", "README.md",
              "LICENSE", ".ci/run", "book/references.bib", "src/qkmlp/__init__.py", "tests/conftest.py",
              "tests/toc_notebooks.py"]
    needed += [next(f"{f}{ext}" for ext in (".ipynb", ".md") if (ROOT / f"{f}{ext}").exists())
               for f in toc_entries(ROOT / "_toc.yml")]
    assert not [n for n in needed if n not in shipped], [n for n in needed if n not in shipped]
    data = [rel for rel in shipped if rel.startswith("book/data/")]
    assert len(data) >= 10, f"only {len(data)} stored results under book/data: {data}"
    stray = [rel for rel in shipped if re.search(r"(^|/)(\.git|\.venv|_build|test-artifacts|__pycache__)(/|$)", rel)]
    assert not stray, stray
    # from the unpacked folder (no git there) the archive would hold the same files
    assert source_files(top) == shipped
    make = shutil.which("make")
    assert make, "make is not installed (the README's two commands need it)"
    for target, planned in (("test", r"-m pytest .*tests"), ("book", r"jupyter-book build \. -W -n")):
        proc = subprocess.run([make, "-n", target], cwd=top, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"make -n {target} in the unpacked source failed: {proc.stderr}"
        assert re.search(planned, proc.stdout), f"make -n {target} does not plan {planned!r}:\n{proc.stdout}"
        assert "-m venv .venv" in proc.stdout and "pip install" in proc.stdout
    for f in toc_entries(book_build.toc):
        text = (book_build.html / f"{f}.html").read_text()
        links = re.findall(rf'href="([./]*{re.escape(ARCHIVE_NAME)})"', text)
        assert len(links) >= 2, f"{f}.html links the source archive {len(links)} times (want header and footer)"
        assert all((book_build.html / Path(f).parent / link).resolve() == archive.resolve() for link in links)
    running = (book_build.html / "book" / "running_locally.html").read_text()
    assert re.search(rf'<a class="[^"]*qk-source-archive[^"]*" href="[./]*{re.escape(ARCHIVE_NAME)}"', running), \
        "the run-locally page does not link the source archive from its text"


NUMBERED = re.compile(r"^(Theorem|Lemma|Proposition|Corollary|Definition|Remark|Example) \d+\.\d+$")


def test_a_reference_to_a_numbered_statement_names_its_number(book_build):
    """Every link whose text is 'Theorem 4.4' (sphinx-proof's own text, or an explicit one
    written so that JupyterLab, which cannot resolve a label in another notebook, shows the
    same words) lands on the statement whose header says 'Theorem 4.4'."""
    headers, pages = {}, {}
    for page in html_pages(book_build.html):
        text = page.read_text()
        pages[page] = text
        for ident, number in re.findall(r'<div class="proof [^"]*" id="([^"]+)">\s*<p class="admonition-title">'
                                        r'<span class="caption-number">([^<]+)</span>', text):
            headers[(page.resolve(), ident)] = number.strip()
    checked, wrong = 0, []
    for page, text in pages.items():
        for href, body in re.findall(r'<a class="reference internal" href="([^"]*#[^"]+)"[^>]*>(.*?)</a>', text, re.S):
            label = re.sub(r"<[^>]+>", "", body).strip()
            if not NUMBERED.match(label):
                continue
            target, ident = href.split("#", 1)
            key = ((page.parent / target).resolve() if target else page.resolve(), ident)
            checked += 1
            if headers.get(key) != label:
                wrong.append(f"{page.name}: '{label}' links to {href}, whose header says {headers.get(key)!r}")
    assert checked > 100, f"only {checked} numbered references found: has the HTML changed?"
    assert not wrong, "\n".join(wrong[:20])
