"""The package's layout stays as the API page's package table says (book/api.md): imports inside
``src/qkmlp`` run one way (no cycle, lazy imports inside functions included), no module
is over 700 lines, and ``import qkmlp`` loads the layer library only."""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import qkmlp

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAX_LINES = 700


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` imports anywhere in ``tree``
    (top level or inside a function): ``from .x import y`` is an edge to ``pkg.x.y`` when
    that is a module, else to ``pkg.x``."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:       # import a.b.c of a module a.b: edge to a.b
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    files = {module_name(p, src): p for p in (src / package).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = imported_modules(tree, name, path.name == "__init__.py", set(files))
    return graph


def find_cycle(graph: dict[str, set[str]]):
    """One import cycle as a list [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_checker_finds_a_cycle_through_a_lazy_relative_import(tmp_path):
    """The two shapes the symmetry modules had: a module-level import at the bottom of
    one module and an import inside a function of the other."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("x = 1\nfrom .sub.b import f  # noqa: E402\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a.x\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (pkg / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None


def test_no_import_cycle_inside_qkmlp():
    graph = import_graph(SRC, "qkmlp")
    assert {"qkmlp.symmetry.transforms", "qkmlp.symmetry.group", "qkmlp.bench.cli"} <= set(graph)
    assert "qkmlp.symmetry.transforms" in graph["qkmlp.symmetry.group"]        # the group builds on it
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_no_module_over_700_lines():
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in (SRC / "qkmlp").rglob("*.py")}
    assert len(sizes) > 40
    big = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_import_qkmlp_loads_the_layer_library_only():
    code = ("import sys, qkmlp\n"
            "heavy = ['matplotlib', 'ipywidgets', 'transformers', 'scipy', 'qkmlp.book', 'qkmlp.bench',\n"
            "         'qkmlp.experiments', 'qkmlp.pretrained']\n"
            "print(json.dumps([m for m in heavy if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert json.loads(out.stdout) == []


#: The pipelines compute and store; the book reads stored files and draws. Arrows run from
#: the book to the pipelines to the library, never back.
PIPELINES = ("qkmlp.experiments", "qkmlp.pretrained", "qkmlp.bench", "qkmlp.runbase")


def test_no_pipeline_imports_the_book_and_the_library_imports_neither():
    graph = import_graph(SRC, "qkmlp")
    up = {(a, b) for a, deps in graph.items() for b in deps
          if a.startswith(PIPELINES) and b.startswith("qkmlp.book")}
    assert not up, f"pipelines importing the book (an arrow up): {sorted(up)}"
    library = [m for m in graph if not m.startswith(PIPELINES + ("qkmlp.book",))]
    assert "qkmlp.layers" in library and "qkmlp.symmetry.group" in library
    down = {(a, b) for a in library for b in graph[a] if b.startswith(PIPELINES + ("qkmlp.book",))}
    assert not down, f"the layer library importing a pipeline or the book: {sorted(down)}"


def private_imports(src: Path, package: str) -> set[tuple[str, str]]:
    """(module, name) for every ``from X import _name`` inside ``package`` where ``_name``
    is not itself a module (importing a private module, ``from . import _fused``, is the
    way in; a private function or constant of another module is not)."""
    files = {module_name(p, src): p for p in (src / package).rglob("*.py")}
    out = set()
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        package_of = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package_of.split(".")
                base = ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and f"{base}.{a.name}" not in files:
                    out.add((name, a.name))
    return out


def test_the_private_import_checker_finds_one(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_priv.py").write_text("def _helper():\n    pass\n")
    (pkg / "a.py").write_text("from . import _priv\nfrom ._priv import _helper\n")
    assert private_imports(tmp_path, "p") == {("p.a", "_helper")}


def test_no_module_imports_another_modules_private_name():
    found = private_imports(SRC, "qkmlp")
    assert not found, (f"private names imported across modules: {sorted(found)}; make the name public "
                       "where it is a shared helper, or move it to the module that owns the job")
