"""Measure pages of the built book as a phone reader meets them (tests/page_metrics.js):
the share of the page's height taken by visible code, the tables that scroll sideways
(and whether one of them has a verdict column, or hides it), inline code broken
mid-word, punctuation parted from its formula by a line break, inline formulas that
scroll, and the size of the header's tap targets.

Run it over a build (``jupyter-book build .`` writes ``_build/html``)::

    python tests/measure_pages.py                       # chapters 8-10 at 390 x 844
    python tests/measure_pages.py book/08_experiments --width 1280 --height 900
    python tests/measure_pages.py --all --json metrics.json   # every page of the toc

Pages open in headless Chromium (Debian's ``chromium``, or ``QKMLP_CHROMIUM``) from a
localhost server, each as it loads: folded cells and dropdowns stay closed, figures are
decoded and MathJax has typeset the page before anything is measured. tests/test_browser.py
uses :func:`measure` for its checks of the same quantities.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS_JS = Path(__file__).with_name("page_metrics.js").read_text()
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions",
]
DEFAULT_PAGES = ("book/08_experiments", "book/09_pretrained", "book/10_cost", "book/11_retrain")
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# Wait until the page is as a reader sees it: images decoded, MathJax done, the site
# script's pass over wide boxes done, fonts loaded.
READY_JS = """
async () => {
  const t0 = Date.now();
  for (const img of document.querySelectorAll('img')) { img.loading = 'eager'; try { await img.decode(); } catch (e) {} }
  while (document.querySelector('.math') && !(window.MathJax && MathJax.startup && MathJax.startup.promise)
         && Date.now() - t0 < 20000) await new Promise(r => setTimeout(r, 50));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  if (document.querySelector('script[src*="qkmlp-site.js"]'))
    while (!document.documentElement.dataset.qkScroll && Date.now() - t0 < 20000)
      await new Promise(r => setTimeout(r, 50));
  await document.fonts.ready;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
}
"""


def chromium() -> str | None:
    """The system Chromium (``QKMLP_CHROMIUM`` first), or None."""
    for name in (os.environ.get("QKMLP_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def view_for(width: int, height: int) -> dict:
    """Playwright context options: a phone (touch, mobile) below 600 px, else a window."""
    if width < 600:
        return {**PHONE, "viewport": {"width": width, "height": height}}
    return {"viewport": {"width": width, "height": height}}


def measure_open_page(page, verdict: str = "verdict") -> dict:
    """page_metrics.js on an open page, once it is ready."""
    page.evaluate(READY_JS)
    return page.evaluate(METRICS_JS, {"verdict": verdict})


def measure(browser, base_url: str, pages, *, width: int = 390, height: int = 844,
            verdict: str = "verdict") -> dict[str, dict]:
    """{page: metrics} for each page (``book/08_experiments`` or ``...html``) of the site
    served at ``base_url``, opened in a fresh tab of ``browser`` (a Playwright browser)
    with every request to another host blocked."""
    context = browser.new_context(**view_for(width, height))
    results = {}
    try:
        for name in pages:
            rel = name if name.endswith(".html") else f"{name}.html"
            page = context.new_page()
            page.route("**/*", lambda r: r.continue_()
                       if r.request.url.startswith(("data:", "blob:", "about:")) or
                       (r.request.url.split("/")[2].split(":")[0] in LOCAL_HOSTS) else r.abort())
            page.goto(base_url + rel, wait_until="load")
            results[name] = measure_open_page(page, verdict)
            page.close()
    finally:
        context.close()
    return results


def summary(metrics: dict) -> dict:
    """The headline numbers of one page's metrics."""
    tables = metrics["tables"]
    scrolling = [t for t in tables if t["scrolls"]]
    return {
        "code_share": round(metrics["code"]["share"], 3),
        "code_px": metrics["code"]["px"],
        "article_px": metrics["height"]["article"],
        "cells_shown": metrics["code"]["cells_shown"],
        "cells_folded": metrics["code"]["cells_folded"],
        "tables": len(tables),
        "tables_scrolling": len(scrolling),
        "scrolling_with_verdict": sum(t["verdict"] for t in scrolling),
        "verdict_hidden": sum(t["verdict_hidden"] for t in tables),
        "broken_identifiers": len(metrics["broken"]),
        "stranded_punctuation": len(metrics["stranded"]),
        "inline_math_scrolling": metrics["math_scrolling"],
        "smallest_header_target": min(([min(h["width"], h["height"]) for h in metrics["header"]]) or [None],
                                      key=lambda v: float("inf") if v is None else v),
    }


def format_report(results: dict[str, dict], width: int) -> str:
    lines = [f"at {width} px:"]
    for name, m in results.items():
        s = summary(m)
        lines.append(
            f"{name}: visible code {100 * s['code_share']:.1f} % of {s['article_px']:,} px "
            f"({s['cells_shown']} cells shown, {s['cells_folded']} folded); tables {s['tables_scrolling']} of "
            f"{s['tables']} scroll sideways, {s['scrolling_with_verdict']} of those with a verdict column "
            f"({s['verdict_hidden']} hide it); identifiers broken mid-word: {s['broken_identifiers']}; "
            f"punctuation parted from a formula: {s['stranded_punctuation']}; inline formulas scrolling: "
            f"{s['inline_math_scrolling']}; smallest header target {s['smallest_header_target']} px")
        for t in m["tables"]:
            if t["scrolls"]:
                lines.append(f"    scrolls: {t['where']} ({t['columns']} columns, {t['width']} px in "
                             f"{t['box']} px; out of view: {', '.join(t['hidden']) or '-'})")
        for b in m["broken"][:10]:
            lines.append(f"    broken: {b['text']}{' (table)' if b['table'] else ''} [in {b['where']!r}]")
        for b in m["stranded"][:10]:
            lines.append(f"    parted: {b['text']} [in {b['where']!r}]")
        for c in m["code"]["largest"][:3]:
            lines.append(f"    code: {c}")
    return "\n".join(lines)


class Server:
    """``directory`` served on a free localhost port (``.url``) until :meth:`close`."""

    def __init__(self, directory: Path):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass
        handler = functools.partial(Quiet, directory=str(directory))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/measure_pages.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help=f"pages without .html (default: {' '.join(DEFAULT_PAGES)})")
    parser.add_argument("--html", default=str(ROOT / "_build" / "html"), help="the built site (default _build/html)")
    parser.add_argument("--all", action="store_true", help="every page of _toc.yml")
    parser.add_argument("--width", type=int, default=390)
    parser.add_argument("--height", type=int, default=844)
    parser.add_argument("--verdict", default="verdict", help="regular expression naming a verdict column")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    html = Path(args.html)
    if not (html / "index.html").is_file():
        parser.error(f"{html} holds no built site (index.html); build the book first")
    pages = list(args.pages)
    if args.all:
        sys.path.insert(0, str(Path(__file__).parent))
        from toc_notebooks import toc_files
        pages = toc_files()
    pages = pages or list(DEFAULT_PAGES)
    missing = [p for p in pages if not (html / (p if p.endswith(".html") else p + ".html")).is_file()]
    if missing:
        parser.error(f"not in {html}: {missing}")
    exe = chromium()
    if exe is None:
        parser.error("no Chromium found (install Debian's `chromium` or set QKMLP_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    server = Server(html)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
            results = measure(browser, server.url, pages, width=args.width, height=args.height,
                              verdict=args.verdict)
            browser.close()
    finally:
        server.close()
    print(format_report(results, args.width))
    if args.json:
        Path(args.json).write_text(json.dumps({"width": args.width, "height": args.height, "pages": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
