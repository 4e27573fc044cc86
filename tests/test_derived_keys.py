"""Keys of derived copies and fingerprints of stage chains (issue 34, item 2): a change of
the shard, the unit, the read, the tokenizer, an option or a stage's version is another key;
a chain with a stage that cannot say what it computes is not cacheable, with one warning."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from ingest.core.errors import ConfigError
from ingest.engine.derived import (
    DerivedKey,
    DerivedWarning,
    chain_fingerprint,
    read_fingerprint,
)
from ingest.engine.stage import Filter, FlatMap, Stage, Staged
from ingest.engine.tokenize import Tokenize
from ingest.engine.transform import build_transform


def word_tokenizer(words: list[str]) -> Tokenizer:
    """A word-level tokenizer over ``words`` (and ``[UNK]``), split on whitespace."""
    vocab = {w: n for n, w in enumerate([*words, "[UNK]"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


WORDS = ["the", "shard", "row", "token"]
KEY = DerivedKey(
    url="s3://b/a.parquet", size=100, version="etag1", start=0, stop=10, chain="c" * 64
)


def test_equal_keys_have_one_name_and_every_field_changes_it() -> None:
    assert KEY.name() == dataclasses.replace(KEY).name()
    assert len(KEY.name()) == 40
    changes: dict[str, Any] = {
        "url": "s3://b/b.parquet",
        "size": 101,
        "version": "etag2",
        "start": 1,
        "stop": None,
        "chain": "d" * 64,
        "read": read_fingerprint("parquet", ["text"]),
    }
    names = {dataclasses.replace(KEY, **{f: v}).name() for f, v in changes.items()}
    assert len(names) == len(changes)
    assert KEY.name() not in names


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        ({"size": -1}, ConfigError, "size=-1"),
        ({"start": 5, "stop": 4}, ConfigError, "stop must be an int >= start"),
        ({"chain": ""}, ConfigError, "chain fingerprint"),
        ({"version": None}, TypeError, "DerivedKey.version must be a str"),
        ({"size": True}, ConfigError, "size=True"),
    ],
)
def test_a_key_refuses_what_names_no_unit(change: dict[str, Any], error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        dataclasses.replace(KEY, **change)


def test_read_fingerprint_follows_the_format_and_columns() -> None:
    assert read_fingerprint("jsonl", None) != read_fingerprint("parquet", None)
    assert read_fingerprint("jsonl", ["text"]) != read_fingerprint("jsonl", None)
    assert read_fingerprint("jsonl", ("text",)) == read_fingerprint("jsonl", ["text"])


def test_read_fingerprint_follows_the_partition_columns_a_shard_is_read_with() -> None:
    """A shard's hive partitions are columns of the rows the chain is given (unless read with
    ``partitioning=None``): a copy made with them is not one made without, nor of another
    value. A shard with none keeps the key it had before partitions were read."""
    plain = read_fingerprint("jsonl", None)
    assert read_fingerprint("jsonl", None, ()) == plain == '{"columns":null,"format":"jsonl"}'
    en = read_fingerprint("jsonl", None, (("lang", "en"),))
    assert en != plain
    assert en != read_fingerprint("jsonl", None, (("lang", "fr"),))
    assert en != read_fingerprint("jsonl", None, (("lang", None),))


def test_tokenize_is_fingerprinted_by_its_tokenizer_and_options() -> None:
    base = chain_fingerprint(Tokenize(word_tokenizer(WORDS), eos_id=4))
    assert base is not None
    # The same tokenizer, serialized and loaded again: the same fingerprint.
    again = Tokenizer.from_str(word_tokenizer(WORDS).to_str())
    assert chain_fingerprint(Tokenize(again, eos_id=4)) == base
    # How fast it runs is not what it computes.
    assert chain_fingerprint(Tokenize(again, eos_id=4, parallel_batches=1)) == base
    others = [
        Tokenize(word_tokenizer([*WORDS, "epoch"]), eos_id=4),  # another vocabulary
        Tokenize(word_tokenizer(WORDS), eos_id=3),
        Tokenize(word_tokenizer(WORDS)),
        Tokenize(word_tokenizer(WORDS), "body", eos_id=4),
        Tokenize(word_tokenizer(WORDS), eos_id=4, output="ids"),
        Tokenize(word_tokenizer(WORDS), eos_id=4, keep=["id"]),
    ]
    prints = {chain_fingerprint(t) for t in others}
    assert len(prints) == len(others)
    assert base not in prints


def test_a_tokenizers_normalizer_changes_its_fingerprint() -> None:
    from tokenizers import normalizers

    lower = word_tokenizer(WORDS)
    lower.normalizer = normalizers.Lowercase()
    assert chain_fingerprint(Tokenize(lower)) != chain_fingerprint(Tokenize(word_tokenizer(WORDS)))


def test_a_callable_tokenizer_is_not_cacheable_and_says_so() -> None:
    def tokenizer(texts: list[str]) -> list[list[int]]:
        return [[len(t)] for t in texts]

    with pytest.warns(DerivedWarning, match="has no fingerprint.*version="):
        assert chain_fingerprint(Tokenize(tokenizer)) is None
    # The warning's advice, followed (found by a probe: Tokenize took no version=).
    one = chain_fingerprint(Tokenize(tokenizer, version="1"))
    assert one is not None and one == chain_fingerprint(Tokenize(tokenizer, version="1"))
    assert one != chain_fingerprint(Tokenize(tokenizer, version="2"))
    assert one != chain_fingerprint(Tokenize(tokenizer, version="1", eos_id=4))
    with pytest.raises(ConfigError, match="version="):
        Tokenize(tokenizer, version="")


@pytest.mark.parametrize(
    "stage",
    [
        Filter(lambda t: [True] * t.num_rows),
        FlatMap(lambda row: [row]),
        lambda t: t,
    ],
    ids=["Filter", "FlatMap", "function"],
)
def test_a_stage_without_a_version_makes_its_chain_uncacheable(stage: Any) -> None:
    tok = Tokenize(word_tokenizer(WORDS))
    with pytest.warns(DerivedWarning, match="not cached.*version='...'") as caught:
        assert chain_fingerprint([stage, tok]) is None
    assert len(caught) == 1


def _versioned(version: str) -> Any:
    def double(table: pa.Table) -> pa.Table:
        return table

    double.version = version  # type: ignore[attr-defined]
    return double


def _other(version: str) -> Any:
    def halve(table: pa.Table) -> pa.Table:
        return table

    halve.version = version  # type: ignore[attr-defined]
    return halve


def test_a_versioned_stage_is_cacheable_and_its_version_and_name_change_the_key() -> None:
    tok = Tokenize(word_tokenizer(WORDS))
    one = chain_fingerprint([_versioned("1"), tok])
    assert one is not None
    assert chain_fingerprint([_versioned("1"), tok]) == one
    assert chain_fingerprint([_versioned("2"), tok]) != one
    assert chain_fingerprint([_other("1"), tok]) != one
    assert chain_fingerprint([tok, _versioned("1")]) != one  # the order is part of the chain


class Chunk(Stage):
    """A stage that says what it computes with its own fingerprint."""

    def __init__(self, size: int) -> None:
        self.size = size

    def fingerprint(self) -> str:
        return f"chunk:{self.size}"

    def __call__(self, table: pa.Table) -> Staged:  # pragma: no cover - never run here
        raise NotImplementedError


def test_a_stage_with_a_fingerprint_method_gives_its_own() -> None:
    assert chain_fingerprint(Chunk(8)) == chain_fingerprint(Chunk(8))
    assert chain_fingerprint(Chunk(8)) != chain_fingerprint(Chunk(16))


def test_a_chain_built_from_a_transform_list_is_fingerprinted_stage_by_stage() -> None:
    tok = Tokenize(word_tokenizer(WORDS))
    built = build_transform([Chunk(8), tok])
    assert chain_fingerprint(built) == chain_fingerprint([Chunk(8), tok])


@pytest.mark.parametrize("bad", ["", 2])
def test_a_bad_version_or_fingerprint_is_refused_naming_the_stage(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"double has version=.*non-empty str"):
        chain_fingerprint(_versioned(bad))

    class Empty(Chunk):
        def fingerprint(self) -> str:
            return bad  # type: ignore[no-any-return]

    with pytest.raises(ConfigError, match=r"Empty.fingerprint\(\) returned"):
        chain_fingerprint(Empty(1))


def test_filter_and_flatmap_are_cacheable_with_a_version() -> None:
    """``Filter(keep, version="1")`` and ``FlatMap(fn, version="1")`` cache (issue 34, item 2:
    a stage built from a user function caches only with a version); the version, and each
    option that changes what they make (``per_row``, ``schema``), changes the key."""

    def keep(t: pa.Table) -> Any:
        return [True] * t.num_rows

    one = chain_fingerprint(Filter(keep, version="1"))
    assert one is not None and one == chain_fingerprint(Filter(keep, version="1"))
    assert chain_fingerprint(Filter(keep, version="2")) != one
    assert chain_fingerprint(Filter(keep, per_row=True, version="1")) != one
    split = chain_fingerprint(FlatMap(lambda row: [row], version="1"))
    assert split is not None and split != one
    typed = FlatMap(lambda row: [row], schema=pa.schema([("id", pa.int64())]), version="1")
    assert chain_fingerprint(typed) not in (None, split)


def _keep_even(t: pa.Table) -> Any:
    return [True] * t.num_rows


def _keep_odd(t: pa.Table) -> Any:
    return [False] * t.num_rows


def _split_words(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [row]


def _split_lines(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [row]


def test_the_function_a_stage_runs_is_part_of_its_key() -> None:
    """Found by a probe: ``Filter(keep_even, version="1")`` then ``Filter(keep_odd,
    version="1")`` over one ``derived=`` URL (shared by every job) read the first one's rows,
    as two callable tokenizers of one version read each other's ids: the key named the
    stage's class, never the function it runs. Two lambdas of one module are told apart by
    their line."""
    assert chain_fingerprint(Filter(_keep_even, version="1")) != chain_fingerprint(
        Filter(_keep_odd, version="1")
    )
    assert chain_fingerprint(FlatMap(_split_words, version="1")) != chain_fingerprint(
        FlatMap(_split_lines, version="1")
    )

    def lengths(texts: list[str]) -> list[list[int]]:
        return [[len(t)] for t in texts]

    def firsts(texts: list[str]) -> list[list[int]]:
        return [[ord(t[0])] for t in texts]

    assert chain_fingerprint(Tokenize(lengths, version="1")) != chain_fingerprint(
        Tokenize(firsts, version="1")
    )
    import functools

    assert chain_fingerprint(Filter(functools.partial(_keep_even), version="1")) != (
        chain_fingerprint(Filter(functools.partial(_keep_odd), version="1"))
    )
    one = FlatMap(lambda row: [row], version="1")
    two = FlatMap(lambda row: [row, row], version="1")
    assert chain_fingerprint(one) != chain_fingerprint(two)


def test_a_transformers_fast_tokenizer_is_fingerprinted_by_its_tokenizer() -> None:
    """Found by a probe: ``Tokenize(PreTrainedTokenizerFast(...))`` had no fingerprint (its
    serialized form is its ``backend_tokenizer``'s), so it was never cached and, once given
    a ``version=`` as the warning said, another tokenizer of that version read its ids."""
    from transformers import PreTrainedTokenizerFast

    def fast(words: list[str]) -> Any:
        return PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(words))

    base = chain_fingerprint(Tokenize(fast(WORDS)))
    assert base is not None and base == chain_fingerprint(Tokenize(fast(WORDS)))
    # Another vocabulary is another key.
    other = chain_fingerprint(Tokenize(fast([*WORDS, "epoch"]), version="1"))
    assert other not in (None, chain_fingerprint(Tokenize(fast(WORDS), version="1")))
