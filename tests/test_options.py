"""Options are checked when they are made (issue 17, "Exactly once at the edges").

A value that cannot work is a ConfigError naming the option, the value, the rule and the
fix, raised by the config's constructor: not a wait of ``timeout_s`` blamed on CPUs or the
store (``fetch_batches=0``), a bare ``GetTimeoutError`` (``timeout_s=-1``), a bare
``TypeError`` from a reader (``batch_size=2.5``) or ``ValueError`` from ``time.sleep``
(``poll_s=nan``), or a value accepted that hangs (``idle_timeout_s=inf``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

import ingest
from ingest.engine.spec import StreamSpec
from ingest.testing import Store, write_dataset

NAN, INF = math.nan, math.inf

CASES: list[tuple[Any, dict[str, Any], str]] = [
    # RankOptions: the rank iterator's knobs
    (ingest.RankOptions, {"fetch_batches": 0}, r"RankOptions\(fetch_batches=0\) must be >= 1"),
    (ingest.RankOptions, {"fetch_batches": 2.0}, r"fetch_batches=2\.0\) .*whole number"),
    (ingest.RankOptions, {"ack_every": 0}, r"RankOptions\(ack_every=0\) must be >= 1"),
    (ingest.RankOptions, {"timeout_s": -1}, r"RankOptions\(timeout_s=-1\) must be > 0 seconds"),
    (ingest.RankOptions, {"timeout_s": NAN}, r"RankOptions\(timeout_s=nan\) .*not finite"),
    (ingest.RankOptions, {"timeout_s": INF}, r"RankOptions\(timeout_s=inf\) .*not finite"),
    (ingest.RankOptions, {"timeout_s": "300"}, r"RankOptions\(timeout_s='300'\) .*got str"),
    # Follow
    (ingest.Follow, {"poll_s": NAN}, r"Follow\(poll_s=nan\) must be > 0 seconds, a finite"),
    (ingest.Follow, {"poll_s": 0}, r"Follow\(poll_s=0\) must be > 0 seconds"),
    (ingest.Follow, {"idle_timeout_s": INF}, r"Follow\(idle_timeout_s=inf\) must be >= 0 sec"),
    (ingest.Follow, {"idle_timeout_s": -1.0}, r"Follow\(idle_timeout_s=-1\.0\) must be >= 0"),
    (ingest.Follow, {"idle_timeout_s": True}, r"Follow\(idle_timeout_s=True\) .*got a bool"),
    (ingest.Follow, {"manifest": ""}, r"Follow\(manifest=''\) names no file"),
    (ingest.Follow, {"manifest": "  "}, r"Follow\(manifest='  '\) names no file"),
    (ingest.Follow, {"manifest": 7}, r"Follow\(manifest=7\) names no file"),
    # ReadOptions
    (ingest.ReadOptions, {"timeout_s": NAN}, r"timeout_s=nan must be > 0 seconds"),
    (ingest.ReadOptions, {"timeout_s": 0}, r"timeout_s=0 must be > 0 seconds"),
    (ingest.ReadOptions, {"prefetch": True}, r"prefetch=True must be >= 0.*got a bool"),
    (ingest.ReadOptions, {"batch_rows": 10.5}, r"batch_rows=10\.5 must be >= 1, a whole"),
    (ingest.ReadOptions, {"max_errors": -1}, r"max_errors=-1 must be >= 0"),
    (ingest.ReadOptions, {"block_bytes": "8M"}, r"block_bytes='8M' must be .*got str"),
    (ingest.ReadOptions, {"max_line_bytes": 100}, r"max_line_bytes=100 is below 1024"),
    (ingest.ReadOptions, {"file_concurrency": 0}, r"file_concurrency=0 must be >= 1"),
    # Shuffle
    (ingest.Shuffle, {"window": NAN}, r"^Shuffle\(window=nan\) must be >= 1, a whole number"),
    (ingest.Shuffle, {"lanes": 0}, r"^Shuffle\(lanes=0\) must be >= 1"),
    (ingest.Shuffle, {"bytes": 0}, r"^Shuffle\(bytes=0\) must be >= 1 bytes"),
]


@pytest.mark.parametrize(("config", "kwargs", "pattern"), CASES)
def test_a_bad_option_is_refused_when_made(
    config: Any, kwargs: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ingest.ConfigError, match=pattern) as info:
        config(**kwargs)
    name = next(iter(kwargs))
    if name not in ("manifest", "seed"):
        assert "the default" in str(info.value), "the message names the fix"


SPEC_CASES: list[tuple[dict[str, Any], str]] = [
    ({"batch_size": 2.5}, r"^batch_size=2\.5 must be >= 1, a whole number \(got float\)"),
    ({"batch_size": 0}, r"^batch_size=0 must be >= 1"),
    ({"batch_size": True}, r"^batch_size=True must be >= 1.*got a bool"),
    ({"shuffle_window": NAN}, r"^shuffle_window=nan must be >= 1, a whole number"),
    ({"shuffle_lanes": 0}, r"^shuffle_lanes=0 must be >= 1"),
]


@pytest.mark.parametrize(("kwargs", "pattern"), SPEC_CASES)
def test_a_bad_stream_option_is_refused_before_anything_is_read(
    local: Store, kwargs: dict[str, Any], pattern: str
) -> None:
    url = local.url("d")
    write_dataset(local.fs, url, "parquet", 1, 100)
    with pytest.raises(ingest.ConfigError, match=pattern):
        ingest.Stream(url, **kwargs)
    if "batch_size" in kwargs:  # the shuffle's numbers are a Shuffle's (CASES)
        with pytest.raises(ingest.ConfigError, match=pattern):
            StreamSpec(urls=(url,), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (
            {"read": {"prefetch": 2}},
            r"^read=\{'prefetch': 2\} \(dict\) is not an ingest\.ReadOptions",
        ),
        (
            {"read": ingest.CacheOptions("/tmp/x", max_bytes=1)},
            r"^read=.* \(CacheOptions\) is not an ingest\.ReadOptions",
        ),
        ({"follow": {"poll_s": 1}}, r"^follow=.* \(dict\) is not an ingest\.Follow"),
        ({"pack": "x"}, r"^pack='x' \(str\) is not an ingest\.Pack or ingest\.TokenBatches"),
        ({"shuffle": 3}, r"^shuffle=3 \(int\) is not an ingest\.Shuffle"),
        ({"storage_options": [1]}, r"^storage_options=\[1\] \(list\) is not a mapping"),
    ],
)
def test_an_option_of_the_wrong_kind_is_named(
    local: Store, kwargs: dict[str, Any], pattern: str
) -> None:
    """An option object of another kind (a dict for ReadOptions, a CacheOptions passed as
    read=) was a bare AttributeError or TypeError from deep inside, naming no option. Found
    by a probe."""
    url = local.url("d")
    write_dataset(local.fs, url, "parquet", 1, 100)
    with pytest.raises(ingest.ConfigError, match=pattern):
        ingest.Stream(url, **kwargs)


def test_a_shuffle_is_one_config_and_the_keywords_still_make_it(local: Store) -> None:
    """Issue 33, item 4: the order's settings are one frozen ``Shuffle``, taken by every
    stream; the ``shuffle_*`` keywords make the same one; both at once are refused, naming
    both; a bad seed is named as passed."""
    url = local.url("d")
    write_dataset(local.fs, url, "parquet", 2, 100)
    by_config = ingest.Stream(url, batch_size=10, shuffle=ingest.Shuffle(seed=3, window=64))
    by_keywords = ingest.Stream(url, batch_size=10, shuffle_seed=3, shuffle_window=64)
    assert by_config.spec.shuffle == by_keywords.spec.shuffle == ingest.Shuffle(seed=3, window=64)
    assert [b["id"].tolist() for b in by_config] == [b["id"].tolist() for b in by_keywords]
    with pytest.raises(ingest.ConfigError, match=r"shuffle=Shuffle\(.*and shuffle_seed=1 both"):
        ingest.Stream(url, shuffle=ingest.Shuffle(seed=3), shuffle_seed=1)
    with pytest.raises(ingest.ConfigError, match=r"^shuffle_seed=-1 must be a non-negative"):
        ingest.Stream(url, shuffle_seed=-1)
    with pytest.raises(ingest.ConfigError, match=r"^Shuffle\(seed=-1\) must be a non-negative"):
        ingest.Shuffle(seed=-1)
    # The keywords both streams take are typed once (StreamKeywords): one misspelt is
    # refused as Python refuses it, naming the stream, before anything starts.
    with pytest.raises(TypeError, match=r"^Stream\(\) got an unexpected keyword .*'batch_sise'"):
        ingest.Stream(url, batch_sise=10)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^RayStream\(\) got an unexpected keyword .*'shuffle_sed'"
    ):
        ingest.RayStream(url, shuffle_sed=1)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ingest.Shuffle().seed = 1  # type: ignore[misc]


def test_good_values_of_every_numeric_kind_are_taken() -> None:
    two: Any = np.int64(2)  # numpy scalars, as read from a config file or computed
    half: Any = np.float32(0.5)
    assert ingest.RankOptions(fetch_batches=two, timeout_s=half).timeout_s == 0.5
    assert ingest.Follow(poll_s=1, idle_timeout_s=0, manifest="s3://b/_MANIFEST").poll_s == 1
    assert ingest.ReadOptions(prefetch=0, timeout_s=5).prefetch == 0
    assert StreamSpec(urls=("s3://b/d/",), batch_size=two).batch_size == 2
