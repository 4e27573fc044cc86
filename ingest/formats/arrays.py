"""Arrow arrays made from numpy arrays and Python lists without importing pandas.

pyarrow's own constructors first ask whether their argument is a pandas object
(``pa.array``, ``pa.record_batch`` of a dict, ``Array.to_numpy``, a Python scalar given to a
compute function), and to ask, they import pandas: 0.4 to 0.8 s of CPU in the first batch of
every process that reads (a reader actor, a ``DataLoader`` worker, a resumed rank), for a
library the stream never uses. These build each array from its buffers instead; for numpy
input they copy nothing. ``tests/test_stream.py::test_the_first_batch_imports_no_pandas``
keeps the paths a first batch takes free of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

_INT32_MAX = 2**31 - 1


def ints(values: npt.ArrayLike, kind: pa.DataType | None = None) -> pa.Array:
    """``values`` (integers) as an Arrow array of ``kind`` (default ``int64``) over their
    memory when they are a contiguous numpy array of its width already (a copy otherwise)."""
    kind = pa.int64() if kind is None else kind
    data = np.ascontiguousarray(values, dtype=kind.to_pandas_dtype())  # (floats too)
    return pa.Array.from_buffers(kind, len(data), [None, pa.py_buffer(data)])


def of_numpy(values: npt.NDArray[Any]) -> pa.Array | None:
    """A 1-d numpy array of numbers or booleans (native byte order) as an Arrow array of its
    type (over its memory where it is contiguous); None for any other array."""
    kind = values.dtype
    if values.ndim != 1 or not kind.isnative:
        return None
    if kind.kind in "iuf":
        return ints(values, pa.from_numpy_dtype(kind))
    if kind.kind == "b":
        return bools(values)
    return None


def bools(values: npt.ArrayLike) -> pa.Array:
    """``values`` (booleans, one per row) as an Arrow ``bool`` array (bits, packed)."""
    data = np.asarray(values, dtype=bool)
    bits = np.packbits(data, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(data), [None, pa.py_buffer(bits)])


def binaries(values: Sequence[bytes | None], kind: pa.DataType | None = None) -> pa.Array:
    """``values`` (bytes, None for a null) as one Arrow ``binary`` array (``large_binary``
    when they pass 2 GiB together, or when ``kind`` says so): the bytes joined once, their
    offsets from their lengths."""
    return _joined(values, kind or pa.binary())


def strings(values: Sequence[str | None], kind: pa.DataType | None = None) -> pa.Array:
    """``values`` (text, None for a null) as one Arrow ``string`` array (``large_string``
    past 2 GiB, or when ``kind`` says so), UTF-8."""
    return _joined([None if v is None else v.encode() for v in values], kind or pa.string())


def _joined(values: Sequence[bytes | None], kind: pa.DataType) -> pa.Array:
    lengths = [0 if v is None else len(v) for v in values]
    data = b"".join(v for v in values if v is not None)
    large = pa.types.is_large_binary(kind) or pa.types.is_large_string(kind)
    if not large and len(data) > _INT32_MAX:  # 32-bit offsets cannot point past 2 GiB
        kind = pa.large_string() if pa.types.is_string(kind) else pa.large_binary()
        large = True
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    valid = None
    nulls = sum(v is None for v in values)
    if nulls:
        valid = pa.py_buffer(np.packbits([v is not None for v in values], bitorder="little"))
    buffers: list[Any] = [valid, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, len(lengths), buffers, null_count=nulls)


def view(arr: pa.Array) -> npt.NDArray[Any]:
    """A numpy view of a fixed-width array with no nulls (integers, floats), over its data
    buffer (what ``Array.to_numpy`` gives, without importing pandas)."""
    dtype = np.dtype(arr.type.to_pandas_dtype())
    data = arr.buffers()[1]
    if data is None or not len(arr):
        return np.empty(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def numbers(arr: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any]:
    """A column of integers, floats or booleans as a numpy array: a view of one chunk of
    numbers without nulls (:func:`view`), floats with nulls as NaN (a copy), booleans
    unpacked from their bits, the chunks joined; any other column (an integer or a boolean
    null, another type) by ``to_numpy``, which imports pandas."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 1:
            return numbers(arr.chunk(0))
        if arr.num_chunks == 0:
            return numbers(pa.nulls(0, arr.type))
        return np.concatenate([numbers(c) for c in arr.chunks])
    return _numbers(arr)


def _numbers(arr: pa.Array) -> npt.NDArray[Any]:
    kind = arr.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if not arr.null_count:
            return view(arr)
        if pa.types.is_floating(kind):
            out = view(arr).copy()  # (a null's slot holds any value)
            out[~_bits(arr.buffers()[0], arr.offset, len(arr))] = np.nan
            return out
    elif pa.types.is_boolean(kind) and not arr.null_count:
        return _bits(arr.buffers()[1], arr.offset, len(arr))
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _bits(buffer: pa.Buffer | None, offset: int, length: int) -> npt.NDArray[np.bool_]:
    """Bits ``[offset, offset + length)`` of an Arrow bitmap (validity, booleans)."""
    if buffer is None or not length:
        return np.zeros(length, dtype=bool)
    packed = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(packed, count=offset + length, bitorder="little")[offset:].astype(bool)


def first_null(column: pa.Array | pa.ChunkedArray) -> int:
    """The position of ``column``'s first null (it holds one: ``column.null_count``)."""
    return int(pc.index(pc.is_null(column), True).as_py())


def record_batch(columns: dict[str, pa.Array]) -> pa.RecordBatch:
    """Named arrays as a record batch (``pa.record_batch`` of a dict imports pandas)."""
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


__all__ = [
    "binaries",
    "bools",
    "first_null",
    "ints",
    "numbers",
    "of_numpy",
    "record_batch",
    "strings",
    "view",
]
