"""Arrow record batches -> dicts of torch tensors, zero-copy where the dtype allows.

Numeric columns without nulls and fixed-size lists of them (nested too: a matrix a row)
become tensors that share the Arrow buffers (read-only memory: copy before writing into them
in place). Variable-length lists of numbers (or of fixed-size lists of them) become lists of
tensors that are views into one flat buffer. Strings and
binaries become lists of ``str``/``bytes``. Fixed-shape tensor columns (n-d arrays returned
by a transform) become one ``(n, *shape)`` tensor, and so do Hugging Face ``datasets``'
``Array2D`` to ``Array5D`` features (lists of lists, their shape in the extension type or,
where ``datasets`` is not imported, in the field's metadata; a first dimension of None: a
list of tensors). Booleans and nullable floats are copied.

Dates and times become integers (torch has no such dtypes), in the units of their Arrow
type, which the stream's schema states: a timestamp, int64 counts of its unit (s, ms, us or
ns) since 1970-01-01T00:00:00 UTC. Arrow holds a timestamp with a time zone as that UTC
instant, so the same instant gives the same number in any zone, and the zone itself (display
metadata) is dropped: a transform that needs local wall-clock time computes it before the
conversion (``pyarrow.compute.local_timestamp``). A date32 becomes int32 days since
1970-01-01, a date64 int64 milliseconds; a time, its unit since midnight (int32 for time32,
int64 for time64); a duration, int64 counts of its unit; an interval, an ``(n, 3)`` int64
tensor of months, days and nanoseconds. ``uint16`` and ``uint32`` numbers become ``int64``
at every depth (a column, lists and arrays of them).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ingest.core.errors import ConfigError
from ingest.engine.tensor_types import NULL_FIX, hf_array_shape, is_number_list
from ingest.formats.arrays import numbers, view

# Arrow buffers are immutable, so numpy views of them are read-only and torch warns once per
# conversion that it will not enforce that. Zero-copy is the point here; the module
# docstring tells users to copy before writing in place.
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", category=UserWarning
)

Batch = dict[str, Any]


def _numeric(arr: pa.Array, name: str) -> torch.Tensor:
    """Numbers as a tensor (zero-copy where torch has their dtype). At every depth (a column,
    its lists, fixed-size lists, arrays): ``uint16`` and ``uint32`` become ``int64``, as
    torch's dtypes of them do no arithmetic, embedding or indexing worth using."""
    if arr.null_count and not pa.types.is_floating(arr.type):
        raise ConfigError(
            f"column {name!r} ({arr.type}) has {arr.null_count} null(s) and no "
            f"torch integer dtype holds nulls; {NULL_FIX}"
        )
    t = arr.type
    if pa.types.is_unsigned_integer(t) and 8 < t.bit_width < 64:
        arr = arr.cast(pa.int64())
    return torch.from_numpy(numbers(arr))  # (a float null as NaN)


def _temporal(arr: pa.Array, name: str) -> torch.Tensor:
    """Dates, times, timestamps (as UTC instants), durations and intervals: integers (see
    the module docstring). An interval (``month_day_nano_interval``): an ``(n, 3)`` int64
    tensor of months, days and nanoseconds (its values as Python objects would be pyarrow's,
    which do not pickle: a DataLoader worker's batch was dropped, and the loader waited for
    it)."""
    t = arr.type
    if not pa.types.is_interval(t):
        return _numeric(arr.cast(pa.int64() if t.bit_width == 64 else pa.int32()), name)
    if arr.null_count:
        raise ConfigError(
            f"column {name!r} ({arr.type}) has {arr.null_count} null interval(s) and no "
            f"torch integer dtype holds nulls; {NULL_FIX}"
        )
    rows = [(v.months, v.days, v.nanoseconds) for v in arr.to_pylist()]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(arr), 3)


def column_to_torch(
    arr: pa.Array | pa.ChunkedArray, name: str, field: pa.Field | None = None
) -> Any:
    """Convert one column (``field``: its field, whose metadata may tell a Hugging Face
    array feature's shape); see the module docstring for the rules."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    t = arr.type
    shape = hf_array_shape(t, field.metadata if field is not None else None)
    if shape is not None and all(d is not None for d in shape[1:]):
        storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
        return _hf_array(storage, shape, name)
    if isinstance(t, pa.FixedShapeTensorType):
        # Decoded images and other n-d arrays from a transform: one (n, *shape) tensor.
        if arr.null_count:
            raise ConfigError(f"column {name!r} has null tensors; fill them in the transform")
        return torch.from_numpy(arr.to_numpy_ndarray())
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return _numeric(arr, name)
    if pa.types.is_temporal(t):
        return _temporal(arr, name)
    if is_number_list(t):
        return _number_lists(arr, name)
    return arr.to_pylist()  # strings, binary and nested values stay Python objects


def _number_lists(arr: pa.Array, name: str) -> Any:
    """A fixed-size list column is one ``(n, size)`` tensor (fixed-size lists of them,
    ``(n, size, *inner)``); a variable one, a list of tensors (of ``(k, *inner)``)."""
    if pa.types.is_fixed_size_list(arr.type):
        flat, shape = _fixed(arr, name)
        return _numeric(flat, name).reshape(len(arr), *shape)
    if arr.null_count:
        raise ConfigError(f"column {name!r} has null lists; fill them in a transform")
    offsets = view(arr.offsets)
    flat, inner = _fixed(arr.values, name)
    values = _numeric(flat, name).reshape(len(arr.values), *inner)
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(arr))]


def _hf_array(storage: pa.Array, shape: tuple[int | None, ...], name: str) -> Any:
    """A ``datasets`` ``ArrayND`` column (its lists of lists, ``len(shape)`` deep): one
    ``(n, *shape)`` tensor; with a first dimension of None, a list of ``(k, *shape[1:])``
    tensors, one per row.

    Raises:
        ConfigError: If a row is null, or a list is not as long as its dimension.
    """
    level = storage
    for size in shape:
        if not (pa.types.is_list(level.type) or pa.types.is_large_list(level.type)):
            raise ConfigError(
                f"column {name!r} ({storage.type}) is not {len(shape)} lists deep as its "
                f"feature's shape {shape} says; write it with datasets' own features"
            )
        if level.null_count:
            raise ConfigError(f"column {name!r} has null arrays; fill them in a transform")
        if size is not None and len(level):
            lengths = pc.list_value_length(level)
            if not (numbers(lengths) == size).all():
                raise ConfigError(
                    f"column {name!r} holds a row that is not of its feature's shape {shape} "
                    f"(a list of {pc.min_max(lengths).as_py()} items where {size} are due); "
                    "fix the rows, or declare the feature with the shape they have"
                )
        level = level.flatten()
    values = _numeric(level, name)
    rest = [int(d) for d in shape[1:] if d is not None]  # the caller checked: all of them
    if shape[0] is not None:
        return values.reshape(len(storage), shape[0], *rest)
    rows = values.reshape(-1, *rest)
    bounds = np.zeros(len(storage) + 1, dtype=np.int64)
    np.cumsum(numbers(pc.list_value_length(storage)), out=bounds[1:])
    return [rows[bounds[i] : bounds[i + 1]] for i in range(len(storage))]


def _fixed(arr: pa.Array, name: str) -> tuple[pa.Array, tuple[int, ...]]:
    """The numbers of ``arr``'s rows (nested fixed-size lists, or numbers), one after another
    (zero-copy views), and a row's shape (``()`` for numbers).

    Raises:
        ConfigError: If a list at any depth is null (its slots hold no values).
    """
    shape: list[int] = []
    while pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            raise ConfigError(f"column {name!r} has null lists; fill them in a transform")
        size = arr.type.list_size
        arr = arr.values.slice(arr.offset * size, len(arr) * size)
        shape.append(size)
    return arr, tuple(shape)


def to_torch(batch: pa.RecordBatch | pa.Table | Mapping[str, Any]) -> Batch:
    """Convert a record batch, a table or a dict of arrays/tensors to a dict for torch."""
    if isinstance(batch, pa.RecordBatch | pa.Table):
        schema = batch.schema
        if len(set(schema.names)) != len(schema.names):  # a dict holds one of them
            twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
            raise ConfigError(
                f"a batch has two columns named {twice} (its columns: {schema.names}), and "
                "a batch of tensors holds one column of a name; rename one in the transform "
                "that added it"
            )
        return {
            name: column_to_torch(batch.column(i), name, schema.field(i))
            for i, name in enumerate(schema.names)
        }
    out: Batch = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            out[name] = torch.from_numpy(value)
        elif isinstance(value, pa.Array | pa.ChunkedArray):
            out[name] = column_to_torch(value, name)
        else:
            out[name] = value
    return out


def pinnable() -> bool:
    """Whether tensors can be pinned in this process: torch has an accelerator to pin them
    for, as torch's ``DataLoader`` asks (``torch.accelerator``: CUDA, ROCm, XPU, ...), other
    than MPS, which does not pin (torch's ``DataLoader`` turns pinning off there too).
    Torch's CPU build cannot pin at all (``Tensor.pin_memory()`` raises)."""
    if not torch.accelerator.is_available():
        return False
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type != "mps"


def placed(batch: Batch, pin_memory: bool, device: str | torch.device | None) -> Batch:
    """``batch``'s tensors in pinned memory (``pin_memory``, where :func:`pinnable`) and/or
    moved to ``device`` (asynchronously from pinned memory).

    The last step of every kind of batch (plain, packed, a mixture's), on every transport,
    as it leaves its rank: after a mixture joins its draws (a join makes new tensors, on the
    device of its parts, and would lose their pinning).
    """
    pin = pin_memory and pinnable()
    if not (pin or device):
        return batch
    out: Batch = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            if pin:
                value = value.pin_memory()
            if device:
                value = value.to(device, non_blocking=pin)
        out[name] = value
    return out
