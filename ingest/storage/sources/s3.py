"""The S3 filesystem of a source: one attempt per call, and no sleep after it.

A source retries S3 requests itself, under one deadline (:class:`RetryPolicy`), so its S3
filesystems make one attempt per call (``retries = 1``; botocore's own retries are off in
their ``config_kwargs``). s3fs's retry loop (``s3fs.core._error_wrapper``) still sleeps
0.1 s after a failed attempt before it checks whether another follows, so with one attempt
every transient fault cost that sleep on top of the source's own backoff: 0.13 s per failed
call, two thirds of the cost of faults in benchmarks/storage_faults.py. There is no option
for it.

:class:`OneAttemptS3FileSystem` and :class:`OneAttemptS3File` are s3fs's classes whose
functions that call ``_error_wrapper`` (directly, or through s3fs's ``_fetch_range`` and
``_inner_fetch``, or by opening an ``S3File``) run s3fs's own code against a copy of
``s3fs.core``'s globals in which ``_error_wrapper`` is :func:`_error_wrapper` here: for
``retries == 1`` it makes the attempt and raises what s3fs would (its
``translate_boto_error``); every other case is s3fs's. Only the filesystems a source makes
are of these classes. Nothing of s3fs is changed and nothing is registered with fsspec, so a
user's own ``s3fs.S3FileSystem`` in the same process is stock s3fs.
"""

from __future__ import annotations

import os
import threading
import types
from collections.abc import Mapping
from typing import Any, ClassVar

import s3fs
import s3fs.core
from aiobotocore.session import AioSession  # type: ignore[import-untyped]
from fsspec.asyn import sync_wrapper
from fsspec.core import url_to_fs
from s3fs.core import version_id_kw
from s3fs.errors import translate_boto_error

_stock_error_wrapper = s3fs.core._error_wrapper


async def _error_wrapper(
    func: Any, *, args: tuple[Any, ...] = (), kwargs: Any = None, retries: int
) -> Any:
    """s3fs's ``_error_wrapper`` that, for ``retries == 1``, raises at once when the attempt
    fails."""
    if retries != 1:
        return await _stock_error_wrapper(func, args=args, kwargs=kwargs, retries=retries)
    try:
        return await func(*args, **(kwargs or {}))
    except Exception as e:
        failed = e
    if "'coroutine'" in str(failed):  # an aiobotocore internal error: s3fs digs it out

        async def again() -> Any:
            raise failed

        return await _stock_error_wrapper(again, retries=1)
    # translate_boto_error sets the boto error as the cause: its response carries the
    # status and Retry-After that the source's retries read, so the chain must stay (no
    # ``from``).
    raise translate_boto_error(failed)


_NAMESPACE: dict[str, Any] = dict(vars(s3fs.core))
"""The globals the rebound functions see: ``s3fs.core``'s (a copy, taken at import), with
``_error_wrapper``, ``_fetch_range``, ``_inner_fetch`` and ``S3File`` the ones here."""


def _rebound(function: Any) -> Any:
    """s3fs's ``function``, the same code run against :data:`_NAMESPACE`."""
    copy = types.FunctionType(
        function.__code__,
        _NAMESPACE,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    copy.__doc__ = function.__doc__
    return copy


_NAMESPACE["_error_wrapper"] = _error_wrapper
_NAMESPACE["_inner_fetch"] = _rebound(s3fs.core._inner_fetch)
_NAMESPACE["_fetch_range"] = _rebound(s3fs.core._fetch_range)


class OneAttemptS3File(s3fs.core.S3File):  # type: ignore[misc]
    """An s3fs file whose range reads raise at once when their one attempt fails."""

    _fetch_range = _rebound(s3fs.core.S3File._fetch_range)


_NAMESPACE["S3File"] = OneAttemptS3File


class SharedModelsSession(AioSession):  # type: ignore[misc]
    """An aiobotocore session whose data loader (botocore's parsed service models and
    endpoint rules) is the one of every such session of the process with the same data
    path: the rest (credentials, config) is its own.

    Each new session loaded them again for its client: 36,000 objects and 0.04 s of CPU
    per S3 filesystem, a new one per stream where the storage options say
    ``skip_instance_cache``. Dropped with the stream, they are cyclic garbage that only a
    full collection of Python's garbage collector frees, and walks; with them, such a
    collection took 0.3-0.8 s, at the first batch of a resume whose plan made enough
    objects to start one (``benchmarks/resume.py``, ``DataLoader(2) -> Stream`` at batch 24:
    1.7-2.7x a fresh epoch's first batch). The loaded files are read-only data."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = self.get_config_variable("data_path")
        with _Loaders.lock:
            loader = _Loaders.by_path.get(path)
            if loader is None:
                loader = _Loaders.by_path[path] = self.get_component("data_loader")
        self.register_component("data_loader", loader)


class _Loaders:
    """The shared botocore data loader per data path (see :class:`SharedModelsSession`)."""

    by_path: ClassVar[dict[Any, Any]] = {}
    lock = threading.Lock()


def _new_loaders_lock() -> None:
    """A forked child's own lock (the parent's may be held by a thread the child lacks)."""
    _Loaders.lock = threading.Lock()


os.register_at_fork(after_in_child=_new_loaders_lock)


async def _cat_file_of_version(
    self: Any,
    path: str,
    version_id: str | None = None,
    start: int | None = None,
    end: int | None = None,
    if_match: str | None = None,
    **kwargs: Any,
) -> bytes:
    """s3fs's ``_cat_file``; with ``if_match`` (an ETag: ``cat_ranges(..., if_match=)`` hands
    it to each range), a ranged GET of that version only: S3 refuses it (412, an ``OSError``
    here) where the object changed. s3fs's takes no request options. Run against
    :data:`_NAMESPACE` (:func:`_rebound`), as s3fs's functions are."""
    if if_match is None or (start is None and end is None):
        return await self._cat_whole(path, version_id, start, end, **kwargs)  # type: ignore[no-any-return]
    bucket, key, vers = self.split_path(path)
    limits = await self._process_limits(path, start, end)

    async def read() -> bytes:
        resp = await self._call_s3(
            "get_object",
            Bucket=bucket,
            Key=key,
            Range=limits,
            IfMatch=if_match,
            **version_id_kw(version_id or vers),
        )
        try:
            return await resp["Body"].read()  # type: ignore[no-any-return]
        finally:
            resp["Body"].close()

    return await _error_wrapper(read, retries=self.retries)  # type: ignore[no-any-return]


class OneAttemptS3FileSystem(s3fs.S3FileSystem):  # type: ignore[misc]
    """An s3fs filesystem that makes one attempt per call and raises at once when it fails:
    every request (``_call_s3``), whole and ranged reads (``_cat_file``, ``cat_ranges``) and
    the reads of the files it opens (:class:`OneAttemptS3File`). Its session, unless the
    storage options give one, is a :class:`SharedModelsSession`."""

    retries = 1  # s3fs's own retry loop: the source retries instead
    reads_a_version = True
    """Its range reads take the ETag of the version to read (``cat_ranges(...,
    if_match=)``), and a shard's copy is checked against the listed ETag
    (:func:`~ingest.storage.sources.cached.fetch_whole`): what a stock s3fs does not."""
    session: Any
    _call_s3 = _rebound(s3fs.S3FileSystem._call_s3)
    call_s3 = sync_wrapper(_call_s3)
    _cat_whole = _rebound(s3fs.S3FileSystem._cat_file)
    _cat_file = _rebound(_cat_file_of_version)
    _open = _rebound(s3fs.S3FileSystem._open)

    async def set_session(self, refresh: bool = False, kwargs: Any = None) -> Any:
        """s3fs's, with a :class:`SharedModelsSession` made first where s3fs would make its
        own session (none given): s3fs still owns it, and makes a stock one on a refresh."""
        if self.session is None:
            self.session = SharedModelsSession(**self.kwargs)
        return await super().set_session(refresh=refresh, kwargs=kwargs or {})

    connect = sync_wrapper(set_session)


def s3_filesystem(url: str, options: Mapping[str, Any]) -> OneAttemptS3FileSystem:
    """A :class:`OneAttemptS3FileSystem` for ``url``, made with the arguments fsspec would
    give s3fs for that URL and ``options`` (``url_to_fs`` works them out on a throwaway s3fs
    instance that no cache keeps). fsspec caches it as it would s3fs's, unless ``options``
    say ``skip_instance_cache``, in a cache of its own: never one of the user's instances."""
    stock, _ = url_to_fs(url, **{**options, "skip_instance_cache": True})
    skip = bool(options.get("skip_instance_cache", False))
    return OneAttemptS3FileSystem(
        *stock.storage_args, **stock.storage_options, skip_instance_cache=skip
    )
