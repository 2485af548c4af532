"""The front door: the README a newcomer reads in two minutes and the introduction's first
screen. The README is at most 600 words and shows the schematic, which
``python -m qkmlp.book schematic`` draws; its answer, and the introduction's, is the why
page's answer word for word, with the numbers that page computes from the stored results;
its ten-line example prints what its comments say; what it no longer says lives on the
reproduce page, which is in the table of contents."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toc_notebooks import toc_files

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INTRO = ROOT / "book" / "intro.md"
STATIC = ROOT / "book" / "_static"
SCHEMATIC = ["schematic-symmetric.svg", "schematic-gated.svg"]
ANSWER_TITLE = "The answer, as far as the evidence goes"
MAX_WORDS = 600


def _words(text: str) -> int:
    """Words as a reader meets them: every whitespace-separated token, code included."""
    return len(text.split())


def _plain(text: str) -> str:
    """Markdown prose reduced to its words: no emphasis marks, one space between words."""
    return " ".join(text.replace("**", "").replace("*", "").split())


# ----------------------------------------------------------------------------- the README
def test_the_readme_fits_two_minutes():
    text = README.read_text()
    assert _words(text) <= MAX_WORDS, f"README.md has {_words(text)} words; at most {MAX_WORDS}"
    # the count can fail: the README before this rewrite had 2,382 words
    assert _words(text * 2) > MAX_WORDS


def test_the_readme_has_what_a_newcomer_looks_for():
    text = README.read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads == [ANSWER_TITLE, "How to read it", "Two commands", "The layers in ten lines",
                     "Reproduce the evidence", "Cite"], heads
    assert re.search(r"^make book\b", text, re.M) and re.search(r"^make test\b", text, re.M)
    assert re.search(r"`make test`\) took [\d ,.]+min [\d.]+ s wall", text), "make test's measured wall time"
    assert "`make lab`" in text
    # the reproduce line points at a page that exists and is in the book
    link = re.search(r"\[Reproduce the evidence\]\(([^)]+)\)", text).group(1)
    assert (ROOT / link).is_file()
    assert link.removesuffix(".md") in toc_files()
    # the reading path names the main path and marks chapter 6
    assert "chapters 1–6" in text and "the answer does not need it" in text
    assert re.search(r"@misc\{breslow2026gated,", text)


def test_the_readme_and_the_reproduce_page_give_the_same_make_test_time():
    pattern = r"`bash \.ci/run` \(which calls\s+`make test`\) took ([\d ,.]+min [\d.]+ s) wall"
    readme = re.search(pattern, README.read_text())
    page = re.search(pattern, (ROOT / "book" / "reproduce.md").read_text())
    assert readme and page, "both say how long `bash .ci/run` took"
    assert " ".join(readme.group(1).split()) == " ".join(page.group(1).split())


def _readme_example() -> str:
    block = re.search(r"## The layers in ten lines\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 10
    return block


def test_the_readme_example_prints_what_its_comments_say():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_readme_example(), "README.md", "exec"), {})
    broken, invariant = (float(v) for v in out.getvalue().split())
    # q <-> k changes SwiGLU by a relative amount of order 1 ...
    assert 0.1 < broken < 10
    # ... and the symmetric unit is invariant under q -> -3q, k -> k/(-3) up to float32 rounding
    assert invariant < 1e-5


# ----------------------------------------------------------------------------- the schematic
def _image_sources(page: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page.read_text())


@pytest.mark.parametrize("page", [README, INTRO], ids=["README", "intro"])
def test_the_pages_show_both_rank_one_panels(page):
    sources = _image_sources(page)
    assert [Path(s).name for s in sources] == SCHEMATIC, sources
    for src in sources:
        assert (page.parent / src).resolve() == (STATIC / Path(src).name).resolve()
        assert (page.parent / src).is_file()


def test_the_committed_schematic_is_what_the_command_draws(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "qkmlp.book", "schematic", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SCHEMATIC)
    for name in SCHEMATIC:
        fresh = (tmp_path / name).read_text()
        assert fresh == (STATIC / name).read_text(), (
            f"book/_static/{name} is not what the command draws now; rerun "
            "`python -m qkmlp.book schematic --out book/_static` and commit it")
        # a 3.5-inch panel (252 pt), text drawn as paths (no font needed), no date stamp
        assert 'width="252pt"' in fresh and "<text" not in fresh and "dc:date" not in fresh
    # the gated panel is not the symmetric one (a test of equality that can fail)
    assert (STATIC / SCHEMATIC[0]).read_text() != (STATIC / SCHEMATIC[1]).read_text()


def test_the_schematic_command_refuses_bad_input(tmp_path):
    from qkmlp.book.schematic import write_schematic

    afile = tmp_path / "a.svg"
    afile.write_text("")
    with pytest.raises(NotADirectoryError, match="folder"):
        write_schematic(afile)
    with pytest.raises(ValueError, match="the panels are"):
        write_schematic(tmp_path / "new", ("gated", "swiglu"))
    assert not (tmp_path / "new").exists()          # nothing written before the check
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    bad = subprocess.run([sys.executable, "-m", "qkmlp.book", "schematic", "--out", str(tmp_path),
                          "--panels", "swiglu"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "invalid choice" in bad.stderr


# ----------------------------------------------------------------------------- the answer
@pytest.fixture(scope="module")
def why_answer(tmp_path_factory):
    """The why page's answer box with its {eval} numbers filled in, computed by running
    the page's code cells that come before it (they read the stored results and assert
    every number against them)."""
    cells = json.loads((ROOT / "book" / "why.ipynb").read_text())["cells"]
    scope: dict = {}
    old = os.getcwd()
    os.chdir(ROOT / "book")
    try:
        for cell in cells:
            src = "".join(cell["source"])
            if cell["cell_type"] == "markdown" and f"{{admonition}} {ANSWER_TITLE}" in src:
                box = src
                break
            if cell["cell_type"] == "code":
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(src, "why.ipynb", "exec"), scope)
        else:
            pytest.fail(f"book/why.ipynb has no admonition titled {ANSWER_TITLE!r}")
    finally:
        os.chdir(old)
    body = box.split("\n\n", 1)[1].rsplit("```", 1)[0]

    def number(m):
        name = m.group(1)
        assert name in scope, f"why.ipynb binds no {name} before its answer"
        return str(scope[name])

    return _plain(re.sub(r"\{eval\}`(\w+)`", number, body))


def test_the_answer_has_its_numbers(why_answer):
    assert "{eval}" not in why_answer and re.search(r"\d%", why_answer)


def test_the_readme_gives_the_why_pages_answer(why_answer):
    text = README.read_text()
    section = text.split(f"## {ANSWER_TITLE}\n", 1)[1].split("\n## ", 1)[0]
    assert _plain(section) == why_answer, f"README's answer is not the why page's; it reads:\n{why_answer}"


def test_the_intro_gives_the_why_pages_answer(why_answer):
    text = INTRO.read_text()
    box = re.search(rf"```{{admonition}} {re.escape(ANSWER_TITLE)}\n:class: important\n\n(.*?)```",
                    text, re.S)
    assert box, "the introduction has no answer box"
    assert _plain(box.group(1)) == why_answer, f"the intro's answer is not the why page's; it reads:\n{why_answer}"
    # a changed number would be caught
    assert _plain(box.group(1).replace("48%", "49%")) != why_answer


# ----------------------------------------------------------------------------- the introduction
def test_the_intro_opens_with_the_picture_and_the_answer():
    text = INTRO.read_text()
    picture = text.index('<img src="_static/schematic-symmetric.svg"')
    answer = text.index(f"{{admonition}} {ANSWER_TITLE}")
    path = text.index("## How to read this book")
    assert picture < answer < path
    assert text.index("\n## ") + 1 == path, "no section comes between the title and the reading path"
    # the opening before the reading path is short: picture, one paragraph, the answer
    assert _words(text[:picture]) < 120
    # the small print on hypotheses comes after the reading path, folded
    small = text.index("{admonition} What is proven and what is measured")
    assert small > path
    assert text[small:].split("\n", 2)[1] == ":class: dropdown"
    assert "every symmetric matrix $S_j$ is indefinite" in text[small:]
    # chapter 6 is marked as the generalisation the answer does not need
    six = text[text.index("6. {doc}`06_rank_r`"):text.index("**Detours**")]
    assert "generalisation" in six and "does not need it" in six


# ------------------------------------------------------- "checks each one in running code"
STATEMENT = re.compile(r"```\{prf:(theorem|proposition|lemma|corollary)\}[^\n]*\n:label: (\S+)")


def test_every_theorem_is_followed_by_code_that_asserts():
    """The README and the running-locally page say each theorem (proposition, lemma,
    corollary) is checked in running code: a code cell with an ``assert`` among the five
    cells after the one that states it."""
    unchecked, seen = [], 0
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for i, c in enumerate(cells):
            if c["cell_type"] != "markdown":
                continue
            for m in STATEMENT.finditer("".join(c["source"])):
                seen += 1
                after = cells[i + 1:i + 6]
                if not any(d["cell_type"] == "code" and re.search(r"\bassert\b", "".join(d["source"]))
                           for d in after):
                    unchecked.append(f"{path.name}: {m.group(2)}")
    assert seen > 40, f"found only {seen} numbered statements: has the directive syntax changed?"
    assert not unchecked, f"statements with no assert in the five cells after them: {unchecked}"
