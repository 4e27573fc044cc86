"""The benchmarks that time process starts say when this project's modules would compile
from source in every new process (``ingest.tools.bench.bytecode``)."""

from __future__ import annotations

import compileall
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.tools.bench import bytecode


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``pkgbc`` of two modules, imported with bytecode writing off (as under
    PYTHONDONTWRITEBYTECODE)."""
    root = tmp_path / "pkgbc"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    for name in ("pkgbc", "pkgbc.mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("pkgbc.mod")
    yield root
    for name in ("pkgbc", "pkgbc.mod"):
        sys.modules.pop(name, None)


def test_modules_without_cached_bytecode_are_named(package: Path) -> None:
    assert bytecode.uncached("pkgbc") == ["pkgbc", "pkgbc.mod"]
    line = bytecode.warning("pkgbc")
    assert line is not None and "2 of pkgbc's" in line and bytecode.FIX in line


def test_compiled_modules_are_not_named_until_their_source_changes(package: Path) -> None:
    assert compileall.compile_dir(str(package), quiet=1)
    assert bytecode.uncached("pkgbc") == []
    assert bytecode.warning("pkgbc") is None
    (package / "mod.py").write_text("X = 22\n")  # another size: the cache no longer holds
    assert bytecode.uncached("pkgbc") == ["pkgbc.mod"]


def test_a_cache_of_another_python_is_not_taken(package: Path) -> None:
    assert compileall.compile_dir(str(package), quiet=1)
    cached = Path(importlib.util.cache_from_source(str(package / "mod.py")))
    data = bytearray(cached.read_bytes())
    data[:4] = b"\x00\x00\r\n"  # another magic number: another Python's bytecode
    cached.write_bytes(bytes(data))
    assert bytecode.uncached("pkgbc") == ["pkgbc.mod"]
