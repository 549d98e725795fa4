"""Headers and expiry: headers reach every consumer kind and survive dead letters and requeues; an
item not handed out within its expiry is dead-lettered (reason "expired") by take, receive and the
worker alike; bad input is refused naming the option, with nothing written."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import (
    DelayedQueue,
    InvalidDelayError,
    InvalidHeadersError,
    Reject,
    current_headers,
    current_message,
)
from aiodelayq._wire.elements import ITEM_MAGIC, MAX_HEADERS_BYTES, pack_headers, unwrap, wrap
from tests.helpers import server_past, until

TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "é"}


def test_the_envelope_round_trips_and_bare_payloads_stay_bare() -> None:
    block = pack_headers(TRACE)
    assert unwrap(wrap(b"payload", block, 1234))[:3] == (b"payload", TRACE, 1234)
    assert unwrap(wrap(b"payload", b"", 99))[:3] == (b"payload", {}, 99)
    assert unwrap(wrap(b"p", block, None, "clé".encode(), 7)) == (b"p", TRACE, None, "clé", 7, False, False, None)
    assert unwrap(wrap(b"p", block, None, group="é{".encode())) == (b"p", TRACE, None, None, 0, False, False, "é{")
    assert wrap(b'{"a":1}', b"", None) == b'{"a":1}'  # nothing to carry: the payload as it is
    # A payload that starts with the marker is wrapped, so it reads back as it was.
    tricky = ITEM_MAGIC + b"\x00" * 20
    assert unwrap(wrap(tricky, b"", None))[:3] == (tricky, {}, None)
    assert unwrap(ITEM_MAGIC + b"\x00")[:3] == (ITEM_MAGIC + b"\x00", {}, None)  # too short: bare


async def test_headers_reach_every_kind_of_consumer(make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    async with q:
        await q.offer("plain", 0, headers=TRACE)
        assert await asyncio.wait_for(q.take_with_headers(), 5) == ("plain", TRACE)
        await q.offer_many([("a", 0), ("b", 0), ("c", 0)], headers=[{"n": "1"}, None, {}])
        got = await asyncio.wait_for(q.take_many_with_headers(3), 5)
        while len(got) < 3:
            got += await asyncio.wait_for(q.take_many_with_headers(3), 5)
        assert got == [("a", {"n": "1"}), ("b", {}), ("c", {})]
        await q.offer("bare", 0)
        assert await asyncio.wait_for(q.take(), 5) == "bare"

        await q.offer({"id": 7}, 0, headers={"k": "v"})
        msg = await q.receive(5, timeout=5)
        assert msg is not None
        assert msg.value == {"id": 7}
        assert msg.headers == {"k": "v"}
        assert msg.expires_at_ms is None
        assert await msg.ack()

        # The worker, reliable and plain: current_message() / current_headers() in the handler and
        # in a task it starts.
        for reliable in (True, False):
            seen: list[tuple[Any, dict[str, str], bool]] = []
            done = asyncio.Event()

            async def handle(item: Any, seen: list[tuple[Any, dict[str, str], bool]] = seen,
                             done: asyncio.Event = done, reliable: bool = reliable) -> None:
                child = await asyncio.create_task(asyncio.sleep(0, current_headers()))
                message = current_message()
                assert (message is not None) == reliable
                seen.append((item, child, message is not None and message.headers == child))
                if len(seen) == 2:
                    done.set()

            await q.offer_many([(1, 0), (2, 0)], headers=[{"i": "1"}, None])
            worker = q.worker(handle, reliable=reliable)
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(done.wait(), 10)
            worker.stop()
            await asyncio.wait_for(running, 10)
            assert sorted(seen, key=lambda s: s[0]) == [(1, {"i": "1"}, reliable), (2, {}, reliable)]
        assert current_headers() == {}
        assert current_message() is None


async def test_dead_letters_keep_headers_and_requeuing_keeps_them(make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    async with q:
        await q.offer("x", 0, headers={"h": "1"})
        msg = await q.receive(5, timeout=5)
        assert msg is not None
        assert await msg.nack(dead_letter=True)
        [letter] = await q.dead_letters()
        assert (letter.value, letter.headers, letter.reason) == ("x", {"h": "1"}, "nacked")
        assert letter.raw == b'"x"'  # the codec's bytes
        assert await q.requeue_dead_letters() == 1
        again = await q.receive(5, timeout=5)
        assert again is not None
        assert (again.value, again.headers) == ("x", {"h": "1"})
        assert await again.ack()


async def test_pending_peek_and_get_show_headers_and_expiry(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    due = await q.offer("later", 60, key="k1", headers={"a": "b"}, expires=timedelta(seconds=30))
    pending = await q.get("k1")
    assert pending is not None
    assert (pending.value, pending.headers, pending.expires_at_ms) == ("later", {"a": "b"}, due + 30_000)
    [peeked] = await q.peek()
    assert (peeked.value, peeked.headers, peeked.expires_at_ms, peeked.raw) == ("later", {"a": "b"}, due + 30_000,
                                                                              b'"later"')
    assert await q.read_all() == ["later"]
    # reschedule keeps the expiry where offer put it.
    await q.reschedule("k1", 120)
    pending = await q.get("k1")
    assert pending is not None
    assert pending.expires_at_ms == due + 30_000


@pytest.mark.parametrize("consumer", ["take", "receive", "worker", "plain_worker"])
async def test_an_item_not_handed_out_within_its_expiry_is_dead_lettered_not_delivered(
        client: Redis, make_queue: Any, consumer: str) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    due = await q.offer("stale", 0, expires=0.05, headers={"why": "late"})
    await q.offer("keeps", 0, expires=3600)
    await q.offer("fresh", 0)
    await until(lambda: server_past(client, due + 50))  # expired before anyone took it
    async with q:
        if consumer == "take":
            got = [await asyncio.wait_for(q.take(), 5) for _ in range(2)]
        elif consumer == "receive":
            got = []
            while len(got) < 2:
                got += [m.value for m in await q.receive_many(5, 5, timeout=5)]
        else:
            got = []
            two = asyncio.Event()

            async def handle(item: str) -> None:
                got.append(item)
                if len(got) == 2:
                    two.set()

            worker = q.worker(handle, reliable=consumer == "worker")
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(two.wait(), 10)
            worker.stop()
            await asyncio.wait_for(running, 10)
        assert got == ["keeps", "fresh"]
        assert q.stats.expired == 1
    [letter] = await q.dead_letters()
    assert (letter.value, letter.reason, letter.headers) == ("stale", "expired", {"why": "late"})
    assert letter.delivery_count == 0
    assert letter.expires_at_ms == due + 50
    assert await q.size() == 0


async def test_a_message_redelivered_after_its_expiry_is_dead_lettered(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    async with q:
        due = await q.offer("once", 0, expires=0.5)
        msg = await q.receive(0.1, timeout=5)  # received in time, then never acked
        assert msg is not None
        assert msg.expires_at_ms == due + 500
        await until(lambda: server_past(client, due + 500))
        assert await q.receive(5, timeout=0.3) is None
        [letter] = await q.dead_letters()
        assert (letter.value, letter.reason, letter.delivery_count) == ("once", "expired", 1)
        # Requeuing drops the expiry: the operator's requeue delivers it.
        assert await q.requeue_dead_letters() == 1
        again = await q.receive(5, timeout=5)
        assert again is not None
        assert again.value == "once"
        assert again.expires_at_ms is None


async def test_a_rejected_message_with_headers_is_dead_lettered_with_them(make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    async with q:
        await q.offer(1, 0, headers={"r": "s"})

        async def handle(item: Any) -> None:
            raise Reject("no")

        worker = q.worker(handle)
        running = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.rejected == 1, timeout_s=10)
        worker.stop()
        await asyncio.wait_for(running, 10)
        [letter] = await q.dead_letters()
        assert letter.headers == {"r": "s"}


async def test_a_bytes_payload_that_looks_like_an_envelope_round_trips(make_queue: Any) -> None:
    q: DelayedQueue[bytes] = make_queue(codec="bytes")
    tricky = ITEM_MAGIC + bytes(range(40))
    await q.offer(tricky, 0)
    await q.offer(ITEM_MAGIC, 60)  # exactly the marker
    assert await q.contains(tricky)
    assert await q.contains(ITEM_MAGIC)
    assert sorted(await q.read_all()) == sorted([tricky, ITEM_MAGIC])
    assert await q.remove(ITEM_MAGIC)
    async with q:
        assert await asyncio.wait_for(q.take_with_headers(), 5) == (tricky, {})


@pytest.mark.parametrize(("kwargs", "error", "names"), [
    ({"headers": {"k": 1}}, InvalidHeadersError, "headers['k']"),
    ({"headers": {1: "v"}}, InvalidHeadersError, "headers"),
    ({"headers": {"": "v"}}, InvalidHeadersError, "headers"),
    ({"headers": ["k", "v"]}, InvalidHeadersError, "headers"),
    ({"headers": {"k": "x" * MAX_HEADERS_BYTES}}, InvalidHeadersError, "headers"),
    ({"headers": {"k": "\ud800"}}, InvalidHeadersError, "headers['k']"),
    ({"expires": -1}, InvalidDelayError, "expires"),
    ({"expires": 0}, InvalidDelayError, "expires"),
    ({"expires": math.nan}, InvalidDelayError, "expires"),
    ({"expires": math.inf}, InvalidDelayError, "expires"),
    ({"expires": True}, InvalidDelayError, "expires"),
    ({"expires": "5"}, InvalidDelayError, "expires"),
    ({"expires": timedelta(seconds=-1)}, InvalidDelayError, "expires"),
])
async def test_bad_headers_and_expiry_are_refused_naming_the_option_with_nothing_written(
        client: Redis, make_queue: Any, kwargs: dict[str, Any], error: type[Exception], names: str) -> None:
    q: DelayedQueue[Any] = make_queue()
    with pytest.raises(error, match=names.replace("[", r"\[").replace("]", r"\]")):
        await q.offer("x", 0, **kwargs)
    many = {k: [v, None] if k == "headers" else v for k, v in kwargs.items()}
    with pytest.raises(error, match=r"headers|expires"):
        await q.offer_many([("a", 0), ("b", 0)], **many)
    with pytest.raises(InvalidHeadersError, match="one value"):
        await q.offer_many([("a", 0), ("b", 0)], headers=[{"k": "v"}])  # one per item
    with pytest.raises(InvalidDelayError, match="one value"):
        await q.offer_many([("a", 0), ("b", 0)], expires=[1])
    assert await q.size() == 0
    assert await client.exists(*q.keys.all) == 0


async def test_items_without_the_new_options_are_stored_as_before(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.offer("bare", 10)
    [element] = await client.zrange(q.keys.timeout_set, 0, -1)
    assert element.endswith(b"bare")
    assert ITEM_MAGIC not in element
    await q.offer("wrapped", 10, headers={"a": "b"})
    elements = await client.zrange(q.keys.timeout_set, 0, -1)
    assert sum(ITEM_MAGIC in e for e in elements) == 1


@pytest.mark.parametrize("strict", [False, True])
async def test_an_offer_that_runs_late_still_lives_its_expiry_after_its_due_time(
        own_server: Any, make_client: Any, make_proxy: Any, make_queue: Any, strict: bool) -> None:
    # Found by the model-based test (tests/test_model.py): an offer with an expiry sent during a
    # network stall that outlasts the call's 1 s issue-time window. Its due time then counts from
    # when the script ran; its expiry must move as much.
    server = own_server()
    proxy = make_proxy(server)
    q: DelayedQueue[Any] = make_queue("late", redis=make_client(proxy), codec="str", call_timeout_s=5, strict=strict)
    await q.offer("warm", 60)  # the producer has an estimate of the server's clock
    proxy.stall(1.5)  # the next offers' scripts run 1.5 s after their issue
    await asyncio.gather(q.offer("x", 0.2, key="k", expires=0.5),
                         q.offer_many([("y", 0.2), ("z", 0.3)], expires=0.5))
    reader: DelayedQueue[Any] = make_queue("late", redis=make_client(server), codec="str")
    late = [p for p in await reader.peek(10) if p.value != "warm"]
    assert sorted(p.value for p in late) == ["x", "y", "z"]
    for pending in late:
        assert pending.expires_at_ms is not None
        assert pending.expires_at_ms - pending.due_ms >= 500, pending  # it lives `expires` after its due time
