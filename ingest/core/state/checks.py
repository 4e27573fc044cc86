"""What a state must be to be used: the versions read, the limits on its size and numbers,
and the refusal of a state that breaks them, naming the field, its value, the rule and the
fix (:data:`FIX`). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ingest.core.errors import StateError
from ingest.core.intervals import MAX_ROW
from ingest.core.state.shards import ShardRecord

STATE_VERSION = 7
"""The version this ingest writes, every state alike: the book's four parts, and one part
per node of the rank's chain that holds any (``pack``; a state of several sources: ``mix``
beside ``sources``). What a state holds is said by its parts, not by its version. It reads
:data:`READ_VERSIONS`: the versions before this one numbered what a state held (2: a
listing as records, 3: packed, 5: rows consumed in part in ``progress.tokens``, 6: copies
owed in ``distributed.owed``; 4: several sources, :mod:`ingest.core.state.sources`)."""
READ_VERSIONS = (2, 3, 5, 6, 7)
BOOK_PARTS = ("dataset", "progress", "distributed", "position")
"""The parts of a state that are the book's (the epoch plan and the rows consumed)."""
NODE_PARTS = ("pack",)
"""The parts of a one-source state that nodes of the rank's chain write (version 7):
``pack``, the documents a packing rank handed out in part (:mod:`ingest.engine.pack`)."""
MAX_STATE_BYTES = 256 << 20
"""States larger than this are refused before parsing (a state is O(shards))."""
MAX_OFFSET = MAX_ROW
"""The largest count, size or offset a state may hold (row offsets are packed with shard
indices into 64-bit integers)."""


FIX = "pass the state as state_dict() returned it, unchanged, or start without it"
"""The fix every refusal of an edited or corrupted state ends with."""


def refuse(field: str, value: object, rule: str) -> StateError:
    """The error for ``field`` holding ``value`` against ``rule``, with the fix."""
    return StateError(f"{field} is {value!r}, but {rule}: the state was edited or corrupted; {FIX}")


def checked_int(value: object, what: str) -> int:
    """``value`` if it is an integer from 0 to :data:`MAX_OFFSET`, else refused as ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OFFSET:
        raise refuse(what, value, f"it must be an integer from 0 to {MAX_OFFSET}")
    return value


def checked_index(key: object, shards: Sequence[ShardRecord]) -> int:
    """``key`` (an integer or its string) as an index into ``shards``, else refused."""
    try:
        index = int(str(key))
    except ValueError:
        raise StateError(f"shard index {key!r} is not an integer") from None
    if not 0 <= index < len(shards):
        raise StateError(f"shard index {index} is out of range for {len(shards)} shards")
    return index


def checked_list(value: object, what: str) -> list[Any]:
    """``value`` if it is a JSON list, else refused as ``what``."""
    if not isinstance(value, list):
        raise StateError(f"{what} must be a JSON list, got {type(value).__name__}")
    return value


def check_size(data: str | bytes, max_bytes: int, what: str) -> None:
    """Refuse JSON text of more than ``max_bytes`` bytes (UTF-8), before it is parsed."""
    if len(data) > max_bytes:
        raise too_large(
            what, f"at least {len(data)}" if isinstance(data, str) else str(len(data)), max_bytes
        )
    if isinstance(data, str) and not data.isascii() and len(data.encode()) > max_bytes:
        raise too_large(what, str(len(data.encode())), max_bytes)


def too_large(what: str, size: str, max_bytes: int) -> StateError:
    """The error for ``what`` of ``size`` bytes over ``max_bytes``, with the fix."""
    return StateError(
        f"{what} is {size} bytes, above the {max_bytes} byte limit (max_bytes): a stream "
        "state is O(shards), a few MB for a million shards. Pass the state that "
        "state_dict() returned, or raise max_bytes if it is one"
    )
