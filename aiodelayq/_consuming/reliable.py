"""Reliable (at-least-once) consumption: messages in flight until acknowledged.

A received message sits in the in-flight zset scored by its visibility deadline (server ms).
RECEIVE pops and registers atomically under a call id: a lost reply is resent and returns the same
messages; a cancelled caller's call is undone by id (RELEASE_CALL), so nothing nobody saw counts as
delivered (unless the undo lands after the visibility timeout: then it was redelivered meanwhile).

Prefetched extras (see _consuming/prefetch.py) are in flight already and wait one round trip for a
receive with the same visibility timeout, then are released (SETTLE 'release', count not raised).
Once receives come back full at the largest prefetch (a backlog drains), the next RECEIVE goes out
before the last one's messages are parsed (a read-ahead), so the server receives while the client
decodes; its messages are prefetched ones, and it carries the acks written behind meanwhile.
Settles go through :class:`~aiodelayq._consuming.settler.Settler`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Coroutine
from typing import Any, Generic, Protocol, TypeVar, cast

from .._options import QueueOptions
from .._recurring.refill import CronRefill
from .._redis.exchange import until_written, writing
from .._redis.retry import retry_until_done
from .._scripts import QueueScripts
from .._util.observe import Events
from .._util.tasks import TaskOwner, run_through_cancellation
from .._util.tracing import tracer
from .._wire.codec import batch_decoder, decode_item, scanning
from .._wire.elements import ITEM_MARK, MESSAGE_HEADER, grouped_payloads, message_payloads, parse_messages, unwrap
from ..exceptions import BackendError, DecodeError, QueueClosedError
from .controls import HOLD_CAPPED, hold_s
from .messages import Message
from .prefetch import PrefetchBuffer
from .settler import Settle, Settler
from .traced import traced_receive
from .wait_loop import WaitLoop

__all__ = ["MessageIterator", "Receiver", "ReliableConsumer"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")

# How long a cancelled receive() spends undoing its call before the cancellation propagates.
_UNDO_BOUND_S = 0.5
# A held message must not spend a noticeable part of its timeout waiting for a caller.
_PREFETCH_MIN_VT_MS = 1000


class ReliableConsumer(Generic[T]):
    """``receive``/``receive_many`` and the settles of one queue object."""

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, options: QueueOptions, events: Events,
                 refill: CronRefill) -> None:
        self._scripts, self._keys, self._events = scripts, scripts.keys, events
        codec = options.resolved_codec
        self._decode = scanning(codec, functools.partial(decode_item, codec))  # a bare payload's item
        self._decode_batch = batch_decoder(codec)  # a whole reply's, when all are bare payloads
        self._tasks, self._refill = tasks, refill
        self._call_timeout_s = options.call_timeout_s
        # Longest a waiting receiver sleeps without a wake-up: bounds any missed one.
        self._recheck_s = options.safety_poll_s
        self.settler = Settler(scripts, tasks, max_deliveries=options.max_deliveries, events=events)
        self.settler.on_nacked = self._wake_after
        self.settler.ride = lambda: self._ahead
        # Replaced on every notify: a receiver takes the current one before it asks Redis, so a
        # wake-up during its call is never lost, and one receiver never consumes another's.
        self._signal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._side_tasks: set[asyncio.Future[Any]] = set()
        self._buffer: PrefetchBuffer[Message[T]] = PrefetchBuffer(self._release_unclaimed)
        self._buffer_vt_ms = 0
        self._prefetch = self._buffer.prefetch
        self._waits = WaitLoop()
        # Receivers the controls refused wait for this or their hold: wake-ups cannot end a pause.
        self._closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._limited = False  # the last RECEIVE met a rate or concurrency limit: receive only what callers want
        # The read-ahead: at most one RECEIVE sent before anyone asked, its messages for the buffer.
        self._ahead: asyncio.Task[None] | None = None
        self._ahead_vt_ms = 0
        self._ahead_wanted = 0  # the most messages a caller waiting for it wants (0: nobody waits)
        self._full: tuple[int, int] | None = None  # (asked, vt ms) of the last fetch, when it came back full
        self._keeping_up = True  # no prefetched message went back since the buffer last emptied
        self._held_back: list[Message[T]] = []  # given back while a read-ahead was out (oldest first)
        # Done once the settler's call that gives messages back to the head of the list ended: the next
        # RECEIVE waits for it (bounded), so that it cannot pop what comes after them first.
        self._returning: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return (f"<ReliableConsumer {self._keys.destination!r} buffered={len(self._buffer)} "
                f"prefetch={self._prefetch.size} waiting={self.waiting} side_tasks={len(self._side_tasks)} "
                f"closed={self._closed}>")

    @property
    def _closed(self) -> bool:
        return self._closing.done()

    def notify(self) -> None:
        """Items may be due now: every waiting receiver looks again."""
        if not self._signal.done():
            self._signal.set_result(None)
        self._signal = asyncio.get_running_loop().create_future()

    def _wake_after(self, delay_ms: int) -> None:
        """A message this process nacked is visible again after ``delay_ms``: wake receivers then."""
        if not self._closed:
            asyncio.get_running_loop().call_later(delay_ms / 1000, self.notify)

    async def receive_many(self, max_items: int, vt_ms: int, timeout_s: float | None, *,
                           traced: bool = True) -> list[Message[T]]:
        """Up to ``max_items`` messages, waiting up to ``timeout_s`` (``None``: forever); ``[]`` after.
        A call that returns messages is a ``receive`` span while an OpenTelemetry SDK is set up."""
        if traced and (found := tracer()) is not None:
            return await traced_receive(found, self._keys.destination,
                                        self.receive_many(max_items, vt_ms, timeout_s, traced=False))
        if messages := self._from_buffer(max_items, vt_ms):  # the hot path: no round trip
            return await self._hand(messages) if self._takes_all(messages) else self._delivered(messages)
        return await self._waits.run(lambda _woken: self.look(max_items, vt_ms), timeout_s)

    @property
    def waiting(self) -> int:
        """Receivers that found nothing and wait for a wake-up (or their recheck)."""
        return self._waits.waiting

    def prefetched(self, vt_ms: int) -> bool:
        """Whether a :meth:`look` with ``vt_ms`` now returns prefetched messages without suspending."""
        return not self._closed and bool(self._buffer) and self._buffer_vt_ms == vt_ms

    async def look(self, max_items: int, vt_ms: int) -> tuple[list[Message[T]], asyncio.Future[None], float]:
        """One look for up to ``max_items`` messages (prefetched, else one RECEIVE): them, a future
        done once more may be there, and the longest wait (s) before looking again anyway.

        Raises:
            QueueClosedError: the queue was closed. BackendError: the RECEIVE failed (undone).
        """
        if messages := self._from_buffer(max_items, vt_ms):
            return await self._hand(messages), self._signal, 0.0
        if (ahead := self._ahead) is not None and self._ahead_vt_ms == vt_ms:
            self._ahead_wanted = max(self._ahead_wanted, max_items)  # the next may go out as it lands
            await asyncio.wait({ahead})  # (a cancelled caller leaves it running: its messages are kept)
            if messages := self._from_buffer(max_items, vt_ms):
                return await self._hand(messages), self._signal, 0.0
        loop = asyncio.get_running_loop()
        signal: asyncio.Future[None] = self._signal
        prefetch = vt_ms >= _PREFETCH_MIN_VT_MS and not self._limited
        asked = max(max_items, self._prefetch.size) if prefetch else max_items
        sent = loop.time()
        reply = await self._call(asked, vt_ms)
        hold = self._fetched(reply, asked, vt_ms, sent, prefetch)
        if self._full is not None and asked == max_items:
            try:
                await self._read_ahead()  # all go to this caller: the next go out before it parses them
            except asyncio.CancelledError:
                self._release_unclaimed(self._messages(reply, vt_ms, sent)[0])  # nobody saw them
                raise
        messages, wait_s = self._messages(reply, vt_ms, sent)
        if messages:
            self._events.count("receives")
            self._keep(messages[max_items:], vt_ms)
            return self._delivered(messages[:max_items]), signal, 0.0
        if hold and hold != HOLD_CAPPED:  # paused or rate limited: ask again after the hold, or at closing
            return [], self._closing, hold_s(hold)
        return [], signal, wait_s  # (a full concurrency limit too: an ack or nack wakes it, or a deadline)

    def _from_buffer(self, max_items: int, vt_ms: int) -> list[Message[T]]:
        """Up to ``max_items`` prefetched messages of ``vt_ms``, for a caller (see :meth:`_hand`).

        Raises:
            QueueClosedError: the queue was closed.
        """
        if self._closed:
            raise QueueClosedError(f"queue {self._keys.destination!r} was closed")
        if self._buffer and self._buffer_vt_ms == vt_ms:
            messages = self._buffer.take(max_items)
            if not self._buffer:
                self._keeping_up = True
            return messages
        return []

    def _takes_all(self, messages: list[Message[T]]) -> bool:
        """Whether ``messages``, taken from the buffer, are all that the last fetch got, and it came
        back full (at the largest prefetch): the next may be read ahead as they go to their caller."""
        return not self._buffer and self._full is not None and len(messages) >= self._full[0]

    async def _hand(self, messages: list[Message[T]]) -> list[Message[T]]:
        """Prefetched ``messages`` to their caller, delivered; when they are a whole fetch that came back
        full, the next RECEIVE goes out first (a caller cancelled meanwhile: they are released)."""
        if self._takes_all(messages):
            try:
                await self._read_ahead()
            except asyncio.CancelledError:
                self._release_unclaimed(messages)
                raise
        return self._delivered(messages)

    def _delivered(self, messages: list[Message[T]]) -> list[Message[T]]:
        """``messages`` go to the caller now: reported as delivered (and redelivered)."""
        if messages:
            self._events.delivered(len(messages))
            again = len([m for m in messages if m.delivery_count > 1])
            if again:
                self._events.redelivered(again)
        return messages

    def _keep(self, extra: list[Message[T]], vt_ms: int) -> None:
        """Prefetched ``extra`` waits for the next receiver, at most one round trip."""
        if not extra:
            return
        if self._buffer_vt_ms != vt_ms:
            self._buffer.give_back()  # another timeout's messages: a receiver of this one won't take them
        self._buffer.keep(extra)
        self._buffer_vt_ms = vt_ms
        self.notify()  # a receiver waiting meanwhile takes them now

    def _release_unclaimed(self, messages: list[Message[T]]) -> None:
        """Release the prefetched messages nobody came for (in reverse: first deliveries go back
        to the head of the list with LPUSH, and must keep their order). While a read-ahead is out,
        they wait for its messages, which are newer, and go back with them."""
        self._keeping_up = False
        if self._ahead is not None:
            self._held_back += messages
            return
        self._events.count("released", len(messages))
        self._returning = self.settler.returned([Settle(m._element, "release", m.deadline_ms)
                                                 for m in reversed(messages)])

    def _fetched(self, reply: list[Any], asked: int, vt_ms: int, sent: float, prefetch: bool) -> int:
        """Note a RECEIVE's ``reply`` (``asked`` messages of ``vt_ms``, sent at loop time ``sent``):
        the prefetch size, the rate limit, and whether a read-ahead may follow; returns the hold."""
        got, hold = len(reply[7]), int(reply[3])
        self._prefetch.fetched(asked, got, asyncio.get_running_loop().time() - sent)
        # Receive only what callers want under a rate or concurrency limit: a prefetch takes their room.
        self._limited = hold > 0 or bool(reply[8])
        # A read-ahead once fetches come back full at the largest prefetch: a backlog drains.
        full = prefetch and got >= asked and not hold and self._prefetch.saturated
        self._full = (asked, vt_ms) if full else None
        return hold

    async def _read_ahead(self) -> None:
        """Send the next RECEIVE now, its messages for the buffer, if the last came back full and the
        callers keep up; return once it is written (the caller's work then overlaps the server's)."""
        if self._full is None or self._ahead is not None or not self._keeping_up or self._closed:
            return
        (asked, vt_ms), self._full = self._full, None
        asked = max(asked, self._prefetch.size)
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ahead_vt_ms, self._ahead_wanted = vt_ms, 0
        self._ahead = task = self._spawn(writing(written, self._receive_ahead(asked, vt_ms)),
                                         name="aiodelayq-receive-ahead")
        await until_written(written, task)

    async def _receive_ahead(self, asked: int, vt_ms: int) -> None:
        """A read-ahead RECEIVE: its messages to the buffer (or released with those given back meanwhile)."""
        me = asyncio.current_task()
        messages: list[Message[T]] = []
        try:
            sent = asyncio.get_running_loop().time()
            try:
                reply = await self._call(asked, vt_ms, carry=True)
            except BackendError as exc:  # the next look receives (and reports) on its own
                log.debug("a read-ahead receive on %r failed: %s", self._keys.destination, exc)
                return
            self._fetched(reply, asked, vt_ms, sent, True)
            try:
                if self._full is not None and self._ahead_wanted >= asked:
                    # A caller waits for all of them: the next go out before these are parsed.
                    self._ahead = None
                    await self._read_ahead()
            finally:
                messages = self._messages(reply, vt_ms, sent)[0]
            if messages:
                self._events.count("receives")
        finally:
            if self._ahead is me:
                self._ahead = None
            held, self._held_back = self._held_back + messages, []
            if held and (self._closed or len(held) > len(messages)):  # some went back meanwhile: all go
                self._release_unclaimed(held)
            elif messages:
                self._keep(messages, vt_ms)

    async def _call(self, max_items: int, vt_ms: int, *, carry: bool = False) -> list[Any]:
        """One RECEIVE call's reply; with ``carry`` it carries the acks written behind meanwhile (the
        settler's). A read-ahead carries them: nobody waits for its reply, while a caller waits for
        this one's, and the acks' server time would come first (a SETTLE of their own follows it).

        Raises:
            BackendError: the call failed (undone when it may have been applied).
        """
        if (returning := self._returning) is not None and not returning.done():
            # Messages given back go first: this RECEIVE, a caller's or a read-ahead, waits (bounded) for
            # the settler's call that returns them, so it cannot pop what follows them. (The call ends
            # within its bound; a failure is the settler's to report.)
            await asyncio.wait({returning}, timeout=self._call_timeout_s)
        call_id = os.urandom(16)
        settler = self.settler
        acks = settler.take_acks() if carry else []
        elements = [element for run in acks for element in run.elements] if acks else ()
        try:
            # A cancellation here drops the exchange's connection (see _redis.connections.call).
            reply = await self._scripts.receive.resend(max_items, vt_ms, settler.limit_arg, call_id, *elements,
                                                       durable=True)
        except BaseException as exc:
            if acks:  # applied or not: they go again with a SETTLE, which tells
                settler.not_carried(acks, not isinstance(exc, BackendError) or exc.maybe_applied)
            await self._undo(call_id, exc)
            raise
        if acks:
            settler.carried(acks, int(reply[6]))
        return cast("list[Any]", reply)

    async def _undo(self, call_id: bytes, exc: BaseException) -> None:
        """Undo a RECEIVE that failed with ``exc`` by its ``call_id``, if it may have been applied."""
        if isinstance(exc, asyncio.CancelledError):
            # Undo the call by id (a late arrival then receives nothing), waiting at most
            # _UNDO_BOUND_S through further cancellations so asyncio.run does not close the loop
            # under it; then the cancellation propagates.
            if not await self._undo_within(call_id, _UNDO_BOUND_S):
                self._spawn(self._release_call(call_id))  # keeps trying unless the loop is going away
        elif isinstance(exc, BackendError) and exc.maybe_applied:
            self._spawn(self._release_call(call_id))

    def _messages(self, reply: list[Any], vt_ms: int, sent: float) -> tuple[list[Message[T]], float]:
        """A RECEIVE ``reply``'s messages (sent at loop time ``sent``), and how long to wait for more."""
        k = self._keys
        now_ms, head, dead = int(reply[0]), reply[1], int(reply[2])
        expired, malformed = int(reply[4]), int(reply[5])
        if expired:
            self._events.dead_lettered(expired, "expired")
            log.debug("%d message(s) of %r expired before delivery; moved to dead-letter list %r",
                      expired, k.destination, k.dead_letter)
        if dead:
            self._events.count("exhausted", dead)
            self._events.dead_lettered(dead, "max_deliveries")
            log.error("%d message(s) of %r exceeded max_deliveries=%s; moved to dead-letter list %r",
                      dead, k.destination, self.settler.max_deliveries, k.dead_letter)
        if malformed:
            self._events.dead_lettered(malformed, "malformed")
            log.warning("moved %d in-flight entries of %r that are not messages to dead-letter list %r",
                        malformed, k.destination, k.dead_letter)
        recheck_s = self._recheck_s
        wait_s = recheck_s if head is None else min(recheck_s, max(0.001, (float(head) - now_ms) / 1000))
        if dead or expired or malformed:
            wait_s = 0.0  # they took the call's room: more may be ready now
        elements = reply[7]
        deadline_ms, expires, settler, decode = now_ms + vt_ms, sent + vt_ms / 1000, self.settler, self._decode
        if self._decode_batch is not None and elements:
            groups: list[str | None] | None = None
            try:
                payloads = message_payloads(elements)
                if payloads[0][:1] == ITEM_MARK:  # an envelope: of a group alone (decoded in one batch too), or more
                    payloads, groups = grouped_payloads(payloads)
                values = self._decode_batch(payloads)
            except ValueError:  # an envelope of more, or a payload json.loads must judge: one at a time below
                pass
            else:  # the common case: bare payloads, nothing per message but its header and the Message
                header, made = MESSAGE_HEADER.unpack_from, []
                for value, element in zip(values, elements, strict=True):
                    count, due = header(element, 20)
                    made.append(Message(value, count, int(due) if due else None, deadline_ms, settler, element,
                                        expires, vt_ms))
                if groups is not None:
                    for message, group in zip(made, groups, strict=True):
                        message.group = group
                return made, wait_s
        messages: list[Message[T]] = []
        for element, (count, due_ms, stored) in zip(elements, parse_messages(elements), strict=True):
            payload, headers, expires_at_ms, group = stored, None, None, None
            if stored[:1] == ITEM_MARK:
                unwrapped = unwrap(stored)
                payload, headers, expires_at_ms = unwrapped[:3]
                group = unwrapped.group
                if self._refill.handed_out(unwrapped, stored):  # a stalled recurring item's resync: nothing to deliver
                    self.settler.behind([Settle(element, "ack", deadline_ms)])
                    continue
            try:
                value = decode(payload)
            except DecodeError as exc:
                self._events.count("undecodable")
                log.error("%s; moving it to dead-letter list %r", exc, k.dead_letter)
                # Atomic: out of flight and into the list. Written behind, so nothing here awaits
                # after the call (a cancelled caller cannot strand the other messages); if it fails,
                # the message comes back after its timeout and is tried again.
                self.settler.behind([Settle(element, "undecodable", now_ms + vt_ms)])
                continue
            message = Message(value, count, due_ms, deadline_ms, settler, element, expires, vt_ms)
            if headers is not None or expires_at_ms is not None:
                message._headers, message.expires_at_ms = headers, expires_at_ms
            if group is not None:
                message.group = group
            messages.append(message)
        return messages, wait_s

    async def _release(self, call_id: bytes, timeout_s: float | None = None) -> None:
        """RELEASE_CALL of a receive call id (idempotent); it publishes nothing, so wake our receivers."""
        released = await self._scripts.release_call.resend(
            call_id, timeout_s=timeout_s, what=f"undo a cancelled receive on {self._keys.destination!r}")
        if released and not self._closed:
            self.notify()

    async def _undo_within(self, call_id: bytes, timeout_s: float) -> bool:
        """RELEASE_CALL within ``timeout_s``, through cancellations; returns whether it was applied."""
        done = False

        async def release() -> None:
            nonlocal done
            await self._release(call_id, timeout_s)
            done = True

        await run_through_cancellation(release, timeout_s)
        return done

    async def _release_call(self, call_id: bytes) -> None:
        """RELEASE_CALL in the background until done (it is idempotent), or the queue closes."""
        try:
            await retry_until_done(lambda timeout_s: self._release(call_id, timeout_s),
                                   per_try_s=self._call_timeout_s, stopped=lambda: self._closed)
        except BackendError as exc:
            log.warning("could not undo a cancelled receive on %r (%s); its messages come back "
                        "after their visibility timeout", self._keys.destination, exc)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str = "aiodelayq-undo-receive") -> asyncio.Task[None]:
        """A side task of the queue's owner that :meth:`aclose` waits for (bounded)."""
        task = self._tasks.spawn(work, name=name)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def aclose(self, deadline: float) -> None:
        """Wake receivers (QueueClosedError), release prefetched messages, wait for side tasks and
        settles until ``deadline`` (loop time)."""
        if not self._closing.done():
            self._closing.set_result(None)
        self.notify()
        self._buffer.give_back()
        loop = asyncio.get_running_loop()
        if self._side_tasks:
            await asyncio.wait(set(self._side_tasks), timeout=max(0.0, deadline - loop.time()))
        await self.settler.aclose(deadline)


class Receiver(Protocol[T]):
    """What :class:`MessageIterator` receives from: a :class:`ReliableConsumer`, or one over the
    shards of a sharded queue."""

    async def receive_many(self, max_items: int, vt_ms: int, timeout_s: float | None) -> list[Message[T]]: ...


class MessageIterator(Generic[T]):
    """``async for msg in queue.messages(visibility_timeout)``: receives until the queue is closed."""

    def __init__(self, consumer: Receiver[T], vt_ms: int) -> None:
        self._consumer = consumer
        self._vt_ms = vt_ms

    def __aiter__(self) -> MessageIterator[T]:
        return self

    async def __anext__(self) -> Message[T]:
        try:
            [message] = await self._consumer.receive_many(1, self._vt_ms, None)
        except QueueClosedError:
            raise StopAsyncIteration from None
        return message
