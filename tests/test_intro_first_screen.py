"""The introduction's first screen, as a reader on a desktop meets it (1280 x 900, the
window tests/test_browser.py reads every page in): the symmetric and gated panels of the
schematic side by side, and the whole answer box, above the fold. On a phone the panels
stack and come before the answer. Screenshots go to test-artifacts/screenshots/."""
from __future__ import annotations

import pytest

from measure_pages import READY_JS
from test_browser import DESKTOP, PHONE, SCREENSHOTS, _open, browser, server  # noqa: F401 (fixtures)
from test_book import toc_entries

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BOXES_JS = """() => {
  const box = e => { const b = e.getBoundingClientRect();
                     return {top: b.top + scrollY, bottom: b.bottom + scrollY, left: b.left, right: b.right}; };
  const article = document.querySelector('article') || document.body;
  const imgs = [...article.querySelectorAll('img')].filter(e => /schematic-/.test(e.getAttribute('src') || ''))
                 .map(e => ({src: e.getAttribute('src'), ...box(e), natural: e.naturalWidth}));
  const answer = article.querySelector('.admonition.important');
  const heads = [...article.querySelectorAll('h2')].map(h => ({text: h.textContent, ...box(h)}));
  return {imgs, answer: answer ? {title: answer.querySelector('.admonition-title').textContent, ...box(answer)} : null,
          heads, height: innerHeight};
}"""


def _boxes(browser, server, view, name):  # noqa: F811
    context = browser.new_context(**view)
    try:
        page, report = _open(context, server + "book/intro.html")
        page.evaluate(READY_JS)
        page.evaluate("() => window.scrollTo(0, 0)")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"intro-first-screen-{name}.png"))
        found = page.evaluate(BOXES_JS)
        page.close()
    finally:
        context.close()
    assert not report.failed and not report.js_errors, (report.failed, report.js_errors)
    return found


@pytest.fixture(scope="module")
def intro_in_toc(book_build):
    if "book/intro" not in toc_entries(book_build.toc):
        pytest.skip("book/intro is not in this build's table of contents")


def test_the_first_screen_holds_the_picture_and_the_answer(browser, server, intro_in_toc):  # noqa: F811
    found = _boxes(browser, server, DESKTOP, "1280")
    height = DESKTOP["viewport"]["height"]
    imgs, answer = found["imgs"], found["answer"]
    assert [i["src"].rsplit("/", 1)[1] for i in imgs] == ["schematic-symmetric.svg", "schematic-gated.svg"]
    assert answer and answer["title"].startswith("The answer"), answer
    # side by side: one row, the symmetric unit left of the gated one
    assert abs(imgs[0]["top"] - imgs[1]["top"]) < 2 and imgs[0]["right"] <= imgs[1]["left"], imgs
    # the panels and the whole answer box are on the first screen, picture first
    assert all(0 <= i["top"] and i["bottom"] <= height for i in imgs), imgs
    assert max(i["bottom"] for i in imgs) <= answer["top"] and answer["bottom"] <= height, (answer, height)
    # and the reading path comes right after
    assert found["heads"] and found["heads"][0]["text"].startswith("How to read this book")


def test_on_a_phone_the_panels_stack_before_the_answer(browser, server, intro_in_toc):  # noqa: F811
    found = _boxes(browser, server, PHONE, "390")
    imgs, answer = found["imgs"], found["answer"]
    assert len(imgs) == 2 and imgs[0]["bottom"] <= imgs[1]["top"] + 1, imgs
    assert imgs[1]["bottom"] <= answer["top"]
    assert all(i["right"] <= PHONE["viewport"]["width"] for i in imgs), imgs
