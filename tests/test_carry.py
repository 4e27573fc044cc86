"""What an epoch carries into the next (:mod:`ingest.core.carry`): every copy of a row it did
not hand out, once, each with its own offset. Pure; no Ray."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.core.assign import CARRY, MAIN, Span
from ingest.core.carry import Carried, carried_out


def copies(out: Carried) -> Counter[tuple[int, int, int]]:
    """Every copy ``(shard, row, offset)`` the next epoch takes: carried and owed."""
    got = Counter(
        (s.shard, row, out.offsets.get((s.shard, row), 0))
        for s in out.spans
        for row in range(s.start, s.stop)
    )
    return got + Counter(out.owed)


def test_both_copies_of_a_row_are_carried_once_and_owed_once() -> None:
    remainder = [Span(0, 0, 10, CARRY), Span(0, 3, 4, MAIN), Span(0, 9, 10, MAIN), Span(1, 0, 2)]
    cut = {(CARRY, 0, 3): 7, (MAIN, 0, 9): 2}
    out = carried_out(remainder, owed=[(1, 1, 4)], cut=cut)
    assert out.spans == (Span(0, 0, 10, CARRY), Span(1, 0, 2, CARRY)), "every row once, merged"
    assert out.offsets == {(0, 9): 2}, "a row's own copy is carried, with its own offset"
    assert out.owed == ((0, 3, 7), (0, 9, 0), (1, 1, 4)), "the others owed, each with its own"
    assert out.rows == 15, "14 copies left over and 1 owed"


def test_an_owed_copy_is_carried_when_its_row_is_not_left_over() -> None:
    out = carried_out([Span(0, 0, 2, MAIN)], owed=[(0, 5, 3), (0, 5, 0)])
    assert out.spans == (Span(0, 0, 2, CARRY), Span(0, 5, 6, CARRY))
    assert out.offsets == {(0, 5): 3} and out.owed == ((0, 5, 0),), "the oldest owed first"


def test_after_an_epoch_with_no_step_every_copy_is_carried() -> None:
    """Nothing was handed out: the next epoch carries a row as often as it is due (a copy
    of each row after another, each a set of rows in runs), so the copies can fill a step."""
    remainder = [Span(0, 0, 4, CARRY), Span(0, 0, 6, MAIN)]
    out = carried_out(remainder, owed=[(0, 1, 0)], whole=True)
    assert out.spans == (Span(0, 0, 6, CARRY), Span(0, 0, 4, CARRY), Span(0, 1, 2, CARRY))
    assert out.owed == () and out.rows == 11


def test_nothing_left_over_carries_nothing() -> None:
    assert carried_out(()) == Carried()


spans = st.builds(
    lambda shard, start, n, segment: Span(shard, start, start + n, segment),
    st.integers(0, 2),
    st.integers(0, 20),
    st.integers(1, 6),
    st.sampled_from([CARRY, MAIN]),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(spans, max_size=6),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 25), st.integers(0, 9)), max_size=5),
    st.dictionaries(
        st.tuples(st.sampled_from([CARRY, MAIN]), st.integers(0, 2), st.integers(0, 25)),
        st.integers(1, 9),
        max_size=6,
    ),
)
def test_every_copy_is_taken_once_with_its_offset(
    remainder: list[Span],
    owed: list[tuple[int, int, int]],
    cut: dict[tuple[int, int, int], int],
) -> None:
    """An epoch holds a row at most once per segment: each segment's spans are disjoint."""
    seen: set[tuple[int, int, int]] = set()
    disjoint = []
    for s in remainder:
        rows = {(s.segment, s.shard, r) for r in range(s.start, s.stop)}
        if not rows & seen:
            disjoint.append(s)
            seen |= rows
    every = carried_out(disjoint, sorted(owed), cut, whole=True)  # an epoch with no step
    taken = Counter((s.shard, r) for s in every.spans for r in range(s.start, s.stop))
    assert taken == Counter(
        [(s.shard, r) for s in disjoint for r in range(s.start, s.stop)]
        + [(i, r) for i, r, _ in owed]
    ), "every copy carried"
    assert not every.owed
    out = carried_out(disjoint, sorted(owed), cut)
    want = Counter(
        (s.shard, r, cut.get((s.segment, s.shard, r), 0))
        for s in disjoint
        for r in range(s.start, s.stop)
    ) + Counter(owed)
    assert copies(out) == want, "every copy once, with its own offset: none lost, none added"
    carried = [(s.shard, r) for s in out.spans for r in range(s.start, s.stop)]
    assert len(carried) == len(set(carried)) == len(out.spans and carried)
    assert carried == sorted(carried), "a set of rows, in order"
    assert all(s.segment == CARRY for s in out.spans)
    assert list(out.owed) == sorted(out.owed)
    assert all(off > 0 for off in out.offsets.values())
