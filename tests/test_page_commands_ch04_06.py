"""Chapters 4-6 as a learner meets them: the main path is at most half the
prose it had before the detours were marked (3,986 / 3,509 / 3,591 words), every chapter
marks detours and has a coding exercise with a solution, and each `make` target the
pages name exists (as a dry run, ``make -n``)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEFORE = {"04_rank_one": 3986, "05_symmetry_breaking": 3509, "06_rank_r": 3591}
DETOUR = ":::{admonition} Detour (optional on a first reading):"


def _cells(chapter: str) -> list[dict]:
    return json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())["cells"]


def main_path_words(cells: list[dict]) -> int:
    """Words of the markdown cells outside dropdown admonitions (detours) and outside
    solution-start ... solution-end spans (which may run across cells); directive fences
    and their options are not counted."""
    words, in_solution = 0, False
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        in_dropdown = False
        for line in "".join(cell["source"]).splitlines():
            if "solution-start" in line:
                in_solution = True
            elif "solution-end" in line:
                in_solution = False
            elif line.startswith(":::{admonition}"):
                in_dropdown = True
            elif in_dropdown:
                in_dropdown = line.strip() != ":::"
            elif not in_solution and not line.startswith(("```", ":label:", ":class:")):
                words += len(line.split())
    return words


def test_main_path_words_counts_what_it_should():
    md = lambda s: {"cell_type": "markdown", "source": [s]}   # noqa: E731
    cells = [md("one two three\n\n" + DETOUR + " x\n:class: dropdown\n\nfour five\n:::\nsix"),
             md("```{solution-start} e\n:class: dropdown\n```\nseven eight"),
             md("```{solution-end}\n```\nnine")]
    assert main_path_words(cells) == 5      # one two three six nine


@pytest.mark.parametrize("chapter", sorted(BEFORE))
def test_the_main_path_is_at_most_half(chapter):
    cells = _cells(chapter)
    assert main_path_words(cells) <= BEFORE[chapter] / 2
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert markdown.count(DETOUR) >= 5
    assert re.search(r":label: ch0\d-ex-code\n\nWrite it yourself", markdown)
    solution = markdown.split("solution-start} " + chapter[:2].replace("0", "ch0", 1) + "-ex-code")
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
