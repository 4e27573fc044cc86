"""The error a user should see, out of Ray's wrappers."""

from __future__ import annotations

import ray

from ingest.core.errors import IngestError


def unwrap(error: BaseException) -> BaseException:
    """The :class:`IngestError` inside Ray's wrappers (task errors, user code errors), if any.

    A bad shard read in a reader actor reaches the rank as a chain of Ray exceptions; the user
    should see the clear error raised where the shard was read.
    """
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        # Ray rethrows a remote IngestError as a class deriving from both RayError and the
        # error's class ("RayTaskError(CoordinatorLostError)"): the original is its cause.
        if isinstance(e, IngestError) and not isinstance(e, ray.exceptions.RayError):
            return e
        for nxt in (getattr(e, "cause", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return error


__all__ = ["unwrap"]
