"""Every cross-reference in a docstring of ``src/qkmlp`` names something that exists.

The book's ``-W -n`` build checks the references of what the API page renders (book/api.md:
the members in each public module's ``__all__``). Private modules (``qkmlp._fused``), private
functions, methods and names outside ``__all__`` are not rendered, so a reference there, such
as one to a module that was renamed, would go unnoticed. This test reads every docstring and
``#:`` comment of the package without importing it (``ast``) and resolves each
``:func:``, ``:class:``, ``:mod:``, ``:meth:``, ``:attr:``, ``:data:``, ``:exc:`` and ``:obj:``
target against the names the package defines:

- a target spelled from the package (``qkmlp.x.y``) must be that exact path (a module, a
  name the module defines or imports, a member of that class or of one of its bases);
- a target with a leading dot (``.declared.budget_tests``) must be the end of such a path,
  as Sphinx searches it;
- any other target resolves as Sphinx's Python domain would from where it is written (the
  class, the module, the package: a name defined there, not one imported there, which is
  documented where it is defined), and, as the site's own resolver does (book/_ext), by its
  last component when the package defines that name in exactly one place;
- targets in torch, numpy and the other outside packages that the build leaves unlinked
  (``nitpick_ignore_regex`` in _config.yml) are skipped.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from test_layout import SRC, module_name

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`([^`]+)`")
#: first components of targets the build leaves unlinked (outside packages and builtins)
OUTSIDE = {"torch", "nn", "np", "numpy", "F", "matplotlib", "ipywidgets", "typing", "pathlib", "os",
           "collections", "dataclasses", "json", "numbers", "enum", "scipy", "transformers", "math",
           "int", "float", "bool", "str", "dict", "list", "tuple", "None", "object", "callable",
           "Optional", "Union", "Callable", "Sequence", "Iterable", "Iterator", "Mapping", "Any",
           "Literal", "Tensor", "Generator", "dtype", "device", "Size"}


@dataclass
class Index:
    """What a package defines, read from its source: modules, each module's top-level names
    (``imported`` says where an imported one comes from), each class's members and bases."""

    modules: set[str] = field(default_factory=set)
    names: dict[str, set[str]] = field(default_factory=dict)
    imported: dict[tuple[str, str], str] = field(default_factory=dict)   # (module, name) -> dotted source
    stars: dict[str, list[str]] = field(default_factory=dict)            # module -> modules it imports * from
    members: dict[str, set[str]] = field(default_factory=dict)           # module.Class -> member names
    bases: dict[str, list[str]] = field(default_factory=dict)            # module.Class -> base expressions
    short: set[str] = field(default_factory=set)                         # every name defined or imported anywhere
    defined: dict[str, int] = field(default_factory=dict)                # name -> how many places define it


def _top_level(body):
    """Statements at module level, looking into if / try / with blocks but not into defs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for sub in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, sub, []):
                    yield from _top_level(child.body if isinstance(child, ast.ExceptHandler) else [child])


def _targets(node) -> list[str]:
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _count(idx: Index, names) -> None:
    for n in names:
        idx.defined[n] = idx.defined.get(n, 0) + 1


def build_index(src: Path, package: str) -> tuple[Index, dict[str, ast.Module], dict[str, str]]:
    idx, trees, texts = Index(), {}, {}
    files = {module_name(p, src): p for p in (src / package).rglob("*.py")}
    idx.modules = set(files)
    for mod, path in files.items():
        texts[mod] = path.read_text()
        trees[mod] = tree = ast.parse(texts[mod], str(path))
        package_of = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        names = idx.names.setdefault(mod, set())
        for node in _top_level(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                _count(idx, [node.name])
            names.update(_targets(node))
            _count(idx, _targets(node))
            if isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package_of.split(".")
                    base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                for a in node.names:
                    if a.name == "*":
                        idx.stars.setdefault(mod, []).append(base)
                        continue
                    names.add(a.asname or a.name)
                    idx.imported[(mod, a.asname or a.name)] = f"{base}.{a.name}"
            if isinstance(node, ast.ClassDef):
                cls = f"{mod}.{node.name}"
                idx.bases[cls] = [ast.unparse(b) for b in node.bases]
                members = idx.members.setdefault(cls, set())
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        members.add(item.name)
                    members.update(_targets(item))
                for sub in ast.walk(node):               # self.x = ... in any method
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        members.add(sub.attr)
                idx.short |= members
                _count(idx, members)
        idx.short |= names
    idx.short |= {m.rpartition(".")[2] for m in idx.modules}
    return idx, trees, texts


def _class_has(idx: Index, cls: str, member: str, seen=()) -> bool:
    """Whether class ``cls`` (dotted) or one of its bases defines ``member``; a base outside
    the package (``nn.Module``, ``Exception``) may define anything."""
    if member in idx.members.get(cls, ()):
        return True
    mod = cls.rpartition(".")[0]
    for base in idx.bases.get(cls, []):
        found = _lookup(idx, f"{mod}.{base}") or _lookup(idx, base)
        if found is None or found not in idx.members:
            return True                                  # an outside base: not checked
        if found not in seen and _class_has(idx, found, member, (*seen, cls)):
            return True
    return False


def _lookup(idx: Index, dotted: str, depth: int = 0):
    """The dotted path of the module or class ``dotted`` names (following re-exports), else None."""
    if depth > 10:
        return None
    if dotted in idx.modules or dotted in idx.members:
        return dotted
    mod, _, name = dotted.rpartition(".")
    if mod in idx.modules and name in idx.names.get(mod, ()):
        source = idx.imported.get((mod, name))
        return _lookup(idx, source, depth + 1) if source else dotted
    return None


def resolves(idx: Index, target: str) -> bool:
    """Whether the absolute dotted ``target`` is a module, a name a module defines or imports,
    or a member of a class (its own or a base's)."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head not in idx.modules:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if rest[0] not in idx.names.get(head, ()):
            source = next((f"{s}.{rest[0]}" for s in idx.stars.get(head, []) if rest[0] in idx.names.get(s, ())), None)
        else:
            source = idx.imported.get((head, rest[0]))
            if source is None:
                obj = f"{head}.{rest[0]}"
                return len(rest) == 1 or (len(rest) == 2 and obj in idx.members and _class_has(idx, obj, rest[1]))
        if source is None:
            return False
        if source.split(".")[0] != parts[0]:
            return True                                  # imported from outside the package
        return resolves(idx, ".".join([source, *rest[1:]]))
    return False


def defined_at(idx: Index, dotted: str) -> bool:
    """Whether ``dotted`` is a module, a name its module defines (not one it imports, which
    Sphinx does not document there), or a member of a class defined there (own or a base's)."""
    if dotted in idx.modules:
        return True
    mod, _, name = dotted.rpartition(".")
    if mod in idx.modules:
        return name in idx.names.get(mod, ()) and (mod, name) not in idx.imported
    return mod in idx.members and _class_has(idx, mod, name)


def references(trees: dict[str, ast.Module], texts: dict[str, str]):
    """(module, class or None, where, target) for every role in a docstring or ``#:`` comment."""
    for mod, tree in trees.items():
        docs = [(None, "module", ast.get_docstring(tree, clean=False) or "")]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                docs.append((node, f"line {node.lineno}", ast.get_docstring(node, clean=False) or ""))
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]

        def owner(line):
            inside = [c for c in classes if c.lineno <= line <= c.end_lineno]
            return inside[-1].name if inside else None

        for i, line in enumerate(texts[mod].splitlines(), 1):
            if line.lstrip().startswith("#:"):
                docs.append((ast.Pass(lineno=i), f"line {i}", line))
        for node, where, text in docs:
            cls = owner(node.lineno) if node is not None else None
            if isinstance(node, ast.ClassDef):
                cls = node.name
            for target in ROLE.findall(text):
                yield mod, cls, where, target


def unresolved(src: Path, package: str) -> list[str]:
    idx, trees, texts = build_index(src, package)
    bad = []
    for mod, cls, where, raw in references(trees, texts):
        target = raw.split("<")[-1].rstrip(">").strip().lstrip("~!").removesuffix("()")
        if not target or target.lstrip(".").split(".")[0] in OUTSIDE:
            continue
        if target.startswith(package + "."):
            ok = resolves(idx, target)                   # spelled from the package: exactly that
        elif target.startswith("."):                     # Sphinx's search: any path ending so
            ok = any(resolves(idx, f"{m}{target}") for m in idx.modules)
        else:
            plain = target.lstrip(".")
            package_of = mod if (src / Path(*mod.split("."))).is_dir() else mod.rpartition(".")[0]
            scopes = ([f"{mod}.{cls}"] if cls else []) + [mod, package_of, package]
            # Sphinx finds a name where it is documented, in the scopes it is written from; the
            # site's resolver (book/_ext) by its last component when one object has that name
            ok = any(defined_at(idx, f"{s}.{plain}") for s in scopes) or idx.defined.get(plain.split(".")[-1]) == 1
        if not ok:
            bad.append(f"{mod} ({where}): {raw}")
    return bad


def test_the_checker_finds_a_reference_to_a_missing_name(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""See :mod:`p.core`, :func:`p.core.go` and :func:`p.gone`."""\n'
                                     "from .core import go\n")
    (pkg / "core.py").write_text('"""The core."""\n\n'
                                 "class Thing:\n"
                                 '    """Has :meth:`run` and :meth:`Thing.fly`; see :class:`p.core.Thing`."""\n'
                                 "    def run(self):\n"
                                 '        """Like :func:`go`, :func:`~p.go`, :func:`.core.go`; not :mod:`p.missing`, :func:`.p.go`."""\n\n'
                                 "#: :data:`LIMIT` is checked, :func:`torch.nn.functional.silu` is not\n"
                                 "LIMIT = 3\n\n"
                                 "def _go():\n"
                                 '    """Private, still read: :func:`p.core.Thing.run`, :attr:`p.core.Thing.speed`."""\n\n'
                                 "go = _go\n")
    assert sorted(unresolved(tmp_path, "p")) == [
        "p (module): p.gone", "p.core (line 11): p.core.Thing.speed", "p.core (line 3): Thing.fly",
        "p.core (line 5): .p.go", "p.core (line 5): p.missing"]


def test_every_docstring_reference_in_the_package_resolves():
    bad = unresolved(SRC, "qkmlp")
    assert not bad, "docstring references to names that do not exist:\n" + "\n".join(bad)


def test_an_imported_bare_name_resolves_only_where_sphinx_would(tmp_path):
    """A bare name a module imports is not documented there: it resolves only when the
    package defines that name once (the site's last-component resolver), as the build's
    ``-n`` found for ``measure``, defined in two modules."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Package."""\n')
    (pkg / "a.py").write_text("def measure():\n    pass\n\n\ndef once():\n    pass\n")
    (pkg / "b.py").write_text("def measure():\n    pass\n")
    (pkg / "c.py").write_text("from .a import measure, once\n\n\n"
                              "def f():\n"
                              '    """See :func:`measure`, :func:`once` and :func:`p.a.measure`."""\n')
    assert unresolved(tmp_path, "p") == ["p.c (line 4): measure"]
