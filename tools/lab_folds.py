"""Fold in JupyterLab what the website folds: set each code cell's ``jupyter`` metadata from
its MyST-NB tags, so the checking code of a chapter opens collapsed in JupyterLab as it does
behind "Show code" on the website.

- ``hide-input``: the input is hidden (``source_hidden``), the output shows;
- ``hide-cell``: input and output are hidden (``source_hidden``, ``outputs_hidden``);
- any other cell: nothing hidden.

Usage: ``python tools/lab_folds.py [--check] book/*.ipynb``. With ``--check`` it changes
nothing and exits 1 if a notebook is out of step (tests/test_prose.py runs the same check).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def wanted(cell: dict) -> dict:
    tags = set(cell.get("metadata", {}).get("tags", []))
    if "hide-cell" in tags:
        return {"source_hidden": True, "outputs_hidden": True}
    if "hide-input" in tags:
        return {"source_hidden": True}
    return {}


def folded(nb: dict) -> dict:
    """The notebook with every code cell's ``jupyter`` metadata set from its tags."""
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        meta = cell.setdefault("metadata", {})
        want = wanted(cell)
        if want:
            meta["jupyter"] = want
        else:
            meta.pop("jupyter", None)
    return nb


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path in (Path(a) for a in argv if a != "--check"):
        text = path.read_text()
        new = json.dumps(folded(json.loads(text)), indent=1, ensure_ascii=False) + "\n"
        if new != text:
            stale.append(str(path))
            if not check:
                path.write_text(new)
    if stale:
        print(("out of step: " if check else "folded: ") + ", ".join(stale))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
