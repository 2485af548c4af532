"""The package's layout stays as the README's Layout section says: imports inside
``src/qkmlp`` run one way (no cycle, lazy imports inside functions included), no module
is over 700 lines, ``import qkmlp`` loads the layer library only, and the old paths of
the modules that moved into ``qkmlp.book`` are aliases that warn, used nowhere in the
repository itself."""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import qkmlp
from qkmlp import _moved

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAX_LINES = 700
#: the deprecated aliases and their helper: the only modules that may name the old paths
ALIASES = {"qkmlp.figures", "qkmlp.widgets", "qkmlp.static_explorer", "qkmlp.examples", "qkmlp._moved"}


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
    assert {"qkmlp.symmetry", "qkmlp.symmetry_group", "qkmlp.bench.cli"} <= set(graph)
    assert "qkmlp.symmetry" in graph["qkmlp.symmetry_group"]        # the group builds on it
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_no_module_over_700_lines():
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in (SRC / "qkmlp").rglob("*.py")}
    assert len(sizes) > 40
    big = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_import_qkmlp_loads_the_layer_library_only():
    code = ("import sys, qkmlp\n"
            "heavy = ['matplotlib', 'ipywidgets', 'transformers', 'scipy', 'qkmlp.book', 'qkmlp.bench',\n"
            "         'qkmlp.experiments', 'qkmlp.pretrained', 'qkmlp.figures', 'qkmlp.widgets']\n"
            "print(json.dumps([m for m in heavy if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert json.loads(out.stdout) == []


# --- the old paths -----------------------------------------------------------------------

@pytest.fixture
def fresh_alias():
    """Forget the alias modules before and after a test, so each import runs (and warns)."""
    def forget():
        for old in _moved.MOVED:
            sys.modules.pop(old, None)
            qkmlp.__dict__.pop(old.rpartition(".")[2], None)
    forget()
    yield
    forget()


@pytest.mark.parametrize("old", ["qkmlp.figures", "qkmlp.widgets", "qkmlp.static_explorer"])
def test_an_old_module_path_is_the_moved_module_and_warns(old, fresh_alias):
    new = old.replace("qkmlp.", "qkmlp.book.")
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new};") as rec:
        mod = importlib.import_module(old)
    assert mod is importlib.import_module(new)
    assert rec[0].filename == __file__          # the warning points at the importing code
    assert getattr(qkmlp, old.rpartition(".")[2]) is mod
    if old == "qkmlp.widgets":
        from qkmlp.widgets import _grid      # private names too: it is the same module
        assert _grid is mod._grid


def test_the_old_examples_module_reexports_every_chapter_name(fresh_alias):
    from qkmlp.book import ch01_key_value, ch02_dynamic_query, ch03_bilinear_attention, ch04_rank_one

    with pytest.warns(DeprecationWarning, match="qkmlp.examples moved to qkmlp.book.ch01_key_value"):
        examples = importlib.import_module("qkmlp.examples")
    chapters = (ch01_key_value, ch02_dynamic_query, ch03_bilinear_attention, ch04_rank_one)
    names = [n for ch in chapters for n in ch.__all__]
    assert len(names) == 28 and sorted(examples.__all__) == sorted(names)
    for ch in chapters:
        for n in ch.__all__:
            assert getattr(examples, n) is getattr(ch, n), n


def test_old_attribute_access_on_qkmlp_warns(fresh_alias):
    with pytest.warns(DeprecationWarning, match="qkmlp.figures moved to qkmlp.book.figures"):
        figures = qkmlp.figures
    assert figures is importlib.import_module("qkmlp.book.figures")
    with pytest.raises(AttributeError, match="has no attribute 'figure'"):
        qkmlp.figure


def test_python_m_qkmlp_examples_runs_the_book_command():
    out = subprocess.run([sys.executable, "-m", "qkmlp.examples", "--help"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m qkmlp.book") and "static-query" in out.stdout
    assert "DeprecationWarning: qkmlp.examples moved to qkmlp.book" in out.stderr


def _code_cells(nb: Path):
    for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())
            yield i, ast.parse(src)


def _old_paths(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """Old paths that ``tree`` imports or reads as ``qkmlp.<old>`` attributes."""
    found = imported_modules(tree, name, is_package, modules) & set(_moved.MOVED)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "qkmlp"
                and f"qkmlp.{node.attr}" in _moved.MOVED):
            found.add(f"qkmlp.{node.attr}")
    return found


def test_the_repository_uses_the_new_paths():
    """No module, test or notebook of the repository imports an old path, so our own runs
    never see the DeprecationWarning (and the aliases can go one day)."""
    modules = {module_name(p, SRC) for p in (SRC / "qkmlp").rglob("*.py")}
    bad = {}
    for p in (SRC / "qkmlp").rglob("*.py"):
        name = module_name(p, SRC)
        if name not in ALIASES:
            bad[str(p.relative_to(ROOT))] = _old_paths(ast.parse(p.read_text()), name, p.name == "__init__.py",
                                                       modules)
    for p in (ROOT / "tests").glob("*.py"):
        if p.name != Path(__file__).name:
            bad[str(p.relative_to(ROOT))] = _old_paths(ast.parse(p.read_text()), p.stem, False, modules)
    notebooks = sorted((ROOT / "book").glob("*.ipynb"))
    assert len(notebooks) >= 10
    for nb in notebooks:
        for i, tree in _code_cells(nb):
            bad[f"{nb.relative_to(ROOT)} cell {i}"] = _old_paths(tree, "__main__", False, modules)
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"old module paths in use: {bad}"
    # the checker sees the forms the repository used before the move
    old_forms = ("from qkmlp import figures\nfrom qkmlp.widgets import make_layer\n"
                 "import qkmlp\nqkmlp.static_explorer.static_explorer_html()\n")
    assert _old_paths(ast.parse(old_forms), "__main__", False, modules) == {
        "qkmlp.figures", "qkmlp.widgets", "qkmlp.static_explorer"}
    assert _old_paths(ast.parse("from .. import figures\n"), "qkmlp.bench.report", False, modules) == {
        "qkmlp.figures"}


def test_no_warning_when_the_chapters_modules_import():
    code = ("import warnings\nwarnings.filterwarnings('error', message=r'qkmlp\\.\\w+ moved to')\n"
            "import qkmlp, qkmlp.bench, qkmlp.experiments, qkmlp.pretrained\n"
            "from qkmlp.book import (figures, widgets, static_explorer, ch01_key_value, ch02_dynamic_query,\n"
            "                        ch03_bilinear_attention, ch04_rank_one)\n"
            "from qkmlp.experiments import report\nfrom qkmlp.pretrained import plots\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
