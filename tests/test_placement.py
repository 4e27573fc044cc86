"""Where batches are put: ``pin_memory`` and ``device`` reach every kind of batch (plain rows,
packed sequences, a mixture of rows, a mixture of packed sequences) on a Ray rank
(``RankOptions``) and in ``ingest.DataLoader`` (torch's ``pin_memory=``), through the one
conversion a batch goes through as it leaves its rank (:func:`ingest.engine.convert.placed`).

Pinning needs an accelerator, which this project's test machine lacks: torch's CPU build
refuses to pin (``Tensor.pin_memory()`` raises "Cannot access accelerator device when none
is available"). There the ``pinned`` fixture makes the test process look like a CUDA machine
(``torch.cuda.is_available``, ``torch.accelerator``) and stands in for ``Tensor.pin_memory``
with a copy it records: a tensor counts as pinned if it is one of those copies, so a tensor
that skipped the pinning step, or was made after it (a mixture's join), shows. With a real
accelerator, the fixture changes nothing and asks ``is_pinned()``. The conversion runs in the
test process in every test here (a ``DataLoader``'s main process; a Ray rank iterated on the
driver), so the stand-in is the one called.

``device``: a ``torch.device("meta")`` (which every torch build has) must reach every tensor
of every batch; a tensor left on the CPU shows.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import torch

import ingest
from ingest.engine.convert import placed
from ingest.testing import Store
from tests.test_pack_stream import lengths, tokenize

KINDS = ["plain", "packed", "mixed", "mixed_packed"]
SEQ_LEN, READ_ROWS = 32, 8
KEYS = {  # a tensor each kind's batches must carry (the rest are checked with it)
    "plain": "doc",
    "packed": "input_ids",
    "mixed": "source",
    "mixed_packed": "input_ids",
}


def write(store: Store, name: str, first: int, count: int) -> str:
    """``count`` documents ``{"doc": d, "text": "<d> <k>"}`` from ``d = first`` (``k`` tokens,
    see ``test_pack_stream``) as 2 JSONL shards under ``name/``; their glob."""
    docs = list(zip(range(first, first + count), lengths(count, seed=first), strict=True))
    half = count // 2
    for s, part in enumerate((docs[:half], docs[half:])):
        lines = [json.dumps({"doc": d, "text": f"{d} {k}"}) for d, k in part]
        store.write(f"{name}/part-{s}.jsonl", ("\n".join(lines) + "\n").encode())
    return store.url(f"{name}/*.jsonl")


def source(kind: str, store: Store) -> tuple[Any, dict[str, Any]]:
    """A small stream of ``kind``: what it reads, and the options a ``Stream`` and a
    ``RayStream`` share."""
    options: dict[str, Any] = {"batch_size": 4, "storage_options": store.storage_options}
    if kind.endswith("packed"):
        options["transform"] = ingest.Tokenize(tokenize)
        options["pack"] = ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=4, pad_id=0)
    if kind.startswith("mixed"):
        urls = {"a": write(store, "a", 0, 48), "b": write(store, "b", 100_000, 32)}
        return ingest.Mix(urls, weights={"a": 2, "b": 1}), options
    return write(store, "docs", 0, 48), options


def tensors(batches: Iterable[dict[str, Any]], kind: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``batches`` with its key; ``kind``'s batches must carry some."""
    seen = 0
    for batch in batches:
        assert isinstance(batch[KEYS[kind]], torch.Tensor), sorted(batch)
        seen += 1
        yield from ((k, v) for k, v in batch.items() if isinstance(v, torch.Tensor))
    assert seen >= 2, f"{seen} batch(es) of {kind}: too few to show anything"


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor was pinned (see the module docstring for the stand-in)."""
    if torch.accelerator.is_available():
        return lambda t: bool(t.is_pinned())
    copies: list[torch.Tensor] = []

    def pin(self: torch.Tensor, *args: Any) -> torch.Tensor:
        copy = self.clone()
        copies.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: cuda)
    # torch's DataLoader pins too, on a thread of its own that sets the device first.
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    return lambda t: any(t is c for c in copies)


def test_placed_moves_every_tensor_to_a_device_given_as_a_string_or_a_torch_device() -> None:
    batch = {"a": torch.arange(3), "b": ["x", "y", "z"], "n": 3}
    for device in ("meta", torch.device("meta")):
        out = placed(batch, pin_memory=False, device=device)
        assert out["a"].device.type == "meta" and out["b"] == ["x", "y", "z"] and out["n"] == 3
    assert placed(batch, pin_memory=False, device=None) is batch


def test_placed_pins_nothing_without_an_accelerator() -> None:
    """Torch's CPU build cannot pin: ``pin_memory=True`` leaves the batch as it is there (as
    torch's own ``DataLoader`` does), and ``device`` still applies."""
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    batch = {"a": torch.arange(3)}
    assert placed(batch, pin_memory=True, device=None)["a"] is batch["a"]
    assert placed(batch, pin_memory=True, device="meta")["a"].device.type == "meta"


# -- DataLoader --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_a_dataloader_pins_every_kind_of_batch(
    kind: str, workers: int, local: Store, pinned: Callable[[torch.Tensor], bool]
) -> None:
    """``DataLoader(pin_memory=True)``: every tensor of plain, packed and mixed batches is
    pinned (before, a packed batch was not, nor a mixture's join of pinned draws)."""
    url, options = source(kind, local)
    stream = ingest.Stream(url, **options)
    with warnings.catch_warnings():  # torch's, when no accelerator is found (not faked)
        warnings.filterwarnings("ignore", message=".*no accelerator is found")
        loader = ingest.DataLoader(stream, num_workers=workers, pin_memory=True)
        try:
            got = list(loader)
        finally:
            loader.close()
            stream.close()
    assert [k for k, t in tensors(got, kind) if not pinned(t)] == []


# -- Ray ranks ---------------------------------------------------------------------------------


def _rank_batches(kind: str, store: Store, options: ingest.RankOptions) -> list[dict[str, Any]]:
    """One epoch of rank 0 of a 1-rank ``RayStream`` of ``kind``, iterated here."""
    url, kw = source(kind, store)
    pool = ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5)
    with ingest.RayStream(url, world_size=1, readers=pool, timeout_s=60, **kw) as stream:
        return list(stream.rank_iterator(0, options=options))


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("kind", KINDS)
def test_a_ray_rank_pins_every_kind_of_batch(
    kind: str, local: Store, pinned: Callable[[torch.Tensor], bool]
) -> None:
    """``RankOptions(pin_memory=True)``: every tensor of plain, packed and mixed batches is
    pinned (before, a packed batch was handed out as packed, and a mixture joined pinned
    draws into tensors that were not)."""
    got = _rank_batches(kind, local, ingest.RankOptions(pin_memory=True, timeout_s=60))
    assert [k for k, t in tensors(got, kind) if not pinned(t)] == []


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("kind", KINDS)
def test_a_ray_rank_puts_every_kind_of_batch_on_its_device(kind: str, local: Store) -> None:
    """``RankOptions(device=...)``, a ``torch.device`` (as ``ray.train.torch.get_device()``
    gives): every tensor of plain, packed and mixed batches is on it (before, a packed batch
    stayed on the CPU, and a mixture's ``source`` columns were made there after its draws
    were moved)."""
    options = ingest.RankOptions(device=torch.device("meta"), timeout_s=60)
    got = _rank_batches(kind, local, options)
    assert [k for k, t in tensors(got, kind) if t.device.type != "meta"] == []
