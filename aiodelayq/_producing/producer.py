"""Producing: validate and encode items, pack them (``_wire/elements.py``), then add them with OFFER.

Offers carry a call id (16 random bytes) that OFFER remembers for 60 s: after a lost reply the
producer resends the same call within ``call_timeout_s`` and the server applies it once. Calls are
capped by count, by bytes (so one large item never fails small ones sent with it) and by the server
time they cost (``call_cost.py``).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

from .._options import QueueOptions
from .._redis.client_facts import facts_for, server_ms_at
from .._redis.eviction import check_eviction_policy
from .._redis.retry import resend_within
from .._scripts import QueueScripts
from .._util.checks import check_item_bytes
from .._util.observe import Events
from .._util.tasks import gather_all, keep
from .._util.tracing import send_span, tracer, with_context
from .._wire.codec import JsonCodec, MsgpackCodec, StrCodec, encode_item
from .._wire.delays import delay_to_ms, positive_ms
from .._wire.elements import (
    ITEM_MAGIC,
    ElementKind,
    Fragment,
    entry_key,
    fragment_size,
    key_entry,
    long_format,
    offer_args,
    pack_fragments,
    pack_headers,
    wrap,
)
from .._wire.item_keys import check_group, check_key, key_tag
from ..exceptions import (
    InvalidDelayError,
    InvalidGroupError,
    InvalidHeadersError,
    InvalidKeyError,
    QueueFullError,
    ScheduledKeyError,
)
from .batcher import OfferBatcher
from .call_cost import CallCost
from .dedupe import dedupe_key, dedupe_keys
from .keyed import Offered, parse_outcome

__all__ = ["Producer", "SendMany", "check_item_bytes"]

SendMany = Callable[[list[Fragment], "list[bytes] | None", float, "list[bytes | None] | None"],
                   Awaitable[list[int]]]
"""What sends an ``offer_many``'s packed items: ``(fragments, OFFER entries or None, issued loop time)``
to their due times (see :meth:`Producer.send_many`)."""


class Producer:
    """``offer``/``offer_many`` of one queue object (see :class:`~aiodelayq.DelayedQueue`)."""

    def __init__(self, scripts: QueueScripts, options: QueueOptions, events: Events, *,
                 send_many: SendMany | None = None) -> None:
        self._scripts, self._keys, self._events = scripts, scripts.keys, events
        # A sharded queue's splits packed items over the shards' producers.
        self._send_many: SendMany = send_many or self.send_many
        self._codec, self._kind = options.resolved_codec, options.kind
        self._call_timeout_s, self._max_call_bytes = options.call_timeout_s, options.max_call_bytes
        self._capacity, self._max_item_bytes = options.capacity, options.max_item_bytes
        self._tier_after_ms = options.tier_after_ms
        self._facts = facts_for(scripts.client)  # looked up once: every offer reads it
        # Only payloads of these codecs never start with an item envelope's marker (see _wire/elements.py).
        self._bare_safe = isinstance(self._codec, (JsonCodec, StrCodec, MsgpackCodec))
        self._batcher: OfferBatcher | None = None
        self._cost = CallCost()

    def __repr__(self) -> str:
        return f"<Producer {self._keys.destination!r} kind={self._kind} batcher={self._batcher!r} cost={self._cost!r}>"

    @property
    def kind(self) -> ElementKind:
        """The element kind this producer writes."""
        return self._kind

    def rebind(self) -> None:
        """Forget the batcher of a previous event loop."""
        self._batcher = None

    async def offer(self, item: Any, delay: float | timedelta, key: str | None = None, replace: bool = False,
                    headers: Mapping[str, str] | None = None, expires: float | timedelta | None = None,
                    group: str | None = None, dedupe_for: float | timedelta | None = None,
                    dedupe_by_content: bool = False) -> int:
        """One item through the batcher; returns its due time (epoch ms, server clock), an
        :class:`Offered` for a keyed item. ``dedupe_for``, ``dedupe_by_content``: see
        :mod:`.dedupe`. Traced (a PRODUCER span, its context in the item's headers) while an
        OpenTelemetry SDK is set up."""
        key, window = dedupe_key(self._codec, item, key, headers, dedupe_for, dedupe_by_content)
        found = tracer()
        if found is None:
            return await self._offer(item, delay, key, replace, headers, expires, group, window)
        with send_span(found, self._keys.destination, 1, key, inject=self._kind == "fast") as carrier:
            return await self._offer(item, delay, key, replace, with_context(headers, carrier) if carrier else headers,
                                     expires, group, window)

    async def _offer(self, item: Any, delay: float | timedelta, key: str | None, replace: bool,
                     headers: Mapping[str, str] | None, expires: float | timedelta | None, group: str | None,
                     window_ms: int | None) -> int:
        issued = asyncio.get_running_loop().time()
        check_eviction_policy(self._scripts.client)
        envelope = None if headers is None and expires is None else (headers, expires, True)
        fragments, entries = await self.prepare([(item, delay)], None if key is None else [key], replace,
                                                envelope=envelope, issued=issued, window_ms=window_ms,
                                                groups=self.check_groups(None if group is None else [group], 1))
        if self._batcher is None:
            self._batcher = OfferBatcher(self._send_issued, max_items=lambda: self._cost.max_items,
                                         max_bytes=self._max_call_bytes, size=lambda f: fragment_size(f[0]))
        return await self._batcher.submit((fragments[0], issued, entries[0] if entries else b"", group is not None))

    async def offer_many(self, pairs: Sequence[tuple[Any, float | timedelta]],
                         keys: Sequence[str | None] | None = None, replace: bool = False,
                         headers: Sequence[Mapping[str, str] | None] | None = None,
                         expires: float | timedelta | Sequence[float | timedelta | None] | None = None,
                         groups: Sequence[str | None] | None = None, dedupe_for: float | timedelta | None = None,
                         dedupe_by_content: bool = False) -> list[int]:
        """Many items (see :meth:`send_many`); due times in input order (:class:`Offered` with
        ``keys``). Traced as :meth:`offer` (one span)."""
        keys, window = dedupe_keys(self._codec, pairs, keys, headers, dedupe_for, dedupe_by_content)
        if not pairs:
            if keys:
                raise InvalidKeyError(f"{len(keys)} keys for 0 items")
            if groups:
                raise InvalidGroupError(f"{len(groups)} groups for 0 items")
            return []
        found = tracer()
        if found is None:
            return await self._offer_many(pairs, keys, replace, headers, expires, groups, window)
        with send_span(found, self._keys.destination, len(pairs), inject=self._kind == "fast") as carrier:
            if carrier and headers is None:
                headers = [carrier] * len(pairs)
            elif carrier and isinstance(headers, Sequence) and not isinstance(headers, (str, bytes, Mapping)):
                headers = [with_context(h, carrier) for h in headers]
            return await self._offer_many(pairs, keys, replace, headers, expires, groups, window)

    async def _offer_many(self, pairs: Sequence[tuple[Any, float | timedelta]], keys: Sequence[str | None] | None,
                          replace: bool, headers: Sequence[Mapping[str, str] | None] | None,
                          expires: float | timedelta | Sequence[float | timedelta | None] | None,
                          groups: Sequence[str | None] | None, window_ms: int | None) -> list[int]:
        issued = asyncio.get_running_loop().time()
        check_eviction_policy(self._scripts.client)
        envelope = None if headers is None and expires is None else (headers, expires, False)
        raw_groups = self.check_groups(groups, len(pairs))
        fragments, entries = await self.prepare(pairs, keys, replace, envelope=envelope, issued=issued,
                                                groups=raw_groups, window_ms=window_ms)
        return await self._send_many(fragments, entries, issued, raw_groups)

    def check_groups(self, groups: Sequence[str | None] | None, count: int) -> list[bytes | None] | None:
        """The UTF-8 bytes of ``groups`` (one group or ``None`` per item; ``None``: no groups).

        Raises:
            InvalidGroupError: not one per item, a bad group, or a group on a queue whose elements
                are not the default (fast) ones: Java must see strict and legacy elements.
        """
        if groups is None:
            return None
        if isinstance(groups, (str, bytes)) or len(groups) != count:
            raise InvalidGroupError(f"groups must be a sequence of one group (or None) per item, {count} items")
        raws = [None if group is None else check_group(group) for group in groups]
        if self._kind != "fast" and any(raws):
            raise InvalidGroupError(
                f"queue {self._keys.destination!r} writes {self._kind} elements (for Java consumers), which "
                "cannot hold grouped items: Java's transfer and consumers would ignore their groups")
        return raws

    async def send_many(self, fragments: list[Fragment], entries: list[bytes] | None, issued: float,
                        groups: list[bytes | None] | None = None) -> list[int]:
        """:meth:`prepare`'s items, issued at loop time ``issued``, in calls of at most
        :class:`CallCost`'s items and ``max_call_bytes`` bytes (one under ``capacity``): the first,
        then the others at once (in order for a key given twice), counting from the first one's base;
        their due times in order. A failed call's error is raised once all are done.

        Raises:
            QueueFullError: under ``capacity``, the call was refused (nothing written).
            BackendError: a call failed (``maybe_applied``).
        """
        chunks: list[list[int]] = [[]]  # indexes into fragments
        size, most = 0, self._cost.max_items
        for i, fragment in enumerate(fragments):
            size_of = fragment_size(fragment)
            # Under capacity one call, all or nothing: no other producer's items between the calls.
            if chunks[-1] and self._capacity is None and (
                    len(chunks[-1]) >= most or size + size_of > self._max_call_bytes):
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += size_of

        bases: list[int] = []

        def send(chunk: list[int]) -> Awaitable[list[int]]:
            return self._send([fragments[i] for i in chunk], issued,
                              None if entries is None else [entries[i] for i in chunk], each=False,
                              base=bases[0] if bases else None, bases=bases,
                              grouped=groups is not None and any(groups[i] for i in chunk))

        first = await send(chunks[0])
        if len(chunks) == 1:
            return first
        # The rest count from the first call's base (OFFER's issue time, or its clock when the estimate
        # was ahead of it): one base for every call, whichever lands first, so items of one delay keep
        # their order; and it is not after any later call's clock, so items of no delay are due at once.
        rest = chunks[1:]
        if entries is not None and _repeated_keys(entries):
            # A key given twice: calls in order, so the later item sees the earlier one pending.
            return first + [due for chunk in rest for due in await send(chunk)]
        return first + [due for dues in await gather_all(send(chunk) for chunk in rest) for due in dues]

    async def prepare(self, pairs: Sequence[tuple[Any, float | timedelta]], keys: Sequence[str | None] | None = None,
                      replace: bool = False, *, envelope: tuple[Any, Any, bool] | None = None,
                      issued: float = 0.0, groups: list[bytes | None] | None = None, window_ms: int | None = None
                      ) -> tuple[list[Fragment], list[bytes] | None]:
        """Validate, encode and pack every pair (``_wire.elements.pack_fragments``) with its key's OFFER
        entry, before anything is sent. ``envelope``: ``(headers, expires, single)``; ``groups``: one
        group (or ``None``) per item, as :meth:`check_groups` returns them, carried in its envelope;
        ``window_ms``: every keyed item's deduplication window.

        Raises:
            InvalidDelayError, EncodeError, InvalidKeyError, InvalidHeadersError: bad input (nothing is
                sent).
            BackendError: the server's long layout (or, for an expiry, its clock) could not be read.
        """
        codec = self._codec
        items = [(delay_to_ms(delay), encode_item(codec, item)) for item, delay in pairs]
        check_item_bytes(self._max_item_bytes, [payload for _, payload in items])  # before any I/O
        if envelope is not None or groups:
            items = await self._wrap(items, *(envelope or (None, None, False)), issued=issued, groups=groups)
        elif not self._bare_safe and any(payload.startswith(ITEM_MAGIC) for _, payload in items):
            items = [(delay_ms, wrap(payload, b"", None)) for delay_ms, payload in items]
        check_item_bytes(self._max_item_bytes, [payload for _, payload in items])  # headers and envelope too
        tags: list[bytes | None] | None = None
        entries: list[bytes] | None = None
        if keys is not None:
            if isinstance(keys, (str, bytes)) or len(keys) != len(items):
                raise InvalidKeyError(f"keys must be a sequence of one key (or None) per item, {len(items)} items")
            raws = [None if key is None else check_key(key) for key in keys]
            tags = [None if raw is None else key_tag(raw) for raw in raws]
            entries = [b"" if raw is None else key_entry(raw, replace, window_ms) for raw in raws]
        fmt = await self._native_long_format() if self._kind == "fast" else None
        return pack_fragments(self._kind, items, stamps=self._facts.stamps, long_fmt=fmt, tags=tags), entries

    async def _send_issued(self, batch: list[tuple[Fragment, float, bytes, bool]]) -> list[int]:
        """Coalesced offers in one call issued with the first; later ones' delays grow by how much
        later they were issued (rounded up: never early)."""
        first = min(issued for _, issued, _, _ in batch)
        fragments = [fragment if issued == first else _later(fragment, math.ceil((issued - first) * 1000))
                     for fragment, issued, _, _ in batch]
        entries = [entry for _, _, entry, _ in batch]
        return await self._send(fragments, first, entries if any(entries) else None, each=True,
                                grouped=any(grouped for _, _, _, grouped in batch))

    async def _send(self, fragments: list[Fragment], issued: float, entries: list[bytes] | None, *,
                    each: bool, base: int | None = None, bases: list[int] | None = None,
                    grouped: bool = False) -> list[Any]:
        """One OFFER call (resent with its call id), its items' due times. Under ``capacity``,
        ``each`` admits items one by one (a refused one's result is a :class:`QueueFullError`);
        else all or nothing. ``base``: the issue time to send (server ms) instead of the estimate's
        at ``issued``; ``bases`` gets the base the call counted from; ``grouped``: some items have a
        group (OFFER checks each then).

        Raises:
            QueueFullError: the call was refused whole (nothing written).
        """
        k = self._keys
        clock = self._facts.clock
        limit = f"{'' if self._capacity is None else self._capacity}{'e' if each else 'a'}"
        args = [os.urandom(16), clock.issue_arg(issued) if base is None else base,
                *offer_args("grouped" if grouped else self._kind, fragments, entries, limit, self._tier_after_ms)]
        loop = asyncio.get_running_loop()

        async def attempt(remaining_s: float, _resend: bool) -> Any:
            sent = loop.time()
            reply = await self._scripts.offer.durable(*args, timeout_s=remaining_s, what=f"offer to {k.destination!r}")
            if reply[1] is not None:  # a fresh run read the server clock between sent and now
                clock.observe(sent, loop.time(), int(reply[1]))
            return reply

        reply = await resend_within(attempt, timeout_s=self._call_timeout_s)
        if reply[0] is None:  # refused whole: nothing written
            if reply[2] == b"scheduled":
                raise self._scheduled(reply[3].decode(), len(fragments))
            raise self._full(int(reply[2]), len(fragments))
        if len(reply) > 3:  # a fresh run measured itself
            self._cost.observe(len(fragments), int(reply[3]))
        base = int(reply[0])
        if bases is not None:
            bases.append(base)
        if entries is None and not reply[2]:
            self._events.offered(len(fragments))
            return [base + fragment[0] for fragment in fragments]
        outcome = parse_outcome(reply[2], len(fragments))
        # A key found taken ('p' pending, 'd' by its window) changed nothing, a refused item ('f') neither.
        self._events.offered(sum(letter in "ar" for letter, _ in outcome))
        if entries is None:
            return [self._full(0, 1) if letter == "f" else base + fragment[0]
                    for fragment, (letter, _) in zip(fragments, outcome, strict=True)]
        return [self._full(0, 1) if letter == "f" else self._scheduled(entry_key(entry).decode(), 1) if letter == "s"
                else Offered(base + fragment[0] if kept is None else kept,
                             key=entry_key(entry).decode() if entry else None, added=letter in "ar",
                             replaced=letter == "r", deduplicated=letter in "pd")
                for fragment, entry, (letter, kept) in zip(fragments, entries, outcome, strict=True)]

    async def _wrap(self, items: list[tuple[int, bytes]], headers: Any, expires: Any, single: bool, *,
                    issued: float, groups: list[bytes | None] | None = None) -> list[tuple[int, bytes]]:
        """``items`` in envelopes with headers, expiry (server epoch ms: issue time + delay + ``expires``)
        and groups (checked UTF-8, one or ``None`` per item).

        Raises:
            InvalidHeadersError, InvalidDelayError: bad headers or expires (nothing is sent).
            BackendError: the server's clock could not be read.
        """
        count = len(items)
        if single:
            blocks = [pack_headers(headers)]
            lifetimes = [None if expires is None else positive_ms(expires, "expires")]
        else:
            blocks = _per_item(headers, count, "headers", pack_headers, InvalidHeadersError, scalar=False)
            lifetimes = _per_item(expires, count, "expires", positive_ms, InvalidDelayError, scalar=True)
        issued_ms = 0
        if any(ms is not None for ms in lifetimes):
            issued_ms = await server_ms_at(self._scripts.client, issued, route=self._keys.destination,
                                           timeout_s=self._call_timeout_s)
        grouping = groups or [None] * count
        return [(delay_ms, wrap(payload, block or b"", None if life is None else issued_ms + delay_ms + life,
                                group=group or b""))
                for (delay_ms, payload), block, life, group in zip(items, blocks, lifetimes, grouping, strict=True)]

    def _full(self, room: int, count: int) -> QueueFullError:
        what = "the item" if count == 1 else f"{count} items"
        return QueueFullError(f"queue {self._keys.destination!r} is full (capacity={self._capacity}, room for "
                              f"{max(0, room)} more): {what} not written", room=max(0, room))

    def _scheduled(self, key: str, count: int) -> ScheduledKeyError:
        what = "the item" if count == 1 else f"{count} items"
        return ScheduledKeyError(f"key {key!r} of queue {self._keys.destination!r} is a recurring schedule's: no other "
                                 f"item takes it (cancel({key!r}) ends the schedule): {what} not written", key)

    async def _native_long_format(self) -> str:
        """``struct`` format of the server's native unsigned long, asked once per client; first callers
        share one shielded request."""
        facts = self._facts
        if facts.long_format is not None:
            return facts.long_format
        ask = facts.long_format_ask
        if ask is None or (ask.done() and (ask.cancelled() or ask.exception() is not None)):
            ask = facts.long_format_ask = keep(asyncio.ensure_future(self._ask_native_long()))
        return await asyncio.shield(ask)

    async def _ask_native_long(self) -> str:
        # Shared by the client's queues: named by what the caller did, not by this queue.
        one: bytes = await self._scripts.native_long(
            what="an offer's first call on this client, reading the server's native long size,")
        fmt = self._facts.long_format = long_format(one)
        return fmt


def _per_item(given: Any, count: int, option: str, check: Callable[[Any, str], Any], error: type[Exception], *,
              scalar: bool) -> list[Any]:
    """``given`` (``None``, one value for every item if ``scalar``, or a sequence of one value or
    ``None`` per item), each checked with ``check(value, option)``."""
    if given is None:
        return [None] * count
    if scalar and not isinstance(given, (list, tuple)):
        one = check(given, option)
        return [one] * count
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Sequence) or len(given) != count:
        raise error(f"{option} must be a sequence of one value (or None) per item, {count} items")
    return [None if value is None else check(value, f"{option}[{index}]") for index, value in enumerate(given)]


def _repeated_keys(entries: list[bytes]) -> bool:
    keyed = [entry_key(entry) for entry in entries if entry]
    return len(set(keyed)) < len(keyed)


def _later(fragment: Fragment, extra_ms: int) -> Fragment:
    """``fragment`` with its delay grown by ``extra_ms``."""
    delay_ms, *rest = fragment
    return cast(Fragment, (delay_ms + extra_ms, *rest))
