"""An ``ingest.DataLoader`` worker's batch that holds values which do not pickle.

A worker hands each batch to torch's queue, whose feeder thread pickles it; a pickling error
there is printed and the batch dropped, and the main process waited for it for ever. The
conversion leaves some columns as Python objects (``arr.to_pylist()``): nested intervals
(pyarrow's ``MonthDayNano``, which does not pickle) and extension types whose scalars make
objects of the user's. With workers, such a column now fails the loop at once with an
``ingest.ConfigError`` naming the column, the type that does not pickle and the fix; without
workers nothing is pickled, and the batches hold the values as a Stream's do.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.integrations.worker_items import sure_to_pickle

ROWS, BATCH = 40, 4
FIX = "return tensors, numbers, strings or lists of them from the transform"


class Handle:
    """A user's object that does not pickle (it holds a lock)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()


class HandleScalar(pa.ExtensionScalar):  # type: ignore[misc]  # pyarrow has no stubs
    def as_py(self, **kwargs: Any) -> Handle:
        return Handle(self.value.as_py())


class HandleType(pa.ExtensionType):  # type: ignore[misc]
    """An extension type whose values, as Python objects, are :class:`Handle` s."""

    def __init__(self) -> None:
        super().__init__(pa.int64(), "tests.handle")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: Any) -> HandleType:
        return cls()

    def __arrow_ext_scalar_class__(self) -> type:
        return HandleScalar


def with_intervals(table: pa.Table) -> pa.Table:
    """A list of intervals a row: their Python values are pyarrow's MonthDayNano."""
    kind = pa.list_(pa.month_day_nano_interval())
    values = [[pa.MonthDayNano([1, 2, int(x)])] for x in table["x"].to_pylist()]
    return table.append_column("spans", pa.array(values, kind))


def with_handles(table: pa.Table) -> pa.Table:
    """A column whose values are :class:`Handle` s."""
    storage = table["x"].combine_chunks()
    return table.append_column("handle", pa.ExtensionArray.from_storage(HandleType(), storage))


def with_locks(table: pa.Table) -> dict[str, Any]:
    """A dict with a list of objects holding locks: no Arrow column (refused already)."""
    return {"x": table["x"], "obj": [Handle(0) for _ in range(table.num_rows)]}


def with_nested(table: pa.Table) -> pa.Table:
    """Nested values that pickle: a struct and a list of strings a row."""
    xs = table["x"].to_pylist()
    table = table.append_column("meta", pa.array([{"x": x, "name": f"r{x}"} for x in xs]))
    return table.append_column("tags", pa.array([[f"t{x}", "u"] for x in xs]))


@pytest.fixture
def data(tmp_path: Path) -> str:
    pq.write_table(pa.table({"x": list(range(ROWS // 2))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": list(range(ROWS // 2, ROWS))}), tmp_path / "b.parquet")
    return str(tmp_path)


def loader(data: str, transform: Any, workers: int) -> ingest.DataLoader:
    stream = ingest.Stream(data, batch_size=BATCH, transform=transform)
    # torch's own timeout: a batch lost on the way fails the loop instead of hanging it
    waits = {"timeout": 60} if workers else {}
    return ingest.DataLoader(stream, num_workers=workers, **waits)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("transform", "column", "kind"),
    [(with_intervals, "spans", "MonthDayNano"), (with_handles, "handle", "Handle")],
)
def test_a_worker_batch_whose_values_do_not_pickle_fails_naming_the_column(
    data: str, transform: Any, column: str, kind: str
) -> None:
    loop = loader(data, transform, workers=2)
    try:
        with pytest.raises(ingest.ConfigError) as raised:
            for _ in loop:
                pass
        message = str(raised.value)
        assert f"column {column!r}" in message
        assert kind in message
        assert "does not pickle" in message
        assert FIX in message
        assert "Traceback" not in message  # the error itself, not torch's re-raised copy
        # the loader is still usable: the next loop fails the same way, again at once
        with pytest.raises(ingest.ConfigError, match=f"column {column!r}"):
            next(iter(loop))
    finally:
        loop.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("transform", "column", "kind"),
    [(with_intervals, "spans", "MonthDayNano"), (with_handles, "handle", "Handle")],
)
def test_without_workers_nothing_is_pickled_and_the_values_come_as_a_streams_do(
    data: str, transform: Any, column: str, kind: str
) -> None:
    batches = list(loader(data, transform, workers=0))
    values = [v for b in batches for v in b[column]]
    assert len(values) == ROWS
    leaves = [v[0] if isinstance(v, list) else v for v in values]
    assert {type(v).__name__ for v in leaves} == {kind}
    streamed = list(ingest.Stream(data, batch_size=BATCH, transform=transform))
    assert [len(b[column]) for b in streamed] == [len(b[column]) for b in batches]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_returning_objects_that_do_not_pickle_is_refused_at_once(
    data: str, workers: int
) -> None:
    with pytest.raises(ingest.ConfigError, match="column 'obj'"):
        for _ in loader(data, with_locks, workers):
            pass


@pytest.mark.timeout(120)
def test_nested_values_that_pickle_come_from_workers_as_without_them(data: str) -> None:
    def rows(workers: int) -> list[tuple[int, Any, Any]]:
        out: list[tuple[int, Any, Any]] = []
        for b in loader(data, with_nested, workers):
            out += zip(b["x"].tolist(), b["meta"], b["tags"], strict=True)
        return sorted(out, key=lambda r: r[0])

    with_workers = rows(2)
    assert with_workers == rows(0)
    assert with_workers[3] == (3, {"x": 3, "name": "r3"}, ["t3", "u"])


def test_which_arrow_types_pickle_as_python_values_is_told_by_the_type_alone() -> None:
    # sure by the type: their values are never pickled to try them (no cost a batch)
    for kind in (
        pa.string(),
        pa.list_(pa.string()),
        pa.list_(pa.int64()),
        pa.struct([("a", pa.int64()), ("b", pa.list_(pa.timestamp("ns", tz="UTC")))]),
        pa.map_(pa.string(), pa.decimal128(10, 2)),
        pa.dictionary(pa.int32(), pa.string()),
        pa.list_(pa.duration("s")),
    ):
        assert sure_to_pickle(kind), kind
    # tried: pyarrow's MonthDayNano does not pickle (at any depth), and an extension type's
    # values are its scalars' to make
    interval = pa.month_day_nano_interval()
    for kind in (
        pa.list_(interval),
        pa.struct([("a", interval)]),
        pa.map_(pa.string(), interval),
        HandleType(),
        pa.list_(HandleType()),
    ):
        assert not sure_to_pickle(kind), kind
