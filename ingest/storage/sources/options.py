"""Storage options: parsed from ``KEY=VALUE`` strings, given this source's timeouts and the
credentials its URLs carry, and the secrets to scrub from every message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fsspec.utils import get_protocol

from ingest.core.errors import ConfigError, redact
from ingest.storage.sources.retry import RetryPolicy

SECRET_OPTION_NAMES = (
    "key",
    "secret",
    "token",
    "password",
    "aws_secret_access_key",
    "aws_access_key_id",
    "aws_session_token",
    "account_key",  # Azure (adlfs)
    "sas_token",
    "client_secret",
    "connection_string",
    "credential",
)
"""Storage options whose string values are secrets, scrubbed from every message."""


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``KEY=VALUE`` strings into storage options.

    Dotted keys nest (``client_kwargs.endpoint_url=http://...``); ``true``/``false``,
    integers and floats become Python values.

    Raises:
        ConfigError: If an item has no ``=``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"storage option {pair!r} is not KEY=VALUE; "
                "write e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000"
            )
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    continue
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


S3_CONNECTIONS = 64
"""Connections an S3 filesystem keeps to its store (botocore's default: 10)."""
HUB_REQUESTS = 16
"""Requests sent side by side to the Hugging Face Hub: a client of a shared service keeps to
16 (twice huggingface_hub's own 8 downloads at once), within its request rate limits."""


def requests_at_once(urls: Sequence[str]) -> int:
    """Requests a source of ``urls`` sends side by side where each waits for the store (its
    footers read, its URLs listed): as many as an S3 filesystem's connections, 16 on the Hub.
    From 16 to 64, 512 Parquet footers 50 ms away were read in 1.7 s instead of 3.6 s, and
    256 URLs listed in 1.5 s instead of 1.9 s, on 2 cores (where the client's CPU per request
    bounds it: 128 took 1.9 s)."""
    return HUB_REQUESTS if any(get_protocol(url) == "hf" for url in urls) else S3_CONNECTIONS


def fs_options(
    protocol: str,
    storage_options: Mapping[str, Any],
    policy: RetryPolicy,
    userinfo: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A source's storage options for ``protocol`` with its timeouts (``policy``), and the
    S3 credentials its URLs carry (``userinfo``) unless the options name a key."""
    options = dict(storage_options)
    if protocol in ("s3", "s3a"):
        options["config_kwargs"] = {
            "connect_timeout": policy.connect_timeout_s,
            "read_timeout": policy.read_timeout_s,
            # One attempt per call: retries are this source's, under one deadline.
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            # botocore's 10 connections held back a feed's 16 lanes, the 16 footer
            # threads and a folder unit's 16 files at once (each waited for one).
            "max_pool_connections": S3_CONNECTIONS,
            **options.get("config_kwargs", {}),
        }
        if userinfo is not None and "key" not in options:
            options["key"], options["secret"] = userinfo
    elif protocol in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs", {}))
        client.setdefault(
            "timeout",
            aiohttp.ClientTimeout(
                sock_connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s
            ),
        )
        options["client_kwargs"] = client
    return options


def strip_userinfo(url: str) -> str:
    """``s3://key:secret@bucket/k`` -> ``s3://bucket/k``; other URLs as they are.

    Only S3 URLs: s3fs reads no credentials from a URL, while HTTP clients send the user
    and password of theirs as basic authentication.
    """
    if get_protocol(url) not in ("s3", "s3a"):
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def s3_userinfo(urls: Sequence[str]) -> tuple[str, str] | None:
    """The ``(key, secret)`` that ``s3://`` URLs carry, if any.

    Raises:
        ConfigError: If the URLs carry different credentials.
    """
    found: set[tuple[str, str]] = set()
    for url in urls:
        if get_protocol(url) in ("s3", "s3a"):
            parts = urlsplit(url)
            if parts.username is not None:
                found.add((parts.username, parts.password or ""))
    if len(found) > 1:
        raise ConfigError(
            "the s3:// URLs carry different credentials; one source has one set: pass "
            "key= and secret= in storage_options, or read them as separate streams"
        )
    return found.pop() if found else None


_ENDPOINT_STORES = ("s3", "s3a", "gs", "gcs")
"""Protocols whose filesystems take an ``endpoint_url`` (s3fs at the top or in
``client_kwargs``, gcsfs at the top)."""


def check_endpoint(
    urls: Sequence[str], options: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> None:
    """Refuse an ``endpoint_url`` without its scheme (``127.0.0.1:9000``) for a source of
    ``urls`` on a store that takes one, before any request: botocore refused it deep in the
    first call with a bare ``ValueError: Invalid endpoint`` naming neither the URL nor the fix.
    For ``s3://`` with no endpoint in the options, the one botocore reads from ``environ``
    (``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``) is checked too.

    Args:
        urls: The source's URLs.
        options: Its storage options.
        environ: The environment botocore reads (None: nothing from the environment).

    Raises:
        ConfigError: If ``endpoint_url`` (or ``client_kwargs.endpoint_url``), or the
            environment variable that gives an S3 source its endpoint, has no scheme.
    """
    url = next((u for u in urls if get_protocol(u) in _ENDPOINT_STORES), None)
    if url is None:
        return
    shown = redact(strip_userinfo(url))
    client = options.get("client_kwargs")
    given = [
        ("endpoint_url", options.get("endpoint_url")),
        (
            "client_kwargs.endpoint_url",
            client.get("endpoint_url") if isinstance(client, Mapping) else None,
        ),
    ]
    for name, value in given:
        if isinstance(value, str) and value and "://" not in value:
            raise ConfigError(
                f"{shown}: the storage option {name}={value!r} has no "
                f"scheme, which the store's client refuses; endpoint_url needs a scheme: "
                f"http://{value} (https://{value} where the endpoint serves TLS)"
            )
    if environ is None or any(value for _, value in given):
        return
    if get_protocol(url) in ("s3", "s3a"):
        _check_endpoint_variable(shown, environ)


_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""The variables botocore takes an S3 client's endpoint from, the first set winning."""


def _check_endpoint_variable(shown: str, environ: Mapping[str, str]) -> None:
    """Refuse the S3 endpoint botocore would take from ``environ`` if it has no scheme
    (unless ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is true, when botocore reads none)."""
    if environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() == "true":
        return
    name = next((n for n in _ENDPOINT_VARIABLES if environ.get(n)), None)
    value = environ[name] if name is not None else ""
    if name is not None and "://" not in value:
        raise ConfigError(
            f"{shown}: the environment variable {name}={value!r} has no scheme, which the "
            f"store's client refuses; the S3 endpoint needs a scheme: set "
            f"{name}=http://{value} (https://{value} where the endpoint serves TLS), or "
            f"pass storage_options={{'endpoint_url': 'http://{value}'}}"
        )


def option_secrets(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys an Azure connection string carries (``AccountKey=``,
    ``SharedAccessSignature=``) and the values of HTTP headers (``headers``,
    ``client_kwargs.headers``: an ``Authorization`` token), to scrub from text too."""
    out: list[str] = []
    client = options.get("client_kwargs")
    for headers in (
        options.get("headers"),
        client.get("headers") if isinstance(client, Mapping) else None,
    ):
        if isinstance(headers, Mapping):
            out += [v for v in headers.values() if isinstance(v, str) and len(v) >= 4]
    text = options.get("connection_string")
    if not isinstance(text, str):
        return tuple(out)
    for part in text.split(";"):
        name, _, value = part.partition("=")
        if name.strip() in ("AccountKey", "SharedAccessSignature") and len(value) >= 4:
            out.append(value)
    return tuple(out)


def url_secrets(urls: Sequence[str]) -> tuple[str, ...]:
    """Passwords and query values in ``urls`` (4 characters or longer), to scrub from text."""
    out: set[str] = set()
    for url in urls:
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:
            continue
        out.update(v for v in (parts.username, password) if v)
        for item in parts.query.split("&"):
            out.add(item.partition("=")[2])
    return tuple(sorted((v for v in out if len(v) >= 4), key=len, reverse=True))
