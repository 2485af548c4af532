"""The built book in a real browser: headless Chromium (Debian's `chromium`) opens every
page from a localhost server, with every request to another host blocked and recorded.

Checked on every page: no JavaScript error, no request leaving the machine and no failed
local request; every math element typeset by MathJax with no MathJax error; every image
loaded and non-empty; theorem/proof blocks numbered; no "??" or unresolved cross-reference;
every internal link and anchor exists. The static explorer of chapter 5 must answer its
slider. A screenshot of each page of the table of contents goes to
test-artifacts/screenshots/.

Skipped, with the reason, where Chromium or the playwright package is missing. Playwright
only drives the system Chromium here (`executable_path`); it never downloads a browser.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

from test_book import html_pages, toc_entries

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions",
]


def _chromium() -> str | None:
    for name in (os.environ.get("QKMLP_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = _chromium()
if CHROMIUM is None:
    pytest.skip("no Chromium found (install Debian's `chromium`, as .ci/run does, or set "
                "QKMLP_CHROMIUM)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements.txt)")


# ---------------------------------------------------------------- server and browser

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server(book_build):
    """Serve _build/html on a free localhost port; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(book_build.html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@dataclass
class PageReport:
    """What one page did in the browser."""

    url: str
    js_errors: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # requests to other hosts (aborted)
    failed: list[str] = field(default_factory=list)  # local requests that failed or gave >= 400
    math: dict = field(default_factory=dict)
    images: list[dict] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    proofs: list[dict] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    has_explorer: bool = False


def _open(context, url: str) -> tuple[object, PageReport]:
    """Open url in a new page with request blocking and error recording set up."""
    report = PageReport(url)
    page = context.new_page()

    def route(r):
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:", "about:")) or host in LOCAL_HOSTS:
            r.continue_()
        else:
            report.blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: report.js_errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: m.type == "error" and report.js_errors.append(f"console: {m.text}"))
    page.on("requestfailed", lambda r: urlparse(r.url).hostname in LOCAL_HOSTS
            and report.failed.append(f"{r.url}: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and report.failed.append(f"{r.url}: HTTP {r.status}"))
    page.goto(url, wait_until="load")
    return page, report


_MATH_JS = """
async () => {
  const els = [...document.querySelectorAll('.math')];
  if (!els.length) return {count: 0, mathjax: !!window.MathJax};
  const t0 = Date.now();
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise) && Date.now() - t0 < 20000)
    await new Promise(r => setTimeout(r, 50));
  if (!(window.MathJax && MathJax.startup)) return {count: els.length, mathjax: false};
  const done = await Promise.race([MathJax.startup.promise.then(() => true),
                                   new Promise(r => setTimeout(() => r(false), 60000))]);
  if (!done) return {count: els.length, mathjax: true, untypeset: ['MathJax still typesetting after 60 s'], errors: []};
  const untypeset = els.filter(e => !e.querySelector('mjx-container'))
                       .map(e => e.textContent.trim().slice(0, 80));
  return {count: els.length, mathjax: true, untypeset,
          errors: [...document.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
          version: MathJax.version};
}
"""

_IMAGES_JS = """
async () => {
  const imgs = [...document.querySelectorAll('img')];
  for (const img of imgs) { img.loading = 'eager'; try { await img.decode(); } catch (e) {} }
  return imgs.map(img => ({src: img.currentSrc || img.src, complete: img.complete,
                          width: img.naturalWidth, height: img.naturalHeight,
                          inFigure: !!img.closest('figure, .cell_output, .output')}));
}
"""

_REFS_JS = r"""
() => {
  const main = document.querySelector('main') || document.body;
  const text = main.innerText;
  const unresolved = [];
  for (const m of text.matchAll(/.{0,40}\?\?.{0,40}/g)) unresolved.push('"??" in text: ' + m[0]);
  for (const m of text.matchAll(/.{0,30}\{(?:prf:ref|eq|cite:[pt]|doc|ref|numref)\}`.{0,30}/g))
    unresolved.push('raw role in text: ' + m[0]);
  for (const m of text.matchAll(/.{0,30}```\{.{0,40}/g)) unresolved.push('raw directive: ' + m[0]);
  // cross-references Sphinx could not resolve stay as `.xref` without a link around them
  // (the API page's plain-text external types, py domain, are meant that way).
  // docutils marks markup it could not process (e.g. an undefined |substitution|)
  for (const x of main.querySelectorAll('.problematic, .system-message'))
    unresolved.push('docutils problem: ' + x.outerHTML.slice(0, 120));
  for (const x of main.querySelectorAll('.xref:not(.py)'))
    if (!x.closest('a')) unresolved.push('unlinked xref: ' + x.outerHTML.slice(0, 120));
  const proofs = [...main.querySelectorAll('div.proof, div.admonition.theorem')].map(d => ({
    classes: d.className,
    title: (d.querySelector('.admonition-title') || {}).innerText || ''}));
  const links = [...main.querySelectorAll('a[href]')].map(a => a.href);
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id)
    .concat([...document.querySelectorAll('a[name]')].map(a => a.name));
  return {unresolved, proofs, links, ids,
          explorer: !!document.querySelector('div.qkmlp-static-explorer')};
}
"""


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", path.removesuffix(".html")).strip("_")


@pytest.fixture(scope="module")
def site(book_build, server, browser) -> dict[str, PageReport]:
    """Open every HTML page of the build once; screenshot each page of the toc."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    toc_pages = {f"{f}.html" for f in toc_entries(book_build.toc)}
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    reports: dict[str, PageReport] = {}
    try:
        for path in html_pages(book_build.html):
            rel = path.relative_to(book_build.html).as_posix()
            page, report = _open(context, server + rel)
            if 'http-equiv="refresh"' in path.read_text(errors="replace").lower():
                # index.html forwards to the landing page: follow it, check where it lands
                page.wait_for_url(lambda u: u != server + rel, timeout=15_000)
                page.wait_for_load_state("load")
            report.math = page.evaluate(_MATH_JS)
            report.images = page.evaluate(_IMAGES_JS)
            refs = page.evaluate(_REFS_JS)
            report.unresolved = refs["unresolved"]
            report.proofs = refs["proofs"]
            report.links = refs["links"]
            report.ids = set(refs["ids"])
            report.has_explorer = refs["explorer"]
            if rel in toc_pages:
                page.screenshot(path=str(SCREENSHOTS / f"{_slug(rel)}.png"), full_page=True)
            page.wait_for_timeout(50)  # let late console errors arrive
            page.close()
            reports[rel] = report
    finally:
        context.close()
    return reports


def _fail_if(found: dict, what: str):
    assert not found, f"{what} on {len(found)} page(s):\n" + "\n".join(
        f"  {page}: {items[:8]}" for page, items in found.items())


# ---------------------------------------------------------------- the checks

def test_every_page_was_opened(site, book_build):
    missing = [f for f in toc_entries(book_build.toc) if f"{f}.html" not in site]
    assert not missing, missing
    shots = [p for p in SCREENSHOTS.glob("*.png") if not p.name.startswith("explorer_")]
    assert len(shots) == len(toc_entries(book_build.toc))


def test_no_javascript_errors(site):
    _fail_if({p: r.js_errors for p, r in site.items() if r.js_errors}, "JavaScript errors")


def test_nothing_is_requested_from_another_host(site):
    _fail_if({p: r.blocked for p, r in site.items() if r.blocked}, "requests to other hosts")


def test_no_local_request_fails(site):
    _fail_if({p: r.failed for p, r in site.items() if r.failed}, "failed local requests")


def test_every_math_element_is_typeset_by_mathjax(site):
    with_math = {p: r.math for p, r in site.items() if r.math.get("count")}
    assert with_math, "no page has math: the check would prove nothing"
    bad = {}
    for p, m in with_math.items():
        if not m.get("mathjax"):
            bad[p] = ["MathJax did not load"]
        elif m["untypeset"] or m["errors"]:
            bad[p] = [f"not typeset: {t}" for t in m["untypeset"]] + [f"MathJax error: {e}" for e in m["errors"]]
    _fail_if(bad, "math not typeset")


def test_every_image_is_present_and_non_empty(site):
    bad = {p: [i["src"] for i in r.images if not (i["complete"] and i["width"] > 0 and i["height"] > 0)]
           for p, r in site.items()}
    _fail_if({p: v for p, v in bad.items() if v}, "broken or empty images")


def test_notebook_figures_are_shown(site, book_build):
    """Every figure a notebook made when the book executed it is on its page, non-empty."""
    executed = book_build.html.parent / "jupyter_execute"
    bad = []
    for f in toc_entries(book_build.toc):
        nb = executed / f"{f}.ipynb"
        if not nb.exists():
            continue
        cells = json.loads(nb.read_text())["cells"]
        figures = sum("image/png" in out.get("data", {}) or "image/svg+xml" in out.get("data", {})
                      for c in cells if c["cell_type"] == "code" for out in c.get("outputs", []))
        shown = sum(1 for i in site[f"{f}.html"].images if i["inFigure"] and i["width"] > 0 and i["height"] > 0)
        if shown < figures:
            bad.append(f"{f}: {figures} figures made, {shown} shown")
    assert not bad, bad


def test_cross_references_and_citations_resolve(site):
    _fail_if({p: r.unresolved for p, r in site.items() if r.unresolved}, "unresolved references")


def test_theorem_blocks_are_numbered(site):
    """sphinx-proof blocks render as div.proof.<kind>.admonition with a numbered title
    ("Theorem 5.1 (...)"); prf:proof blocks (div.proof.admonition) are titled "Proof"."""
    bad, numbered = {}, 0
    for p, r in site.items():
        for block in r.proofs:
            if block["classes"].split()[:2] == ["proof", "admonition"]:
                continue
            if re.search(r"\d", block["title"]):
                numbered += 1
            else:
                bad.setdefault(p, []).append(f"{block['classes']}: {block['title']!r}")
    _fail_if(bad, "theorem-like blocks without a number")
    assert numbered, "no theorem/definition block found in the whole book: the check proved nothing"


def test_internal_links_and_anchors_exist(site, server):
    bad: dict[str, list[str]] = {}
    checked_files: dict[str, bool] = {}
    for p, r in site.items():
        for link in r.links:
            url, frag = urldefrag(link)
            if not url.startswith(server):
                continue
            rel = url[len(server):]
            if rel == "" or rel.endswith("/"):
                rel += "index.html"
            if rel.endswith(".html"):
                target = site.get(rel)
                if target is None:
                    bad.setdefault(p, []).append(f"missing page {rel}")
                elif frag and frag not in target.ids:
                    bad.setdefault(p, []).append(f"missing anchor {rel}#{frag}")
            else:  # downloads (.ipynb, .md sources), images: fetch them
                if rel not in checked_files:
                    try:
                        with urllib.request.urlopen(url, timeout=10) as resp:
                            checked_files[rel] = resp.status == 200 and len(resp.read(1)) == 1
                    except OSError:
                        checked_files[rel] = False
                if not checked_files[rel]:
                    bad.setdefault(p, []).append(f"broken file link {rel}")
    _fail_if(bad, "broken internal links")


# ---------------------------------------------------------------- the static explorer

_EXPLORER_STATE_JS = """
(root) => ({
  alpha: root.querySelector('input[type=range].qkmlp-alpha').value,
  alphaText: root.querySelector('.qkmlp-alpha-value').textContent.trim(),
  scale: root.querySelector('.qkmlp-scale-change').textContent.trim(),
  swap: root.querySelector('.qkmlp-swap-change').textContent.trim(),
  plot: root.querySelector('.qkmlp-plot').innerHTML,
})
"""

_FARTHER_END_JS = """
(s) => {
  const lo = parseFloat(s.min || '0'), hi = parseFloat(s.max || '100'), v = parseFloat(s.value);
  return (hi - v) > (v - lo) ? 'End' : 'Home';
}
"""


def test_static_explorer_answers_its_slider(site, server, browser):
    pages = [p for p, r in site.items() if r.has_explorer]
    if not pages:
        pytest.skip("no page contains div.qkmlp-static-explorer yet (chapter 5 not built)")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        for p in pages:
            page, report = _open(context, server + p)
            explorers = page.locator("div.qkmlp-static-explorer")
            assert explorers.count() >= 1
            for i in range(explorers.count()):
                root = explorers.nth(i)
                for sel in ("input[type=range].qkmlp-alpha", "select.qkmlp-activation", "select.qkmlp-form",
                            ".qkmlp-alpha-value", ".qkmlp-scale-change", ".qkmlp-swap-change", ".qkmlp-plot"):
                    assert root.locator(sel).count() == 1, f"{p}: explorer {i} lacks exactly one {sel}"
                root.scroll_into_view_if_needed()
                before = root.evaluate(_EXPLORER_STATE_JS)
                # move the slider as a reader would: focus it, jump to its farther end
                slider = root.locator("input[type=range].qkmlp-alpha")
                key = slider.evaluate(_FARTHER_END_JS)
                slider.focus()
                page.keyboard.press(key)
                page.wait_for_timeout(300)
                after = root.evaluate(_EXPLORER_STATE_JS)
                assert after["alpha"] != before["alpha"], f"{p}: slider did not move (stuck at {before['alpha']})"
                assert after["alphaText"] != before["alphaText"], f"{p}: α readout did not change"
                assert after["scale"] != before["scale"], f"{p}: scale-change text did not change"
                assert after["plot"] != before["plot"], f"{p}: plot did not change with the slider"
                root.screenshot(path=str(SCREENSHOTS / f"explorer_{_slug(p)}_{i}_moved.png"))
                activation = root.locator("select.qkmlp-activation")
                current = activation.input_value()
                others = [v for v in activation.locator("option").evaluate_all("os => os.map(o => o.value)")
                          if v != current]
                if others:
                    activation.select_option(others[0])
                    page.wait_for_timeout(300)
                    again = root.evaluate(_EXPLORER_STATE_JS)
                    assert (again["scale"], again["swap"], again["plot"]) != (after["scale"], after["swap"], after["plot"]), \
                        f"{p}: choosing activation {others[0]} changed nothing"
            page.wait_for_timeout(50)
            page.close()
            assert not report.js_errors, f"{p}: JavaScript errors while moving the explorer: {report.js_errors}"
            assert not report.blocked, f"{p}: explorer requested other hosts: {report.blocked}"
    finally:
        context.close()
