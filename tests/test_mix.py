"""Weighted mixtures in a stream (ingest.Mix, ingest.engine.mix): every source within one draw
of its weight at every prefix, every token once per epoch of its own source through stops,
the uninterrupted run's draws after a resume, and a weight change at resume.

Two JSONL corpora: ``web`` (documents 0 to 479) and ``code`` (documents 100,000 to 100,095),
tokens ``d * 10_000 + j + 1`` (see ``test_pack_stream``), so that every token names its
document and source.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.core.errors import ConfigError, StateError
from ingest.core.state import StreamState
from ingest.testing import Store
from tests.test_pack_stream import lengths, tokenize

SEQ_LEN, READ_ROWS, BATCH = 64, 16, 4
CORPORA = {"web": (0, 480), "code": (100_000, 96)}
NAMES = list(CORPORA)


def write_corpora(store: Store, corpora: Mapping[str, tuple[int, int]] = CORPORA) -> dict[str, str]:
    """Each corpus as 2 JSONL shards of ``{"text": "<d> <tokens>"}``; name -> glob."""
    urls = {}
    for n, (name, (first, count)) in enumerate(corpora.items()):
        docs = list(zip(range(first, first + count), lengths(count, seed=n), strict=True))
        half = count // 2
        for s, part in enumerate((docs[:half], docs[half:])):
            lines = [json.dumps({"text": f"{d} {k}"}) for d, k in part]
            store.write(f"{name}/part-{s}.jsonl", ("\n".join(lines) + "\n").encode())
        urls[name] = store.url(f"{name}/*.jsonl")
    return urls


def every_token(name: str) -> Counter[int]:
    first, count = CORPORA[name]
    n = NAMES.index(name)
    return Counter(
        t
        for d, k in zip(range(first, first + count), lengths(count, seed=n), strict=True)
        for t in tokenize([f"{d} {k}"])[0]
    )


def mixed(urls: Mapping[str, str], store: Store, **options: Any) -> ingest.Stream:
    mix = ingest.Mix(
        urls,
        weights=options.pop("weights", {"web": 3, "code": 1}),
        schedule=options.pop("schedule", ()),
    )
    return ingest.Stream(
        mix,
        batch_size=BATCH,
        transform=ingest.Tokenize(tokenize),
        pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8),
        shuffle_seed=options.pop("shuffle_seed", 1),
        shuffle_window=48,
        storage_options=store.storage_options,
        **options,
    )


def draws(batches: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, list[int]]]:
    """Each sequence of the batches: its source, its source's epoch and its tokens."""
    out = []
    for b in batches:
        for seq, source, epoch in zip(
            b["input_ids"].tolist(), b["source"].tolist(), b["source_epoch"].tolist(), strict=True
        ):
            out.append((NAMES[source], epoch, [t for t in seq if t]))
    return out


def check_once_per_source_epoch(got: Sequence[tuple[str, int, list[int]]]) -> dict[str, int]:
    """Every source's epochs but its last hand out each of its tokens once, the last at most
    once; returns each source's epochs begun."""
    per: dict[tuple[str, int], Counter[int]] = {}
    for name, epoch, tokens in got:
        per.setdefault((name, epoch), Counter()).update(tokens)
    last = {name: max(e for n, e in per if n == name) for name in {n for n, _ in per}}
    for (name, epoch), counted in per.items():
        whole = every_token(name)
        repeated = {t: c for t, c in counted.items() if c > 1}
        assert not repeated, f"{name} epoch {epoch} repeated {len(repeated)} tokens"
        assert not counted - whole, f"{name} epoch {epoch} handed out tokens not of {name}"
        if epoch < last[name]:
            lost = whole - counted
            assert not lost, f"{name} epoch {epoch} lost {sum(lost.values())} tokens"
    return {name: e + 1 for name, e in last.items()}


def check_carried(got: Sequence[tuple[str, int, list[int]]], final: Mapping[str, Any]) -> None:
    """Token by token, each source's epochs hand out no token twice but for the ones an
    epoch carries into its source's next (a remainder, a rank's surplus); and
    all of them together hand out each token exactly as often as the ``final`` state of the
    mixture says was due (:func:`due`)."""
    per: dict[str, dict[int, Counter[int]]] = {}
    for name, epoch, tokens in got:
        per.setdefault(name, {}).setdefault(epoch, Counter()).update(tokens)
    for name, epochs in per.items():
        whole, owed = every_token(name), Counter[int]()
        assert sorted(epochs) == list(range(max(epochs) + 1)), f"{name}: an epoch with no draw"
        for epoch in sorted(epochs):
            counted, allowed = epochs[epoch], whole + owed
            assert not counted - allowed, f"{name} epoch {epoch}: tokens repeated"
            owed = allowed - counted
        handed = sum(epochs.values(), Counter[int]())
        assert handed == due(name, final["sources"][name]), f"{name}: lost or repeated tokens"


def due(name: str, part: Mapping[str, Any]) -> Counter[int]:
    """How often each token of source ``name`` was due by its ``part`` of a state: once per
    epoch before the state's, less the rows carried into its epoch (not handed out yet), plus
    what its epoch consumed (cut documents up to their offsets)."""
    first, count = CORPORA[name]
    docs = list(
        zip(range(first, first + count), lengths(count, seed=NAMES.index(name)), strict=True)
    )
    length = dict(docs)
    out: Counter[int] = Counter()
    for (d, upto), n in times_due(StreamState.from_json(part), docs).items():
        for t in tokenize([f"{d} {length[d]}"])[0][: None if upto < 0 else upto]:
            out[t] += n
    return +out


def times_due(state: StreamState, docs: Sequence[tuple[int, int]]) -> Counter[tuple[int, int]]:
    """``(document, tokens) -> times due`` (tokens -1: all of them) by one source's ``state``,
    its documents ``docs`` ``(id, tokens)`` written as 2 shards by :func:`write_corpora`."""
    half = len(docs) // 2
    shards = [docs[:half] if s.url.endswith("part-0.jsonl") else docs[half:] for s in state.shards]
    cut = {(seg, s, r): o for seg, s, r, o in state.progress.tokens}
    times: Counter[tuple[int, int]] = Counter()
    for shard, rows in enumerate(shards):
        for row, (d, _) in enumerate(rows):
            times[d, -1] += state.progress.epoch
            for segment in (0, 1):
                if state.consumed_whole(segment, shard, row):
                    times[d, -1] += 1
                elif (segment, shard, row) in cut:
                    times[d, cut[segment, shard, row]] += 1
    for shard, start, stop in state.distributed.carry:  # due in the epoch before
        for d, _ in shards[shard][start:stop]:
            times[d, -1] -= 1
    for shard, row, offset in state.distributed.owed:  # due before, but for [0, offset)
        d = shards[shard][row][0]
        times[d, -1] -= 1
        if offset:
            times[d, offset] += 1
    return times


def deviation(sources: Sequence[str], weights: Mapping[str, float]) -> float:
    """The largest |draws of a source - its weight's share| over every prefix, in draws."""
    total = sum(weights.values())
    worst = 0.0
    for name, w in weights.items():
        counts = np.cumsum([s == name for s in sources])
        expected = w / total * np.arange(1, len(sources) + 1)
        worst = max(worst, float(np.abs(counts - expected).max()))
    return worst


def run(urls: Mapping[str, str], store: Store, stops: Sequence[int], epochs: int, **kw: Any):
    """``epochs`` epochs of the mixture, a state saved (through JSON) and loaded into a new
    stream after each batch count in ``stops``; the batches."""
    s = mixed(urls, store, **kw)
    got: list[dict[str, Any]] = []
    for _ in range(epochs):
        while True:
            stopped = False
            for batch in s:
                got.append(batch)
                if len(got) in stops:
                    state = json.loads(json.dumps(s.state_dict()))
                    s.close()
                    s = mixed(urls, store, **kw)
                    s.load_state_dict(state)
                    stopped = True
                    break
            if not stopped:
                break
    s.close()
    return got


def test_every_token_once_per_source_epoch_and_within_one_sequence_of_the_weights(
    local: Store,
) -> None:
    urls = write_corpora(local)
    whole = run(urls, local, (), epochs=2)
    stopped = run(urls, local, (1, 5, 6, 13, 30, 31), epochs=2)
    for got in (whole, stopped):
        seqs = draws(got)
        epochs = check_once_per_source_epoch(seqs)
        # code is a fifth of web's documents at a third of its weight: it repeats, web is read
        # about once an epoch of the mixture.
        assert epochs["code"] > epochs["web"] >= 2
        sources = [name for name, _, _ in seqs]
        assert deviation(sources, {"web": 3, "code": 1}) <= 1.0
    # A resume goes on with the uninterrupted run's draws (not its sequences: a sequence
    # left open at a stop is packed anew).
    assert [d[:2] for d in draws(whole)] == [d[:2] for d in draws(stopped)]
    # An epoch of the mixture ends with the batch in which both sources ended one of theirs.
    first = run(urls, local, (), epochs=1)
    begun = {name: max(e for n, e, _ in draws(first) if n == name) for name in NAMES}
    assert min(begun.values()) >= 1


def test_a_weight_change_at_resume_starts_a_stage_there_and_loses_nothing(local: Store) -> None:
    urls = write_corpora(local)
    s = mixed(urls, local)
    got = []
    for batch in s:
        got.append(batch)
        if len(got) == 12:
            break
    state = json.loads(json.dumps(s.state_dict()))
    s.close()
    before = [name for name, _, _ in draws(got)]
    assert deviation(before, {"web": 3, "code": 1}) <= 1.0
    after_stream = mixed(urls, local, weights={"web": 1, "code": 1})
    after_stream.load_state_dict(state)
    after = []
    for batch in after_stream:
        after.append(batch)
        if len(after) == 20:
            break
    sources = [name for name, _, _ in draws(after)]
    assert deviation(sources, {"web": 1, "code": 1}) <= 1.0
    mixture = after_stream.state_dict()["mix"]["mixture"]
    assert mixture["stages"][1]["start"] == 12 * BATCH * SEQ_LEN  # its exact count
    assert mixture["stages"][1]["weights"] == [0.5, 0.5]
    check_once_per_source_epoch(draws(got + after))


def test_a_schedule_changes_the_weights_at_its_global_count(local: Store) -> None:
    urls = write_corpora(local)
    at = 10 * BATCH * SEQ_LEN
    s = mixed(urls, local, schedule=[(at, {"web": 1, "code": 3})])
    got = []
    for batch in s:
        got.append(batch)
        if len(got) == 24:
            break
    sources = [name for name, _, _ in draws(got)]
    cut = 10 * BATCH
    assert deviation(sources[:cut], {"web": 3, "code": 1}) <= 1.0
    assert deviation(sources[cut:], {"web": 1, "code": 3}) <= 1.0
    s.close()


def test_rows_without_packing_are_drawn_one_document_at_a_time(local: Store) -> None:
    urls = write_corpora(local)
    s = ingest.Stream(
        ingest.Mix(urls, weights={"web": 2, "code": 1}),
        batch_size=8,
        shuffle_seed=2,
        storage_options=local.storage_options,
    )
    got = list(s)
    texts = [
        (NAMES[src], ep, t)
        for b in got
        for src, ep, t in zip(
            b["source"].tolist(), b["source_epoch"].tolist(), b["text"], strict=True
        )
    ]
    assert deviation([n for n, _, _ in texts], {"web": 2, "code": 1}) <= 1.0
    per = Counter((n, ep, t) for n, ep, t in texts)
    assert max(per.values()) == 1  # no row twice in an epoch of its source
    web = [t for n, ep, t in texts if n == "web" and ep == 0]
    assert len(web) == CORPORA["web"][1]  # web's first epoch whole: the mixture's epoch ends


def test_states_from_another_stream_or_mixture_are_refused(local: Store) -> None:
    urls = write_corpora(local)
    s = mixed(urls, local)
    next(iter(s))
    state = s.state_dict()
    one = ingest.Stream(urls["web"], storage_options=local.storage_options)
    with pytest.raises(StateError, match="several sources"):
        one.load_state_dict(state)
    with pytest.raises(StateError, match="not a mixture's"):
        mixed(urls, local).load_state_dict(one.state_dict())
    renamed = mixed({"web": urls["web"], "books": urls["code"]}, local, weights=None)
    with pytest.raises(StateError, match="sources"):
        renamed.load_state_dict(state)
    swapped = mixed({"code": urls["code"], "web": urls["web"]}, local)
    with pytest.raises(StateError, match="names"):  # the ties are ordered by the sources'
        swapped.load_state_dict(state)
    with pytest.raises(ConfigError, match="one weight per source"):
        ingest.Mix(urls, weights={"web": 1, "books": 1})
    s.close()


def test_a_dataloader_over_a_mix_draws_as_the_stream_through_stops_at_other_worker_counts(
    local: Store,
) -> None:
    """ingest.DataLoader over a mixed stream: a loader per source (its workers tokenize, the
    main process packs), the stream's draws; stopped twice and resumed with 1, then 3
    workers: the uninterrupted stream's sources in its order, every token once per epoch of
    its source (rows carried into the source's next epoch, there)."""
    urls = write_corpora(local)
    whole = draws(run(urls, local, (), epochs=1))
    got: list[dict[str, Any]] = []
    state = None
    for workers, stop in ((2, 9), (1, 20), (3, None)):
        s = mixed(urls, local)
        loader = ingest.DataLoader(s, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        for batch in loader:
            got.append(batch)
            if len(got) == stop:
                state = json.loads(json.dumps(loader.state_dict()))
                break
        s.close()
    seqs = draws(got)
    # The same sources in the same order (a source's epochs end elsewhere: its workers'
    # shares carry a remainder and the rows packed past their last common step).
    n = min(len(seqs), len(whole))
    assert [d[0] for d in seqs[:n]] == [d[0] for d in whole[:n]]
    check_carried(seqs, loader.state_dict())


@pytest.mark.parametrize("taken", [2, 0], ids=["begun", "not-begun"])
def test_a_state_refused_by_one_source_leaves_the_mixture_as_it_was(
    tmp_path: Any, taken: int
) -> None:
    """A mixture loads its sources' parts one after another: a part refused (its source
    changed since the state was saved) named neither the source nor undid the parts loaded
    before it. The stream went on with one source at the state's position and the other at
    its own, and its epoch lost rows and gave others twice. Now the refusal names the source
    and the stream goes on as if no state had been offered, as a one-source stream does:
    from its batches so far (``taken``), or, a mixture that had not begun, as a fresh one (a
    source that had not begun is put back by beginning it again: its state would list it,
    once more than the load does)."""
    for name, first in (("a", 0), ("b", 1000)):
        (tmp_path / name).mkdir()
        for k in range(2):
            table = pa.table({"id": list(range(first + k * 25, first + k * 25 + 25))})
            pq.write_table(table, tmp_path / name / f"{k}.parquet")

    def stream() -> Any:
        urls = {"web": str(tmp_path / "a"), "code": str(tmp_path / "b")}
        return ingest.Stream(ingest.Mix(urls, weights=None), batch_size=10, shuffle_seed=4)

    want = [b["id"].tolist() for b in stream()]
    other = iter(stream_ := stream())
    for _ in range(5):
        next(other)
    state = json.loads(json.dumps(stream_.state_dict()))
    s = stream()
    if taken:
        it = iter(s)
        got = [next(it)["id"].tolist() for _ in range(taken)]
    else:
        got = []
    shard = tmp_path / "b" / "1.parquet"
    kept, listed = shard.read_bytes(), shard.stat()
    pq.write_table(pa.table({"id": list(range(5000, 5030))}), shard)  # 'code' changed
    with pytest.raises(StateError, match=r"source 'code'.*changed"):
        s.load_state_dict(state)
    shard.write_bytes(kept)  # the version listed again: its bytes, and its mtime (a local
    os.utime(shard, ns=(listed.st_atime_ns, listed.st_mtime_ns))  # file's version), as a
    # backup's restore keeps them; with a new mtime, the stream's next read refuses it
    got += [b["id"].tolist() for b in s]
    assert got == want


def test_every_source_starts_reading_before_its_first_draw(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source's loop began when the mixer first drew from it: its listing and its first
    window's reads waited for the draws before, so a mixture of 4 sources on a store 50 ms
    away took 1.9 s to its first batch where one source took 0.45. Now every source of a
    weight above 0 is listed and starts reading as the epoch begins, side by side: here each
    source's first read waits until every source's has begun (a barrier; begun one after
    another, the first waits alone and fails). No row is handed out before it is drawn: each
    epoch of a source still has each of its rows once."""
    import threading

    from ingest.engine.lanes import LaneReader

    sources = {}
    for n, name in enumerate(("a", "b", "c", "d")):
        (tmp_path / name).mkdir()
        first = n * 1000
        pq.write_table(
            pa.table({"id": list(range(first, first + 40))}), tmp_path / name / "0.parquet"
        )
        sources[name] = str(tmp_path / name)
    barrier = threading.Barrier(4, timeout=15)
    read_ranges = LaneReader._read_ranges
    first_read: set[str] = set()
    lock = threading.Lock()

    def side_by_side(self: LaneReader, ctx: Any, shard: int, *args: Any) -> Any:
        url = ctx.shard.url
        with lock:
            new = url not in first_read
            first_read.add(url)
        if new:
            barrier.wait()  # every source's first read has begun
        yield from read_ranges(self, ctx, shard, *args)

    monkeypatch.setattr(LaneReader, "_read_ranges", side_by_side)
    stream = ingest.Stream(ingest.Mix(sources), batch_size=8, shuffle_seed=1)
    loop = iter(stream)
    batches = [next(loop)]
    assert len(first_read) == 4
    batches += list(loop)
    drawn = Counter(
        (source, epoch, i)
        for b in batches
        for source, epoch, i in zip(
            b["source"].tolist(), b["source_epoch"].tolist(), b["id"].tolist(), strict=True
        )
    )
    assert set(drawn.values()) == {1}, "a row twice in an epoch of its source"
    for n in range(4):  # every source's first epoch whole (the mixture's ends after them)
        assert {i for source, epoch, i in drawn if (source, epoch) == (n, 0)} == set(
            range(n * 1000, n * 1000 + 40)
        )


def test_a_state_loads_listing_each_source_once(s3: Any) -> None:
    """A mixture took each source's state before loading its part (to put it back if a later
    part is refused), and a stream that had not begun listed its source to say it: a resume
    listed every source twice, a listing's requests more per source than a fresh start
    (two sources on S3: 2 LISTs more). Now a source that has not begun is put back by
    beginning again, and a resume sends no more requests than a fresh start."""
    from ingest.tools.bench.proxy import CountingProxy

    url = s3.create_bucket("mix-load-once")
    fs = s3.filesystem()
    for n, name in enumerate(("web", "code")):
        for k in range(2):
            first = n * 1000 + k * 30
            table = pa.table({"id": list(range(first, first + 30))})
            with fs.open(f"{url}/{name}/{k}.parquet", "wb") as f:
                pq.write_table(table, f)
    with CountingProxy(s3.endpoint) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)

        def stream() -> Any:
            mix = ingest.Mix({name: f"{url}/{name}/" for name in ("web", "code")})
            return ingest.Stream(mix, batch_size=10, shuffle_seed=2, storage_options=options)

        def first_batch(state: dict[str, Any] | None) -> tuple[list[int], int]:
            before = proxy.counters()
            s = stream()
            if state is not None:
                s.load_state_dict(state)
            got = next(iter(s))["id"].tolist()
            s.close()
            return got, (proxy.counters() - before).requests

        whole = stream()
        loop = iter(whole)
        batches = [next(loop)["id"].tolist() for _ in range(2)]
        state = json.loads(json.dumps(whole.state_dict()))
        batches.append(next(loop)["id"].tolist())
        whole.close()
        _, fresh = first_batch(None)
        resumed, requests = first_batch(state)
    assert resumed == batches[2]
    assert requests <= fresh, f"a resume sent {requests} requests, a fresh start {fresh}"
