"""Every error of the package survives pickling whole: it crosses threads, actors and tasks."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

import ingest
from ingest.core.errors import (
    IngestError,
    LocationError,
    SchemaMismatchError,
    ShardError,
    SourceError,
    StoreError,
)
from ingest.distributed.coordinator import CoordinatorLostError, StaleSessionError
from ingest.engine.decoders import UndecodedMemberError
from ingest.engine.derived.codec import CorruptDerivedError
from ingest.engine.derived.copies import DerivedStoreError
from ingest.engine.derived.prepare import PrepareError
from ingest.engine.provenance import ProvenanceError
from ingest.engine.stage import RowError
from ingest.formats._lines import LineTooLongError
from ingest.planner.index import IndexStoreError
from ingest.testing import write_dataset

URL = "s3://key:secret@bucket/part-00002.parquet"


def _subclasses(cls: type[IngestError]) -> set[type[IngestError]]:
    """The error classes of this package below ``cls`` (Ray makes subclasses of an error
    raised in a task, ``RayTaskError(ShardError)``, in whatever test ran one first)."""
    found = {cls}
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("ingest."):
            found |= _subclasses(sub)
    return found


EXAMPLES: list[IngestError] = [
    IngestError("plain"),
    ingest.ConfigError("batch_size=0 is not positive"),
    SourceError(URL, "disappeared after it was listed", "restore the object"),
    ingest.NoShardsError(URL, "matches no data files", "check the glob"),
    ShardError(URL, "truncated", "rewrite the shard", row=7, line=8, byte=9),
    SchemaMismatchError(URL, "column id is string", "cast it", row=3),
    StoreError(URL, "read of bytes [0, 9) failed after 5 retries", "check the store", byte=0),
    LineTooLongError(URL, "line over 64 MiB", "raise max_line_bytes", byte=1 << 20),
    ingest.StateError("saved for another dataset"),
    ingest.StreamTimeoutError("no batch in 60 s"),
    CoordinatorLostError(RuntimeError("actor died\nmore detail")),
    StaleSessionError("session 3 was replaced"),
    ingest.SupersededError.of_rank(2),
    IndexStoreError("s3://bucket/index", "forbidden", "grant write access"),
    RowError(3, "the tokenizer's id 2147483653 is out of range", "return the vocabulary's ids"),
    UndecodedMemberError(1, "k1.png", "cannot be decoded as an image", "replace the file"),
    CorruptDerivedError("1000 bytes where its header says 1200"),
    DerivedStoreError("s3://key:secret@bucket/derived/", "forbidden", "grant write access"),
    PrepareError(f"{URL} rows [0, 4096): the chain raised ValueError: bad text"),
    ProvenanceError("s3://key:secret@bucket/run/prov/", "no attempt is recorded there", "fix"),
    LocationError("s3://key:secret@bucket/store/", "forbidden", "grant read access"),
]


def test_the_examples_cover_every_error_class() -> None:
    missing = _subclasses(IngestError) - {type(e) for e in EXAMPLES}
    assert not missing, f"add an example of {sorted(c.__name__ for c in missing)}"


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_pickles_to_the_same_class_message_and_fields(error: IngestError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)
    assert "secret" not in str(back)


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_raised_in_a_ray_worker_reaches_the_rank_as_its_own_class(
    error: IngestError,
) -> None:
    # Ray rethrows a remote error as a class that derives from both RayTaskError and the
    # error's class ("RayTaskError(CoordinatorLostError)"); the rank raises the error itself.
    from ray.exceptions import RayTaskError

    from ingest.distributed.rank import unwrap

    wrapped = RayTaskError("read", "Traceback ...", error).as_instanceof_cause()
    assert isinstance(wrapped, type(error)) and type(wrapped) is not type(error)
    got = unwrap(wrapped)
    assert type(got) is type(error) and str(got) == str(error)
    outer = RayTaskError("next_batch", "Traceback ...", wrapped)
    assert type(unwrap(outer)) is type(error)


class _NeedsAVocabulary:
    """A class transform whose constructor fails (a tokenizer whose files are missing)."""

    def __init__(self) -> None:
        raise OSError("vocab.json not found")

    def __call__(self, table: Any) -> Any:
        return table


INIT_RAISED = (
    r"transform=_NeedsAVocabulary: building it \(_NeedsAVocabulary\(\)\) raised "
    r"OSError: vocab\.json not found; "
)


def test_a_class_transform_whose_init_raises_is_a_config_error_naming_it(tmp_path: Path) -> None:
    url = str(tmp_path)
    write_dataset(fsspec.filesystem("file"), url, "parquet", 1, 100)
    with pytest.raises(ingest.ConfigError, match=INIT_RAISED) as info:
        ingest.Stream(url, batch_size=10, transform=_NeedsAVocabulary)
    assert isinstance(info.value.__cause__, OSError), "the original error is chained"


@pytest.mark.usefixtures("ray_session")
def test_a_class_transform_whose_init_raises_in_the_pool_reaches_the_rank_clearly(
    tmp_path: Path,
) -> None:
    """Issue 17: the rank saw a bare ActorDiedError."""
    url = str(tmp_path)
    write_dataset(fsspec.filesystem("file"), url, "parquet", 2, 100)
    with ingest.RayStream(url, batch_size=10, transform=_NeedsAVocabulary, timeout_s=60) as rs:
        started = time.monotonic()
        with pytest.raises(ingest.ConfigError, match=INIT_RAISED + "fix the class"):
            next(iter(rs.rank_iterator(0)))
        assert time.monotonic() - started < 30, "at once, not after a timeout"
