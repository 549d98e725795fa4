"""Failures that last: a server down for hours, and a key another program wrote, which the server
refuses on every call. Every background loop keeps trying at its backoff's pace, its log says so in
a few lines (one when the failures start, a summary every few minutes, an ERROR a minute at most for
a refusal, naming the key), and delivery resumes within one backoff step of the cause going away.

The long outage runs on an event loop whose clock is looptime's: its sleeps and timeouts take no real
time, while the calls to the (dead, then restarted) server are real."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.backoff import ConstantBackoff, NoBackoff
from redis.retry import Retry

import aiodelayq._redis.backoff as backoff_module
from aiodelayq import DelayedQueue
from aiodelayq.cli._doctor import diagnose
from aiodelayq.testing import ThrowawayServer
from tests.helpers import until

OUTAGE_S = 2 * 3600.0


class _Records(logging.Handler):
    """Every record of the ``aiodelayq`` logger while installed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int, contains: str = "") -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level and contains in r.getMessage()]


@pytest.fixture
def records() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("aiodelayq")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


# Loop turns without a ready callback or I/O after which looptime moves its clock to the next timer.
# While the server answers, a reply must arrive before that, or the call's own timeout fires (a
# reply over loopback takes well under a millisecond, these turns tens of milliseconds); while the
# server is down, every call fails at once (connection refused) and the clock may move quickly.
PATIENT_TURNS, QUICK_TURNS = 2_000, 42


def _run_in_loop_time(main: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``main(loop)`` on an event loop whose clock is looptime's: a sleep moves the clock at once
    when nothing else can happen, real I/O is waited for in real time (looptime needs Python >= 3.11)."""
    looptime = pytest.importorskip("looptime")
    loop = looptime.new_event_loop(noop_cycles=PATIENT_TURNS)
    try:
        loop.run_until_complete(main(loop))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


# The loops a long outage drives, by the name their lines carry.
_LOOPS = ("pub/sub connection", "safety poll", "transfer for 'orders'", "pop from 'orders'",
          "fetch of the worker on 'orders'")


@pytest.mark.slow
@pytest.mark.alone
def test_a_two_hour_outage_leaves_every_loop_retrying_and_delivery_resumes(own_server: Any,
                                                                            records: _Records) -> None:
    server: ThrowawayServer = own_server()
    handled: list[int] = []

    async def handle(value: int) -> None:
        handled.append(value)

    async def main(loop: Any) -> None:
        client = Redis.from_url(server.url)
        try:
            producer: DelayedQueue[int] = DelayedQueue(client, "orders")
            q: DelayedQueue[int] = DelayedQueue(client, "orders", lag_warning_s=60)
            async with q:
                await producer.offer_many([(1, 5.0), (2, 5.0), (3, 5.0)])
                await client.save()  # the restarted server has them
                taking = asyncio.create_task(q.take())  # the take pump's pops, and the transfers they carry
                worker = q.worker(handle, concurrency=1)  # the worker's fetches (RECEIVE)
                working = asyncio.create_task(worker.run())
                await asyncio.sleep(0.5)
                server.kill()
                loop.setup_looptime(noop_cycles=QUICK_TURNS)
                started = loop.time()
                await asyncio.sleep(OUTAGE_S)
                assert not taking.done()
                assert not working.done()
                failing = len(records.records)
                loop.setup_looptime(noop_cycles=PATIENT_TURNS)
                server.start()
                back = loop.time()
                # Within one capped backoff pause (2 s) of the server's return, and its own calls. Which
                # consumer gets which item is a race: the worker may get all three.
                while len(handled) + taking.done() < 3:
                    await asyncio.sleep(0.05)
                    assert loop.time() - back < 10, "delivery did not resume"
                got = [taking.result()] if taking.done() else []
                assert sorted([*got, *handled]) == [1, 2, 3]
                while not all(records.messages(logging.INFO, f"{n} works again after") for n in _LOOPS):
                    await asyncio.sleep(0.05)  # the loops that were not needed for it meet the server too
                    assert loop.time() - back < 10, "a loop did not resume"
                worker.stop()
                await asyncio.wait_for(working, 10)
                taking.cancel()
                await asyncio.gather(taking, return_exceptions=True)
                assert loop.time() - started >= OUTAGE_S
        finally:
            await client.aclose()
        during = records.records[:failing]
        assert [r.getMessage() for r in during if r.exc_info] == []  # no traceback, no crashed loop
        assert [r.getMessage() for r in during if r.levelno >= logging.ERROR] == []
        for name in _LOOPS:
            warnings = [r.getMessage() for r in during
                        if r.levelno == logging.WARNING and r.getMessage().startswith(f"{name} ")]
            # One line when the failures start, then one summary every 5 minutes.
            assert 2 <= len(warnings) <= 2 + OUTAGE_S / backoff_module.SUMMARY_EVERY_S, (name, len(warnings))
            assert "still failing after" in warnings[-1]
        # The loops that try most went through far more than the 1,024 failures that once overflowed.
        attempts = [int(m.group(1)) for r in during
                    if (m := re.search(r"pub/sub connection still failing after (\d+) attempts", r.getMessage()))]
        assert max(attempts) > 2000

    _run_in_loop_time(main)


async def test_a_key_of_another_type_is_retried_at_the_backoffs_pace_and_named(
        own_server: Any, make_client: Any, make_queue: Any, records: _Records,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pause_s = 0.25
    monkeypatch.setattr(backoff_module, "RETRY_BACKOFF", ConstantBackoff(pause_s))
    server = own_server()
    admin = make_client(server)
    q = make_queue("orders", redis=make_client(server), safety_poll_s=0.5)  # its looks come within the window
    async with q:
        await admin.set("orders", "not a list")  # Redisson names the ready list after the queue
        await q.offer_many([(i, 0.1) for i in range(3)])
        taking = asyncio.create_task(q.take())
        window_s = 2.0
        await asyncio.sleep(0.2)
        before = q.stats.transfer_errors
        await asyncio.sleep(window_s)
        # Every path that can start a transfer (the timers, the published due times, the safety
        # poll's look, the take pump's POP) waits for the pause: a spin makes hundreds.
        assert q.stats.transfer_errors - before <= window_s / pause_s + 2
        errors = records.messages(logging.ERROR)
        assert errors, "the refusal is logged at ERROR"
        named = ("'orders' holds a string where the queue keeps a list; another program writes 'orders': "
                 "rename one of them")
        assert all(named in line for line in errors), errors
        assert len(records.messages(logging.ERROR, "transfer for 'orders'")) == 1  # once a minute at most
        assert not taking.done()
        await admin.delete("orders")
        assert await asyncio.wait_for(taking, 5 * pause_s + 5) in (0, 1, 2)
    assert records.messages(logging.INFO, "transfer for 'orders' works again after")


async def test_a_refusal_is_logged_at_error_once_every_refusal_interval(
        own_server: Any, make_client: Any, make_queue: Any, records: _Records,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The interval scaled down from a minute to a second, the pause to 50 ms: the same rule.
    every_s, seconds = 1.0, 4.5
    monkeypatch.setattr(backoff_module, "REFUSAL_EVERY_S", every_s)
    monkeypatch.setattr(backoff_module, "RETRY_BACKOFF", ConstantBackoff(0.05))
    server = own_server()
    admin = make_client(server)
    q = make_queue("orders", redis=make_client(server), lag_warning_s=None)
    async with q:
        await admin.set("orders", "not a list")
        await q.offer(1, 0)
        await until(lambda: records.messages(logging.ERROR, "transfer for 'orders'"), timeout_s=10)
        first = asyncio.get_running_loop().time()
        await asyncio.sleep(seconds)
        errors = records.messages(logging.ERROR, "transfer for 'orders'")
        elapsed_s = asyncio.get_running_loop().time() - first
        assert q.stats.transfer_errors > 3 * len(errors)  # far more tries than lines
        assert 1 + (elapsed_s - 1) // every_s <= len(errors) <= 1 + elapsed_s // every_s, errors
        assert all("another program writes 'orders'" in line for line in errors)
        assert records.messages(logging.WARNING) == []  # a refusal is an ERROR, not a warning per try
        await admin.delete("orders")
        assert await asyncio.wait_for(q.take(), 5) == 1


async def test_doctor_names_a_key_another_program_wrote(make_client: Any, make_queue: Any, drop_keys: Any,
                                                        qname: str) -> None:
    client = make_client()
    q = make_queue(qname, redis=client)
    await q.offer("x", 60)
    drop_keys(q.keys.key_index)
    await client.set(q.keys.key_index, "taken")
    found = {f.check: f for f in await diagnose(client, [qname])}
    assert found["keys"].status == "fail"
    assert found["keys"].saw == f"{q.keys.key_index!r} holds a string where the queue keeps a hash"
    assert found["keys"].todo == f"another program writes {q.keys.key_index!r}: rename one of them"
    await client.delete(q.keys.key_index)
    assert {f.check: f for f in await diagnose(client, [qname])}["keys"].status == "ok"



@pytest.mark.slow
@pytest.mark.alone
def test_a_clock_that_moves_only_when_the_loop_idles_keeps_moving(own_server: Any, make_client: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # asyncio runs a timer once its clock is within a hair of the timer's moment; a task that then
    # reads a time a hair early and waits again spins, and on looptime's clock, which moves only when
    # the loop idles, for ever. Every wait that re-reads the clock, driven for minutes at a pace whose
    # moments fall between the clock's ticks (0.1 s is no whole number of floats apart).
    pause_s, outage_s, idle_s = 0.1, 120.0, 5.0
    monkeypatch.setattr(backoff_module, "RETRY_BACKOFF", ConstantBackoff(pause_s))
    server: ThrowawayServer = own_server()

    async def handle(value: int) -> None:
        pass

    async def main(loop: Any) -> None:
        client = Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))  # each call fails at once
        try:
            options: dict[str, Any] = {"safety_poll_s": pause_s, "lag_warning_s": None}
            q: DelayedQueue[int] = DelayedQueue(client, "orders", **options)
            held: DelayedQueue[int] = DelayedQueue(client, "held", **options)
            sharded: DelayedQueue[int] = DelayedQueue(client, "sharded", shards=3, **options)
            async with q, held, sharded:
                # Healthy: the safety polls, a take pump held by the rate limit, a sharded receive's
                # waits for its quiet shards.
                await held.set_rate_limit(1 / pause_s, burst=1)
                await held.offer_many([(i, 0) for i in range(int(idle_s / pause_s))])
                started = loop.time()
                got = [await held.take() for _ in range(int(idle_s / pause_s))]
                assert sorted(got) == got
                assert await sharded.receive_many(10, 30, timeout=idle_s) == []
                assert loop.time() - started >= idle_s
                # Failing: the transfer's, the worker's and the safety poll's retries.
                await q.offer_many([(1, 1.0), (2, 1.0)])  # due during the outage: transfers fail
                await client.save()  # the restarted server has them
                worker = q.worker(handle, concurrency=1)
                working = asyncio.create_task(worker.run())
                await asyncio.sleep(0.5)
                server.kill()
                loop.setup_looptime(noop_cycles=QUICK_TURNS)
                errors = q.stats.transfer_errors
                await asyncio.sleep(outage_s)
                errors = q.stats.transfer_errors - errors
                assert outage_s / pause_s / 3 < errors <= outage_s / pause_s + 1, errors  # the backoff's pace
                loop.setup_looptime(noop_cycles=PATIENT_TURNS)
                server.start()
                back = loop.time()
                while worker.stats.succeeded < 2:
                    await asyncio.sleep(0.05)
                    assert loop.time() - back < 10, "the worker did not resume"
                worker.stop()
                await asyncio.wait_for(working, 10)
        finally:
            await client.aclose()

    _run_in_loop_time(main)
