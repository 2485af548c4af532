"""The commands that the introduction and chapters 1-3 show a reader exist and run
(issue 46, item 9): each `make` target of the introduction's code block (as a dry run,
``make -n``), and each ``python -m qkmlp.book ...`` command of chapters 2 and 3 (with
``--help``, which parses the command's arguments first; the notebooks check that the
stored studies name the same commands, and test_examples.py runs the study itself)."""
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
