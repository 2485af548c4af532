"""Repository hygiene the book and CI depend on: stripped notebooks, a complete table of
contents, pinned toolchain, and a CI script that runs the README's test command."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from toc_notebooks import ROOT, toc_files

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


def tracked(path: Path) -> bool:
    rel = path.relative_to(ROOT)
    return subprocess.run(["git", "ls-files", "--error-unmatch", str(rel)], cwd=ROOT,
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_stripped_with_python3_kernel(nb):
    data = json.loads(nb.read_text())
    dirty = [i for i, c in enumerate(data["cells"])
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{nb.name}: cells {dirty} hold outputs; run nbstripout"
    assert data["metadata"]["kernelspec"]["name"] == "python3"


CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")    # nbformat 4.5's pattern for a cell id


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_cell_has_its_own_id(nb):
    """nbformat >= 4.5 wants an id on every cell (code and markdown); without one it warns
    on each read and makes up a new random id, which churns the diffs."""
    data = json.loads(nb.read_text())
    assert (data["nbformat"], data["nbformat_minor"]) >= (4, 5), f"{nb.name}: nbformat older than 4.5"
    cells = data["cells"]
    missing = [i for i, c in enumerate(cells) if "id" not in c]
    assert not missing, f"{nb.name}: cells {missing} have no id"
    bad = [(i, c["id"]) for i, c in enumerate(cells) if not CELL_ID.match(str(c["id"]))]
    assert not bad, f"{nb.name}: ids not of 1-64 letters, digits, - or _: {bad}"
    ids = [c["id"] for c in cells]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"{nb.name}: ids used by more than one cell: {dup}"


def test_every_toc_entry_exists_and_every_notebook_is_listed():
    files = toc_files()
    missing = [f for f in files if not any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml lists missing pages: {missing}"
    listed = {str(ROOT / f) for f in files}
    unlisted = [p.name for p in NOTEBOOKS if str(p.with_suffix("")) not in listed]
    assert not unlisted, f"notebooks not in _toc.yml: {unlisted}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^make test\b", readme, re.M), "README must give `make test` as the test command"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\s*$", ci, re.M), ".ci/run must call `make test`"


def test_toolchain_is_pinned():
    req = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^torch==2\.13\.0$", req, re.M), "torch must be pinned (an unpinned torch pulls CUDA)"
    version = re.search(r"^jupyter-book==(\S+)$", req, re.M)
    assert version and version.group(1).startswith("1."), "jupyter-book must be 1.x"
    for line in req.splitlines():
        if line.strip() and not line.startswith("#"):
            assert "==" in line, f"unpinned requirement: {line}"
