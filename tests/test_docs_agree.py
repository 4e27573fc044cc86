"""ARCHITECTURE.md and docs/reference.md name the code as it is.

What is checked, read from the code with ``ast`` (nothing is imported):

- **The layer table** (ARCHITECTURE.md, section 1) names every module: each ``.py`` under
  ``ingest/`` but ``__init__.py`` and ``__main__.py`` appears in the row of its layer (the
  first folder under ``ingest/``; ``ingest/`` itself for the package root), as ``name.py``,
  or as ``package/`` for a module inside a package (``state/`` covers ``core/state/*.py``).
  Every module the table names exists. The files are listed when the test runs.
- **Names in backticks** (code spans; fenced blocks are left out). A span's head is its text
  before the first ``(``; a head with a space or another character than letters, digits,
  ``_`` and dots is prose or a command, and left alone. For the rest:

  - every part that starts with one ``_`` (``_make_lanes``, ``Feed._first``) is defined
    somewhere in ``ingest/`` (a function, class, method, assigned name or attribute);
  - ``Class.attr``, where ``Class`` is a class of ``ingest/`` (or a name bound to one, as
    ``Coordinator = ray.remote(...)(_Coordinator)``): ``attr`` is a method, class attribute,
    field or ``self.attr`` of it or of a base class of ``ingest/``;
  - ``ingest.a.b``: the longest prefix that is a module of ``ingest/``, then a name at that
    module's top level (the package root's ``__all__`` counts), then an attribute if that
    name is a class;
  - ``module.name``, where ``module`` is the last part of a module's name (``pack.ORIGIN``):
    ``name`` is at that module's top level, or an attribute of some class of ``ingest/``
    (``plan.skip`` names a ``FeedPlan``'s field through a variable);
  - any other dotted name (``torch.from_numpy``, ``it.step``) is not ours: left alone.
- **Paths in backticks**: ``dir/file.py`` exists under the repository or ``ingest/``, and
  ``dir/file.py:name`` has ``name`` at that module's top level; ``test_x.py::test_y`` (or
  ``tests/test_x.py::Class::test_y``) is a test in ``tests/``.

Bare names (``EpochBook``) are not checked: the docs name torch's, Ray's and the Hub's
classes the same way.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "ingest"
DOCS = ("ARCHITECTURE.md", "docs/reference.md")
LEFT_OUT = ("__init__.py", "__main__.py")
"""Files that are no module of their own in the layer table."""


@dataclass
class Index:
    """What ``ingest/`` defines, read with ``ast``."""

    modules: dict[str, set[str]] = field(default_factory=dict)
    """Dotted module name -> the names at its top level."""
    by_last: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """Last part of a module's name -> the dotted names that end with it."""
    classes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Class name -> its own attributes (the union over classes of that name)."""
    bases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Class name -> the names of its bases."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Name bound to a class at a module's top level -> that class."""
    names: set[str] = field(default_factory=set)
    """Every name defined anywhere: functions, classes, assigned names and attributes."""

    def attributes(self, cls: str) -> set[str]:
        """The attributes of ``cls`` and of its bases defined in ``ingest/``."""
        seen: set[str] = set()
        todo = [self.aliases.get(cls, cls)]
        found: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen or name not in self.classes:
                continue
            seen.add(name)
            found |= self.classes[name]
            todo.extend(self.bases[name])
        return found

    def is_class(self, name: str) -> bool:
        """Whether ``name`` is a class of ``ingest/`` or bound to one."""
        return self.aliases.get(name, name) in self.classes


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        yield from node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        yield node.target


def _flat(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for item in target.elts:
            yield from _flat(item)
    else:
        yield target


def _top_level(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in tree.body:
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                found |= {(a.asname or a.name).split(".")[0] for a in sub.names}
            for target in _targets(sub):
                found |= {t.id for t in _flat(target) if isinstance(t, ast.Name)}
            if (
                isinstance(sub, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in sub.targets)
                and isinstance(sub.value, (ast.List, ast.Tuple))
            ):
                found |= {
                    e.value
                    for e in sub.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
    return found


def _class_attributes(node: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for sub in node.body:
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(sub.name)
        for target in _targets(sub):
            found |= {t.id for t in _flat(target) if isinstance(t, ast.Name)}
    for inner in ast.walk(node):
        for target in _targets(inner):
            found |= {
                t.attr
                for t in _flat(target)
                if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id in ("self", "cls")
            }
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _read(found: Index, path: Path) -> None:
    """Add one module's names, classes and aliases to ``found``."""
    tree = ast.parse(path.read_text(), str(path))
    module = _module_name(path)
    found.modules[module] = _top_level(tree)
    found.by_last[module.rsplit(".", 1)[-1]].append(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found.classes[node.name] |= _class_attributes(node)
            found.bases[node.name] |= {
                b.id if isinstance(b, ast.Name) else b.attr
                for b in node.bases
                if isinstance(b, (ast.Name, ast.Attribute))
            }
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.names.add(node.name)
        for target in _targets(node):
            found.names |= {
                t.id if isinstance(t, ast.Name) else t.attr
                for t in _flat(target)
                if isinstance(t, (ast.Name, ast.Attribute))
            }
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            bound = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & classes
            for target in _targets(node):
                if bound and isinstance(target, ast.Name) and target.id not in classes:
                    found.aliases[target.id] = min(bound)


@cache
def index() -> Index:
    """Read every module of ``ingest/``."""
    found = Index()
    for path in sorted(PACKAGE.rglob("*.py")):
        _read(found, path)
    for module in found.modules:
        parent, _, last = module.rpartition(".")
        if parent in found.modules:
            found.modules[parent].add(last)
    return found


def _text(doc: str) -> str:
    return re.sub(r"^```.*?^```", "", (ROOT / doc).read_text(), flags=re.S | re.M)


def _spans(doc: str) -> list[str]:
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", _text(doc))]


NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
PATH = re.compile(r"([\w./]+/)?\w+\.py(:\w+)?")
TEST = re.compile(r"(tests/)?(test_\w+\.py)((::\w+)+)")


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _resolve_ingest(parts: list[str], found: Index) -> str | None:
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in found.modules:
            break
    else:
        return "no module of ingest/"
    rest = parts[cut:]
    if not rest:
        return None
    if rest[0] not in found.modules[module]:
        return f"{module} defines no {rest[0]}"
    if len(rest) > 1 and found.is_class(rest[0]) and rest[1] not in found.attributes(rest[0]):
        return f"{rest[0]} has no attribute {rest[1]}"
    return None


def _resolve_module(parts: list[str], found: Index) -> str | None:
    """``module.name``: a name of the module, or an attribute of some class (a variable)."""
    first, name = parts[0], parts[1]
    if any(name in found.modules[m] for m in found.by_last[first]):
        return None
    if any(name in attrs for attrs in found.classes.values()):
        return None
    return f"module {first} defines no {name}, and no class has it as an attribute"


def unresolved(head: str, found: Index) -> str | None:
    """Why a code span's dotted name does not resolve in ``ingest/``; None if it does."""
    parts = head.split(".")
    missing = [p for p in parts if _private(p) and p not in found.names]
    if missing:
        return f"{', '.join(missing)}: defined nowhere in ingest/"
    if len(parts) == 1:
        why = None
    elif parts[0] == "ingest":
        why = _resolve_ingest(parts, found)
    elif found.is_class(parts[0]):
        has = parts[1] in found.attributes(parts[0])
        why = None if has else f"class {parts[0]} has no attribute {parts[1]}"
    elif parts[0] in found.by_last:
        why = _resolve_module(parts, found)
    else:
        why = None
    return why


def _path_missing(span: str, found: Index) -> str | None:
    path, _, name = span.partition(":")
    hits = [p for p in (ROOT / path, PACKAGE / path) if p.is_file()]
    if not hits:
        return f"{path}: no such file under the repository or ingest/"
    if name:
        module = _module_name(hits[-1]) if hits[-1].is_relative_to(PACKAGE) else None
        if module is None or name not in found.modules.get(module, set()):
            return f"{path} defines no {name} at its top level"
    return None


def _test_missing(span: str) -> str | None:
    match = TEST.fullmatch(span)
    assert match is not None
    path = ROOT / "tests" / match[2]
    if not path.is_file():
        return f"tests/{match[2]}: no such file"
    tree = ast.parse(path.read_text())
    defined = {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    missing = [p for p in match[3].split("::")[1:] if p not in defined]
    return f"tests/{match[2]} defines no {', '.join(missing)}" if missing else None


def stale(doc: str) -> list[str]:
    """Every code span of ``doc`` that names something the code does not have, and why."""
    found = index()
    problems = []
    for span in _spans(doc):
        if TEST.fullmatch(span):
            why = _test_missing(span)
        elif PATH.fullmatch(span):
            why = _path_missing(span, found) if "/" in span or ":" in span else None
        else:
            head = span.split("(", 1)[0].strip()
            why = unresolved(head, found) if NAME.fullmatch(head) else None
        if why is not None:
            problems.append(f"`{span}`: {why}")
    return sorted(set(problems))


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_in_backticks_is_in_the_code(doc: str) -> None:
    problems = stale(doc)
    assert not problems, f"{doc} names what the code does not have (write today's names):\n" + (
        "\n".join(problems)
    )


def _table() -> dict[str, set[str]]:
    """ARCHITECTURE.md's layer table: layer folder -> the modules and packages its row names."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## 1. Layers", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        layer = cells[0].strip("`").rstrip("/")
        rows[layer] = set(re.findall(r"`([^`]+)`", cells[1]))
    return rows


def _layer_entry(path: Path) -> tuple[str, str]:
    """The layer a module of ``ingest/`` belongs to, and how the table names it."""
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return "ingest", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    return parts[0], f"{parts[1]}/"


def test_the_layer_table_names_every_module() -> None:
    table = _table()
    assert {"core", "engine", "distributed"} <= set(table), f"no layer table read: {table}"
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in LEFT_OUT:
            continue
        layer, entry = _layer_entry(path)
        if entry not in table.get(layer, set()):
            missing.append(f"{path.relative_to(ROOT)} (as `{entry}` in the row `{layer}/`)")
    assert not missing, "ARCHITECTURE.md's layer table misses modules (add each to its row):\n" + (
        "\n".join(missing)
    )


def test_every_module_the_layer_table_names_exists() -> None:
    gone = []
    for layer, entries in _table().items():
        folder = PACKAGE if layer == "ingest" else PACKAGE / layer
        for entry in entries:
            name = entry.split()[0]
            if not (folder / name).exists():
                gone.append(f"{layer}/{name}")
    assert not gone, "ARCHITECTURE.md's layer table names modules that are gone:\n" + "\n".join(
        gone
    )
