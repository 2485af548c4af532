"""The site extension's HTML transforms (book/_ext/qkmlp_site.py), on hand-written HTML:
where inline code may break, and which punctuation stays with its formula. How the pages
then look is measured in the browser (test_browser.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
qkmlp_site = pytest.importorskip("qkmlp_site")


def code(text: str) -> str:
    return f'<code class="docutils literal notranslate"><span class="pre">{text}</span></code>'


def test_inline_code_may_break_after_dots_underscores_and_slashes_only():
    got = qkmlp_site.break_at_separators("<p>" + code("StaticQueryMLP.query") + " and " + code("d_model")
                                         + " " + code("book/data/x_1") + "</p>")
    assert got == ("<p>" + code("StaticQueryMLP.<wbr>query") + " and " + code("d_<wbr>model") + " "
                   + code("book/<wbr>data/<wbr>x_1") + "</p>")


@pytest.mark.parametrize("text", ["__init__", "0.5", "x_1", "1e-7", "&quot;silu&quot;", "a..", "_private"])
def test_no_break_inside_numbers_dunders_or_at_the_ends(text):
    assert qkmlp_site.break_at_separators(code(text)) == code(text)


def test_in_tables_names_break_after_dots_only_and_other_markup_is_untouched():
    table = "<table><tr><td>{}</td></tr></table>"
    text = '<p class="a.b">x_y.z ' + table.format(code("gate_proj.weight") + " " + code("d_model")) + "</p>"
    assert qkmlp_site.break_at_separators(text) == \
        '<p class="a.b">x_y.z ' + table.format(code("gate_proj.<wbr>weight") + " " + code("d_model")) + "</p>"
    # a tag inside the code keeps its attributes
    inner = '<code class="docutils literal notranslate"><a href="a.b_c.html">a.b</a></code>'
    assert qkmlp_site.break_at_separators(inner) == \
        '<code class="docutils literal notranslate"><a href="a.b_c.html">a.<wbr>b</a></code>'


MATH = '<span class="math notranslate nohighlight">\\(x_1\\)</span>'


@pytest.mark.parametrize("before, after", [("", ","), ("", "."), ("(", ")."), ("", "-th,"), ("\u201c", "\u201d")])
def test_a_formula_and_its_punctuation_share_one_unbreakable_span(before, after):
    got = qkmlp_site.keep_math_with_punctuation(f"so {before}{MATH}{after} then")
    assert got == f'so <span class="qk-nobr">{before}{MATH}{after}</span> then'


def test_a_formula_without_punctuation_and_display_math_are_left_alone():
    for text in (f"so {MATH} then", f"so {MATH} , then",
                 '<div class="math notranslate nohighlight">\\[x\\]</div>, then'):
        assert qkmlp_site.keep_math_with_punctuation(text) == text
