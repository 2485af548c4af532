"""Numbers in the prose: qkmlp.book.prose, and the notebooks that use MyST's {eval} role."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.core.formatters import PlainTextFormatter

from qkmlp.book.prose import PREFIX, Text, bind

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
EVAL = re.compile(r"\{eval\}`([^`]*)`")


def test_text_shows_as_itself_in_jupyters_plain_text_form():
    # what both MyST-NB's {eval} and jupyterlab-myst show: the kernel's text/plain
    fmt = PlainTextFormatter()
    assert fmt("0.12") == "'0.12'"                   # a plain str would show its quotes
    assert fmt(Text("0.12")) == "0.12"
    assert fmt(Text("−0.19 to 0.17")) == "−0.19 to 0.17"


def test_bind_names_the_value_for_the_prose():
    ns = {}
    assert bind(ns, "gap", "0.05") == "0.05" and isinstance(ns[PREFIX + "gap"], Text)
    bind(ns, "gap", "0.05")                           # the same number again is fine


def test_bind_refuses_a_second_value_and_a_clash_with_a_variable():
    ns = {PREFIX + "rate": 0.3}
    with pytest.raises(ValueError, match="already a float"):
        bind(ns, "rate", "0.3")
    bind(ns, "gap", "0.05")
    with pytest.raises(ValueError, match="one number, two values"):
        bind(ns, "gap", "0.06")
    with pytest.raises(ValueError, match="identifier"):
        bind(ns, "a.b", "1")
    with pytest.raises(TypeError, match="string"):
        bind(ns, "n", 3)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_numbers_in_the_prose_use_eval_and_inline_execution(path):
    nb = json.loads(path.read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    assert "{glue" not in text, "glue shows nothing in JupyterLab: bind the value and use {eval}"
    names = [n for c in nb["cells"] if c["cell_type"] == "markdown"
             for n in EVAL.findall("".join(c["source"]))]
    assert all(n.startswith(PREFIX) and re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_]*", n) for n in names), names
    if names:   # the website evaluates them while it executes the notebook
        assert nb["metadata"].get("mystnb", {}).get("execution_mode") == "inline"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_numbers_in_the_prose_are_bound_only_through_bind(path):
    """JupyterLab evaluates {eval} after Run All (the kernel's state at the end), the website
    in order; a txt_ name assigned directly could hold two values and read differently."""
    nb = json.loads(path.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert not re.findall(r"\b" + PREFIX + r"\w+\s*(?:=|\+=)[^=]", code)
