"""qkmlp.book.source_archive: the book's source shipped with the website. The file list
is checked against git's own (in a git checkout) and against a tree written by hand; the
archive is unpacked and compared byte for byte with the files it came from. The archive
the book build writes is checked in test_book.py."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from qkmlp.book import source_archive as sa

ROOT = Path(__file__).resolve().parents[1]


def _git_tracked(root: Path) -> list[str] | None:
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else None


def _fake_source(root: Path) -> set[str]:
    """A source folder with every kind of file the archive takes and every kind it leaves
    out; returns the paths it must take."""
    take = ["Makefile", "requirements.txt", "pyproject.toml", "_config.yml", "_toc.yml", "README.md",
            "LICENSE", ".ci/run", "book/intro.md", "book/01_key_value.ipynb", "book/data/bench/run.json",
            "book/_static/site.css", "src/qkmlp/__init__.py", "src/qkmlp/book/figures.py",
            "tests/test_x.py", "tests/page.js"]
    leave = [".git/HEAD", ".venv/bin/python", "_build/html/index.html", "test-artifacts/book/build.log",
             "src/qkmlp/__pycache__/layers.cpython-311.pyc", "src/qkmlp.egg-info/PKG-INFO",
             "book/.ipynb_checkpoints/01_key_value-checkpoint.ipynb", "tests/.pytest_cache/v/x",
             ".hypothesis/examples/a", "book/.jupyter_cache/global.db", "notes.txt", ".github/workflows/x.yml",
             "src/other/mod.py", "tests/helper.pyc"]
    for rel in take + leave:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"contents of {rel}\n")
    (root / ".ci/run").chmod(0o755)
    return set(take)


def test_the_walked_file_list_takes_the_source_and_leaves_builds_caches_and_git(tmp_path):
    want = _fake_source(tmp_path)
    assert set(sa.source_files(tmp_path)) == want          # no .git here: walks
    assert sa.source_files(tmp_path, use_git=False) == sorted(want)
    with pytest.raises(ValueError, match="not the top of a git work tree"):
        sa.source_files(tmp_path, use_git=True)


def test_in_a_git_checkout_the_files_are_the_tracked_ones():
    tracked = _git_tracked(ROOT)
    if tracked is None:
        pytest.skip(f"{ROOT} is not a git checkout (an unpacked source archive has no .git)")
    tops = ("Makefile", "requirements.txt", "pyproject.toml", "_config.yml", "_toc.yml", "README.md",
            "CONTRIBUTING.md", "LICENSE", ".ci/", "book/", "lab/", "src/qkmlp/", "tests/", "tools/")
    want = sorted(f for f in tracked if f.startswith(tops) and (ROOT / f).is_file()
                  and "__pycache__" not in f)
    assert sa.source_files(ROOT, use_git=True) == want
    # and the walk, used where there is no .git, takes every tracked file too (it may also
    # take files not yet added to git)
    assert set(want) <= set(sa.source_files(ROOT, use_git=False))


def test_a_folder_that_is_not_the_source_is_refused(tmp_path):
    (tmp_path / "Makefile").write_text("all:\n")
    with pytest.raises(FileNotFoundError, match=r"lacks \['requirements.txt', 'pyproject.toml'"):
        sa.source_files(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sa.source_files(tmp_path / "nowhere")


def test_the_archive_unpacks_to_the_same_bytes_under_one_folder(tmp_path):
    src = tmp_path / "src"
    want = _fake_source(src)
    data = sa.archive_bytes(src, mtime=1_700_000_000)
    assert data == sa.archive_bytes(src, mtime=1_700_000_000), "same files, same time stamp: same bytes"
    out = tmp_path / "out"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        tar.extractall(out, filter="data")
    assert {m.name for m in members} == {f"{sa.TOP}/{rel}" for rel in want}
    assert all(m.isfile() and m.uid == 0 and m.mtime == 1_700_000_000 for m in members)
    for rel in want:
        assert (out / sa.TOP / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert os.access(out / sa.TOP / ".ci/run", os.X_OK), "the CI script stays executable"
    assert not os.access(out / sa.TOP / "Makefile", os.X_OK)
    written = sa.write_source_archive(src, tmp_path, mtime=1_700_000_000)
    assert written == tmp_path / sa.ARCHIVE_NAME and written.read_bytes() == data
