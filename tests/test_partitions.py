"""Hive-style partitions: the ``key=value`` directories of a shard's path below the listed
root are columns of its rows, as ``ray.data.read_parquet``, pyarrow's datasets and polars
read them (a data lake written by Spark or Hive: ``s3://lake/t/lang=en/year=2024/...``).
Before, a stream dropped them without a word."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset
import pyarrow.parquet as pq
import pytest
import torch

import ingest
from ingest.core.errors import ConfigError, ShardError
from ingest.storage.sources.partitions import HIVE_NULL, base_of, hive_partition
from ingest.testing import Store, encode, make_table

# -- the paths (no store) ---------------------------------------------------------------


def test_the_key_value_directories_below_the_root_in_order() -> None:
    assert hive_partition("b/t", "b/t/lang=en/year=2024/part-0.parquet") == (
        ("lang", "en"),
        ("year", "2024"),
    )
    # Directories that are no key=value, and a file name with '=' in it, are no partition.
    assert hive_partition("b/t", "b/t/raw/lang=fr/v2/x=1.parquet") == (("lang", "fr"),)
    # Above the listed root: the root's own path is no partition of its rows.
    assert hive_partition("b/run=3/t", "b/run=3/t/lang=en/a.parquet") == (("lang", "en"),)
    assert hive_partition("b/t", "b/t/a.parquet") == ()
    assert hive_partition("b/t", "b/other/lang=en/a.parquet") == ()  # not below the root


def test_values_are_unescaped_and_hives_null_partition_is_null() -> None:
    # Spark and Hive escape '/', '=', '%', ':' and others in a value as %XX.
    assert hive_partition("r", "r/day=2024-01-01 10%3A00/url=a%2Fb%3Dc/f.jsonl") == (
        ("day", "2024-01-01 10:00"),
        ("url", "a/b=c"),
    )
    assert hive_partition("r", f"r/lang={HIVE_NULL}/f.jsonl") == (("lang", None),)
    assert hive_partition("r", "r/lang=/f.jsonl") == (("lang", ""),)
    assert hive_partition("r", "r/k=a=b/f.jsonl") == (("k", "a=b"),)  # the first '=' splits


def test_a_key_twice_in_one_path_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"'lang' twice.*lang=en/lang=fr"):
        hive_partition("r", "r/lang=en/lang=fr/f.jsonl")


def test_the_root_of_a_glob_is_its_directories_before_the_first_pattern() -> None:
    assert base_of("b/t/**/*.parquet", glob=True) == "b/t"
    assert base_of("b/t/lang=*/*.parquet", glob=True) == "b/t"
    assert base_of("b/t/", glob=False) == "b/t"
    assert base_of("b/t", glob=False) == "b/t"


# -- a stream over partitioned shards ------------------------------------------------------

LAYOUT = [("en", "2023"), ("en", "2024"), ("fr", "2024"), (HIVE_NULL, "2024")]
ROWS = 50


def write_lake(store: Store, fmt: str = "parquet", name: str = "lake") -> dict[int, Any]:
    """Shards at ``lang=../year=..`` (one in Hive's null partition) under ``name``; the
    ``(lang, year)`` of every id."""
    expected = {}
    for n, (lang, year) in enumerate(LAYOUT):
        table = make_table(n * ROWS, ROWS).select(["id", "score", "text"])
        store.write(f"{name}/lang={lang}/year={year}/part-0.{fmt}", encode(table, fmt))
        for i in range(n * ROWS, (n + 1) * ROWS):
            expected[i] = (None if lang == HIVE_NULL else lang, year)
    store.write(f"{name}/_SUCCESS", b"")
    return expected


def rows_of(stream: Any) -> dict[int, tuple[Any, str]]:
    out: dict[int, tuple[Any, str]] = {}
    for batch in stream:
        for i, lang, year in zip(batch["id"].tolist(), batch["lang"], batch["year"], strict=True):
            assert i not in out, f"id {i} twice"
            out[i] = (lang, year)
    return out


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_stream_has_the_partition_columns_of_every_row(store: Store, fmt: str) -> None:
    expected = write_lake(store, fmt)

    def stream() -> ingest.Stream:
        return ingest.Stream(
            store.url("lake"), batch_size=10, storage_options=store.storage_options, shuffle_seed=3
        )

    first = next(iter(stream()))
    assert list(first)[-2:] == ["lang", "year"]  # after the file's columns
    assert all(isinstance(v, str) for v in first["year"])  # text, as Ray Data reads them
    assert rows_of(stream()) == expected


def test_columns_may_name_partition_keys_in_any_order(local: Store) -> None:
    expected = write_lake(local)
    columns = ["year", "id", "lang"]
    assert list(next(iter(ingest.Stream(local.url("lake"), batch_size=50, columns=columns)))) == (
        columns
    )
    assert rows_of(ingest.Stream(local.url("lake"), batch_size=50, columns=columns)) == expected
    only = ingest.Stream(local.url("lake"), batch_size=200, columns=["lang"])
    assert sorted(set(next(iter(only))["lang"]), key=str) == sorted({"en", "fr", None}, key=str)


def test_partitioning_none_reads_the_files_columns_alone(local: Store) -> None:
    write_lake(local)
    stream = ingest.Stream(
        local.url("lake"), batch_size=10, read=ingest.ReadOptions(partitioning=None)
    )
    assert list(next(iter(stream))) == ["id", "score", "text"]
    with pytest.raises(ConfigError, match=r"partitioning='dir'.*'hive' or None"):
        ingest.ReadOptions(partitioning="dir")


def test_a_glob_below_the_partitions_and_a_partition_named_as_root(local: Store) -> None:
    expected = write_lake(local)
    glob = ingest.Stream(local.url("lake/lang=*/year=2024/*.parquet"), batch_size=10)
    assert rows_of(glob) == {i: v for i, v in expected.items() if v[1] == "2024"}
    # Listed from inside a partition: its own key is above the root, not a column.
    inside = ingest.Stream(local.url("lake/lang=en"), batch_size=10)
    assert list(next(iter(inside))) == ["id", "score", "text", "year"]
    # A file named explicitly is read alone: no directory of its path is below a root.
    one = ingest.Stream(local.url("lake/lang=en/year=2023/part-0.parquet"), batch_size=10)
    assert list(next(iter(one))) == ["id", "score", "text"]


def test_a_partition_key_that_is_also_a_column_is_refused(local: Store) -> None:
    local.write("clash/id=7/a.parquet", encode(make_table(0, 10), "parquet"))
    with pytest.raises(ConfigError, match=r"'id'.*partition.*column of .*a\.parquet") as e:
        next(iter(ingest.Stream(local.url("clash"), batch_size=4)))
    assert "partitioning=None" in str(e.value)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_declared_schema_types_the_partition_columns(local: Store, fmt: str) -> None:
    """``year=2024`` is text in a path; a declared schema that names ``year`` reads it as
    the type it gives (as pyarrow's hive partitioning takes a schema), each value checked.
    Before, naming a partition key in ``ReadOptions(schema=...)`` was refused."""
    expected = write_lake(local, fmt)
    files = [("id", pa.int64()), ("score", pa.float64()), ("text", pa.string())]
    schema = pa.schema([*files, ("year", pa.int16())])
    read = ingest.ReadOptions(schema=schema)
    got: dict[int, Any] = {}
    for batch in ingest.Stream(local.url("lake"), batch_size=10, shuffle_seed=1, read=read):
        assert list(batch) == ["id", "score", "text", "lang", "year"]
        assert batch["year"].dtype == torch.int16  # lang: not declared, a string
        rows = zip(batch["id"].tolist(), batch["lang"], batch["year"].tolist(), strict=True)
        got.update((i, (lang, str(year))) for i, lang, year in rows)
    assert got == expected
    # A value the type cannot hold is named with its directory.
    local.write(
        f"lake/lang=de/year=soon/part-0.{fmt}",
        encode(make_table(999, 2).select(["id", "score", "text"]), fmt),
    )
    with pytest.raises(ShardError, match=r"year=soon.*int16"):
        list(ingest.Stream(local.url("lake"), batch_size=1, read=read))


def test_shards_without_a_key_read_it_as_null(local: Store) -> None:
    local.write("mixed/lang=en/a.jsonl", b'{"id": 0}\n{"id": 1}\n')
    local.write("mixed/b.jsonl", b'{"id": 2}\n')
    got = {}
    for batch in ingest.Stream(local.url("mixed"), batch_size=1):
        got[batch["id"].item()] = batch["lang"][0]
    assert got == {0: "en", 1: "en", 2: None}


def test_a_resume_inside_a_window_is_exactly_once_with_the_partition_columns(
    local: Store,
) -> None:
    expected = write_lake(local)
    kwargs: dict[str, Any] = {"batch_size": 10, "shuffle_seed": 1, "shuffle_window": 60}
    stream = ingest.Stream(local.url("lake"), **kwargs)
    it = iter(stream)
    before: dict[int, Any] = {}
    for _ in range(5):
        batch = next(it)
        langs_years = zip(batch["lang"], batch["year"], strict=True)
        before.update(zip(batch["id"].tolist(), langs_years, strict=True))
    state = json.loads(json.dumps(stream.state_dict()))
    resumed = ingest.Stream(local.url("lake"), **kwargs)
    resumed.load_state_dict(state)
    after = rows_of(resumed)
    assert not set(before) & set(after)
    assert {**before, **after} == expected


def test_a_dataloader_and_a_derived_copy_carry_them(local: Store, tmp_path: Any) -> None:
    expected = write_lake(local)
    loader = ingest.DataLoader(ingest.Stream(local.url("lake"), batch_size=10), num_workers=2)
    try:
        assert rows_of(loader) == expected
    finally:
        loader.close()
    # A stage sees them.
    english = ingest.Filter(lambda t: pc.fill_null(pc.equal(t.column("lang"), "en"), False))
    stream = ingest.Stream(local.url("lake"), batch_size=10, transform=english)
    assert rows_of(stream) == {i: v for i, v in expected.items() if v[0] == "en"}
    # A derived copy keeps them, and one made with them is not read without them.
    every = ingest.Filter(lambda t: pc.greater_equal(t.column("id"), 0), version="1")
    derived = f"file://{tmp_path}/derived"
    for made in (True, False):  # made, then read back from the copies
        stream = ingest.Stream(local.url("lake"), batch_size=10, transform=every, derived=derived)
        assert rows_of(stream) == expected
        assert (stream.stats["derived_hits"] > 0) is not made
    without = ingest.Stream(
        local.url("lake"),
        batch_size=10,
        transform=every,
        derived=derived,
        read=ingest.ReadOptions(partitioning=None),
    )
    batches = list(without)
    assert sorted(i for b in batches for i in b["id"].tolist()) == sorted(expected)
    assert list(batches[0]) == ["id", "score", "text"]
    assert without.stats["derived_hits"] == 0


def test_pyarrow_reads_the_same_columns(local: Store) -> None:
    """The reference: pyarrow's own hive partitioning (types left as strings)."""
    write_lake(local)
    path = local.url("lake").removeprefix("file://")
    theirs = pq.read_table(
        path,
        partitioning=pyarrow.dataset.partitioning(
            pa.schema([("lang", pa.string()), ("year", pa.string())]),
            flavor="hive",
        ),
    ).sort_by("id")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = rows_of(ingest.Stream(local.url("lake"), batch_size=40))
    assert [ours[i] for i in theirs.column("id").to_pylist()] == [
        (None if lang in (None, HIVE_NULL) else lang, year)
        for lang, year in zip(
            theirs.column("lang").to_pylist(), theirs.column("year").to_pylist(), strict=True
        )
    ]


@pytest.mark.usefixtures("ray_session")
def test_a_ray_streams_ranks_and_ray_data_read_them_as_ray_data_does(s3_store: Store) -> None:
    """The reference: ``ray.data.read_parquet``, whose default partitioning is hive (strings),
    over the same shards (but for Hive's null partition, which it reads as the directory's
    name); and two ranks of a ``RayStream``, their readers in the pool."""
    import pyarrow.fs as pafs
    import ray.data

    expected = write_lake(s3_store)
    url = s3_store.url("lake")
    handler = pafs.PyFileSystem(pafs.FSSpecHandler(s3_store.fs))
    theirs = ray.data.read_parquet(url.removeprefix("s3://"), filesystem=handler).to_arrow_refs()
    ref = pa.concat_tables(ray.get(theirs, timeout=120)).select(["id", "lang", "year"])
    # Ray Data keeps Hive's null partition as its directory name; pyarrow and Hive read null.
    null = pc.equal(ref.column("lang"), HIVE_NULL)
    ref = ref.set_column(1, "lang", pc.if_else(null, pa.scalar(None, pa.string()), ref["lang"]))
    ours = ingest.ray_data.read(url, storage_options=s3_store.storage_options).to_arrow_refs()
    got = pa.concat_tables(ray.get(ours, timeout=120))
    assert got.column_names == ["id", "score", "text", "lang", "year"]
    assert got.select(["id", "lang", "year"]).sort_by("id").equals(ref.sort_by("id"))
    with ingest.RayStream(
        url, storage_options=s3_store.storage_options, world_size=2, batch_size=10, shuffle_seed=2
    ) as stream:
        ranks = [stream.rank_iterator(rank) for rank in range(2)]
        seen: dict[int, tuple[Any, str]] = {}
        for it in ranks:
            part = rows_of(it)
            assert not set(part) & set(seen)
            seen.update(part)
    assert seen == expected
