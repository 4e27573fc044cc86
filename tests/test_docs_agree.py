"""ARCHITECTURE.md and docs/reference.md name the code as it is.

What is checked, read from the code with ``ast`` (nothing is imported):

- **The module table** (ARCHITECTURE.md, section 1) has one row per module of ``ingest/``,
  each with a line on what it is: every ``.py`` file, named by its path under ``ingest/``
  (``core/plan.py``, ``core/state/checks.py``), a package by its folder (``core/``,
  ``core/state/``: its ``__init__.py``) and the package root as ``__init__.py``. Every row
  names a module that exists, once.
- **Names in backticks** (code spans; fenced blocks are left out). A span's head is its text
  before the first ``(``; a head with a space or another character than letters, digits,
  ``_`` and dots is prose or a command, and left alone. For the rest:

  - every part that starts with one ``_`` (``_make_lanes``, ``Feed._first``) is defined
    somewhere in ``ingest/`` (a function, class, method, assigned name or attribute);
  - ``ingest.a.b``: the longest prefix that is a module of ``ingest/``, then a name at that
    module's top level (the package root's ``__all__`` counts), then an attribute if that
    name is a class;
  - ``Class.attr``, where ``Class`` is a class of ``ingest/`` (or a name bound to one, as
    ``Coordinator = ray.remote(...)(_Coordinator)``): ``attr`` is a method, class attribute,
    field or ``self.attr`` of it or of a base class of ``ingest/``;
  - ``module.name``, where ``module`` is the last part of a module's name (``pack.ORIGIN``):
    ``name`` is at that module's top level;
  - ``variable.attr`` for the variables the docs use for our objects (:data:`VARIABLES`:
    ``it.step``, ``plan.skip``, ``progress.tokens`` for the state's parts): ``attr`` is an
    attribute of one of the variable's classes; a head that reads as a module and as a
    variable resolves if either reading does;
  - any other dotted name must start with another library's name, listed in
    :data:`FOREIGN` with what it is: a dotted name the code does not have fails.
  - a bare name (``EpochBook``, ``seq_len``) is something ``ingest/`` or ``tests/`` defines,
    takes as a parameter or spells as a string (a state's JSON key), a builtin, or listed in
    :data:`FOREIGN_BARE`.
- **Paths in backticks**: ``dir/file.py`` exists under the repository or ``ingest/``, and
  ``dir/file.py:name`` has ``name`` at that module's top level; a bare ``file.py`` is a file
  of the repository; a folder (``tests/fixtures/states/``, ``state/``) is one of the
  repository or of ``ingest/``; ``test_x.py::test_y`` (or
  ``tests/test_x.py::Class::test_y``) is a test in ``tests/``.
- **The public names**: docs/reference.md names every entry of ``ingest/__init__.py``'s
  ``__all__`` as ``ingest.Name`` in backticks.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "ingest"
TESTS = ROOT / "tests"
DOCS = ("ARCHITECTURE.md", "docs/reference.md")
REFERENCE = "docs/reference.md"

VARIABLES: dict[str, tuple[str, ...]] = {
    "book": ("EpochBook",),
    "coordinator": ("_Coordinator",),
    "ctx": ("ReadContext",),
    "dataset": ("DatasetState",),
    "distributed": ("DistributedState",),
    "it": ("RankIterator", "MixedRankIterator"),
    "link": ("RankLink",),
    "listing": ("Listed", "Listing"),
    "mix": ("Mix",),
    "pack": ("Pack", "Grouping"),
    "plan": ("FeedPlan",),
    "position": ("PositionState",),
    "progress": ("ProgressState",),
    "reader": ("_Reader",),
    "spec": ("StreamSpec",),
    "stream": ("Stream", "RayStream"),
}
"""The variable names the docs use for objects of ours -> the classes they may hold.
``progress``, ``distributed``, ``position`` and ``dataset`` are the state's parts as its JSON
names them (``progress.tokens``); ``pack`` is a stream's ``pack=`` settings (``pack.column``,
beside the module ``pack.ORIGIN``); ``reader`` is a reader actor and ``coordinator`` the
coordinator actor, as the rank calls them (``reader.take.remote``)."""

FOREIGN = {
    "gcsfs": "gcsfs, the GCS filesystem (gcsfs.core.GCSFileSystem)",
    "huggingface_hub": "the Hub's client (HfFileSystem)",
    "json": "Python's json module (json.dump writes a JSON array document)",
    "pyarrow": "Arrow (pyarrow.parquet.write_table)",
    "ray": "Ray (ray.init, ray.data.Dataset, ray.util.metrics, ray.cluster_utils.Cluster)",
    "tokenizers": "Hugging Face tokenizers (tokenizers.Tokenizer)",
    "torch": "PyTorch (torch.from_numpy)",
}
"""The first part of a dotted name that is another library's, not ours, and what it is."""

FOREIGN_BARE = {
    "HF_ENDPOINT": "the Hub client's environment variable for a mirror",
    "Array2D": "a Hugging Face datasets feature: an array of a fixed shape per row",
    "Array5D": "a Hugging Face datasets feature: an array of a fixed shape per row",
    "HfFileSystem": "huggingface_hub's filesystem",
    "string": "an Arrow type (32-bit offsets)",
    "large_string": "an Arrow type (64-bit offsets)",
    "float64": "an Arrow type (a double)",
    "uint32": "an Arrow type (an unsigned 32-bit integer)",
    "binary": "an Arrow type (32-bit offsets)",
    "large_binary": "an Arrow type (64-bit offsets)",
    "large_list": "an Arrow type (64-bit offsets)",
    "ObjectRef": "Ray's reference to an object in its store",
    "StatefulDataLoader": "torchdata's loader (a bench peer)",
    "StreamingDataLoader": "MosaicML Streaming's and LitData's loader (bench peers)",
    "StreamingDataset": "MosaicML Streaming's and LitData's dataset (bench peers)",
    "flock": "the POSIX file lock",
    "optimize": "LitData's conversion into chunks (a bench peer)",
    "with": "Python's with statement",
    "filecache": "fsspec's caching filesystem",
    "for": "Python's for loop (a `for` loop over a rank iterator)",
    "metrics_report_interval_ms": "a Ray system setting",
    "r": "a rank's number in prose (rank `r` on actor `r % size`)",
    "ray_": "the prefix Ray gives exported metrics",
    "tokenizers": "the Hugging Face tokenizers package",
}
"""Bare names in backticks that are not ours (nor builtins), and what each is."""


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
    words: set[str] = field(default_factory=set)
    """Parameters and string constants (a state's JSON keys, a keyword's name)."""

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


def _words(tree: ast.Module) -> set[str]:
    """Parameters, imported names and string constants of one module."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            found |= {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {a.asname or a.name.rsplit(".", 1)[-1] for a in node.names}
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defined(tree: ast.Module) -> set[str]:
    """Every function, class, assigned name and assigned attribute of one module."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        for target in _targets(node):
            found |= {
                t.id if isinstance(t, ast.Name) else t.attr
                for t in _flat(target)
                if isinstance(t, (ast.Name, ast.Attribute))
            }
    return found


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
    found.names |= _defined(tree)
    found.words |= _words(tree)
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


@cache
def defined_in_tests() -> set[str]:
    """What ``tests/`` defines, takes as a parameter or spells as a string (fixtures,
    markers, Hypothesis profiles, a test's helper classes)."""
    found: set[str] = set()
    for path in TESTS.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        found |= _defined(tree) | _words(tree)
    return found


@cache
def repo_files() -> dict[str, list[Path]]:
    """File and folder name -> where the repository has one (the virtual env left out)."""
    found: dict[str, list[Path]] = defaultdict(list)
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if rel[0].startswith(".") or "__pycache__" in rel or rel[0].endswith(".egg-info"):
            continue
        found[path.name].append(path)
    return found


def _text(doc: str) -> str:
    return re.sub(r"^```.*?^```", "", (ROOT / doc).read_text(), flags=re.S | re.M)


def _spans(doc: str) -> list[str]:
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", _text(doc))]


NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
PATH = re.compile(r"([\w./-]+/)?[\w-]+\.py(:\w+)?")
FOLDER = re.compile(r"[\w.-]+(/[\w.-]+)*/|[\w.-]+(/[\w.-]+)+")
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


def _readings(parts: list[str], found: Index) -> list[str | None]:
    """``first.name`` read as a module's name and as a variable's attribute: why each
    reading fails (None where it resolves); empty when ``first`` is neither."""
    first, name = parts[0], parts[1]
    why: list[str | None] = []
    if first in found.by_last:
        has = any(name in found.modules[m] for m in found.by_last[first])
        why.append(None if has else f"module {first} defines no {name}")
    if first in VARIABLES:
        has = any(name in found.attributes(c) for c in VARIABLES[first])
        classes = " or ".join(VARIABLES[first])
        why.append(None if has else f"{first} ({classes}) has no attribute {name}")
    return why


def _bare(name: str, found: Index) -> str | None:
    """Why a bare name in backticks is neither ours, a builtin nor in FOREIGN_BARE."""
    known = found.names | found.words | set(found.by_last) | defined_in_tests()
    if name in known or name in FOREIGN_BARE or hasattr(builtins, name):
        return None
    return "not ours (nor in FOREIGN_BARE)"


def _dotted(parts: list[str], found: Index) -> str | None:
    """Why ``Class.attr``, ``module.name`` or ``variable.attr`` does not resolve."""
    if found.is_class(parts[0]):
        has = parts[1] in found.attributes(parts[0])
        return None if has else f"class {parts[0]} has no attribute {parts[1]}"
    readings = _readings(parts, found)
    if readings:
        return None if None in readings else "; ".join(w for w in readings if w)
    if parts[0] in FOREIGN:
        return None
    return f"{parts[0]} is no module, class or variable of ours (nor in FOREIGN)"


def unresolved(head: str, found: Index) -> str | None:
    """Why a code span's name does not resolve in ``ingest/``; None if it does."""
    parts = head.split(".")
    missing = [p for p in parts if _private(p) and p not in found.names]
    if missing:
        return f"{', '.join(missing)}: defined nowhere in ingest/"
    if len(parts) == 1:
        return _bare(head, found)
    if parts[0] == "ingest":
        return _resolve_ingest(parts, found)
    return _dotted(parts, found)


def _path_missing(span: str, found: Index) -> str | None:
    path, _, name = span.partition(":")
    if "/" not in path:
        return None if path in repo_files() else f"{path}: no such file in the repository"
    hits = [p for p in (ROOT / path, PACKAGE / path) if p.is_file()]
    if not hits:
        return f"{path}: no such file under the repository or ingest/"
    if name:
        module = _module_name(hits[-1]) if hits[-1].is_relative_to(PACKAGE) else None
        if module is None or name not in found.modules.get(module, set()):
            return f"{path} defines no {name} at its top level"
    return None


def _folder_missing(span: str) -> str | None:
    path = span.rstrip("/")
    if not any(p.is_dir() for p in repo_files().get(path.split("/", 1)[0], [])):
        return None  # not a path of ours: an example (`./p0.parquet`, `<root>/<class>`)
    if (ROOT / path).exists() or (PACKAGE / path).exists():
        return None
    if "/" not in path and any(p.is_dir() for p in repo_files().get(path, [])):
        return None
    return f"{span}: no such file or folder under the repository or ingest/"


def _test_missing(span: str) -> str | None:
    match = TEST.fullmatch(span)
    assert match is not None
    path = TESTS / match[2]
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
        head = span.split("(", 1)[0].strip()
        if TEST.fullmatch(span):
            why = _test_missing(span)
        elif PATH.fullmatch(span):
            why = _path_missing(span, found)
        elif NAME.fullmatch(head):
            why = unresolved(head, found)
        elif FOLDER.fullmatch(span):
            why = _folder_missing(span)
        else:
            why = None
        if why is not None:
            problems.append(f"`{span}`: {why}")
    return sorted(set(problems))


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_in_backticks_is_in_the_code(doc: str) -> None:
    problems = stale(doc)
    assert not problems, f"{doc} names what the code does not have (write today's names):\n" + (
        "\n".join(problems)
    )


def test_the_allow_lists_name_nothing_of_ours() -> None:
    found = index()
    ours = set(found.by_last) | set(found.classes)
    assert not ours & set(FOREIGN), "FOREIGN names a module or class of ingest/"
    assert not (found.names & set(FOREIGN_BARE)), "FOREIGN_BARE names something ingest/ defines"
    gone = {v: c for v, cs in VARIABLES.items() for c in cs if not found.is_class(c)}
    assert not gone, f"VARIABLES names classes ingest/ does not have: {gone}"


def _entry(path: Path) -> str:
    """How the module table names a module of ``ingest/``."""
    rel = path.relative_to(PACKAGE)
    if rel.name != "__init__.py":
        return rel.as_posix()
    return "__init__.py" if rel.parent == Path() else f"{rel.parent.as_posix()}/"


def _module_rows() -> list[tuple[str, str]]:
    """ARCHITECTURE.md's module table (section 1): (module, what it is) per row."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## 1. Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("*")
        if len(cells) == 2 and re.fullmatch(r"`[^`]+`", name):
            rows.append((name.strip("`"), cells[1]))
    return rows


def test_the_module_table_has_a_row_for_every_module() -> None:
    rows = _module_rows()
    assert len(rows) > 20, f"no module table read in ARCHITECTURE.md's section 1: {rows}"
    named = [name for name, _ in rows]
    modules = sorted(_entry(p) for p in PACKAGE.rglob("*.py"))
    missing = [m for m in modules if m not in named]
    assert not missing, "ARCHITECTURE.md's module table misses modules (a row each):\n" + (
        "\n".join(missing)
    )
    gone = [n for n in named if n not in modules]
    assert not gone, "ARCHITECTURE.md's module table names modules that are gone:\n" + (
        "\n".join(gone)
    )
    twice = sorted({n for n in named if named.count(n) > 1})
    assert not twice, f"ARCHITECTURE.md's module table names these twice: {twice}"
    bare = [n for n, what in rows if len(what.split()) < 3]
    assert not bare, f"ARCHITECTURE.md's module table says nothing of: {bare}"


def test_the_reference_names_every_public_name() -> None:
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    public = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
    )
    heads = {s.split("(", 1)[0].strip() for s in _spans(REFERENCE)}
    named = {h.split(".")[1] for h in heads if h.startswith("ingest.") and NAME.fullmatch(h)}
    missing = sorted(set(public) - named)
    assert not missing, (
        f"{REFERENCE} does not name these public names of ingest/__init__.py's __all__ "
        "(as `ingest.Name` in backticks, with what it is): " + ", ".join(missing)
    )


@pytest.mark.parametrize("doc", ["README.md", *DOCS, "docs/what-survives-what.md"])
def test_the_state_version_shown_is_the_one_written(doc: str) -> None:
    """A state shown as ``{"version": N, ...}`` shows the version states are written with
    (the README showed version 2 of a version-7 state)."""
    tree = ast.parse((PACKAGE / "core" / "state" / "checks.py").read_text())
    version = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "STATE_VERSION" for t in n.targets)
    )
    shown = re.findall(r'\{"version": (\d+), "(?:dataset|sources)"', (ROOT / doc).read_text())
    assert all(int(v) == version for v in shown), f"{doc} shows state versions {shown}"
