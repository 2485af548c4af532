"""The book's source as one archive that the website ships (``qkmlp-source.tar.gz``).

The website is built from a source folder (notebooks, the library, the stored results
the chapters read, the tests); a reader of the offline site gets that folder from the
archive the build writes beside the pages, unpacks it and runs the README's two commands
(``make book``, ``make test``) in it.

What goes in (:data:`INCLUDE`): the ``Makefile``, ``requirements.txt``,
``pyproject.toml``, ``_config.yml``, ``_toc.yml``, ``README.md``, ``CONTRIBUTING.md``,
``LICENSE``, ``.ci/``, ``book/`` (with ``book/data/``), ``lab/`` (JupyterLab's settings),
``src/qkmlp/``, ``tests/`` and ``tools/`` (which a test imports). In a git checkout whose
top is the source folder the files are the ones git tracks (as they are on disk now);
elsewhere (a folder unpacked from the archive, with no ``.git``) every file under those
paths but what the repository's ``.gitignore`` leaves out (:data:`EXCLUDE_DIRS`,
:data:`EXCLUDE_SUFFIXES`). No ``.git`` is ever shipped.

The archive is a gzipped tar whose members sit under one folder, :data:`TOP`; entries
are sorted, owned by uid/gid 0, mode 0644 (0755 for executables) and share one time
stamp (``SOURCE_DATE_EPOCH`` when set, else the newest file's), so the same files give
the same bytes.
"""
from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Optional, Sequence, Union

__all__ = ["ARCHIVE_NAME", "TOP", "INCLUDE", "REQUIRED", "EXCLUDE_DIRS", "EXCLUDE_SUFFIXES",
           "source_files", "archive_bytes", "write_source_archive"]

#: File name of the archive in the built site (beside ``index.html``).
ARCHIVE_NAME = "qkmlp-source.tar.gz"
#: The folder every member of the archive sits in.
TOP = "qkmlp-source"
#: What ``make book`` and ``make test`` need, relative to the source folder.
INCLUDE = ("Makefile", "requirements.txt", "pyproject.toml", "_config.yml", "_toc.yml",
           "README.md", "CONTRIBUTING.md", "LICENSE", ".ci", "book", "lab", "src/qkmlp", "tests",
           "tools")
#: Files without which the archive could not run ``make book`` / ``make test``.
REQUIRED = ("Makefile", "requirements.txt", "pyproject.toml", "_config.yml", "_toc.yml",
            "book", "src/qkmlp", "tests")
#: Folders never shipped (build outputs, caches, environments, git).
EXCLUDE_DIRS = frozenset({".git", ".venv", "_build", "test-artifacts", "__pycache__",
                          ".pytest_cache", ".hypothesis", ".ipynb_checkpoints",
                          ".jupyter_cache", ".whl"})
#: File endings never shipped.
EXCLUDE_SUFFIXES = (".pyc", ".pyo", ".egg-info")

PathLike = Union[str, os.PathLike]


def _excluded(rel: str) -> bool:
    parts = rel.split("/")
    return (any(p in EXCLUDE_DIRS or p.endswith(".egg-info") for p in parts[:-1])
            or parts[-1] in EXCLUDE_DIRS or parts[-1].endswith(EXCLUDE_SUFFIXES))


def _included(rel: str) -> bool:
    return any(rel == top or rel.startswith(top + "/") for top in INCLUDE)


def _git_files(root: Path) -> Optional[list[str]]:
    """Files git tracks under ``root``, or None when ``root`` is not the top of a git work
    tree (no git, no ``.git``, or a folder inside some other repository)."""
    if not (root / ".git").exists():
        return None
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
        if Path(top).resolve() != root.resolve():
            return None
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode().split("\0") if p]


def _walked_files(root: Path) -> list[str]:
    found = []
    for top in INCLUDE:
        path = root / top
        if path.is_file():
            found.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if d not in EXCLUDE_DIRS and not d.endswith(".egg-info")]
            for name in filenames:
                found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return found


def source_files(root: PathLike, *, use_git: Optional[bool] = None) -> list[str]:
    """The files of the archive: paths relative to ``root`` (posix), sorted.

    ``use_git=None`` asks git when ``root`` is the top of a git work tree and walks the
    folders otherwise; ``True`` requires git (ValueError when ``root`` is not such a
    work tree), ``False`` always walks. Raises FileNotFoundError naming every entry of
    :data:`REQUIRED` that ``root`` lacks.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"source folder {str(root)!r} does not exist")
    missing = [p for p in REQUIRED if not (root / p).exists()]
    if missing:
        raise FileNotFoundError(f"{str(root)!r} is not the book's source folder: it lacks {missing} "
                                f"(expected {list(REQUIRED)})")
    files = None if use_git is False else _git_files(root)
    if use_git and files is None:
        raise ValueError(f"{str(root)!r} is not the top of a git work tree (use_git=True)")
    if files is None:
        files = _walked_files(root)
    files = {f for f in files if _included(f) and not _excluded(f) and (root / f).is_file()}
    return sorted(files)


def archive_bytes(root: PathLike, files: Optional[Sequence[str]] = None, *,
                  mtime: Optional[int] = None) -> bytes:
    """The gzipped tar of ``files`` (default :func:`source_files`) under :data:`TOP`/."""
    root = Path(root)
    files = source_files(root) if files is None else sorted(files)
    if not files:
        raise ValueError("no files to archive")
    stats = {f: (root / f).stat() for f in files}
    if mtime is None:
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        mtime = int(epoch) if epoch else int(max(s.st_mtime for s in stats.values()))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            info = tarfile.TarInfo(f"{TOP}/{rel}")
            info.size = stats[rel].st_size
            info.mtime = mtime
            info.mode = 0o755 if stats[rel].st_mode & 0o111 else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(root / rel, "rb") as fh:
                tar.addfile(info, fh)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=mtime, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def write_source_archive(root: PathLike, dest: PathLike, *, mtime: Optional[int] = None) -> Path:
    """Write :func:`archive_bytes` of ``root`` to ``dest`` (a file, or a folder to hold
    :data:`ARCHIVE_NAME`); return the file's path."""
    dest = Path(dest)
    if dest.is_dir():
        dest = dest / ARCHIVE_NAME
    data = archive_bytes(root, mtime=mtime)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return dest
