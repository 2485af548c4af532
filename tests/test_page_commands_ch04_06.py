"""Chapters 4-6 as a learner meets them: the main path is at most half the prose it had
before the detours were marked (3,986 / 3,509 / 3,591 words), plus the words of the short
proofs it shows inline (a proof of three lines or fewer is on the main path,
tests/test_book_folds.py), every chapter marks detours and has a coding exercise with a
solution, and each `make` target the pages name exists (as a dry run, ``make -n``)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_book_folds import main_path_proof_words

ROOT = Path(__file__).resolve().parents[1]
BEFORE = {"04_rank_one": 3986, "05_symmetry_breaking": 3509, "06_rank_r": 3591}
DETOUR = ":::{admonition} Detour (optional on a first reading):"


def _cells(chapter: str) -> list[dict]:
    return json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())["cells"]


def main_path_words(cells: list[dict]) -> int:
    """Words of the markdown cells outside dropdown admonitions (detours) and outside
    solutions: a ``{solution}`` directive (one cell; its closing fence is the backticks that
    opened it) or, as the chapters were written before, a solution-start ... solution-end
    span (which may run across cells); directive fences and their options are not
    counted. An admonition that is not a dropdown (a box the reader sees, such as
    chapter 4's answer box) is main path: its title and body count."""
    words, in_solution = 0, False
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        in_dropdown, in_box, fence = False, False, None
        lines = "".join(cell["source"]).splitlines()
        for i, line in enumerate(lines):
            if fence is not None:
                fence = None if line.strip() == fence else fence
            elif "{solution}" in line and line.startswith("```"):
                fence = line[:len(line) - len(line.lstrip("`"))]
            elif "solution-start" in line:
                in_solution = True
            elif "solution-end" in line:
                in_solution = False
            elif line.startswith(":::{admonition}"):
                if i + 1 < len(lines) and lines[i + 1].strip() == ":class: dropdown":
                    in_dropdown = True
                else:
                    in_box = True
                    words += len(line.split()[1:])          # the box's title
            elif in_dropdown:
                in_dropdown = line.strip() != ":::"
            elif in_box and line.strip() == ":::":
                in_box = False
            elif not in_solution and not line.startswith(("```", ":label:", ":class:")):
                words += len(line.split())
    return words


def test_main_path_words_counts_what_it_should():
    md = lambda s: {"cell_type": "markdown", "source": [s]}   # noqa: E731
    cells = [md("one two three\n\n" + DETOUR + " x\n:class: dropdown\n\nfour five\n:::\nsix"),
             md("```{solution-start} e\n:class: dropdown\n```\nseven eight"),
             md("```{solution-end}\n```\nnine"),
             md("ten\n````{solution} f\n:class: dropdown\n\neleven\n```\ntwelve\n```\n````\nthirteen"),
             md(":::{admonition} A box\n:class: important\n\nfourteen\n:::\nfifteen")]
    # one two three six nine ten thirteen; the box's title (2 words), fourteen, fifteen
    assert main_path_words(cells) == 11


@pytest.mark.parametrize("chapter", sorted(BEFORE))
def test_the_main_path_is_at_most_half(chapter):
    cells = _cells(chapter)
    # the limit moves by the words of the inline short proofs, and by nothing else
    assert main_path_words(cells) <= BEFORE[chapter] / 2 + main_path_proof_words(cells)
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert markdown.count(DETOUR) >= 5
    assert re.search(r":label: ch0\d-ex-code\n\nWrite it yourself", markdown)
    solution = markdown.split("{solution} " + chapter[:2].replace("0", "ch0", 1) + "-ex-code")
    assert len(solution) == 2, "the coding exercise has one folded solution"


@pytest.mark.parametrize("chapter", sorted(BEFORE))
def test_the_make_targets_named_exist(chapter):
    markdown = "\n".join("".join(c["source"]) for c in _cells(chapter) if c["cell_type"] == "markdown")
    targets = re.findall(r"`make (\w+)`", markdown)
    if not targets:
        return
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for target in targets:
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"make -n {target}: {done.stderr}"
