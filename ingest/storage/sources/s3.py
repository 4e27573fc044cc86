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

import types
from collections.abc import Mapping
from typing import Any

import s3fs
import s3fs.core
from fsspec.asyn import sync_wrapper
from fsspec.core import url_to_fs
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


class OneAttemptS3FileSystem(s3fs.S3FileSystem):  # type: ignore[misc]
    """An s3fs filesystem that makes one attempt per call and raises at once when it fails:
    every request (``_call_s3``), whole and ranged reads (``_cat_file``, ``cat_ranges``) and
    the reads of the files it opens (:class:`OneAttemptS3File`)."""

    retries = 1  # s3fs's own retry loop: the source retries instead
    _call_s3 = _rebound(s3fs.S3FileSystem._call_s3)
    call_s3 = sync_wrapper(_call_s3)
    _cat_file = _rebound(s3fs.S3FileSystem._cat_file)
    _open = _rebound(s3fs.S3FileSystem._open)


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
