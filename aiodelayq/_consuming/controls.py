"""The controls every consumer of a queue obeys, in every process: pause, a rate limit and a
concurrency limit.

They live in the queue's ``controls`` hash; POP and RECEIVE read them in the call that hands items
out (``lua/lib/controls.lua``), so nothing is cached. A rate limit is a token bucket on the server
clock: at most ``burst + per_second * t`` items in any ``t`` seconds. A concurrency limit caps the
messages reliable consumers hold at once (RECEIVE counts them: ``lua/lib/controls.lua``); ``take``
holds nothing, so it is not counted. Redisson's consumers do not read the controls.
"""

from __future__ import annotations

import math

from .._redis.retry import call_idempotent
from .._scripts import QueueScripts
from .._util.checks import count, positive

__all__ = ["HOLD_CAPPED", "MAX_GROUP_CONCURRENCY", "PAUSED_RECHECK_S", "Controls", "hold_s"]

# RECEIVE's hold when the concurrency limit leaves no room (lua/lib/controls.lua): the consumer waits
# for a wake-up (an ack or a nack publishes one) or the next visibility deadline, not a period.
HOLD_CAPPED = -2
# The highest group concurrency: a group's field counts its items admitted below 2**20
# (lua/lib/groups.lua).
MAX_GROUP_CONCURRENCY = 1_000_000
# A paused consumer's recheck period: bounds how late delivery restarts after resume(), and the
# calls a paused queue costs.
PAUSED_RECHECK_S = 0.5
# At high rates a few tokens per call rather than one call per token.
_MIN_RATE_HOLD_S = 0.01


def hold_s(hold_ms: int) -> float:
    """Seconds a consumer refused with ``hold`` (ms; -1: paused) waits before asking again."""
    if hold_ms < 0:
        return PAUSED_RECHECK_S
    return min(PAUSED_RECHECK_S, max(_MIN_RATE_HOLD_S, hold_ms / 1000))


class Controls:
    """``pause``/``resume``/``is_paused``/``set_rate_limit``/``set_concurrency_limit``/
    ``set_group_concurrency`` of one queue (``counts()`` shows them)."""

    def __init__(self, scripts: QueueScripts) -> None:
        self._scripts = scripts
        self._keys = scripts.keys

    def __repr__(self) -> str:
        return f"<Controls {self._keys.destination!r}>"

    async def _set(self, *argv: object, what: str) -> None:
        # Idempotent: resent after a lost reply; confirmed by the queue's durability.
        await self._scripts.set_controls.resend(*argv, durable=True, what=f"{what} {self._keys.destination!r}")

    async def pause(self) -> None:
        """Pause every consumer of the queue (see the module docstring)."""
        await self._set("pause", what="pause")

    async def resume(self) -> None:
        """Undo :meth:`pause`."""
        await self._set("resume", what="resume")

    async def is_paused(self) -> bool:
        """Whether the queue is paused."""
        k = self._keys
        paused = await call_idempotent(self._scripts.client, "HGET", k.controls, "paused", route=k.controls,
                                       what=f"is_paused of {k.destination!r}", timeout_s=self._scripts.call_timeout_s)
        return paused is not None

    async def set_rate_limit(self, per_second: float | None, burst: int | None = None) -> None:
        """Limit all consumers together to ``per_second`` items a second (``None``: no limit), in
        bursts of at most ``burst`` (default: one second's worth, at least 1).

        Raises:
            ConfigurationError: ``per_second`` is not a finite number above 0, or ``burst`` not an
                int >= 1; nothing is written.
        """
        if per_second is None:
            if burst is not None:
                count("burst", burst)  # still checked: a typo should not pass silently
            await self._set("unrate", what="remove the rate limit of")
            return
        rate = positive("per_second", per_second)
        size = max(1, math.ceil(rate)) if burst is None else count("burst", burst)
        await self._set("rate", repr(rate), size, what="set the rate limit of")

    async def set_concurrency_limit(self, limit: int | None) -> None:
        """Let reliable consumers hold at most ``limit`` messages at once (``None``: no limit).

        Raises:
            ConfigurationError: ``limit`` is not an int >= 1 (or ``None``); nothing is written.
        """
        if limit is None:
            await self._set("uncap", what="remove the concurrency limit of")
            return
        await self._set("cap", count("limit", limit), what="set the concurrency limit of")

    async def set_group_concurrency(self, limit: int) -> None:
        """Let reliable consumers hold at most ``limit`` messages of one group at once.

        Raises:
            ConfigurationError: ``limit`` is not an int from 1 to 1,000,000; nothing is written.
        """
        await self._set("group_limit", count("limit", limit, maximum=MAX_GROUP_CONCURRENCY),
                        what="set the group concurrency of")
