"""Retry policy: the backoff, and the one "resend within a bound" loop.

A call is resent only after a failure that may be transient (a dropped connection, a pool without
a free connection), never after the server refused it (an error reply: OOM, a script error) or a
permanent error (permission, wrong node), and only while its bound lasts. The callers make a resend
harmless (call ids, or the resend flag below): see docs/design.md, "Connections and resends".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ResponseError

from ._connections import is_permanent
from .exceptions import BackendError

__all__ = ["RETRY_BACKOFF", "resend_within"]

T = TypeVar("T")

# Delay before the n-th retry after a Redis error: full jitter, 50 ms doubling up to 2 s (a
# restarted server is found within ~2 s; a down one sees at most a few commands per second).
RETRY_BACKOFF = ExponentialWithJitterBackoff(cap=2.0, base=0.05)


def may_resend(exc: BackendError) -> bool:
    """Whether a failed call may be tried again: not refused by the server, not permanent."""
    return not is_permanent(exc) and not isinstance(exc.__cause__, ResponseError)


async def resend_within(attempt: Callable[[float, bool], Awaitable[T]], *, timeout_s: float) -> T:
    """Run ``attempt(remaining_s, resend)`` until it succeeds, resending after transient failures
    with backoff, all within ``timeout_s`` seconds. ``resend`` is ``True`` once an earlier attempt
    may have been applied (it was sent and its reply lost).

    Raises:
        BackendError: the last failure, once the bound is spent or the failure is final
            (``maybe_applied`` if any attempt may have been applied).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    failures = 0
    resend = False
    while True:
        try:
            return await attempt(max(0.001, deadline - loop.time()), resend)
        except BackendError as exc:
            failures += 1
            pause = RETRY_BACKOFF.compute(failures)
            if not may_resend(exc) or loop.time() + pause >= deadline:
                exc.maybe_applied = exc.maybe_applied or resend  # any attempt may have been applied
                raise
            resend = resend or exc.maybe_applied
            await asyncio.sleep(pause)
