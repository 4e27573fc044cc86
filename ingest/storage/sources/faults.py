"""What a failed store request was: the store's or ours, worth another attempt or not, an
object that is not there, a refused connection, and how long the store asked to wait.

Read from the exception and its causes, whatever the client library (botocore, aiohttp,
requests, huggingface_hub); :mod:`ingest.storage.sources.retry` acts on it.
"""

from __future__ import annotations

import email.utils
import socket
import time
from collections.abc import Mapping
from typing import Any

from ingest.storage.cache.files import DISK_FULL

# Statuses worth another attempt: throttling (429, 503 SlowDown), server faults, timeouts.
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Errors that no retry mends: the object, the bucket or the permission is not there.
_PERMANENT_ERRORS = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)
# HTTP answers for an object that is not there (any more).
_GONE_STATUSES = frozenset({404, 410})
# Packages whose exceptions mean "the store failed", whatever their class: botocore's
# EndpointConnectionError and aiohttp's errors are not OSErrors.
_STORE_ERROR_PACKAGES = frozenset(
    {
        "botocore",
        "aiobotocore",
        "aiohttp",
        "requests",
        "urllib3",
        "huggingface_hub",
        "httpx",  # huggingface_hub's HTTP client: its ConnectError, timeouts
        "httpx2",
        "httpcore",
        "httpcore2",
        "google",
        "gcsfs",
        "adlfs",
        "azure",
        "s3fs",
        "fsspec",
    }
)


def is_store_error(error: BaseException) -> bool:
    """Whether ``error`` comes from the store or the network rather than from our code."""
    if isinstance(error, OSError | TimeoutError):
        return True
    return type(error).__module__.split(".")[0] in _STORE_ERROR_PACKAGES


class ChangedError(OSError):
    """The object read is no longer the version listed (:func:`is_changed`); its message
    says what the read found instead (:func:`changed_answer`)."""


def changed_answer(error: BaseException) -> str | None:
    """What the :class:`ChangedError` in ``error``'s chain found, or None."""
    for e in _chain(error):
        if isinstance(e, ChangedError):
            return str(e)
    return None


class ShortBodyError(OSError):
    """A response ended before the bytes asked for: never handed on as data."""


class RangeIgnoredError(Exception):
    """The server answered a range request with the whole file (``200``, not ``206``): no
    retry mends it (not a store error, so :func:`attempt` raises it at once)."""


def is_range_ignored(error: BaseException) -> bool:
    """Whether ``error`` is fsspec's HTTP file saying the server answered a range request
    from past the start with the whole file (a ``ValueError``)."""
    return isinstance(error, ValueError) and "support range requests" in str(error)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes, outermost first."""
    seen: list[BaseException] = []
    node: BaseException | None = error
    while node is not None and all(node is not e for e in seen) and len(seen) < 8:
        seen.append(node)
        node = node.__cause__ or node.__context__
    return seen


def _http_status(error: BaseException) -> tuple[int | None, Mapping[str, Any]]:
    """The HTTP status and headers of a failed response somewhere in ``error``'s chain."""
    for e in _chain(error):
        response = getattr(e, "response", None)
        if isinstance(response, Mapping):  # botocore ClientError
            meta = response.get("ResponseMetadata", {})
            if "HTTPStatusCode" in meta:
                return int(meta["HTTPStatusCode"]), meta.get("HTTPHeaders", {})
        status = getattr(e, "status", None)  # aiohttp ClientResponseError
        if isinstance(status, int):
            return status, getattr(e, "headers", None) or {}
        code = getattr(response, "status_code", None)  # requests, huggingface_hub
        if isinstance(code, int):
            return code, getattr(response, "headers", None) or {}
    return None, {}


def _busy(error: BaseException) -> bool:
    """Whether ``error``'s chain holds an answer that asks to try again (429, 503, any 5xx).
    fsspec's HTTP filesystem reports every failed HEAD or GET of a file's info as a
    ``FileNotFoundError``, a throttled one too: its cause says which it was."""
    return busy_status(error) is not None


def busy_status(error: BaseException) -> int | None:
    """The status of the answer in ``error``'s chain that asks to try again (429, 503, any
    5xx: see :func:`_busy`), or None."""
    status, _ = _http_status(error)
    busy = status is not None and (status in _TRANSIENT_STATUSES or status >= 500)
    return status if busy else None


def _redirect_loop(error: BaseException) -> bool:
    """Whether ``error``'s chain says the server redirected past the client's limit (a
    loop): fsspec's HTTP filesystem reports it as a ``FileNotFoundError`` too."""
    return any(type(e).__name__ == "TooManyRedirects" for e in _chain(error))


_BUSY_FIX = (
    "the server is busy or failing: try again later, or give it longer with "
    "ReadOptions(retry=ingest.RetryPolicy(deadline_s=...))"
)
_REDIRECT_FIX = "check the URL: the server sends the request on to itself, again and again"


def server_answer(url: str, error: BaseException) -> tuple[str, str] | None:
    """What an HTTP server's answer in ``error``'s chain says, and the fix: a refusal (401,
    403: :func:`http_refusal`), busy (429, 5xx, until the deadline), or a redirect loop;
    else None. fsspec's HTTP filesystem reports each as a ``FileNotFoundError``, the answer
    as its cause: the listing and the reads name it from here."""
    refusal = http_refusal(url, error)
    if refusal is not None:
        return f"the server refused access ({refusal})", HTTP_REFUSED_FIX
    busy = busy_status(error)
    if busy is not None:
        return f"the server kept answering HTTP {busy} (busy, or failing)", _BUSY_FIX
    if _redirect_loop(error):
        return "the server redirects in a loop", _REDIRECT_FIX
    return None


def is_changed(error: BaseException) -> bool:
    """Whether ``error`` says the object is no longer the version listed: a read that named
    the listed ETag (``If-Match``) refused by the store (412), as s3fs reports it (fsspec's
    ``FileExpired``, or the ``OSError`` it makes of S3's PreconditionFailed)."""
    for e in _chain(error):
        if isinstance(e, ChangedError) or type(e).__name__ == "FileExpired":
            return True
        if isinstance(e, OSError) and "pre-conditions" in str(e):
            return True
    status, _ = _http_status(error)
    return status == 412


def is_not_found(error: BaseException) -> bool:
    """Whether ``error`` says the object is not there; not a connection that failed, nor a
    busy store, which fsspec's HTTP filesystem reports as a ``FileNotFoundError`` too."""
    if refused_connection(error) is not None or _busy(error):
        return False
    return isinstance(error, FileNotFoundError) or _http_status(error)[0] in _GONE_STATUSES


def unresolved_name(error: BaseException) -> BaseException | None:
    """The failed name lookup somewhere in ``error``'s chain (the endpoint's host name does
    not resolve), or None."""
    for e in _chain(error):
        if isinstance(e, socket.gaierror):
            return e
    return None


def refused_connection(error: BaseException) -> BaseException | None:
    """The refused connection somewhere in ``error``'s chain (nothing listens at the
    endpoint's port), or None. aiohttp keeps it as ``os_error``, urllib3 as the cause."""
    for e in _chain(error):
        for candidate in (e, getattr(e, "os_error", None)):
            if isinstance(candidate, ConnectionRefusedError):
                return e
    return None


# The client library found no credentials at all, before any request: botocore's provider
# chain (storage options, environment, profile, instance role), the profile it was told to
# use (a name in no config file), and google-auth's default credentials. botocore's and
# google-auth's own fetchers already retry an instance's metadata service, and no retry here
# finds credentials that are not set.
_NO_CREDENTIALS = {
    "NoCredentialsError": (
        "set them in storage_options (key and secret, or profile) or the environment "
        "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; on Ray, the reader "
        "nodes' too: runtime_env={'env_vars': ...}); for a public bucket pass "
        "storage_options={'anon': True}"
    ),
    "PartialCredentialsError": (
        "set both the key and the secret: in storage_options (key, secret) or the "
        "environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    ),
    "ProfileNotFound": (
        "the profile (storage_options' profile, else AWS_PROFILE) is in neither "
        "~/.aws/config nor ~/.aws/credentials (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE): "
        "check its name, add it (aws configure --profile NAME; on Ray, on the reader nodes "
        "too), or pass key and secret in storage_options instead"
    ),
    "DefaultCredentialsError": (
        "set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or pass "
        "storage_options={'token': ...}; for a public bucket storage_options={'token': 'anon'}"
    ),
}


def missing_credentials(error: BaseException) -> str | None:
    """Where to set credentials, if ``error`` says the client found none (an S3 or GCS
    client with nothing in the storage options, the environment or a profile)."""
    for e in _chain(error):
        fix = _NO_CREDENTIALS.get(type(e).__name__)
        if fix is not None and type(e).__module__.split(".")[0] in ("botocore", "google"):
            return fix
    return None


_REFUSALS = {401: "Unauthorized", 403: "Forbidden"}

HTTP_REFUSED_FIX = (
    "the URL needs credentials the request did not carry, or no longer accepts them: pass "
    "them as headers (storage_options={'headers': {'Authorization': 'Bearer ...'}}), or "
    "make a new signed URL (a signed URL expires); not retried"
)


def http_refusal(url: str, error: BaseException) -> str | None:
    """``"HTTP 403 Forbidden"`` when an HTTP(S) server refused ``url`` (401 or 403 in
    ``error``'s chain); None otherwise. fsspec's HTTP filesystem reports a refused HEAD or
    GET of a file's info as a ``FileNotFoundError``: the cause says which it was. Object
    stores say so their own way (a ``PermissionError`` from s3fs or gcsfs)."""
    if not url.lower().startswith(("http://", "https://")):
        return None
    status, _ = _http_status(error)
    if status not in _REFUSALS:
        return None
    return f"HTTP {status} {_REFUSALS[status]}"


def is_transient(error: BaseException) -> bool:
    """Whether another attempt may succeed where ``error`` failed: a refused connection may
    (a store restarting); a missing object, missing credentials or a full local disk may
    not."""
    if refused_connection(error) is not None:
        return True
    # a version other than the one listed: no retry brings the one listed back
    if not is_store_error(error) or missing_credentials(error) is not None or is_changed(error):
        return False
    if _busy(error):  # also under a FileNotFoundError (fsspec's HTTP info)
        return True
    if isinstance(error, _PERMANENT_ERRORS):
        return False
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return False  # a local disk that cannot take a fetch into the cache: no retry mends it
    status, _ = _http_status(error)
    return status is None or status in _TRANSIENT_STATUSES or status >= 500


def retry_after(error: BaseException) -> float | None:
    """Seconds the store asked to wait (``Retry-After``: seconds or an HTTP date)."""
    _, headers = _http_status(error)
    value = next((str(v) for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
