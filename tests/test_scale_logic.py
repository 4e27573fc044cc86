"""The vectorised plan, shares, ledger and interval paths equal the scalar ones they replaced.

Each reference below is the scalar code as it was before the numpy paths (a loop over
Python objects), or, where that code is still the library's fallback (``remaining``), a
definition row by row; hypothesis draws small random inputs and the two must agree exactly.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.core import ledger as ledger_module
from ingest.core.assign import CARRY, MAIN, Assignment, Span, Spans, deal_lanes, remaining, split
from ingest.core.intervals import IntervalSet, stack, union
from ingest.core.keyed import covered, merge_into, union_into
from ingest.core.ledger import Ledger, StepRecord, merge_runs
from ingest.core.plan import (
    PlanShard,
    Unit,
    Units,
    epoch_units,
    hash64,
    hash64_many,
    permutation,
    permutations,
    shard_order,
)
from ingest.core.share import FeedPlan
from ingest.core.state import (
    Consumed,
    DatasetState,
    ShardRecord,
    ShardTable,
    packed_digest,
)
from ingest.core.state.packed import (
    byte_shuffled,
    front_coded,
    pack_sets,
    unpack_sets,
    version_hashes,
)
from ingest.engine.feed import Feed, FeedConfig
from ingest.formats.base import ReadOptions

# -- the scalar references ------------------------------------------------------------------


def ref_shard_order(keys: Sequence[str], seed: int | None, epoch: int) -> list[int]:
    if seed is None:
        return list(range(len(keys)))
    return sorted(range(len(keys)), key=lambda i: (hash64("shard", seed, epoch, keys[i]), i))


def ref_epoch_units(shards: Sequence[PlanShard], seed: int | None, epoch: int) -> list[Unit]:
    units: list[Unit] = []
    for index in ref_shard_order([s.key for s in shards], seed, epoch):
        shard = shards[index]
        if shard.rows == 0:
            continue
        if shard.blocks is None or shard.rows is None or len(shard.blocks) <= 1:
            units.append(Unit(index, 0, shard.rows))
            continue
        bounds = [*shard.blocks, shard.rows]
        order: Sequence[int] = range(len(shard.blocks))
        if seed is not None:
            order = permutation(len(shard.blocks), "blocks", seed, epoch, shard.key).tolist()
        units.extend(
            Unit(index, bounds[b], bounds[b + 1]) for b in order if bounds[b + 1] > bounds[b]
        )
    return units


def ref_remaining(
    units: Sequence[Unit], rows: Sequence[int], consumed: Mapping[int, set[int]]
) -> list[Span]:
    """Row by row, not by interval: each unit's rows not in ``consumed``, in order, a run of
    consecutive ones made one span (spans do not cross units)."""
    out: list[Span] = []
    for unit in units:
        stop = rows[unit.shard] if unit.stop is None else unit.stop
        left = [r for r in range(unit.start, stop) if r not in consumed.get(unit.shard, set())]
        for _, run in itertools.groupby(enumerate(left), key=lambda p: p[1] - p[0]):
            rows_of_run = [r for _, r in run]
            out.append(Span(unit.shard, rows_of_run[0], rows_of_run[-1] + 1))
    return out


def ref_split(spans: Sequence[Span], world_size: int, batch_size: int) -> Assignment:
    total = sum(s.rows for s in spans)
    steps = total // (world_size * batch_size)
    share = steps * batch_size
    ranks: list[list[Span]] = [[] for _ in range(world_size)]
    remainder: list[Span] = []
    rank, room = 0, share
    for span in spans:
        start = span.start
        while start < span.stop:
            if rank == world_size or (room == 0 and rank == world_size - 1):
                remainder.append(span.cut(start, span.stop))
                break
            if room == 0:
                rank, room = rank + 1, share
                continue
            take = min(room, span.stop - start)
            ranks[rank].append(span.cut(start, start + take))
            start += take
            room -= take
    return Assignment(tuple(tuple(r) for r in ranks), steps, tuple(remainder))


def ref_merged(runs: Sequence[tuple[int, int, int, int]]) -> dict[tuple[int, int], IntervalSet]:
    out: dict[tuple[int, int], IntervalSet] = {}
    for segment, shard, start, stop in runs:
        if stop > start:
            out.setdefault((segment, shard), IntervalSet()).add(start, stop)
    return out


# -- strategies -----------------------------------------------------------------------------

plan_shards = st.lists(
    st.tuples(
        st.integers(0, 4),  # key suffix: keys may repeat
        st.one_of(st.none(), st.integers(0, 60)),
        st.one_of(st.none(), st.lists(st.integers(0, 70), max_size=5).map(tuple)),
    ),
    max_size=12,
)
seeds = st.one_of(st.none(), st.integers(0, 2**40))
interval_lists = st.lists(st.tuples(st.integers(0, 80), st.integers(0, 15)), max_size=8)


def make_plan_shards(spec: list[tuple[int, int | None, tuple[int, ...] | None]]) -> list[PlanShard]:
    return [
        PlanShard(f"s3://b/{k}/part-{n}", rows, blocks) for n, (k, rows, blocks) in enumerate(spec)
    ]


# -- plan -----------------------------------------------------------------------------------


@given(plan_shards, seeds, st.integers(0, 30))
def test_epoch_units_equal_the_scalar_plan(spec, seed, epoch) -> None:
    shards = make_plan_shards(spec)
    units = epoch_units(shards, seed, epoch)
    expected = ref_epoch_units(shards, seed, epoch)
    assert list(units) == expected
    assert units == expected and len(units) == len(expected)
    assert [units[i] for i in range(len(units))] == expected
    assert list(units[1:3]) == expected[1:3]


@given(st.lists(st.text(max_size=12), max_size=40), seeds, st.integers(0, 30))
def test_shard_order_and_hashes_equal_the_scalar_ones(keys, seed, epoch) -> None:
    assert shard_order(keys, seed, epoch) == ref_shard_order(keys, seed, epoch)
    got = hash64_many(keys, "shard", seed, epoch)
    assert got.dtype == np.uint64
    assert got.tolist() == [hash64("shard", seed, epoch, k) for k in keys]


@given(st.integers(0, 40), st.lists(st.integers(0, 2**64 - 1), max_size=6))
def test_permutations_equal_one_permutation_per_key(n, bases) -> None:
    got = permutations(n, np.array(bases, dtype=np.uint64))
    assert got.shape == (len(bases), n)
    for row, base in zip(got, bases, strict=True):
        # The splitmix64 sort keys, in plain Python integers: ties keep index order.
        keys = [(_splitmix(base, i), i) for i in range(n)]
        assert row.tolist() == [i for _, i in sorted(keys)]
    key = ("blocks", n, len(bases))
    assert permutations(n, np.array([hash64(*key)], dtype=np.uint64))[0].tolist() == (
        permutation(n, *key).tolist()
    )


def _splitmix(base: int, i: int) -> int:
    mask = (1 << 64) - 1
    z = (i * 0x9E3779B97F4A7C15 + base) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


PINNED = """
import json
from ingest.core.plan import PlanShard, epoch_units, permutation, shard_order
shards = [PlanShard("s3://b/x-0", 100, (0, 30, 60)), PlanShard("s3://b/x-1", 10, None),
          PlanShard("s3://b/x-2", 0, (0,)), PlanShard("s3://b/x-3", None, (0, 5))]
print(permutation(8, "rows", 0, 0, 0).tolist())
print(shard_order(["a", "b", "c", "d", "e", "f"], 7, 3))
print(json.dumps([[u.shard, u.start, u.stop] for u in epoch_units(shards, 11, 2)]))
"""


def test_orders_are_the_ones_pinned_before_vectorising() -> None:
    # Values printed by the scalar implementation (commit 719a349); run in a fresh
    # interpreter with another string hash seed: the orders must not depend on either.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", PINNED], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    assert json.loads(out[0]) == [2, 7, 5, 3, 4, 1, 6, 0]
    assert json.loads(out[1]) == [3, 2, 4, 1, 0, 5]
    assert json.loads(out[2]) == [[1, 0, 10], [0, 60, 100], [0, 0, 30], [0, 30, 60], [3, 0, None]]


# -- remaining and split --------------------------------------------------------------------


@given(plan_shards, seeds, st.dictionaries(st.integers(0, 13), interval_lists, max_size=6))
def test_remaining_equals_the_scalar_gaps(spec, seed, consumed_spec) -> None:
    shards = make_plan_shards(spec)
    units = epoch_units(shards, seed, 0)
    rows = [37 if s.rows is None else s.rows for s in shards]
    consumed = {k: IntervalSet((a, a + n) for a, n in v) for k, v in consumed_spec.items()}
    consumed_rows = {
        k: {r for a, n in v for r in range(a, a + n)} for k, v in consumed_spec.items()
    }
    got = remaining(units, rows, consumed)
    expected = ref_remaining(list(units), rows, consumed_rows)
    assert isinstance(got, Spans)
    assert got.to_list() == expected
    assert remaining(list(units), rows, consumed) == expected  # the scalar path


def test_remaining_of_open_ended_units_beyond_the_vectorised_range() -> None:
    units = epoch_units([PlanShard("a", None), PlanShard("b", 50)], None, 0)
    rows = [1 << 62, 50]
    consumed = {0: IntervalSet([(0, 10)]), 1: IntervalSet([(5, 7)])}
    assert remaining(units, rows, consumed).to_list() == [
        Span(0, 10, 1 << 62),
        Span(1, 0, 5),
        Span(1, 7, 50),
    ]


span_lists = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(0, 30), st.sampled_from([0, 1])),
    max_size=15,
).map(lambda xs: [Span(sh, a, a + n, seg) for sh, a, n, seg in xs])


@given(span_lists, st.integers(1, 5), st.integers(1, 9))
def test_split_equals_the_scalar_loop(spans, world_size, batch_size) -> None:
    expected = ref_split(spans, world_size, batch_size)
    assert split(spans, world_size, batch_size) == expected
    assert split(Spans.of(spans), world_size, batch_size) == expected


def test_split_refuses_a_span_that_ends_before_it_starts() -> None:
    with pytest.raises(ValueError, match=r"ends before it starts"):
        split([Span(0, 10, 5)], 1, 1)


@given(span_lists)
def test_spans_are_a_sequence_of_span(spans) -> None:
    arr = Spans.of(spans)
    assert len(arr) == len(spans) and list(arr) == spans and arr == spans
    assert arr.lengths.tolist() == [s.rows for s in spans]
    assert [arr[i] for i in range(len(arr))] == spans
    assert arr[1:4] == spans[1:4]
    assert Spans.concat([arr, arr]) == spans + spans
    picked = np.arange(len(spans))[::-1]
    assert arr.take(picked).to_list() == spans[::-1]


# -- ledger and interval sets ---------------------------------------------------------------

runs_lists = st.lists(
    st.tuples(
        st.sampled_from([CARRY, MAIN]), st.integers(0, 6), st.integers(0, 200), st.integers(0, 12)
    ).map(lambda r: (r[0], r[1], r[2], r[2] + r[3])),
    max_size=60,
)


def check_merged(runs: list[tuple[int, int, int, int]]) -> None:
    """``merge_runs(runs)`` holds the rows of ``runs``, sorted, one run per interval."""
    merged = merge_runs(runs)
    got: dict[tuple[int, int], IntervalSet] = {}
    for segment, shard, start, stop in merged.tolist():
        got.setdefault((segment, shard), IntervalSet()).add(start, stop)
    assert got == ref_merged(runs)
    # Sorted, and one run per interval: nothing left to merge.
    keys = [tuple(r[:3]) for r in merged.tolist()]
    assert keys == sorted(keys)
    assert len(merged) == sum(len(v) for v in got.values())


@given(runs_lists)
def test_merge_runs_equals_interval_sets_per_shard(runs) -> None:
    check_merged(runs)


def test_merge_runs_beyond_the_packed_range_still_merges() -> None:
    big = 1 << 61
    runs = [(1, 3, big, big + 5), (1, 3, big + 5, big + 9), (0, 3, 0, 2), (1, 2, 7, 8)]
    assert merge_runs(runs).tolist() == [[0, 3, 0, 2], [1, 2, 7, 8], [1, 3, big, big + 9]]


@given(st.lists(st.lists(runs_lists, min_size=2, max_size=2), max_size=4))
def test_ledger_runs_cover_exactly_the_acked_rows(steps) -> None:
    ledger = Ledger(2, 0)
    for step, per_rank in enumerate(steps):
        for rank, runs in enumerate(per_rank):
            ledger.ack(rank, [StepRecord(step, tuple(runs))])
    acked = [run for per_rank in steps for runs in per_rank for run in runs]
    got: dict[tuple[int, int], IntervalSet] = {}
    for segment, shard, start, stop in ledger.runs(0, len(steps) - 1).tolist():
        got.setdefault((segment, shard), IntervalSet()).add(start, stop)
    assert got == ref_merged(acked)


@given(interval_lists, interval_lists)
def test_add_many_equals_adding_one_by_one(before, added) -> None:
    one = IntervalSet((a, a + n) for a, n in before)
    many = one.copy()
    for a, n in added:
        one.add(a, a + n)
    many.add_many([a for a, _ in added], [a + n for a, n in added])
    assert many == one
    rows = IntervalSet()
    rows.add_rows(np.array([a for a, _ in added], dtype=np.int64))
    assert rows == IntervalSet((a, a + 1) for a, _ in added)


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 10**6)), min_size=1, max_size=40))
def test_union_is_sorted_disjoint_and_exact(pairs) -> None:
    starts = np.array([a for a, _ in pairs], dtype=np.int64)
    stops = np.array([a + n for a, n in pairs], dtype=np.int64)
    lo, hi = union(starts, stops)
    expected = IntervalSet((a, a + n) for a, n in pairs)
    assert list(zip(lo.tolist(), hi.tolist(), strict=True)) == list(expected)


def test_add_many_refuses_bad_ranges() -> None:
    with pytest.raises(ValueError, match=r"interval \[5, 2\)"):
        IntervalSet().add_many([0, 5], [1, 2])
    with pytest.raises(ValueError, match="one stop per start"):
        IntervalSet().add_many([0, 5], [1])


@given(st.lists(st.integers(0, 5000), max_size=400), st.integers(0, 10**9))
@settings(max_examples=60)
def test_encode_round_trips_and_is_never_longer(rows, offset) -> None:
    iv = IntervalSet()
    iv.add_rows(np.array(rows, dtype=np.int64) + offset)
    encoded = iv.encode()
    assert IntervalSet.from_json(json.loads(json.dumps(encoded))) == iv
    assert len(json.dumps(encoded)) <= len(json.dumps(iv.to_json()))


def test_a_half_consumed_window_encodes_as_a_bitmap_in_a_fraction_of_the_pairs() -> None:
    rng = np.random.default_rng(0)
    iv = IntervalSet()
    iv.add_rows(rng.permutation(16_384)[:8192] + 1_000_000)
    encoded = iv.encode()
    assert isinstance(encoded, dict) and set(encoded) == {"from", "to", "bits"}
    assert len(json.dumps(encoded)) * 10 < len(json.dumps(iv.to_json()))


@pytest.mark.parametrize(
    "bad",
    [
        {"from": 0, "to": 8},
        {"from": 0, "to": 8, "bits": "not base64!"},
        {"from": 0, "to": 8, "bits": "AAA="},
        {"from": 5, "to": 2, "bits": ""},
        {"from": True, "to": 8, "bits": "AA=="},
        {"from": 0, "to": 8, "bits": "AA==", "extra": 1},
    ],
)
def test_from_json_rejects_malformed_bitmaps(bad: object) -> None:
    with pytest.raises(ValueError, match="interval bitmap"):
        IntervalSet.from_json(bad)


def test_units_equal_only_the_same_units() -> None:
    shards = [PlanShard(f"k{i}", 10, (0, 5)) for i in range(4)]
    units = epoch_units(shards, 3, 1)
    assert isinstance(units, Units)
    assert units != epoch_units(shards, 3, 2)
    assert units != list(units)[:-1]
    assert (units == 5) is False


def test_ledger_runs_follow_acks_and_folds_after_being_asked() -> None:
    ledger = Ledger(1, 0)
    ledger.ack(0, [StepRecord(0, ((1, 0, 0, 4),)), StepRecord(2, ((1, 0, 8, 9),))])
    assert ledger.runs(0, 2).tolist() == [[1, 0, 0, 4], [1, 0, 8, 9]]
    ledger.ack(0, [StepRecord(1, ((1, 0, 4, 8),))])  # fills the gap: one run now
    assert ledger.runs(0, 2).tolist() == [[1, 0, 0, 9]]
    ledger.fold(1)
    assert ledger.runs(0, 2).tolist() == [[1, 0, 8, 9]]
    with pytest.raises(ValueError, match="read-only"):
        ledger.runs(0, 2)[0, 0] = 7


keyed_intervals = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 100), st.integers(0, 12)), max_size=40
)


@given(st.dictionaries(st.integers(0, 5), interval_lists, max_size=4), keyed_intervals)
def test_union_into_equals_adding_to_each_set(before, added) -> None:
    sets = {k: IntervalSet((a, a + n) for a, n in v) for k, v in before.items()}
    kept = {k: v.copy() for k, v in sets.items()}
    got = union_into(
        sets, [k for k, _, _ in added], [a for _, a, _ in added], [a + n for _, a, n in added]
    )
    expected = {k: v.copy() for k, v in sets.items()}
    for k, a, n in added:
        expected.setdefault(k, IntervalSet()).add(a, a + n)
    touched = {k for k, _, n in added if n}
    assert got == {k: expected[k] for k in touched}
    assert sets == kept  # the given sets are left as they were


def test_union_into_rows_too_large_to_pack() -> None:
    big = 1 << 61
    sets = {3: IntervalSet([(big, big + 2)])}
    got = union_into(sets, [3, 3, 1], [big + 2, big + 7, 0], [big + 4, big + 9, 5])
    assert got == {3: IntervalSet([(big, big + 4), (big + 7, big + 9)]), 1: IntervalSet([(0, 5)])}


def test_union_into_refuses_bad_ranges() -> None:
    with pytest.raises(ValueError, match=r"interval \[4, 2\) of key 1"):
        union_into({}, [0, 1], [0, 4], [1, 2])
    with pytest.raises(ValueError, match="need as many"):
        union_into({}, [0], [0, 1], [1, 2])


# -- the paths of the coordinator at scale (benchmarks/coordinator_scale.py) ----------------

short_runs = st.lists(
    st.tuples(
        st.sampled_from([CARRY, MAIN]),
        st.integers(0, 6),
        st.integers(0, 200),
        st.sampled_from([1, 1, 1, 2, 0]),
    ).map(lambda r: (r[0], r[1], r[2], r[2] + r[3])),
    max_size=60,
)


@given(short_runs, st.booleans())
def test_merge_runs_of_about_a_row_each_equals_interval_sets(runs, one_segment) -> None:
    """The paths for shuffled batches: one row per run, a few longer (expanded to rows)."""
    if one_segment:
        runs = [(MAIN, *r[1:]) for r in runs]
    check_merged(runs)


@given(st.lists(st.lists(short_runs, min_size=3, max_size=3), max_size=4))
def test_ledger_runs_by_rank_merge_each_rank_alone(steps) -> None:
    ledger = Ledger(3, 0)
    for step, per_rank in enumerate(steps):
        for rank, runs in enumerate(per_rank):
            ledger.ack(rank, [StepRecord(step, tuple(runs))])
    parts = ledger.runs_by_rank(0, len(steps) - 1)
    mine = [[run for per_rank in steps for run in per_rank[rank]] for rank in range(3)]
    expected = [ref_merged(runs) for runs in mine if any(r[3] > r[2] for r in runs)]
    assert [ref_merged(p.tolist()) for p in parts] == expected
    assert all(merge_runs(p).tolist() == p.tolist() for p in parts)  # each already merged


@given(
    st.dictionaries(st.integers(0, 5), interval_lists, max_size=4),
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 100), st.integers(0, 30)), max_size=20),
)
def test_covered_counts_the_rows_of_each_range(before, ranges) -> None:
    sets = {k: IntervalSet((a, a + n) for a, n in v) for k, v in before.items()}
    got = covered(
        sets, [k for k, _, _ in ranges], [a for _, a, _ in ranges], [a + n for _, a, n in ranges]
    )
    empty = IntervalSet()
    expected = [
        sum(1 for row in range(a, a + n) if row in sets.get(k, empty)) for k, a, n in ranges
    ]
    assert got.tolist() == expected


@given(st.dictionaries(st.integers(0, 5), interval_lists, max_size=4), keyed_intervals)
def test_merge_into_gives_the_new_sets_as_arrays(before, added) -> None:
    sets = {k: IntervalSet((a, a + n) for a, n in v) for k, v in before.items()}
    got = merge_into(
        sets, [k for k, _, _ in added], [a for _, a, _ in added], [a + n for _, a, n in added]
    )
    key, start, stop = stack(sorted(got.sets.items()))
    assert (got.key.tolist(), got.start.tolist(), got.stop.tolist()) == (
        key.tolist(),
        start.tolist(),
        stop.tolist(),
    )
    for rows in got.sets.values():  # read-only: a set's arrays are shared, never edited
        assert not rows._starts.flags.writeable and not rows._stops.flags.writeable


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 10**6)), min_size=1, max_size=40))
def test_union_of_sorted_runs_by_merge_sort_is_the_same(pairs) -> None:
    half = len(pairs) // 2
    runs = sorted(pairs[:half]) + sorted(pairs[half:])
    starts = np.array([a for a, _ in runs], dtype=np.int64)
    stops = np.array([a + n for a, n in runs], dtype=np.int64)
    quick, merged = union(starts, stops), union(starts, stops, runs=True)
    assert quick[0].tolist() == merged[0].tolist() and quick[1].tolist() == merged[1].tolist()


# -- the state's columns, against the per-shard code they replaced --------------------------


def ref_front_coded(suffixes: list[bytes]) -> bytes:
    shared = [0] * min(len(suffixes), 1) + [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for a, b in itertools.pairwise(suffixes)
    ]
    lengths = [len(s) - k for s, k in zip(suffixes, shared, strict=True)]
    return (
        byte_shuffled(np.array(shared), "<u4")
        + byte_shuffled(np.array(lengths), "<u4")
        + b"".join(s[k:] for s, k in zip(suffixes, shared, strict=True))
    )


def ref_packed_digest(shards: Sequence[ShardRecord]) -> str:
    h = hashlib.sha256()
    for column in ([s.url.encode() for s in shards], [s.version.encode() for s in shards]):
        h.update(np.asarray([len(b) for b in column], dtype="<i8").tobytes())
        h.update(b"".join(column))
    h.update(np.asarray([s.size for s in shards], dtype="<i8").tobytes())
    return h.hexdigest()


def ref_version_hashes(versions: Sequence[str]) -> list[int]:
    out = []
    for v in versions:
        crc = zlib.crc32(v.encode()) | 1 if v else 0
        out.append(max(crc >> 16, 1) if crc else 0)
    return out


texts = st.text(alphabet="ab/-.é0", max_size=8)
listings = st.lists(
    st.tuples(texts, st.integers(0, 10**12), st.sampled_from(["", "e1", "etag-é", "x" * 32])),
    max_size=30,
    unique_by=lambda t: t[0],
)


@given(listings, st.integers(0, 3))
def test_packed_columns_equal_the_per_shard_code(listing, skip) -> None:
    shards = [ShardRecord("s3://b/" + url, size, v, None) for url, size, v in listing]
    assert packed_digest(shards) == ref_packed_digest(shards)
    versions = [s.version for s in shards]
    assert version_hashes(versions).tolist() == ref_version_hashes(versions)
    text = "".join(s.url for s in shards).encode()
    lengths = np.array([len(s.url.encode()) for s in shards], dtype=np.int64)
    skip = min([skip, *(len(s.url.encode()) for s in shards)])
    expected = ref_front_coded([s.url.encode()[skip:] for s in shards])
    assert front_coded(text, lengths, skip) == expected


def ref_pack_sets(sets: dict[int, IntervalSet]) -> bytes:
    """The bits column of :func:`ingest.core.state.packed.pack_sets`, one set at a time."""
    bits = []
    for k in sorted(sets):
        pairs = list(sets[k])
        first, last = pairs[0][0], pairs[-1][1]
        member = [any(a <= row < b for a, b in sets[k]) for row in range(first, last)]
        bits.append(np.packbits(np.array(member, dtype=bool), bitorder="little").tobytes())
    return b"".join(bits)


@given(st.dictionaries(st.integers(0, 9), interval_lists.filter(lambda v: any(n for _, n in v))))
def test_pack_sets_writes_each_set_as_its_bitmap(before) -> None:
    sets = {k: IntervalSet((a, a + n) for a, n in v) for k, v in before.items()}
    sets = {k: v for k, v in sets.items() if len(v)}
    packed = pack_sets(*stack(sorted(sets.items())))
    assert zlib.decompress(base64.b64decode(packed["bits"])) == ref_pack_sets(sets)
    back = {int(k): v for k, v in unpack_sets(packed, "x").items()}
    assert back == sets


@given(
    st.dictionaries(st.integers(0, 7), interval_lists, max_size=6),
    st.lists(keyed_intervals, max_size=3),
    st.lists(st.sampled_from([-1, 0, 20, 40, 95]), min_size=8, max_size=8),
)
def test_a_kept_completion_equals_one_found_anew(before, folds, counts) -> None:
    listed = np.array(counts, dtype=np.int64)
    shards = [ShardRecord(f"s3://b/{i}", 1, "", None if n < 0 else n) for i, n in enumerate(counts)]
    progress = Consumed({k: IntervalSet((a, a + n) for a, n in v) for k, v in before.items()})
    progress.add_sets({}, listed)  # made from all sets
    for added in folds:
        rows = [(k, a, a + n) for k, a, n in added if k < 8]
        if rows:
            keys, starts, stops = (list(c) for c in zip(*rows, strict=True))
            got = merge_into(progress.sets, keys, starts, stops)
            progress.add_sets(got.sets, listed, [(got.key, got.start, got.stop)])
    kept = progress.to_json(shards, packed=True)
    progress.completion = None
    assert progress.to_json(shards, packed=True) == kept


def test_a_shard_table_is_the_records_it_holds() -> None:
    records = [ShardRecord(f"s3://b/{i}", 10 + i, f"e{i}", None if i == 2 else i) for i in range(5)]
    table = ShardTable(
        [r.url for r in records],
        np.array([r.size for r in records]),
        [r.version for r in records],
        np.array([-1 if r.rows is None else r.rows for r in records]),
    )
    assert list(table) == records and table == records and table[2] == records[2]
    assert table[1:3] == records[1:3] and len(table) == 5
    as_list = DatasetState(["s3://b/"], records)
    assert DatasetState(["s3://b/"], table).to_json() == as_list.to_json()
    with pytest.raises(ValueError, match="one of each per shard"):
        ShardTable(["a"], np.array([1, 2]), ["v"], np.array([1]))


@given(st.lists(st.integers(0, 3), max_size=20), st.integers(1, 6))
def test_lanes_are_dealt_as_the_feed_deals_them(shards, lanes) -> None:
    spans = tuple(Span(shard, n, n + 1) for n, shard in enumerate(shards))
    plan = FeedPlan(0, 0, 0, None, spans, ({}, {}), None, None)  # type: ignore[arg-type, type-var]
    config = FeedConfig(
        batch_size=1, seed=0, window=8, lanes=lanes, columns=None, read=ReadOptions()
    )
    feed = Feed(plan, config, None)  # type: ignore[arg-type]  # lanes only: nothing is read
    assert [lane.spans for lane in feed._lanes] == deal_lanes(spans, lanes)


@given(st.lists(short_runs, min_size=1, max_size=5), st.lists(runs_lists, max_size=3))
def test_packed_and_kept_steps_of_one_rank_merge_together(packed, kept) -> None:
    """A message of short runs is packed into rows as it arrives; one of long runs is kept."""
    small = ledger_module._PACK_FROM_RUNS
    ledger_module._PACK_FROM_RUNS = 1  # pack the small messages of this test
    try:
        ledger = Ledger(1, 0)
        ledger.ack(0, [StepRecord(i, tuple(runs)) for i, runs in enumerate(packed)])
        ledger.ack(0, [StepRecord(len(packed) + i, tuple(runs)) for i, runs in enumerate(kept)])
    finally:
        ledger_module._PACK_FROM_RUNS = small
    steps = packed + kept
    assert ref_merged(ledger.runs(0, len(steps) - 1).tolist()) == ref_merged(
        [run for runs in steps for run in runs]
    )
    for step, runs in enumerate(steps):  # each step holds its own rows, and no other's
        assert ref_merged(ledger.runs(step, step).tolist()) == ref_merged(runs)
