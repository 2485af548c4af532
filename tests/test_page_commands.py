"""The commands that the README, the API page, the running-locally page and the reproduce
page show a reader exist and run. tests/test_page_commands_intro_ch01_03.py does the same
for the introduction and chapters 1-3.

- every ``python -m qkmlp...`` command (in a code span or a bash block, also after
  ``torchrun``) runs with the arguments the page shows and ``--help`` appended: argparse
  checks each option name and choice it reads before ``--help`` stops it, so a command
  whose options the CLI does not take fails (placeholders such as FILE and DIR are
  values, and ``[ ]`` around an option only says it is optional);
- every ``make TARGET`` exists (``make -n``);
- ``python -m pytest --nbval-lax --nbval-current-env`` has the plug-in it needs;
- what running_locally says about ``make book`` matches the Makefile, and the chapters it
  lists as reading stored results are those whose notebooks read ``book/data/``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "book/api.md", "book/running_locally.md", "book/reproduce.md"]
SPAN = re.compile(r"`([^`]+)`")
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
QKMLP = re.compile(r"-m (qkmlp(?:\.\w+)*)((?: +[^ ]+)*)")
MAKE = re.compile(r"^make ([\w.][\w./-]*)")


def _code(page: str) -> list[str]:
    """Each code span and each line of a bash block (continuations joined), comments cut."""
    text = (ROOT / page).read_text()
    pieces = []
    for block in BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            pieces.append(line.split("#", 1)[0])
    pieces += SPAN.findall(re.sub(r"```.*?```", "", text, flags=re.S))
    return [" ".join(p.split()) for p in pieces if p.strip()]


def _qkmlp_commands(page: str) -> list[tuple[str, list[str]]]:
    out = []
    for piece in _code(page):
        m = QKMLP.search(piece)
        if m:
            args = [a.strip("[]") for a in m.group(2).split() if a not in ("...", "…")]
            out.append((m.group(1), [a for a in args if a]))
    return out


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)


def test_the_pages_show_the_commands_this_test_expects():
    found = {page: {mod for mod, _ in _qkmlp_commands(page)} for page in PAGES}
    # every pipeline's command is on the reproduce page, which the README points to
    assert {"qkmlp.bench", "qkmlp.experiments", "qkmlp.experiments.width", "qkmlp.pretrained",
            "qkmlp.pretrained.retrain", "qkmlp.pretrained.robustness", "qkmlp.book"} <= found["book/reproduce.md"]
    assert "book/reproduce.md" in (ROOT / "README.md").read_text()
    assert "qkmlp.pretrained" in found["book/api.md"]
    # the pretrained CLI needs --out: the pages show it
    for page in PAGES:
        for mod, args in _qkmlp_commands(page):
            if mod == "qkmlp.pretrained" and args:
                assert "--out" in args, (page, args)


@pytest.mark.parametrize("command", sorted({(mod, tuple(args)) for page in PAGES
                                             for mod, args in _qkmlp_commands(page)}),
                         ids=lambda c: " ".join([c[0], *c[1]]))
def test_every_python_m_command_on_the_pages_parses(command):
    mod, args = command
    done = _run(["-m", mod, *args, "--help"])
    assert done.returncode == 0, f"python -m {mod} {' '.join(args)} --help: {done.stderr[-2000:]}"
    assert "usage:" in done.stdout
    # argparse stops at --help before it rejects an unknown option: the help names each one
    for option in (a for a in args if a.startswith("--")):
        assert re.search(rf"{re.escape(option)}\b", done.stdout), (mod, option)


def test_the_check_can_fail():
    # the pretrained CLI without --out, as the pages once showed it, is refused
    done = _run(["-m", "qkmlp.pretrained", "--model", "PATH"])
    assert done.returncode != 0 and "--out" in done.stderr
    done = _run(["-m", "qkmlp.pretrained", "--help"])
    assert "--out" in done.stdout and not re.search(r"--no-such-option\b", done.stdout)


def test_every_make_target_on_the_pages_exists():
    targets = sorted({t for page in PAGES for piece in _code(page) for t in MAKE.findall(piece)})
    assert {"book", "test", "lab", "bench"} <= set(targets), targets
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for target in targets:
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"make -n {target}: {done.stderr}"
    assert subprocess.run(["make", "-n", "no-such-target"], cwd=ROOT, capture_output=True).returncode != 0


def test_the_nbval_command_has_its_plugin():
    text = (ROOT / "book/running_locally.md").read_text()
    assert "--nbval-lax --nbval-current-env" in text
    done = _run(["-m", "pytest", "--help"])
    assert done.returncode == 0 and "--nbval-lax" in done.stdout and "--nbval-current-env" in done.stdout


def test_running_locally_says_what_the_makefile_does():
    page = (ROOT / "book/running_locally.md").read_text()
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\nbook:", 1)[1].split("\n\n", 1)[0]
    flags = re.search(r"\(`(-W -n[^`]*)`\)", page).group(1).split()
    assert flags == [f for f in recipe.split() if f.startswith("-")], (flags, recipe)
    assert "--keep-going" in flags and "fails at the end" in page
    assert "stops on the first" not in page
    # no run-time claims the suite does not measure
    assert not re.search(r"\bfrom \d+ s\b|\d+ seconds", page)
    # the chapters that read stored results
    m = re.search(r"Chapters (\d)–(\d) and (\d+)–(\d+) also read stored", page)
    listed = set(range(int(m.group(1)), int(m.group(2)) + 1)) | set(range(int(m.group(3)), int(m.group(4)) + 1))
    reading = {int(nb.name[:2]) for nb in (ROOT / "book").glob("[0-9][0-9]_*.ipynb")
               if any(re.search(r"data/|Path\(\"data\"\)", "".join(c["source"]))
                      for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")}
    assert listed == reading, (sorted(listed), sorted(reading))


def test_the_intro_claims_no_run_times():
    text = (ROOT / "book/intro.md").read_text()
    assert not re.search(r"\d+ s\b|\d+ seconds", text)
