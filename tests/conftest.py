"""Shared fixtures: one build of the book per test session, reused by the browser test.

The book build (`jupyter-book build . -W -n --keep-going`, executing every notebook) takes
minutes, so it runs once per `pytest` invocation, even under pytest-xdist: the first
worker that needs it builds into ``test-artifacts/book`` while holding a file lock, and
writes the outcome to ``build-result.json`` tagged with the run's id; other workers wait
on the lock and read that file.

Environment knobs (for working on the tests, not for CI):

- ``QKMLP_BOOK_TOC``: build with this table of contents instead of ``_toc.yml``.
- ``QKMLP_BOOK_HTML``: use an existing ``_build/html`` folder and build nothing (the
  build test then skips, saying so).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from qkmlp import (
    BilinearAttentionMLP,
    GatedMLP,
    KeyValueMLP,
    StaticQueryMLP,
    SymmetricBilinearMLP,
    SymmetrizedGatedMLP,
)

# The layers of qkmlp.layers, in the book's order: every test module takes its list from here
# (tests/test_layers.py checks it against qkmlp.layers.__all__).
LAYERS = (KeyValueMLP, StaticQueryMLP, BilinearAttentionMLP, SymmetricBilinearMLP, GatedMLP,
          SymmetrizedGatedMLP)
# Those with a rank (query_weight, key_weight, value and a rank= argument).
RANK_R = (SymmetricBilinearMLP, GatedMLP, SymmetrizedGatedMLP)
# Those with a fused path (qkmlp.functional's autograd functions and custom op): the tests of
# that path (saved tensors, hand-written backward, compile, export, half precision) take these;
# SymmetrizedGatedMLP computes its formula in plain autograd (tests/test_layers.py checks the split).
FUSED = (SymmetricBilinearMLP, GatedMLP)


def layer_cases(ranks=(1, 3)) -> list[tuple[type, int | None]]:
    """(layer class, rank) for every layer: rank None for the layers without one, each of
    ``ranks`` for the rank-r layers."""
    return [(c, r) for c in LAYERS for r in ((None,) if c not in RANK_R else ranks)]

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
BOOK_OUT = ARTIFACTS / "book"
BUILD_TIMEOUT_S = 3600
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


@dataclass(frozen=True)
class BookBuild:
    """Outcome of one book build: where the HTML is and how the build went."""

    html: Path
    returncode: int | None  # None: a prebuilt folder was reused, nothing was built
    log: str
    toc: Path
    seconds: float


def _jupyter_book() -> str:
    exe = Path(sys.executable).with_name("jupyter-book")
    if exe.exists():
        return str(exe)
    found = shutil.which("jupyter-book")
    if not found:
        pytest.fail("jupyter-book is not installed in this environment (see requirements.txt)")
    return found


def _build() -> dict:
    toc = Path(os.environ.get("QKMLP_BOOK_TOC", ROOT / "_toc.yml")).resolve()
    if BOOK_OUT.exists():
        shutil.rmtree(BOOK_OUT)
    BOOK_OUT.mkdir(parents=True)
    cmd = [_jupyter_book(), "build", str(ROOT), "--toc", str(toc), "--path-output", str(BOOK_OUT),
           "-W", "-n", "--keep-going"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    seconds = time.perf_counter() - start
    log = f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    (BOOK_OUT / "build.log").write_text(log)
    return {"run_id": _RUN_ID, "returncode": proc.returncode, "toc": str(toc), "seconds": seconds}


@pytest.fixture(scope="session")
def book_build() -> BookBuild:
    """Build the book once per test session (shared by xdist workers through a lock)."""
    prebuilt = os.environ.get("QKMLP_BOOK_HTML")
    if prebuilt:
        html = Path(prebuilt).resolve()
        if not (html / "index.html").exists():
            pytest.fail(f"QKMLP_BOOK_HTML={prebuilt} has no index.html")
        toc = Path(os.environ.get("QKMLP_BOOK_TOC", ROOT / "_toc.yml")).resolve()
        return BookBuild(html=html, returncode=None, log="", toc=toc, seconds=0.0)
    ARTIFACTS.mkdir(exist_ok=True)
    result_file = ARTIFACTS / "book-build-result.json"
    with FileLock(str(ARTIFACTS / "book-build.lock"), timeout=BUILD_TIMEOUT_S + 60):
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        if result.get("run_id") != _RUN_ID:
            result_file.unlink(missing_ok=True)
            result = _build()
            result_file.write_text(json.dumps(result))
    return BookBuild(
        html=BOOK_OUT / "_build" / "html",
        returncode=result["returncode"],
        log=(BOOK_OUT / "build.log").read_text(),
        toc=Path(result["toc"]),
        seconds=result["seconds"],
    )
