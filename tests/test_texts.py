"""qkmlp.pretrained.texts: the named texts, their pins and their disjointness.

Each text is rebuilt here from its sources by other means (``inspect.getsource`` of the
imported modules, the corpus loader, ``pydoc_data`` itself) and hashed with ``hashlib``
directly; the pins are checked against that, and a tampered text must raise.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import platform

import pytest

from qkmlp.pretrained import texts as T

SAME_PYTHON = platform.python_version() == T.PINNED_PYTHON
needs_python = pytest.mark.skipif(not SAME_PYTHON, reason=f"the Python texts are pinned for Python {T.PINNED_PYTHON}, "
                                                          f"this is {platform.python_version()}")


def _corpus_available() -> bool:
    from qkmlp.experiments.corpus import CorpusMissingError, load_plays

    try:
        load_plays("cache")
        return True
    except CorpusMissingError:
        return False


needs_corpus = pytest.mark.skipif(not _corpus_available(),
                                  reason="the Shakespeare corpus is not in the cache (python -m qkmlp.experiments.corpus fetch)")


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def _independent(name: str) -> str:
    """The text rebuilt without texts.py's builders."""
    if name.startswith("python_"):
        return "\n\n".join(inspect.getsource(importlib.import_module(m)).strip() for m in T.PYTHON_MODULES[name])
    if name == "pydoc_topics":
        from pydoc_data.topics import topics
        return "\n\n".join(topics[k].strip() for k in sorted(topics))
    from qkmlp.experiments.corpus import load_plays
    plays = load_plays("cache")[name.split("_", 1)[1]]
    return "\n\n".join(plays[p].strip() for p in sorted(plays))


def test_registry_and_roles():
    assert set(T.names()) == set(T.TEXTS)
    assert T.names("training") == ["shakespeare_train", "python_train"]
    assert T.names("validation") == ["shakespeare_validation", "python_validation"]
    assert T.names("held-out") == ["shakespeare_test", "python_test", "pydoc_topics"]
    for name, spec in T.TEXTS.items():
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0 and spec.n_chars > 100_000
        assert T.text_sha256(name) == spec.sha256
        d = T.describe(name)
        assert d["sha256"] == spec.sha256 and d["genre"] == spec.genre and d["n_chars"] == spec.n_chars
    with pytest.raises(KeyError, match="unknown text 'nope'.*pydoc_topics"):
        T.text("nope")
    with pytest.raises(ValueError, match="unknown role"):
        T.names("train")


def test_module_lists_and_splits_are_disjoint():
    lists = [set(v) for v in T.PYTHON_MODULES.values()]
    assert sum(map(len, lists)) == len(set().union(*lists))
    assert all(len(v) == len(set(v)) for v in T.PYTHON_MODULES.values())
    from qkmlp.experiments.corpus import held_out_plays
    h = held_out_plays()
    assert not set(h["validation"]) & set(h["test"])


@pytest.mark.parametrize("name", list(T.TEXTS))
def test_pinned_text_matches_independent_rebuild(name):
    if name.startswith("python_") or name == "pydoc_topics":
        if not SAME_PYTHON:
            pytest.skip(f"pinned for Python {T.PINNED_PYTHON}")
    elif not _corpus_available():
        pytest.skip("Shakespeare corpus not cached")
    s = T.text(name)
    ref = _independent(name)
    assert s == ref
    assert _sha(ref) == T.TEXTS[name].sha256 and len(ref) == T.TEXTS[name].n_chars


def test_tampered_text_raises_naming_text_and_hashes(monkeypatch):
    original = "\n\n".join(["some text", "more text"])
    good = dataclasses.replace(T.TEXTS["pydoc_topics"], sha256=_sha(original), n_chars=len(original),
                               build=lambda: original)
    monkeypatch.setitem(T.TEXTS, "pydoc_topics", good)
    T._built.cache_clear()
    try:
        assert T.text("pydoc_topics") == original
        tampered = original.replace("more", "mora")
        with pytest.raises(T.TextMismatchError) as e:
            T.verify("pydoc_topics", tampered)
        msg = str(e.value)
        for part in ("'pydoc_topics'", _sha(original), _sha(tampered), "Python", "check=False"):
            assert part in msg
        monkeypatch.setitem(T.TEXTS, "pydoc_topics", dataclasses.replace(good, build=lambda: tampered))
        T._built.cache_clear()
        with pytest.raises(T.TextMismatchError, match="pydoc_data.topics differs between Python releases"):
            T.text("pydoc_topics")
        assert T.text("pydoc_topics", check=False) == tampered
    finally:
        T._built.cache_clear()


@needs_python
@needs_corpus
def test_no_long_stretch_of_a_heldout_or_validation_text_is_in_training():
    train = "\n".join(T.text(n) for n in T.names("training"))
    k = 200
    for name in T.names("held-out") + T.names("validation"):
        s = T.text(name)
        starts = range(0, len(s) - k, 1009)
        hits = [i for i in starts if s[i:i + k] in train]
        assert len(starts) > 200 and not hits, (name, [s[i:i + 60] for i in hits[:3]])
