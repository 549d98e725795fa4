"""Recurring items: one pending occurrence per key whatever hands them out, the next scheduled in
the same script as the hand-out, never lost nor doubled when an occurrence comes back; missed
occurrences collapse; cancel stops it; cron schedules (croniter) list more times as they go; bad
input is refused with nothing written."""

from __future__ import annotations

import asyncio
import itertools
import math
import signal
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, DelayedQueue, InvalidDelayError, ScheduledKeyError
from aiodelayq._recurring import cron as recurrence
from aiodelayq._recurring.refill import CronRefill
from aiodelayq._scripts import QueueScripts
from aiodelayq._util.tasks import TaskOwner
from aiodelayq._wire.elements import parse_schedule, wrap
from aiodelayq.cli._render import pending_json
from tests.faults import pause_server
from tests.helpers import server_ms, server_past, until


async def _pending_of(client: Redis, q: DelayedQueue[Any]) -> int:
    return int(await client.zcard(q.keys.timeout_set))


async def _record(client: Redis, q: DelayedQueue[Any], key: str) -> Any:
    raw = await client.hget(q.keys.schedules, key)
    return None if raw is None else parse_schedule(raw)


async def test_every_hand_out_schedules_the_next_occurrence_once(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    first = await q.schedule("tick", "t", every=0.2, headers={"job": "tick"})
    pending = await q.get("tick")
    assert pending is not None
    assert (pending.value, pending.due_ms, pending.recurring, pending.headers) == ("t", first, True, {"job": "tick"})
    assert abs(first - await server_ms(client) - 200) < 100
    [peeked] = await q.peek()
    assert peeked.recurring
    assert pending_json(peeked, 0)["recurring"] is True
    assert (await q.counts()).recurring == 1
    start = (await _record(client, q, "tick")).occurrence  # a random first number
    async with q:
        dues = []
        for n in range(3):
            item, headers = await asyncio.wait_for(q.take_with_headers(), 5)
            assert (item, headers) == ("t", {"job": "tick"})
            # The next one is pending as soon as this one is handed out, and only it.
            assert await _pending_of(client, q) == 1
            nxt = await q.get("tick")
            assert nxt is not None
            dues.append(nxt.due_ms)
            assert (await _record(client, q, "tick")).occurrence == start + n + 1
        # On the schedule's grid: first + k * 200 ms.
        assert all((due - first) % 200 == 0 for due in dues)
        assert dues == sorted(set(dues))


async def test_every_consumer_kind_continues_the_chain_and_none_doubles_it(
        client: Redis, make_client: Any, make_queue: Any) -> None:
    # Two processes' worth of consumers (two clients): a taker and a reliable receiver.
    q: DelayedQueue[Any] = make_queue(codec="str")
    other: DelayedQueue[Any] = make_queue(redis=make_client(), codec="str")
    await q.schedule("beat", "b", every=0.05)
    got: list[str] = []
    async with q, other:
        async def taker() -> None:
            while len(got) < 12:
                got.extend(await q.take_many(2, timeout=0.2))

        async def receiver() -> None:
            while len(got) < 12:
                for m in await other.receive_many(2, 5, timeout=0.2):
                    got.append(m.value)
                    await m.ack()

        await asyncio.wait_for(asyncio.gather(taker(), receiver()), 30)
        assert await _pending_of(client, q) <= 1  # never more than one occurrence scheduled
    # Closed: what a consumer prefetched went back. The chain goes on: its next occurrence is pending,
    # or ready once due (every 50 ms: a slow machine's check may come after that).
    assert await _pending_of(client, q) + await client.llen(q.keys.destination) >= 1
    assert await _pending_of(client, q) <= 1


async def test_an_occurrence_handed_out_again_continues_nothing(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("once-only", "o", every=60)
    first = (await _record(client, q, "once-only")).occurrence
    assert await q.reschedule("once-only", 0) is not None  # the first occurrence, due now
    async with q:
        # A reliable delivery never acked: the next occurrence is scheduled at the first delivery;
        # the redelivery after the visibility timeout schedules nothing more.
        msg = await q.receive(0.1, timeout=5)
        assert msg is not None
        assert (await _record(client, q, "once-only")).occurrence == first + 1
        again = await q.receive(5, timeout=5)
        assert again is not None
        assert (again.id, again.delivery_count) == (msg.id, 2)
        assert await again.ack()
        assert (await _record(client, q, "once-only")).occurrence == first + 1
        assert await _pending_of(client, q) == 1
        # A popped occurrence given back to the list (as a hand-off lease does after a crash) is
        # taken again without starting a second chain.
        await client.lpush(q.keys.destination, wrap(b"o", b"", None, b"once-only", first))
        assert await asyncio.wait_for(q.take(), 5) == "o"
        assert (await _record(client, q, "once-only")).occurrence == first + 1
        assert await _pending_of(client, q) == 1


# A consumer in another process: receives one message, prints its value and delivery count, then
# waits to be killed without acking.
RECEIVE_AND_HANG = r"""
import asyncio, sys
from redis.asyncio import Redis
from aiodelayq import DelayedQueue


async def main():
    async with DelayedQueue(Redis.from_url(sys.argv[1]), sys.argv[2], codec="str") as q:
        msg = await q.receive(0.5, timeout=30)
        print("got", msg.value, msg.delivery_count, flush=True)
        await asyncio.sleep(120)


asyncio.run(main())
"""


async def test_a_consumer_killed_holding_an_occurrence_neither_loses_nor_doubles_the_chain(
        redis_server: Any, client: Redis, make_queue: Any, qname: str, spawn_consumer: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("job", "run", every=60)
    first = (await _record(client, q, "job")).occurrence
    assert await q.reschedule("job", 0) is not None  # the first occurrence, due now
    child = spawn_consumer(RECEIVE_AND_HANG, args=[redis_server.url, qname])
    assert await child.await_line(lambda line: line.startswith("got"), 60) == "got run 1"
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    # The next occurrence was scheduled by the hand-out, before the crash: the chain is not lost.
    assert (await _record(client, q, "job")).occurrence == first + 1
    assert await _pending_of(client, q) == 1
    async with q:
        again = await q.receive(30, timeout=10)  # the killed consumer's message, redelivered
        assert again is not None
        assert (again.value, again.delivery_count) == ("run", 2)
        assert await again.ack()
    # ... and not doubled: the redelivery scheduled nothing more.
    assert (await _record(client, q, "job")).occurrence == first + 1
    assert await _pending_of(client, q) == 1


async def test_missed_occurrences_collapse_into_one_then_the_schedule_goes_on_from_now(
        client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    first = await q.schedule("missed", "m", every=0.1)
    await until(lambda: server_past(client, first + 600))  # six periods with no consumer
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "m"
        now = await server_ms(client)
        assert await q.poll() is None  # one occurrence, not six
        nxt = await q.get("missed")
        assert nxt is not None
        assert now - 100 < nxt.due_ms <= now + 100  # the first due time after the hand-out
        assert (nxt.due_ms - first) % 100 == 0


async def test_cancel_stops_the_schedule_and_replacing_keeps_one_occurrence(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("job", "v1", every=60)
    await q.schedule("job", "v2", every=0.1)  # replaces schedule and pending item
    assert await _pending_of(client, q) == 1
    pending = await q.get("job")
    assert pending is not None
    assert pending.value == "v2"
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "v2"
        assert await q.cancel("job")
        assert await q.get("job") is None
        assert await client.hlen(q.keys.schedules) == 0
        assert await q.take_many(5, timeout=0.5) == []
        # Cancelled while its occurrence is ready: handing that one out continues nothing.
        await q.schedule("job", "v3", every=0.05)
        await until(lambda: _ready(client, q))
        assert await q.cancel("job")  # the record goes (no pending occurrence at that moment)
        assert await asyncio.wait_for(q.take(), 5) == "v3"
        assert await _pending_of(client, q) == 0
        assert not await q.cancel("job")
    assert (await q.counts()).recurring == 0


async def test_an_offer_never_takes_a_schedules_key(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("k", "tick", every=0.5)
    with pytest.raises(ScheduledKeyError, match=r"key 'k' .* is a recurring schedule's") as refused:
        await q.offer("other", 0.2, key="k", replace=True)
    assert refused.value.key == "k"
    with pytest.raises(ScheduledKeyError):  # keeping the occurrence would be an offer that took nothing
        await q.offer("other", 0.2, key="k")
    with pytest.raises(ScheduledKeyError):  # all or nothing: the other items are not written either
        await q.offer_many([("a", 60), ("b", 60)], keys=["free", "k"], replace=True)
    assert await q.get("free") is None
    # Concurrent offers sent in one call: only the one with the schedule's key is refused.
    results = await asyncio.gather(q.offer("x", 60, key="x"), q.offer("y", 60, key="k", replace=True),
                                   q.offer("z", 60), return_exceptions=True)
    assert isinstance(results[1], ScheduledKeyError)
    assert not isinstance(results[0], BaseException)
    assert not isinstance(results[2], BaseException)
    assert (await q.counts()).pending == 3  # the occurrence, x and z
    async with q:
        # The schedule goes on, one occurrence at a time, none of them "other".
        assert [await asyncio.wait_for(q.take(), 5) for _ in range(2)] == ["tick", "tick"]
        pending = await q.get("k")
        assert pending is not None
        assert pending.recurring
        # While its occurrence is in flight, the key is still the schedule's.
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert msg.value == "tick"
        with pytest.raises(ScheduledKeyError):
            await q.offer("other", 60, key="k", replace=True)
        await msg.ack()
        assert await q.cancel("k")
        offered = await q.offer("after", 60, key="k")  # the key is free again
        assert offered.added
    assert (await q.counts()).recurring == 0


async def _ready(client: Redis, q: DelayedQueue[Any]) -> bool:
    return int(await client.llen(q.keys.destination)) > 0 and int(await client.zcard(q.keys.timeout_set)) == 0


async def test_clear_stops_every_schedule(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.schedule("a", 1, every=10)
    await q.clear()
    assert await client.exists(q.keys.schedules, q.keys.timeout_set) == 0


async def test_cron_schedules_follow_the_expression_in_their_time_zone(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    due = await q.schedule("nine", "n", cron="0 9 * * *", tz="Europe/Paris")
    at = datetime.fromtimestamp(due / 1000, ZoneInfo("Europe/Paris"))
    assert (at.hour, at.minute, at.second) == (9, 0, 0)
    assert 0 < due - await server_ms(client) <= 86_400_000
    record = await _record(client, q, "nine")
    assert record.spec == "0 9 * * *\nEurope/Paris"
    assert len(record.times_ms) == recurrence.CRON_LISTED - 1
    utc = await q.schedule("utc", "u", cron="30 * * * *")
    assert datetime.fromtimestamp(utc / 1000, ZoneInfo("UTC")).minute == 30


async def test_a_cron_schedule_lists_more_times_as_consumers_go(client: Redis, make_queue: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # One time listed at a time: every hand-out finds the list empty, the record stalls, and the
    # consumer's refill lists more and schedules the next occurrence.
    monkeypatch.setattr(recurrence, "CRON_LISTED", 1)
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("sec", "s", cron="* * * * * *")  # every second (croniter's seconds field)
    async with q:
        seen = []
        for _ in range(3):
            assert await asyncio.wait_for(q.take(), 10) == "s"
            await until(lambda: _restarted(client, q, "sec"), timeout_s=10)  # the refill scheduled the next one
            nxt = await q.get("sec")
            assert nxt is not None
            seen.append(nxt.due_ms)
        assert [b - a for a, b in itertools.pairwise(seen)] == [1000, 1000]
        assert await _pending_of(client, q) == 1


def _listing_one_time(own_server: Any, make_client: Any, make_queue: Any,
                      monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Redis, DelayedQueue[Any]]:
    """A private server (the tests hold it), a client of it, and a queue whose cron records list one time."""
    monkeypatch.setattr(recurrence, "CRON_LISTED", 1)
    server = own_server()
    r = make_client(server)
    return server, r, make_queue(redis=r, codec="str")


async def test_a_cron_listing_that_falls_behind_before_its_call_runs_is_made_again(
        own_server: Any, make_client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # One time listed (at most a second ahead) and the server held for 1.5 s: when SCHEDULE runs,
    # every listed time is past, and the client lists again from the clock the script returns.
    server, r, q = _listing_one_time(own_server, make_client, make_queue, monkeypatch)
    await q.schedule("warm", "w", cron="0 0 1 1 *")  # reads the server's clock: later listings use its estimate
    pause_server(server.url, 1500)
    due = await asyncio.wait_for(q.schedule("sec", "s", cron="* * * * * *"), 30)
    assert due > await server_ms(r) - 1000  # listed from the clock after the pause, not before it
    pending = await q.get("sec")
    assert pending is not None
    assert pending.due_ms == due


async def test_a_refill_whose_times_pass_before_its_call_runs_lists_again(
        own_server: Any, make_client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stalled per-second schedule; its consumer's refill lists one time, and the server holds
    # writes (REFILL) for 1.5 s: the listed time passes, REFILL stalls the record again and lists
    # nothing, and the refill lists again from a later clock instead of waiting for the resync.
    _, r, q = _listing_one_time(own_server, make_client, make_queue, monkeypatch)
    await q.schedule("sec", "s", cron="* * * * * *")
    handed: list[bytes] = []
    monkeypatch.setattr(CronRefill, "soon", lambda self, key, payload: handed.append(payload))
    async with q:
        assert await asyncio.wait_for(q.take(), 10) == "s"
    assert (await _record(r, q, "sec")).stalled
    scripts = QueueScripts(r, q.keys, call_timeout_s=5)
    tasks = TaskOwner("test")
    await r.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
    await asyncio.wait_for(CronRefill(scripts, tasks)._refill("sec", handed[0]), 30)
    assert await tasks.aclose(asyncio.get_running_loop().time() + 5)  # the refill spawns nothing
    assert not (await _record(r, q, "sec")).stalled
    nxt = await q.get("sec")
    assert nxt is not None
    assert nxt.due_ms < await server_ms(r) + 2_000  # the next second, not the resync a minute away


async def _restarted(client: Redis, q: DelayedQueue[Any], key: str) -> bool:
    record = await _record(client, q, key)
    return record is not None and not record.stalled


async def test_an_occurrence_of_a_cancelled_schedule_continues_nothing_of_a_new_one(client: Redis,
                                                                                    make_queue: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("k", "A", every=60)
    assert await q.reschedule("k", 0) is not None
    async with q:
        await until(lambda: _ready(client, q))  # A's occurrence waits in the ready list
        assert await q.cancel("k")
        await q.schedule("k", "B", every=60)
        assert await asyncio.wait_for(q.take(), 5) == "A"  # delivered once...
        pending = await q.get("k")
        assert pending is not None
        assert pending.value == "B"  # ...without taking over B's schedule
        assert await _pending_of(client, q) == 1


async def test_a_stalled_cron_schedule_is_restarted_by_whichever_consumer_gets_its_resync(
        client: Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recurrence, "CRON_LISTED", 1)
    q: DelayedQueue[Any] = make_queue(codec="str")
    await q.schedule("sec", "s", cron="* * * * * *")
    refills: list[str] = []
    real_soon = CronRefill.soon
    # The consumer handed the last listed occurrence dies before it lists more.
    monkeypatch.setattr(CronRefill, "soon", lambda self, key, payload: refills.append(key))
    async with q:
        assert await asyncio.wait_for(q.take(), 10) == "s"
        assert refills == ["sec"]
        record = await _record(client, q, "sec")
        assert record.stalled
        resync = await q.get("sec")  # a resync is pending, a minute away: the chain is not lost
        assert resync is not None
        assert resync.due_ms > await server_ms(client) + 50_000
        monkeypatch.setattr(CronRefill, "soon", real_soon)
        assert await q.reschedule("sec", 0) is not None  # its minute has come
        # It hands nothing out; its consumer lists more times, which restarts the schedule: the
        # next item taken is the schedule's next second, and the chain goes on.
        assert await asyncio.wait_for(q.take(), 10) == "s"
        await until(lambda: _restarted(client, q, "sec"))
        nxt = await q.get("sec")
        assert nxt is not None
        assert nxt.due_ms < await server_ms(client) + 2_000
        assert await _pending_of(client, q) == 1


@pytest.mark.parametrize(("kwargs", "error", "names"), [
    ({}, ConfigurationError, "every= and cron="),
    ({"every": 1, "cron": "* * * * *"}, ConfigurationError, "every= and cron="),
    ({"every": 1, "tz": "UTC"}, ConfigurationError, "tz"),
    ({"every": 0}, InvalidDelayError, "every"),
    ({"every": -1}, InvalidDelayError, "every"),
    ({"every": math.nan}, InvalidDelayError, "every"),
    ({"every": True}, InvalidDelayError, "every"),
    ({"every": timedelta(0)}, InvalidDelayError, "every"),
    ({"cron": "61 * * * *"}, ConfigurationError, "cron"),
    ({"cron": "not cron"}, ConfigurationError, "cron"),
    ({"cron": ""}, ConfigurationError, "cron"),
    ({"cron": "* * * * *", "tz": "Mars/Olympus"}, ConfigurationError, "tz"),
    ({"cron": "0 0 30 2 *"}, ConfigurationError, "cron '0 0 30 2 \\*' matches no date"),  # February 30th
    ({"cron": "0 0 31 4 *", "tz": "Europe/Paris"}, ConfigurationError, "matches no date"),
    ({"cron": "* * * * * * *"}, ConfigurationError, "has 7 fields"),  # croniter's year field
    ({"cron": "0 0 1 1 * 0 2099"}, ConfigurationError, "has 7 fields"),
    ({"cron": "* * * *"}, ConfigurationError, "has 4 fields"),
])
async def test_bad_schedules_are_refused_naming_the_option_with_nothing_written(
        client: Redis, make_queue: Any, kwargs: dict[str, Any], error: type[Exception], names: str) -> None:
    q: DelayedQueue[Any] = make_queue()
    with pytest.raises(error, match=names):
        await q.schedule("k", "x", **kwargs)
    assert await client.exists(*q.keys.all) == 0


@pytest.mark.parametrize("cron", ["@daily", "0 0 29 2 *", "*/5 * * * * 30"])
async def test_cron_names_leap_days_and_seconds_are_accepted(make_queue: Any, cron: str) -> None:
    q: DelayedQueue[Any] = make_queue()
    assert await q.schedule("k", "x", cron=cron) > 0
