"""Print the notebooks listed in _toc.yml, one path per line (used by `make test`)."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def toc_files(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """Every file entry of a Jupyter Book toc (without suffix), root first."""
    toc = yaml.safe_load(Path(toc_path).read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return files


def toc_notebooks() -> list[Path]:
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


if __name__ == "__main__":
    print("\n".join(str(p.relative_to(ROOT)) for p in toc_notebooks()))
