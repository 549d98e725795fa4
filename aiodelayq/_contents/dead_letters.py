"""The dead-letter list of one queue: read it (:class:`DeadLetter`), requeue its entries, purge it.

Entries are envelopes (``_wire/elements.py``); anything else reads as reason ``"malformed"``.
Requeue and purge carry a call id, so a resend after a lost reply is applied once.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from .._redis.client_facts import facts_for
from .._redis.retry import call_idempotent
from .._scripts import QueueScripts
from .._wire.codec import Codec, decode_item
from .._wire.delays import delay_to_ms
from .._wire.elements import DeadReason, ElementKind, parse_dead_letter, requeue_ids, unwrap
from ..exceptions import ConfigurationError, DecodeError

__all__ = ["DeadLetter", "DeadLetters"]

T = TypeVar("T")

# Entries one REQUEUE call moves at most: a few ms of server time for small payloads.
REQUEUE_PAGE = 500


@dataclass(frozen=True)
class DeadLetter(Generic[T]):
    """One entry of the dead-letter list.

    Attributes:
        value: the decoded item; ``None`` when the raw bytes cannot be decoded (see ``decodable``).
        raw: the payload bytes (for reason ``"malformed"``: the pending element as it was found).
        reason: ``"max_deliveries"`` (nacked or timed out once too often), ``"undecodable"`` (the
            codec failed on it), ``"malformed"`` (a garbage pending or in-flight element),
            ``"nacked"`` (``nack(dead_letter=True)``), ``"expired"`` (not handed out within its
            ``expires``); an entry the library did not write reads as ``"malformed"``.
        delivery_count: deliveries it had (``take()`` counts 1; 0 if never delivered; ``None``: old entry).
        dead_at_ms: when it died (server epoch ms; ``None`` for an old entry).
        decodable: whether ``value`` holds the decoded item.
        headers: the headers it was offered with (``{}`` when none); requeuing keeps them.
        expires_at_ms: its expiry (server epoch ms, or ``None``); requeuing drops it.
    """

    value: T | None
    raw: bytes = field(repr=False)
    reason: DeadReason
    delivery_count: int | None
    dead_at_ms: int | None
    decodable: bool
    headers: dict[str, str] = field(default_factory=dict)
    expires_at_ms: int | None = None


class DeadLetters:
    """``dead_letters``/``requeue_dead_letters``/``purge_dead_letters`` of one queue object."""

    def __init__(self, scripts: QueueScripts, codec: Codec, kind: ElementKind) -> None:
        self._scripts, self._keys, self._codec, self._kind = scripts, scripts.keys, codec, kind
        self._client, self._call_timeout_s = scripts.client, scripts.call_timeout_s

    def __repr__(self) -> str:
        return f"<DeadLetters {self._keys.dead_letter!r}>"

    async def read(self, limit: int | None) -> list[DeadLetter[Any]]:
        """The oldest ``limit`` entries (``None``: all), oldest first, decoded where possible."""
        _check_limit(limit)
        stop = -1 if limit is None else limit - 1
        entries: list[bytes] = await call_idempotent(self._client, "LRANGE", self._keys.dead_letter, 0, stop,
                                                     what="dead_letters", timeout_s=self._call_timeout_s,
                                                     route=self._keys.dead_letter)
        return [self._letter(entry) for entry in entries]

    def _letter(self, entry: bytes) -> DeadLetter[Any]:
        parsed = parse_dead_letter(entry)
        unwrapped = unwrap(parsed.raw) if parsed.reason != "malformed" else None
        raw, headers, expires_at_ms = (parsed.raw, {}, None) if unwrapped is None else unwrapped[:3]
        try:
            value, decodable = decode_item(self._codec, raw), True
        except DecodeError:
            value, decodable = None, False
        return DeadLetter(value, raw, parsed.reason, parsed.delivery_count, parsed.dead_at_ms, decodable, headers,
                          expires_at_ms)

    async def requeue(self, limit: int | None, delay: float | timedelta) -> int:
        """Move the oldest ``limit`` entries (``None``: every entry there when the call starts) back
        into the queue as pending items due after ``delay``; malformed ones are skipped (they move
        to the tail). Returns how many were requeued.

        Raises:
            ConfigurationError: a bad ``limit``. InvalidDelayError: a bad ``delay``.
            BackendError: a call failed (the pages before it stay requeued).
        """
        _check_limit(limit)
        delay_ms = delay_to_ms(delay)
        k = self._keys
        if limit is None:  # what is there now: entries dying meanwhile wait for the next call
            limit = int(await call_idempotent(self._client, "LLEN", k.dead_letter, what="requeue_dead_letters",
                                              timeout_s=self._call_timeout_s, route=k.dead_letter))
        facts = facts_for(self._client)
        loop = asyncio.get_running_loop()
        requeued, seen = 0, 0
        while seen < limit:
            page = min(REQUEUE_PAGE, limit - seen)
            ids = requeue_ids(facts.stamps, page)
            args = [os.urandom(16), facts.clock.issue_arg(loop.time()), delay_ms, self._kind, page, ids]
            reply = await self._scripts.requeue.resend(*args, what=f"requeue of {k.dead_letter!r}", durable=True)
            done, skipped = (int(x) for x in reply)
            requeued += done
            seen += done + skipped
            if done + skipped < page:  # the list ended
                break
        return requeued

    async def purge(self) -> int:
        """Delete every entry; returns how many there were.

        Raises:
            BackendError: the call failed.
        """
        return int(await self._scripts.purge.resend(os.urandom(16), what=f"purge of {self._keys.dead_letter!r}"))


def _check_limit(limit: object) -> None:
    """Accept ``None`` or an ``int`` >= 1.

    Raises:
        ConfigurationError: anything else.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigurationError(f"limit must be None or an int >= 1, got {limit!r}")
