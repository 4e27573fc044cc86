"""Retries under one deadline: :class:`RetryPolicy`, the attempts it allows, and the error a
request that still failed becomes (the shard is gone, or the store did not answer)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ingest.core.errors import ConfigError, SourceError, StoreError
from ingest.storage.sources.faults import (
    changed_answer,
    is_changed,
    is_not_found,
    is_store_error,
    is_transient,
    missing_credentials,
    refused_connection,
    retry_after,
    server_answer,
)
from ingest.storage.sources.stats import IOStats

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a source retries what the store gets wrong: one deadline per request.

    A request (a listing, an open, one read, one batch of range reads) is tried again after
    a transient fault (503 SlowDown, 500, 429, a dropped or refused connection, a body cut
    short, a timeout) until it succeeds or ``deadline_s`` has passed since its first
    attempt. Waits between attempts grow exponentially with jitter, or follow the store's
    ``Retry-After``.
    This is the only retry layer: botocore's and s3fs's own retries are turned off, so
    retries never stack. Each S3 or HTTP attempt waits at most ``connect_timeout_s`` to
    connect and ``read_timeout_s`` for the next bytes (unless ``storage_options`` set them),
    so a request that keeps failing, or an endpoint that accepts connections and never
    answers, fails within ``deadline_s + read_timeout_s``: 30 s with the defaults; a refused
    connection is reported as one, naming the endpoint. Missing objects (S3's NoSuchKey, an
    HTTP 404 or 410), refused credentials and a full local disk (the shard cache's) fail at
    once; local files are not retried.

    Attributes:
        deadline_s: No new attempt starts this long after the first.
        connect_timeout_s: Longest wait for a connection (S3, HTTP).
        read_timeout_s: Longest wait for the next bytes of a response (S3, HTTP).
        backoff_s: The most to wait before the first retry; doubled for each retry after
            it. The wait is a uniform draw between 0 and that ("full jitter", as the AWS
            SDKs do: clients that failed together do not retry together, and a lone fault
            costs half the bound on average).
        max_backoff_s: Longest wait between two attempts, Retry-After aside.
    """

    deadline_s: float = 20.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("deadline_s", "connect_timeout_s", "read_timeout_s", "max_backoff_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0 seconds")
        if not 0 < self.backoff_s <= self.max_backoff_s:
            raise ConfigError(
                f"backoff_s={self.backoff_s} must be > 0 and <= max_backoff_s={self.max_backoff_s}"
            )

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based), jittered."""
        cap = min(self.max_backoff_s, self.backoff_s * 2.0 ** min(retry, 30))
        return random.uniform(0.0, cap)


class GaveUpError(Exception):
    """A request still failed at its deadline (or failed for good): what the caller reports."""

    def __init__(self, last: BaseException, retries: int, elapsed: float) -> None:
        super().__init__(str(last))
        self.last = last
        self.retries = retries
        self.elapsed = elapsed

    def describe(self, scrub: Callable[[str], str]) -> str:
        """``"after N retries in S s: Error: message"``."""
        return (
            f"after {self.retries} retries in {self.elapsed:.1f} s: "
            f"{type(self.last).__name__}: {scrub(str(self.last))}"
        )


def _vanished(url: str, gave_up: GaveUpError) -> SourceError | None:
    """The error for a listed object that is gone or changed, if that is why a request
    failed: a ``FileNotFoundError`` (S3's NoSuchKey), an HTTP 404 or 410 (an HTTP server,
    the Hub), or a read of the version listed refused (:func:`is_changed`)."""
    if is_changed(gave_up.last):
        found = changed_answer(gave_up.last)
        why = found or "the store refused a read of the version listed, its ETag"
        return SourceError(
            url,
            f"changed after it was listed ({why}): its rows would mix two versions",
            "the dataset changed under the stream; restart the epoch (its listing takes the "
            "new version) or restore the object",
        )
    if not is_not_found(gave_up.last):
        return None
    return SourceError(
        url,
        "disappeared after it was listed",
        "the dataset changed under the stream; restart the epoch or restore the object",
    )


REFUSED_FIX = (
    "check that the store runs at that address and port, and the endpoint in storage_options "
    "(client_kwargs.endpoint_url for S3, endpoint for the Hub) or in the URL"
)
"""The fix named when the store's endpoint refused the connection."""


DENIED_FIX = (
    "let these credentials read the objects (s3:GetObject on S3, storage.objects.get on "
    "GCS; a bucket policy may allow listing and not reading), or use credentials that may "
    "(storage_options or the environment; on Ray, the reader nodes' too); not retried"
)


def store_error(
    url: str,
    what: str,
    gave_up: GaveUpError,
    fix: str,
    *,
    endpoint: str,
    scrub: Callable[[str], str],
    byte: int = 0,
) -> SourceError | StoreError:
    """The error of a shard request that still failed at the retry deadline: the shard is
    gone (:class:`SourceError`), or the store did not answer (:class:`StoreError`), saying so
    when the endpoint refused the connection."""
    gone = _vanished(url, gave_up)
    if gone is not None:
        return gone
    if refused_connection(gave_up.last) is not None:
        what, fix = f"{what}: the endpoint {endpoint} refused the connection", REFUSED_FIX
    credentials = missing_credentials(gave_up.last)
    if credentials is not None:
        what, fix = f"{what}: no credentials for the store", credentials
    answered = server_answer(url, gave_up.last)
    if answered is not None:
        what, fix = f"{what}: {answered[0]}", answered[1]
    elif isinstance(gave_up.last, PermissionError):  # s3fs and gcsfs: a 403 on this object
        what, fix = f"{what}: access denied", DENIED_FIX
    return StoreError(url, f"{what} {gave_up.describe(scrub)}", fix, byte=byte)


def attempt(call: Callable[[], _T], policy: RetryPolicy | None, stats: IOStats | None) -> _T:
    """Run ``call`` until it succeeds, retrying transient store faults under one deadline.

    Raises:
        GaveUpError: If it failed for good, or still failed when the next attempt would start
            past the deadline (``policy`` None: no retries).
        Exception: Whatever ``call`` raised that is not a store error.
    """
    start = time.monotonic()
    retries = 0
    while True:
        try:
            return call()
        except Exception as e:
            if not is_store_error(e):
                raise
            elapsed = time.monotonic() - start
            if policy is None or not is_transient(e):
                raise GaveUpError(e, retries, elapsed) from e
            wait = retry_after(e)
            wait = policy.backoff(retries) if wait is None else wait
            if elapsed + wait >= policy.deadline_s:
                raise GaveUpError(e, retries, elapsed) from e
            retries += 1
            if stats is not None:
                stats.add(retries=1)
            time.sleep(wait)
