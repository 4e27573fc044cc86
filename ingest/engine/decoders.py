"""Decode transforms for folder datasets and Hugging Face datasets' ``Image()`` and
``Audio()`` features: image and audio bytes -> fixed-shape arrays.

Pass one as a stream's ``transform``: in a :class:`ingest.RayStream` it runs in the CPU
reader pool, so training ranks receive ready float tensors and never decode. Instances are
configured once (``Images(size=(64, 64))``) and built into each pool actor by pickling.
Pillow is a core dependency; :class:`Audio` needs ``soundfile`` (``pip install
'ingest[media]'``). A file that does not decode is a :class:`~ingest.core.errors.ShardError`
naming its URL (``path``), which ``ReadOptions(on_error="skip")`` quarantines alone: the
feed splits the batch to find the files that fail and delivers the others
(:func:`ingest.engine.transform.split_failures`).
"""

from __future__ import annotations

import io
import numbers
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.core.errors import ConfigError, ShardError

_FIX = "replace or remove the file, or pass ReadOptions(on_error='skip') to quarantine it"

_ADDRESS = re.compile(r"\s*<[^<>]* object at 0x[0-9a-fA-F]+>")
"""A Python object's repr (``<_io.BytesIO object at 0x7f...>``), which Pillow and soundfile
put in their errors for the bytes they were given: it names no file."""


class UndecodedMemberError(ShardError):
    """A row's file did not decode, and the batch does not hold its URL (a WebDataset
    sample: its member's name is known, its shard's URL is not): the feed that ran the
    decoder names the shard URL and row (:meth:`at`).

    Attributes:
        batch_row: The row's position in the batch the decoder was given.
        member: The file's name in its shard (``key.png``).
    """

    def __init__(self, batch_row: int, member: str, problem: str, fix: str) -> None:
        self.batch_row = batch_row
        self.member = member
        super().__init__(f"row {batch_row} of a batch", f"member {member} {problem}", fix)

    def at(self, url: str, row: int) -> ShardError:
        """The same error naming the member's shard ``url`` and ``row``."""
        return ShardError(url, self.problem, self.fix, row=row)


def _reason(error: Exception) -> str:
    """What a decoder's ``error`` says, without the object address it gives for the bytes."""
    return _ADDRESS.sub("", str(error)) or type(error).__name__


def _file_error(names: _Names, n: int, problem: str, fix: str = _FIX) -> ShardError:
    """The error for row ``n``'s file: named by its URL, or by its member's name for the
    feed to add its shard's URL and row (:class:`UndecodedMemberError`)."""
    paths, members = names
    if members is not None:
        return UndecodedMemberError(n, members[n], problem, fix)
    return ShardError(paths[n], problem, fix)


def _height_and_width(size: object) -> bool:
    """Whether ``size`` is two integers >= 1."""
    return (
        isinstance(size, (tuple, list))
        and len(size) == 2
        and all(_positive_integer(n) for n in size)
    )


def _positive_integer(n: object) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool) and int(n) >= 1


class Images:
    """``image`` bytes -> ``image`` float32 ``(n, channels, height, width)`` in ``[0, 1]``.

    Args:
        size: ``(height, width)`` every image is resized to (bilinear).
        mode: Pillow mode to convert to first (``"RGB"``: 3 channels, ``"L"``: 1).
        keep: Columns passed through unchanged (numeric ones become tensors).
        column: The column of the images, and of the decoded arrays: an image folder's
            ``image``, or a Hugging Face dataset's ``Image()`` feature (``struct<bytes,
            path>`` in its Parquet files; CIFAR-10's is ``img``).
    """

    def __init__(
        self,
        size: tuple[int, int] = (224, 224),
        *,
        mode: str = "RGB",
        keep: Sequence[str] = ("label",),
        column: str = "image",
    ) -> None:
        if not _height_and_width(size):
            raise ConfigError(
                f"size={size!r} must be (height, width), both integers >= 1 (for a square "
                "image of side n, pass (n, n))"
            )
        self.size = (int(size[0]), int(size[1]))
        self.mode = mode
        self.keep = tuple(keep)
        self.column = column

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        from PIL import Image

        height, width = self.size
        datas, names = _files(table, self.column)
        out: list[np.ndarray] = []
        for n, data in enumerate(datas):
            try:
                with Image.open(io.BytesIO(data or b"")) as image:
                    pixels = image.convert(self.mode).resize(
                        (width, height), Image.Resampling.BILINEAR
                    )
                    array = np.asarray(pixels, dtype=np.uint8)
            except Exception as e:
                raise _file_error(
                    names, n, f"cannot be decoded as an image ({_reason(e)})"
                ) from None
            out.append(array.reshape(height, width, -1))
        images = (
            np.stack(out).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
            if out
            else np.zeros((0, len(self.mode), height, width), np.float32)
        )
        return {self.column: images, **_kept(table, self.keep)}


class Audio:
    """``audio`` bytes -> ``audio`` float32 ``(n, frames)`` (mono) and ``frames`` (int64).

    Each clip is mixed down to mono, then cut or zero-padded to ``seconds`` at
    ``sample_rate``; ``frames`` is its length before that. A clip at another sample rate is
    an error (resample the files, or decode them in your own transform).

    Args:
        sample_rate: The files' sample rate (Hz).
        seconds: Length of every clip delivered.
        keep: Columns passed through unchanged.
        column: The column of the clips, and of the decoded ones: an audio folder's
            ``audio``, or a Hugging Face dataset's ``Audio()`` feature (``struct<bytes,
            path>`` in its Parquet files).
    """

    def __init__(
        self,
        sample_rate: int = 16_000,
        seconds: float = 1.0,
        *,
        keep: Sequence[str] = ("label",),
        column: str = "audio",
    ) -> None:
        if sample_rate < 1 or seconds <= 0:
            raise ConfigError(f"sample_rate={sample_rate} and seconds={seconds} must be > 0")
        self.sample_rate = int(sample_rate)
        self.frames = round(seconds * sample_rate)
        self.keep = tuple(keep)
        self.column = column

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        try:
            import soundfile
        except ImportError:
            raise ConfigError(
                "ingest.decode.Audio needs soundfile: pip install 'ingest[media]'"
            ) from None
        datas, names = _files(table, self.column)
        clips = np.zeros((len(datas), self.frames), np.float32)
        lengths = np.zeros(len(datas), np.int64)
        for n, data in enumerate(datas):
            try:
                samples, rate = soundfile.read(
                    io.BytesIO(data or b""), dtype="float32", always_2d=True
                )
            except Exception as e:
                raise _file_error(names, n, f"cannot be decoded as audio ({_reason(e)})") from None
            if rate != self.sample_rate:
                raise _file_error(
                    names,
                    n,
                    f"is sampled at {rate} Hz, not the {self.sample_rate} Hz asked for",
                    f"resample the files, or pass Audio(sample_rate={rate})",
                )
            mono = samples.mean(axis=1)
            lengths[n] = len(mono)
            clips[n, : min(len(mono), self.frames)] = mono[: self.frames]
        return {self.column: clips, "frames": lengths, **_kept(table, self.keep)}


_Names = tuple[list[str], list[str] | None]
"""Each row's file named by its URL (or as ``row n of a batch``), and for the rows of a
WebDataset shard (no URL, a ``__key__``) each one's member name in its shard."""


def _files(table: pa.Table, column: str) -> tuple[list[bytes], _Names]:
    """Each row's file bytes in ``column``, and a name for each row's file in errors.

    The column holds bytes (a folder dataset's, its file's URL in ``path``; a WebDataset
    shard's member ``key.column``, its sample's key in ``__key__``), or a Hugging Face
    ``Image()``/``Audio()`` feature as ``datasets`` writes it: ``struct<bytes, path>``, the
    path the file's name in the dataset.

    Raises:
        ConfigError: If the batch has no such column.
        ShardError: If a struct's row holds no bytes (``datasets`` keeps a path alone for
            files it did not embed), naming the path.
    """
    if column not in table.column_names:
        raise ConfigError(
            f"the decoder's column {column!r} is not in the batch; it has "
            f"{table.column_names}: pass column='...' (a Hugging Face image dataset's may "
            "be 'img')"
        )
    values = table.column(column).combine_chunks()
    if not pa.types.is_struct(values.type) or values.type.get_field_index("bytes") < 0:
        datas = values.to_pylist()
        if "path" in table.column_names:
            return datas, ([str(p) for p in table.column("path").to_pylist()], None)
        unnamed = [f"row {n} of a batch" for n in range(table.num_rows)]
        if "__key__" in table.column_names:
            keys = table.column("__key__").to_pylist()
            return datas, (unnamed, [f"{key}.{column}" for key in keys])
        return datas, (unnamed, None)
    datas = values.field("bytes").to_pylist()
    named = values.type.get_field_index("path") >= 0
    names = values.field("path").to_pylist() if named else [None] * len(datas)
    paths = [str(p) if p else f"row {n} of a batch" for n, p in enumerate(names)]
    for n, data in enumerate(datas):
        if data is None:
            raise ShardError(
                paths[n],
                f"has no bytes in the {column!r} column (the dataset keeps its path only)",
                "embed the files' bytes in the dataset (datasets' embed_external_files), "
                "or decode them in a transform of your own",
            )
    return datas, (paths, None)


def _kept(table: pa.Table, keep: Sequence[str]) -> dict[str, Any]:
    missing = [c for c in keep if c not in table.column_names]
    if missing:
        raise ConfigError(
            f"keep={list(keep)} names column(s) {missing} the batch lacks; it has "
            f"{table.column_names}"
        )
    return {c: table.column(c).combine_chunks() for c in keep}


__all__ = ["Audio", "Images", "UndecodedMemberError"]
