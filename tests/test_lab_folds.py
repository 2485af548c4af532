"""JupyterLab folds what the website folds: every code cell's ``jupyter`` metadata follows its
MyST-NB tags (hide-input: source hidden; hide-cell: source and outputs hidden; else nothing
hidden), as ``tools/lab_folds.py`` sets it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from lab_folds import folded, wanted  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_cells_fold_in_lab_as_on_the_website(path):
    nb = json.loads(path.read_text())
    wrong = [c.get("id") for c in nb["cells"] if c["cell_type"] == "code"
             and c.get("metadata", {}).get("jupyter", {}) != wanted(c)]
    assert not wrong, f"cells {wrong}: run python tools/lab_folds.py {path.relative_to(ROOT)}"


def test_the_folds_follow_the_tags():
    cell = lambda *tags: {"cell_type": "code", "metadata": {"tags": list(tags)}}   # noqa: E731
    nb = folded({"cells": [cell("hide-input"), cell("hide-cell"), cell(),
                           {**cell(), "metadata": {"jupyter": {"source_hidden": True}}}]})
    assert [c["metadata"].get("jupyter") for c in nb["cells"]] == [
        {"source_hidden": True}, {"source_hidden": True, "outputs_hidden": True}, None, None]


def test_the_tool_checks_without_writing(tmp_path):
    nb = tmp_path / "x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": ["hide-input"]}}]}))
    before = nb.read_text()
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "lab_folds.py"), "--check", str(nb)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and nb.read_text() == before
