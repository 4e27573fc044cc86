"""Whether this project's modules start from cached bytecode, for the benchmarks that time a
process start (a Ray actor, a job, a CLI).

pip compiles the packages it installs, but not an editable install's source; where
``PYTHONDONTWRITEBYTECODE`` is set, Python never caches it either, and every new process
compiles each of this project's ~100 modules it imports: 0.2-0.45 CPU seconds a process on
a 2-core machine (``make compile`` writes the cache). A benchmark timing new processes says
so beside its figures, as a user's wheel install would not pay it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

FIX = "make compile (python -m compileall ingest)"
"""What writes the cache."""


def _valid(source: str) -> bool:
    """Whether ``source`` has a cached bytecode file that Python would load (a timestamp
    ``.pyc`` recording its mtime and size, or a hash-based one)."""
    try:
        cached = importlib.util.cache_from_source(source)
        with open(cached, "rb") as f:
            header = f.read(16)
        st = os.stat(source)
    except (OSError, NotImplementedError, ValueError):
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(header[4:8], "little") & 1:  # hash-based: Python checks it itself
        return True
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return mtime == int(st.st_mtime) & 0xFFFFFFFF and size == st.st_size & 0xFFFFFFFF


def uncached(package: str = "ingest") -> list[str]:
    """The modules of ``package`` imported in this process whose source has no valid cached
    bytecode: each new process that imports them compiles them again."""
    out = []
    for name, module in list(sys.modules.items()):
        if name != package and not name.startswith(package + "."):
            continue
        source = getattr(module, "__file__", None)
        if source and source.endswith(".py") and not _valid(source):
            out.append(name)
    return sorted(out)


def warning(package: str = "ingest") -> str | None:
    """A line for a benchmark's output when ``package``'s modules compile from source in
    every new process; None when they start from cached bytecode."""
    missing = uncached(package)
    if not missing:
        return None
    return (
        f"note: {len(missing)} of {package}'s imported modules have no cached bytecode "
        f"(PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}): each "
        f"new process compiles them, which a wheel install does not; run {FIX} before "
        "timing process starts"
    )
