"""What a transform, a Filter or a FlatMap hands back that the stream cannot use: refused with
a ConfigError naming the stage, the column, what it got and the fix, or converted where that
is cheap and loses nothing; and a user's own exception, kept as it was, with a note naming
the stage it was raised in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

import ingest

ROWS = 8
LANGS = ["en", "fr", None, "en", "en", "de", "en", None]


@pytest.fixture
def url(tmp_path: Path) -> str:
    """One Parquet shard of 8 rows: ``id`` 0..7 and ``lang``, with two nulls."""
    table = pa.table({"id": pa.array(range(ROWS), pa.int64()), "lang": LANGS})
    pq.write_table(table, tmp_path / "a.parquet")
    return str(tmp_path)


def _batches(url: str, transform: Any) -> list[dict[str, Any]]:
    return list(ingest.Stream(url, batch_size=4, transform=transform))


def _first(url: str, transform: Any) -> dict[str, Any]:
    return next(iter(ingest.Stream(url, batch_size=4, transform=transform)))


def _ids(batches: list[dict[str, Any]]) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


# A. A transform's result that cannot be a table.


def short_column(t: pa.Table) -> Any:
    return {"id": t["id"], "y": np.arange(2)}


def bfloat16(t: pa.Table) -> Any:
    return {"id": t["id"], "y": torch.ones(t.num_rows, dtype=torch.bfloat16)}


def scalar(t: pa.Table) -> Any:
    return {"id": t["id"], "y": 5}


def zero_d(t: pa.Table) -> Any:
    return {"id": t["id"], "y": torch.tensor(5)}


def text(t: pa.Table) -> Any:
    return {"id": t["id"], "y": "abcd"}


def strings_2d(t: pa.Table) -> Any:
    return {"id": t["id"], "y": np.full((t.num_rows, 2), "ab")}


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (short_column, ["short_column", "'y'", "2 values", "4 rows", "one value per row"]),
        (bfloat16, ["bfloat16", "'y'", "torch.bfloat16", ".float()"]),
        (scalar, ["scalar", "'y'", "int", "one value per row"]),
        (zero_d, ["zero_d", "'y'", "shape ()", "one value per row"]),
        (text, ["'y'", "str", "one value per row"]),
        (strings_2d, ["strings_2d", "'y'", "shape (4, 2)", "<U2"]),
    ],
)
def test_a_result_that_cannot_be_a_column_is_refused_naming_it(
    url: str, fn: Any, said: list[str]
) -> None:
    with pytest.raises(ingest.ConfigError) as refused:
        _first(url, fn)
    for words in said:
        assert words in str(refused.value), (words, str(refused.value))


def test_a_column_of_another_length_names_every_length(url: str) -> None:
    def lengths(t: pa.Table) -> Any:
        return {"id": np.arange(t.num_rows), "y": [1, 2, 3]}

    with pytest.raises(ingest.ConfigError, match=r"'y'.*3 values.*4 rows"):
        _first(url, lengths)


def test_a_tensor_that_requires_grad_is_detached(url: str) -> None:
    def grad(t: pa.Table) -> Any:
        return {"id": t["id"], "y": torch.ones(t.num_rows, requires_grad=True) * 2}

    batch = _first(url, grad)
    assert batch["y"].tolist() == [2.0] * 4
    assert not batch["y"].requires_grad


@pytest.mark.parametrize("shape", [(4,), (4, 3)])
def test_big_endian_numbers_are_made_native(url: str, shape: tuple[int, ...]) -> None:
    def big(t: pa.Table) -> Any:
        return {"id": t["id"], "y": np.arange(np.prod(shape), dtype=">i4").reshape(shape)}

    batch = _first(url, big)
    assert np.asarray(batch["y"]).tolist() == np.arange(np.prod(shape)).reshape(shape).tolist()


def test_a_two_dimensional_bool_array_is_a_column(url: str) -> None:
    def mask(t: pa.Table) -> Any:
        out = np.zeros((t.num_rows, 3), bool)
        out[:, 1] = True
        return {"id": t["id"], "mask": out}

    batch = _first(url, mask)
    assert isinstance(batch["mask"], torch.Tensor) and batch["mask"].dtype == torch.bool
    assert batch["mask"].tolist() == [[False, True, False]] * 4


def test_tensors_and_arrays_still_make_columns(url: str) -> None:
    def fine(t: pa.Table) -> Any:
        n = t.num_rows
        return {
            "a": torch.arange(n),
            "b": np.ones((n, 2), np.float32),
            "c": [str(i) for i in range(n)],
        }

    batch = _first(url, fine)
    assert batch["a"].tolist() == [0, 1, 2, 3]
    assert tuple(batch["b"].shape) == (4, 2)
    assert batch["c"] == ["0", "1", "2", "3"]


# B. FlatMap's fn returning something other than rows.


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (lambda row: None, "None"),
        (lambda row: {"id": row["id"]}, "dict"),
        (lambda row: [row["id"]], "int"),
        (lambda row: 5, "int"),
        (lambda row: "text", "str"),
    ],
)
def test_flat_map_refuses_what_is_not_rows(url: str, fn: Any, said: str) -> None:
    with pytest.raises(ingest.ConfigError) as refused:
        _first(url, ingest.FlatMap(fn))
    message = str(refused.value)
    assert "FlatMap" in message
    assert said in message
    assert "iterable of dicts" in message


def test_flat_map_takes_any_iterable_of_dicts(url: str) -> None:
    def twice(row: dict[str, Any]) -> Any:
        return ({"id": row["id"]} for _ in range(2))

    assert _ids(_batches(url, ingest.FlatMap(twice)))[:4] == [0, 0, 1, 1]


# C. A null in a Filter's mask drops its row.

EN = [i for i, lang in enumerate(LANGS) if lang == "en"]


def test_the_readme_filter_drops_rows_of_a_null(url: str) -> None:
    english = ingest.Filter(lambda table: pc.equal(table["lang"], "en"))
    assert _ids(_batches(url, english)) == EN


@pytest.mark.parametrize(
    "mask",
    [
        lambda t: np.array([v == "en" if v else None for v in t["lang"].to_pylist()], object),
        lambda t: [v == "en" if v else None for v in t["lang"].to_pylist()],
        lambda t: np.ma.masked_array(
            [v in ("en", None) for v in t["lang"].to_pylist()],
            mask=[v is None for v in t["lang"].to_pylist()],
        ),
        lambda t: pa.chunked_array(
            [pc.equal(t["lang"], "en").slice(0, 1), pc.equal(t["lang"], "en").slice(1)]
        ),
    ],
    ids=["numpy-object", "list", "numpy-masked", "chunked"],
)
def test_a_null_in_any_mask_drops_its_row(url: str, mask: Any) -> None:
    assert _ids(_batches(url, ingest.Filter(mask))) == EN


def test_a_mask_of_another_type_is_refused_as_before(url: str) -> None:
    with pytest.raises(
        ingest.ConfigError,
        match=r"Filter: keep returned int64 of shape \(4,\) for 4 rows; return one boolean",
    ):
        _first(url, ingest.Filter(lambda t: np.ones(t.num_rows, np.int64)))
    with pytest.raises(ingest.ConfigError, match=r"keep returned object of shape \(4,\)"):
        _first(url, ingest.Filter(lambda t: np.array(["yes"] * t.num_rows, object)))


# D. A user's exception names the stage it was raised in.


def _notes(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


def _frames(error: BaseException) -> list[str]:
    names = []
    tb = error.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


class RefusedError(Exception):
    """The user's own error."""


def refusing(t: pa.Table) -> Any:
    raise RefusedError("cannot handle this record")


def refusing_keep(t: pa.Table) -> Any:
    raise RefusedError("cannot handle this record")


def refusing_row(row: dict[str, Any]) -> Any:
    if row["id"] == 2:
        raise RefusedError("cannot handle this record")
    return [row]


@pytest.mark.parametrize(
    ("transform", "named", "raiser"),
    [
        (refusing, "transform 'refusing'", "refusing"),
        (ingest.Filter(refusing_keep), "Filter's keep 'refusing_keep'", "refusing_keep"),
        (ingest.FlatMap(refusing_row), "FlatMap's fn 'refusing_row' on row 2", "refusing_row"),
        ([ingest.Filter(lambda t: pc.greater(t["id"], 0)), refusing], "'refusing'", "refusing"),
    ],
    ids=["transform", "filter", "flat-map", "chain"],
)
def test_a_users_exception_is_kept_and_names_its_stage(
    url: str, transform: Any, named: str, raiser: str
) -> None:
    with pytest.raises(RefusedError) as raised:
        _batches(url, transform)
    assert type(raised.value) is RefusedError
    assert str(raised.value) == "cannot handle this record"
    notes = _notes(raised.value)
    assert len(notes) == 1, notes
    assert named in notes[0]
    assert _frames(raised.value)[-1] == raiser  # the traceback still ends where it was raised


def test_a_note_is_not_added_twice_to_one_exception(url: str) -> None:
    error = RefusedError("the same object each time")

    def again(t: pa.Table) -> Any:
        raise error

    for _ in range(2):
        with pytest.raises(RefusedError):
            _first(url, again)
    assert len(_notes(error)) == 1
