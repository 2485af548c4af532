"""A second corpus for the language-modelling experiment: Python's standard-library source.

Chapter 8's character model is trained on Shakespeare's plays (:mod:`.corpus`). To test
whether a result holds on other data, the same model is trained on a text of another
kind that every Python install carries, so nothing is downloaded: the source of the
standard library of the Python that runs this code (``sysconfig.get_paths()["stdlib"]``).

**The files** (``MANIFEST``, ``python_stdlib_corpus.json`` beside this module): every
top-level module ``Lib/<name>.py`` of CPython 3.11 whose characters all lie in the
project's 96-symbol vocabulary (newline and printable ASCII: no tab, no carriage return,
no non-ASCII character), and the same for the modules of the ``asyncio`` package, which
brings the total near the size of the Shakespeare corpus (4.71 M characters against 4.85 M;
3.70 M of training text against 3.86 M). Left
out: the build-generated ``_sysconfigdata_*`` module (it differs per machine), and
``antigravity``, ``this`` and ``turtle`` (jokes and a Tk demo that some distributions
package apart). Files are read as ASCII; the list is fixed in the manifest, not re-derived
from the install.

**The split, by file** (no module has text in two splits), by a fixed rule: order the
files by the SHA-256 of their path (relative to ``Lib/``); validation takes files in that
order until it holds at least as many characters as Shakespeare's validation plays
(459,824), test then takes files until it holds at least as many as the test plays
(531,337); every other file is for training. As with the plays, the training stream joins
its files by a blank line in path order, and held-out windows are cut from each file
separately (:func:`qkmlp.experiments.lm.lm_data`).

**Pinned**: the manifest holds the SHA-256 of each file's exact characters and of each
split's joined text, made with the Python in :data:`PINNED_PYTHON`. :func:`load_modules`
refuses (:class:`SourceMismatchError`, naming the file, both hashes and both Python
versions) when a file differs, and raises :class:`SourceMissingError` naming a file that
is absent: patch releases fix bugs in these modules, so another 3.11.x may not reproduce
the corpus, and a different text must never pass silently as the declared one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sysconfig
from pathlib import Path
from typing import Optional

__all__ = ["MANIFEST", "PINNED_PYTHON", "SHAKESPEARE_HELD_OUT_CHARS", "SourceMismatchError", "SourceMissingError",
           "stdlib_root", "load_manifest", "load_modules", "split_by_rule", "candidate_files", "write_manifest",
           "sha256_text"]

MANIFEST = Path(__file__).with_name("python_stdlib_corpus.json")
#: The Python whose standard library the manifest's hashes were made with.
PINNED_PYTHON = "3.11.7"
#: Characters of Shakespeare's validation and test plays (``corpus.load_plays()``): the
#: sizes the held-out splits of this corpus match.
SHAKESPEARE_HELD_OUT_CHARS = {"validation": 459824, "test": 531337}
_PACKAGES = ("asyncio",)
_LEFT_OUT = ("antigravity.py", "this.py", "turtle.py")
SPLITS = ("train", "validation", "test")


class SourceMismatchError(ValueError):
    """A standard-library file's characters do not hash to the pinned SHA-256."""


class SourceMissingError(FileNotFoundError):
    """A file of the manifest is not in this Python's standard library."""


def sha256_text(text: str) -> str:
    """SHA-256 (hex) of a text's characters encoded as UTF-8 (ASCII here)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stdlib_root() -> Path:
    """The folder of this Python's standard library (``Lib/`` of the CPython source)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _in_vocab(text: str) -> bool:
    from .corpus import VOCAB

    allowed = set(VOCAB)
    return all(c in allowed for c in set(text))


def _read(path: Path) -> Optional[str]:
    """The file as ASCII text (newlines untranslated), or None when it is not ASCII."""
    try:
        return path.read_bytes().decode("ascii")
    except UnicodeDecodeError:
        return None


def candidate_files(root: Optional[Path] = None) -> dict:
    """{relative path: text} of the files the rule admits in the standard library at
    ``root``: top-level modules and the ``asyncio`` package, every character in the
    vocabulary, the build-generated and left-out modules excluded."""
    root = Path(root) if root is not None else stdlib_root()
    paths = sorted(root.glob("*.py")) + [p for pkg in _PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    out = {}
    for p in paths:
        rel = p.relative_to(root).as_posix()
        if p.name.startswith("_sysconfigdata") or rel in _LEFT_OUT:
            continue
        text = _read(p)
        if text is not None and _in_vocab(text):
            out[rel] = text
    return out


def split_by_rule(sizes: dict, held_out: Optional[dict] = None) -> dict:
    """{path: split} for files of ``sizes`` ({path: characters}) by the module's rule:
    order by SHA-256 of the path; validation, then test, take files until each holds at
    least ``held_out[split]`` characters; the rest is training."""
    held_out = held_out or SHAKESPEARE_HELD_OUT_CHARS
    order = sorted(sizes, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    split, filled, out = "validation", 0, {}
    for p in order:
        if split == "validation" and filled >= held_out["validation"]:
            split, filled = "test", 0
        if split == "test" and filled >= held_out["test"]:
            split = "train"
        out[p] = split
        if split != "train":
            filled += sizes[p]
    return out


def _joined(texts: dict) -> str:
    return "\n\n".join(texts[p] for p in sorted(texts))


def load_manifest(path: Optional[Path] = None) -> dict:
    return json.loads(Path(path or MANIFEST).read_text())


def load_modules(root: Optional[Path] = None, manifest: Optional[dict] = None) -> dict:
    """{split: {path: text}} of the manifest's files, read from the standard library at
    ``root`` (default: this Python's) and checked file by file and split by split against
    the pinned SHA-256. Raises :class:`SourceMissingError` or :class:`SourceMismatchError`."""
    root = Path(root) if root is not None else stdlib_root()
    manifest = manifest or load_manifest()
    out = {s: {} for s in SPLITS}
    here = platform.python_version()
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise SourceMissingError(
                f"the Python-source corpus needs {entry['path']} from the standard library, but {path} does not "
                f"exist (pinned for Python {manifest['python']}, this is Python {here})")
        text = _read(path)
        digest = sha256_text(text) if text is not None else "(not ASCII)"
        if digest != entry["sha256"]:
            raise SourceMismatchError(
                f"{entry['path']} in {root} has SHA-256 {digest}, but the corpus pins {entry['sha256']}: this "
                f"standard library differs from the one the corpus was pinned with (Python {manifest['python']}; "
                f"this is Python {here}). Run with that Python; the corpus is not the declared one otherwise.")
        out[entry["split"]][entry["path"]] = text
    for split in SPLITS:
        digest = sha256_text(_joined(out[split]))
        if digest != manifest["splits"][split]["sha256"]:
            raise SourceMismatchError(f"the {split} split joins to SHA-256 {digest}, expected "
                                      f"{manifest['splits'][split]['sha256']} (the manifest's file list changed?)")
    return out


def write_manifest(path: Optional[Path] = None, root: Optional[Path] = None) -> Path:
    """Write the manifest from this Python's standard library (run once, with the pinned Python)."""
    files = candidate_files(root)
    split = split_by_rule({p: len(t) for p, t in files.items()})
    entries = [{"path": p, "split": split[p], "chars": len(files[p]), "sha256": sha256_text(files[p])}
               for p in sorted(files)]
    splits = {}
    for s in SPLITS:
        texts = {p: files[p] for p in files if split[p] == s}
        joined = _joined(texts)
        splits[s] = {"files": len(texts), "chars": len(joined), "sha256": sha256_text(joined)}
    path = Path(path) if path is not None else MANIFEST
    path.write_text(json.dumps({
        "what": "the Python-source corpus of the language-modelling experiment (qkmlp.experiments.pysource)",
        "python": platform.python_version(), "splits": splits, "files": entries}, indent=1) + "\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.experiments.pysource", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["info", "manifest"],
                   help="info: verify and print the splits; manifest: rewrite the manifest from this Python")
    args = p.parse_args(argv)
    if args.command == "manifest":
        print(f"wrote {write_manifest()}")
        return 0
    for split, files in load_modules().items():
        print(f"{split:10s} {len(files):3d} files  {sum(map(len, files.values())):9d} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
