"""Tests of the second language-modelling corpus: Python's standard-library source, pinned by
SHA-256, split by file by a fixed rule, and read by the same windows as the plays."""
from __future__ import annotations

import hashlib
import platform
import shutil

import pytest

from qkmlp.experiments import pysource
from qkmlp.experiments.corpus import VOCAB
from qkmlp.experiments.tasks import TASKS

MANIFEST = pysource.load_manifest()
PINNED = platform.python_version() == MANIFEST["python"]
needs_pinned = pytest.mark.skipif(not PINNED, reason=f"the corpus is pinned for Python {MANIFEST['python']}")


def test_manifest_splits_are_disjoint_and_follow_the_declared_rule():
    files = MANIFEST["files"]
    paths = [f["path"] for f in files]
    assert len(paths) == len(set(paths))
    # the rule, recomputed here without the module: order by SHA-256 of the path, fill
    # validation then test to at least the Shakespeare held-out sizes, the rest trains
    order = sorted(files, key=lambda f: hashlib.sha256(f["path"].encode()).hexdigest())
    targets = [("validation", 459824), ("test", 531337)]
    expected, k, filled = {}, 0, 0
    for f in order:
        while k < len(targets) and filled >= targets[k][1]:
            k, filled = k + 1, 0
        split = targets[k][0] if k < len(targets) else "train"
        expected[f["path"]] = split
        if split != "train":
            filled += f["chars"]
    assert {f["path"]: f["split"] for f in files} == expected
    for split, (name, target) in zip(("validation", "test"), targets):
        chars = sum(f["chars"] for f in files if f["split"] == split)
        assert target <= chars < target + max(f["chars"] for f in files)
    # joined text = files + one blank line between consecutive files
    for split, info in MANIFEST["splits"].items():
        mine = [f["chars"] for f in files if f["split"] == split]
        assert info["files"] == len(mine) and info["chars"] == sum(mine) + 2 * (len(mine) - 1)
    assert not any(p.startswith("_sysconfigdata") or p in ("turtle.py", "this.py", "antigravity.py") for p in paths)


def test_split_by_rule_on_constructed_sizes():
    sizes = {f"m{i}.py": 10 for i in range(20)}
    split = pysource.split_by_rule(sizes, {"validation": 25, "test": 40})
    counts = {s: sum(1 for v in split.values() if v == s) for s in ("train", "validation", "test")}
    assert counts == {"validation": 3, "test": 4, "train": 13}


@needs_pinned
def test_load_verifies_every_file_and_stays_in_the_vocabulary():
    splits = pysource.load_modules()
    allowed = set(VOCAB)
    for split, files in splits.items():
        joined = "\n\n".join(files[p] for p in sorted(files))
        assert hashlib.sha256(joined.encode()).hexdigest() == MANIFEST["splits"][split]["sha256"]
        assert set(joined) <= allowed
    assert set(splits["train"]).isdisjoint(splits["test"]) and set(splits["validation"]).isdisjoint(splits["test"])


def _copy_lib(tmp_path, entries):
    root = tmp_path / "Lib"
    for e in entries:
        dest = root / e["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pysource.stdlib_root() / e["path"], dest)
    return root


@needs_pinned
def test_a_changed_or_missing_file_is_refused_by_name(tmp_path):
    entries = [e for e in MANIFEST["files"] if e["split"] == "validation"][:2]
    small = {**MANIFEST, "files": entries}
    root = _copy_lib(tmp_path, entries)
    changed = root / entries[1]["path"]
    changed.write_text(changed.read_text() + "# one more line\n")
    with pytest.raises(pysource.SourceMismatchError, match=entries[1]["path"].replace(".", r"\.")):
        pysource.load_modules(root, small)
    changed.unlink()
    with pytest.raises(pysource.SourceMissingError, match="pinned for Python"):
        pysource.load_modules(root, small)


def test_the_declared_grid_is_compute_6000_on_the_other_corpus():
    lm = TASKS["lm"]
    mine, base = lm.config("stdlib_6000"), lm.config("compute_6000")
    assert mine["source"] == "python_stdlib" and base["source"] == "cache"
    assert mine["families"] == ["gated1-silu", "symgated1-silu", "kv-relu"]
    assert {k: v for k, v in mine.items() if k not in ("source", "families")} == \
        {k: v for k, v in base.items() if k not in ("source", "families")}


def test_the_sequential_looks_share_the_24000_step_records():
    lm = TASKS["lm"]
    base = lm.config("compute_24000")
    for k, seeds in ((1, range(40, 60)), (2, range(40, 80))):
        cfg = lm.config(f"compute_24000_p1_look{k}")
        assert cfg["seeds"] == list(seeds) and cfg["records_of"] == "compute_24000"
        assert not set(cfg["seeds"]) & set(range(20, 40))
        assert {k2: v for k2, v in cfg.items() if k2 not in ("seeds", "families", "records_of")} == \
            {k2: v for k2, v in base.items() if k2 not in ("seeds", "families")}
