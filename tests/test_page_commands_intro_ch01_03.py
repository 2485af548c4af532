"""The commands that the introduction and chapters 1-3 show a reader exist and run:
each `make` target of the introduction's code block (as a dry run,
``make -n``), and each ``python -m qkmlp.book ...`` command of chapters 2 and 3 (with
``--help``, which parses the command's arguments first; the notebooks check that the
stored studies name the same commands, and test_examples.py runs the study itself),
and that the main path of chapters 1-3 is at most half its prose before the
learner pass: 1,908 / 1,844 / 2,611 words, with at least 5 / 5 / 8 detours."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK_COMMAND = re.compile(r"`(python -m qkmlp\.book [^`]+)`")


def _markdown(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _intro_make_targets() -> list[str]:
    text = (ROOT / "book" / "intro.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split()[1] for line in block.splitlines() if line.startswith("make ")]


def test_the_intro_shows_make_targets_that_exist():
    targets = _intro_make_targets()
    assert targets == ["lab", "book", "test"]
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for target in targets:
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"make -n {target}: {done.stderr}"


@pytest.mark.parametrize("chapter", ["02_dynamic_query", "03_bilinear_attention"])
def test_the_chapters_book_commands_parse(chapter):
    commands = BOOK_COMMAND.findall(_markdown(ROOT / "book" / f"{chapter}.ipynb"))
    assert commands, f"{chapter} shows no python -m qkmlp.book command"
    for command in commands:
        argv = command.split()[3:]
        done = subprocess.run([sys.executable, "-m", "qkmlp.book", *argv, "--help"], cwd=ROOT,
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert "usage: python -m qkmlp.book" in done.stdout
    # an unknown study is refused, so the check above can fail
    bad = subprocess.run([sys.executable, "-m", "qkmlp.book", "no-such-study", "--out", "x", "--help"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0


# ----------------------------------------------------------------------------- main path
# Chapters 1-3 as a learner meets them, checked as chapters 4-6 are
# (test_page_commands_ch04_06.py, whose word count this reuses): the main path, the prose
# outside detours and folded solutions, is at most half of what it was just before each
# chapter's first learner-pass commit, counted the same way on the notebook as committed
# there: chapter 1, 1,908 words at f5f7428 (the parent of 1125fc8); chapter 2, 1,844 at
# 1125fc8 (the parent of c561ff9); chapter 3, 2,611 at c561ff9 (the parent of c76d1f6).
# The limit moves by the words of the short proofs shown inline (a proof of three
# lines or fewer is on the main path, tests/test_book_folds.py), and by nothing else.
# Each chapter keeps its detours (5 / 5 / 4: chapter 3 had 8, four of them the folded
# short proofs of corollary 3.1, proposition 3.1, lemma 3.1 and proposition 3.2, now
# inline) and its coding exercise.
from test_book_folds import main_path_proof_words  # noqa: E402
from test_page_commands_ch04_06 import DETOUR, main_path_words  # noqa: E402

BEFORE = {"01_key_value": (1908, "f5f7428"), "02_dynamic_query": (1844, "1125fc8"),
          "03_bilinear_attention": (2611, "c561ff9")}
DETOURS = {"01_key_value": 5, "02_dynamic_query": 5, "03_bilinear_attention": 4}


def _cells(chapter: str) -> list[dict]:
    return json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())["cells"]


@pytest.mark.parametrize("chapter", sorted(BEFORE))
def test_the_main_path_is_at_most_half(chapter):
    cells = _cells(chapter)
    assert main_path_words(cells) <= BEFORE[chapter][0] / 2 + main_path_proof_words(cells)
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert markdown.count(DETOUR) >= DETOURS[chapter]
    assert re.search(r":label: ch0\d-ex-code\n\nWrite it yourself", markdown)
    assert markdown.count("{solution} " + chapter[:2].replace("0", "ch0", 1) + "-ex-code") == 1


@pytest.mark.parametrize("chapter", sorted(BEFORE))
def test_the_before_counts_are_the_history(chapter):
    """The stated BEFORE counts, recounted from git (skipped without the history, as in
    the source archive)."""
    words, commit = BEFORE[chapter]
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git history here")
    shown = subprocess.run(["git", "show", f"{commit}:book/{chapter}.ipynb"], cwd=ROOT,
                           capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone: {shown.stderr.strip()}")
    assert main_path_words(json.loads(shown.stdout)["cells"]) == words
