"""What the chapters fold and what they show.

A proof of three lines or fewer is the explanation itself ("put b = 1"), so it stays on
the main path; a longer proof is a detour, folded in a dropdown; and a proven statement
(theorem, lemma, proposition, corollary) is never only inside a fold, because the
introduction promises that statements stay in the main text. Lines are the non-blank
source lines of the ``prf:proof`` body, as the chapters wrap their prose (about 90
columns).

The parser below reads MyST's fenced directives (backtick or colon fences, nested), with
their options; a directive is *folded* if it lies inside a directive whose options say
``:class: dropdown`` (a detour admonition, a solution) or inside a ``{dropdown}``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))
# chapters with a main path and detours: a proof on their main path is a short one
MAIN_PATH_CHAPTERS = ["01_key_value", "02_dynamic_query", "03_bilinear_attention",
                      "04_rank_one", "05_symmetry_breaking", "06_rank_r"]
SHORT = 3                       # lines: a proof this short is shown, never folded
STATEMENTS = ("prf:theorem", "prf:lemma", "prf:proposition", "prf:corollary")

_OPEN = re.compile(r"^(`{3,}|:{3,})\{([\w:-]+)\}(.*)$")
_CODE = re.compile(r"^(`{3,}|~{3,})[\w-]*\s*$")
_OPTION = re.compile(r"^:[\w-]+:")


@dataclass
class Directive:
    name: str                   # "prf:proof", "admonition", ...
    title: str
    body: list[str]             # the lines inside, options excluded
    folded: bool                # inside a dropdown

    def lines(self) -> int:
        return sum(1 for line in self.body if line.strip())

    def words(self) -> int:
        """Words as the main-path count reads them (fences and options not counted)."""
        return sum(len(line.split()) for line in self.body
                   if not line.startswith(("```", ":label:", ":class:")))


def directives(markdown: str) -> list[Directive]:
    """Every fenced directive of ``markdown``, innermost first where they nest."""
    lines = markdown.splitlines()
    stack: list[dict] = []      # open fences: fence, name, title, dropdown, body
    found: list[Directive] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        top = stack[-1] if stack else None
        if top is not None and top["name"] == "code":     # nothing opens in code
            if line.strip() == top["fence"]:
                stack.pop()
            for entry in stack:
                if entry is not top:
                    entry["body"].append(line)
            i += 1
            continue
        if top is not None and line.strip() == top["fence"]:
            stack.pop()
            found.append(Directive(top["name"], top["title"], top["body"],
                                   any(e["dropdown"] for e in stack)))
            for entry in stack:
                entry["body"].append(line)
            i += 1
            continue
        for entry in stack:
            entry["body"].append(line)
        opened, code = _OPEN.match(line), _CODE.match(line)
        if opened:
            fence, name, title = opened.groups()
            dropdown = name == "dropdown"
            i += 1
            while i < len(lines) and _OPTION.match(lines[i]):
                dropdown |= lines[i].split(None, 1)[0] == ":class:" and "dropdown" in lines[i].split()
                for entry in stack:
                    entry["body"].append(lines[i])
                i += 1
            stack.append({"fence": fence, "name": name, "title": title.strip(),
                          "dropdown": dropdown, "body": []})
            continue
        if code:
            stack.append({"fence": code.group(1), "name": "code", "title": "",
                          "dropdown": False, "body": []})
        i += 1
    if stack:
        raise ValueError(f"unclosed {stack[-1]['name']} fence {stack[-1]['fence']!r}")
    return found


def page_markdown(path: Path) -> list[str]:
    """The markdown cells of a notebook (one string each), or a text page's text."""
    if path.suffix == ".md":
        return [path.read_text()]
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def main_path_proof_words(cells: list[dict]) -> int:
    """Words of the proofs a chapter shows on its main path (the short ones)."""
    return sum(d.words() for c in cells if c["cell_type"] == "markdown"
               for d in directives("".join(c["source"]))
               if d.name == "prf:proof" and not d.folded)


DETOUR = ":::{admonition} Detour (optional on a first reading): the proof\n:class: dropdown\n\n"


def test_the_parser_finds_folds_and_counts_lines():
    short = "```{prf:proof}\nPut $b = 1$.\n\n$\\square$\n```\n"
    long_ = "```{prf:proof}\none\ntwo\n\n$$\nx\n$$\n```\n"
    text = (DETOUR + short + ":::\n\n" + short + "\n" + DETOUR + long_ + ":::\n\n"
            "````{solution} e\n:class: dropdown\n\n~~~\n```{prf:proof}\nquoted\n```\n~~~\n"
            "```{prf:lemma} L\n:label: l\n\nA.\n```\n````\n")
    found = directives(text)
    proofs = [(d.lines(), d.folded) for d in found if d.name == "prf:proof"]
    assert proofs == [(2, True), (2, False), (5, True)]     # none read inside ~~~ code
    lemma = next(d for d in found if d.name == "prf:lemma")
    assert lemma.folded and lemma.title == "L" and lemma.body == ["", "A."]
    with pytest.raises(ValueError, match="unclosed"):
        directives("```{prf:proof}\nno end")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_no_short_proof_is_folded(path):
    folded_short = [d.body[:2] for text in page_markdown(path) for d in directives(text)
                    if d.name == "prf:proof" and d.folded and d.lines() <= SHORT]
    assert not folded_short, (f"proofs of {SHORT} lines or fewer folded in {path.name}; "
                              f"show them on the main path: {folded_short}")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_no_proven_statement_lives_only_inside_a_fold(path):
    hidden = [f"{d.name} {d.title}" for text in page_markdown(path) for d in directives(text)
              if d.name in STATEMENTS and d.folded]
    assert not hidden, f"statements only inside a fold in {path.name}: {hidden}"


@pytest.mark.parametrize("chapter", MAIN_PATH_CHAPTERS)
def test_a_proof_on_the_main_path_is_short(chapter):
    """The other half of the rule, in the chapters that have a main path: a longer
    proof is a detour."""
    path = ROOT / "book" / f"{chapter}.ipynb"
    long_shown = [d.body[:2] for text in page_markdown(path) for d in directives(text)
                  if d.name == "prf:proof" and not d.folded and d.lines() > SHORT]
    assert not long_shown, f"proofs of more than {SHORT} lines on the main path: {long_shown}"
