"""Retry policy: the backoff, and the one retry loop behind both ways the library tries again.

- :func:`resend_within` (a caller waits): resent only after a transient failure (dropped connection,
  timeout), never after a refusal or a permanent error, within the caller's bound. Callers make a
  resend harmless (docs/design.md, "Connections and resends").
- :func:`retry_until_done` (background cleanup of idempotent calls): retried after any non-permanent
  failure, refusals included (memory may be freed), until done, a deadline or the owner stops.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..exceptions import BackendError
from .backoff import Backoff, may_resend
from .connections import AnyRedis, Script, call, is_permanent
from .durability import Durability, run_durable

__all__ = ["call_idempotent", "resend_script", "resend_within", "retry_until_done"]

T = TypeVar("T")

async def _retry(attempt: Callable[[float, bool], Awaitable[T]], *, deadline: float, per_try_s: float,
                 retry_refused: bool, stopped: Callable[[], bool]) -> T:
    loop = asyncio.get_running_loop()
    backoff = Backoff("a call")  # counts only: the caller reports the failure it raises
    resend = False
    while True:
        try:
            return await attempt(max(0.001, min(per_try_s, deadline - loop.time())), resend)
        except BackendError as exc:
            pause = backoff.count()
            retryable = not is_permanent(exc) if retry_refused else may_resend(exc)
            if not retryable or stopped() or loop.time() + pause >= deadline:
                exc.maybe_applied = exc.maybe_applied or resend  # any attempt may have been applied
                raise
            resend = resend or exc.maybe_applied
            await asyncio.sleep(pause)


async def resend_within(attempt: Callable[[float, bool], Awaitable[T]], *, timeout_s: float) -> T:
    """Run ``attempt(remaining_s, resend)`` until it succeeds, resending after transient failures
    with backoff, all within ``timeout_s`` seconds. ``resend`` is ``True`` once an earlier attempt
    may have been applied (it was sent and its reply lost).

    Raises:
        BackendError: the last failure, once the bound is spent or the failure is final
            (``maybe_applied`` if any attempt may have been applied).
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    return await _retry(attempt, deadline=deadline, per_try_s=math.inf, retry_refused=False,
                        stopped=lambda: False)


async def resend_script(client: AnyRedis, script: Script, keys: Sequence[Any], args: Sequence[Any], *,
                        timeout_s: float, what: str, durability: Durability | None = None) -> Any:
    """:func:`resend_within` of one script call whose resend is harmless (read-only, idempotent, or
    with a call id in ``args``); with ``durability``, a durable write (:func:`run_durable`).

    Raises: as :func:`resend_within`; NotReplicatedError when it ran but was not confirmed.
    """
    confirm = durability or Durability()  # the default waits for nothing: a plain run_script
    return await resend_within(
        lambda remaining_s, _resend: run_durable(client, script, keys, args, durability=confirm,
                                                 timeout_s=remaining_s, what=what),
        timeout_s=timeout_s)


async def call_idempotent(client: AnyRedis, *args: Any, what: str, timeout_s: float, route: Any = None) -> Any:
    """:func:`resend_within` of one command whose resend is harmless (a read, or ``UNLINK``), within
    ``timeout_s`` seconds. ``route``: a key it touches (a cluster sends it to that key's primary).

    Raises: as :func:`resend_within`.
    """
    return await resend_within(
        lambda remaining_s, _resend: call(client, *args, what=what, timeout_s=remaining_s, route=route),
        timeout_s=timeout_s)


async def retry_until_done(attempt: Callable[[float], Awaitable[T]], *, per_try_s: float,
                           deadline: float = math.inf, stopped: Callable[[], bool] = lambda: False) -> T:
    """Run the idempotent ``attempt(timeout_s)`` (each try bounded by ``per_try_s`` seconds) until it
    succeeds, ``deadline`` (loop time) passes or ``stopped()``.

    Raises:
        BackendError: a permanent failure, or the last failure once the deadline passed or the owner
            stopped.
    """
    return await _retry(lambda timeout_s, _resend: attempt(timeout_s), deadline=deadline, per_try_s=per_try_s,
                        retry_refused=True, stopped=stopped)
