"""The worker (``queue.consume``/``queue.worker``): bounded concurrency, ack/retry/reject/dead letter,
leases for slow handlers, graceful drain and a hard stop, with nothing lost or doubled; and the
worker process (``run_worker``) under real signals."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import os
import re
import signal
import sys
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.backoff import ConstantBackoff, ExponentialBackoff

from aiodelayq import (
    ConfigurationError,
    DelayedQueue,
    Prioritized,
    QueueClosedError,
    Queues,
    Reject,
    Retry,
    Worker,
    WorkerOptions,
    current_message,
)
from aiodelayq.worker import run_worker
from tests.faults import REPO_ROOT
from tests.helpers import until


async def _run(q: DelayedQueue[Any], handler: Any, done: Any, timeout_s: float, **options: Any) -> Worker[Any]:
    """Open ``q``, run a worker until ``done(worker)`` (sync or async), stop it, wait for it."""
    async with q:
        worker = q.worker(handler, **options)
        task = asyncio.create_task(worker.run())
        await until(lambda: done(worker), timeout_s=timeout_s)
        worker.stop()
        await asyncio.wait_for(task, 10)
    return worker


async def _counts_settle(q: DelayedQueue[Any], **expected: int) -> bool:
    counts = await q.counts()
    return all(getattr(counts, name) == value for name, value in expected.items())


async def test_every_item_handled_once_at_most_concurrency_at_a_time(make_queue: Any) -> None:
    q = make_queue(codec="json")
    seen: collections.Counter[int] = collections.Counter()
    running, peak = 0, 0

    async def handler(item: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        seen[item] += 1
        running -= 1

    await q.offer_many([(i, 0) for i in range(200)])
    worker = await _run(q, handler, lambda _: sum(seen.values()) == 200, 20, concurrency=8)
    assert set(seen) == set(range(200))
    assert max(seen.values()) == 1
    assert peak == 8  # the bound, and reached
    assert worker.stats.started == worker.stats.succeeded == 200
    assert await _counts_settle(q, pending=0, ready=0, in_flight=0, dead_letters=0)


async def test_a_failure_is_retried_with_the_backoff_then_dead_lettered(make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=3)
    attempts: collections.Counter[str] = collections.Counter()

    async def handler(item: str) -> None:
        attempts[item] += 1
        if item == "flaky" and attempts[item] < 2:
            raise ValueError("first try fails")
        if item == "broken":
            raise ValueError("always fails")

    await q.offer_many([("flaky", 0), ("broken", 0), ("fine", 0)])
    worker = await _run(q, handler, lambda _: _counts_settle(q, dead_letters=1, in_flight=0, ready=0, pending=0), 10,
                        retry_backoff=ConstantBackoff(0.05))
    assert attempts == {"flaky": 2, "broken": 3, "fine": 1}
    [dead] = await q.dead_letters()
    assert (dead.value, dead.reason, dead.delivery_count) == ("broken", "max_deliveries", 3)
    assert (worker.stats.failed, worker.stats.retried, worker.stats.succeeded) == (4, 4, 2)


async def test_without_a_limit_max_deliveries_is_none_and_the_worker_logs_retries_not_dead_letters(
        make_queue: Any, qname: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aiodelayq")
    unlimited, limited = make_queue(codec="json"), make_queue(f"{qname}:limited", codec="json", max_deliveries=2)
    assert unlimited.max_deliveries is None
    assert limited.max_deliveries == 2

    async def handler(item: str) -> None:
        message = current_message()
        assert message is not None
        if item == "always" or message.delivery_count < 3:
            raise ValueError("fails")

    await unlimited.offer("twice", 0)
    await _run(unlimited, handler, lambda w: w.stats.succeeded == 1, 10, retry_backoff=ConstantBackoff(0.05))
    await limited.offer("always", 0)
    await _run(limited, handler, lambda _: _counts_settle(limited, dead_letters=1, in_flight=0), 10,
               retry_backoff=ConstantBackoff(0.05))
    failures = [r.getMessage() for r in caplog.records if "handler failed on message" in r.getMessage()]
    assert len(failures) == 4
    assert "(delivery 1 with no limit); retry in 0.1 s" in failures[0]
    assert "(delivery 2 with no limit); retry in 0.1 s" in failures[1]
    assert "(delivery 1 of 2); retry in 0.1 s" in failures[2]
    assert "(delivery 2 of 2); its last: dead-lettered" in failures[3]
    assert await unlimited.dead_letters() == []


async def test_a_message_failing_past_1024_deliveries_keeps_the_backoffs_delay(
        make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    # redis-py's exponential backoffs compute base * 2**failures: a float overflow from 2**1024.
    caplog.set_level(logging.ERROR, logger="aiodelayq")
    q = make_queue(codec="json")
    backoff = ExponentialBackoff(cap=0.001, base=0.001)
    with pytest.raises(OverflowError):
        backoff.compute(1024)
    deliveries = 1030

    async def handler(item: str) -> None:
        message = current_message()
        assert message is not None
        if message.delivery_count < deliveries:
            raise ValueError("fails")

    await q.offer("stubborn", 0)
    worker = await _run(q, handler, lambda w: w.stats.succeeded == 1, 120, concurrency=1, retry_backoff=backoff)
    assert (worker.stats.failed, worker.stats.retried) == (deliveries - 1, deliveries - 1)
    assert [r.getMessage() for r in caplog.records] == []  # no "retry_backoff failed", no traceback


async def test_retry_and_reject_steer_a_message(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=5)
    attempts: collections.Counter[str] = collections.Counter()
    retried_at: list[float] = []

    async def handler(item: str) -> None:
        attempts[item] += 1
        if item == "later" and attempts[item] == 1:
            retried_at.append(asyncio.get_running_loop().time())
            raise Retry(0.3)
        if item == "later":
            retried_at.append(asyncio.get_running_loop().time())
        if item == "poison":
            raise Reject("cannot parse")

    await q.offer_many([("later", 0), ("poison", 0)])
    worker = await _run(q, handler, lambda _: attempts["later"] == 2 and attempts["poison"] == 1, 10,
                        retry_backoff=ConstantBackoff(60))
    assert retried_at[1] - retried_at[0] >= 0.25  # Retry's own delay, not the 60 s backoff
    [dead] = await q.dead_letters()
    assert (dead.value, dead.reason, dead.delivery_count) == ("poison", "nacked", 1)
    assert worker.stats.rejected == 1


async def test_a_slow_handler_keeps_its_message(make_queue: Any) -> None:
    q = make_queue(codec="json")
    calls: collections.Counter[int] = collections.Counter()

    async def handler(item: int) -> None:
        calls[item] += 1
        await asyncio.sleep(2.6)  # more than twice the visibility timeout

    await q.offer(1, 0)
    worker = await _run(q, handler, lambda w: w.stats.succeeded == 1, 10, visibility_timeout_s=1.0, concurrency=2)
    assert calls == {1: 1}
    assert worker.stats.lost_leases == 0
    assert await _counts_settle(q, in_flight=0, ready=0, pending=0)


async def test_stop_drains_running_handlers_and_starts_nothing_new(make_queue: Any) -> None:
    q = make_queue(codec="json")
    release = asyncio.Event()
    started: list[int] = []
    finished: list[int] = []

    async def handler(item: int) -> None:
        started.append(item)
        await release.wait()
        finished.append(item)

    await q.offer_many([(i, 0) for i in range(10)])
    async with q:
        worker = q.worker(handler, concurrency=4, drain_timeout_s=10)
        task = asyncio.create_task(worker.run())
        await until(lambda: len(started) == 4)
        worker.stop()
        await until(lambda: worker.state == "draining")
        release.set()
        await asyncio.wait_for(task, 10)
        assert sorted(finished) == sorted(started)
        assert len(started) == 4
        # The rest never started: fetched ahead and released, or never fetched; none counted. (A
        # bounded wait: what the queue's own prefetch held goes back written behind, a round trip later.)
        await until(lambda: _counts_settle(q, in_flight=0, ready=6), timeout_s=5)
        rest = await q.receive_many(6, 30, timeout=5)
        assert sorted(m.value for m in rest) == sorted(set(range(10)) - set(started))
        assert {m.delivery_count for m in rest} == {1}
        for m in rest:
            await m.ack(confirm=True)


async def test_slow_handlers_do_not_hoard_messages_fetched_ahead(make_queue: Any) -> None:
    q = make_queue(codec="json")
    release = asyncio.Event()
    started: list[int] = []

    async def handler(item: int) -> None:
        started.append(item)
        await release.wait()

    await q.offer_many([(i, 0) for i in range(5)])
    async with q:
        worker = q.worker(handler, concurrency=1)
        task = asyncio.create_task(worker.run())
        # One runs; the others, fetched ahead, go back to the list for other consumers.
        await until(lambda: _counts_settle(q, in_flight=1, ready=4), timeout_s=5)
        release.set()
        await until(lambda: len(started) == 5, timeout_s=10)
        worker.stop()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("how", ["drain_timeout", "abort", "caller_cancelled"])
async def test_cut_off_handlers_hand_their_messages_back(make_queue: Any, how: str) -> None:
    q = make_queue(codec="json", max_deliveries=5)
    started: list[int] = []
    cancelled: list[int] = []

    async def handler(item: int) -> None:
        started.append(item)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    await q.offer_many([(i, 0) for i in range(3)])
    async with q:
        worker = q.worker(handler, concurrency=3, drain_timeout_s=0.2 if how == "drain_timeout" else 30)
        task = asyncio.create_task(worker.run())
        await until(lambda: len(started) == 3)
        t0 = asyncio.get_running_loop().time()
        if how == "caller_cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
        else:
            worker.stop()
            if how == "abort":
                await until(lambda: worker.state == "draining")
                worker.abort()
            await asyncio.wait_for(task, 5)
        assert asyncio.get_running_loop().time() - t0 < 2  # not the 30 s drain
        assert sorted(cancelled) == [0, 1, 2]
        assert worker.stats.interrupted == 3
        # Nacked with no delay: redelivered from the in-flight set at once, none lost.
        await until(lambda: _counts_settle(q, in_flight=3, ready=0), timeout_s=5)
        again = await q.receive_many(3, 30, timeout=5)
        assert sorted((m.value, m.delivery_count) for m in again) == [(0, 2), (1, 2), (2, 2)]
        for m in again:
            await m.ack(confirm=True)


async def test_an_abort_logs_the_hand_back_as_the_stats_and_redis_count_it(
        client: Redis, make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    # Many handlers running at the abort: most in redis-py calls (where Python 3.11's wait_for can
    # swallow a cancellation: it is delivered again), two that swallow it themselves and return (so
    # they are done, and acked, not handed back). The log's counts, the stats and Redis agree.
    caplog.set_level(logging.INFO, logger="aiodelayq")
    q = make_queue(codec="json", max_deliveries=5)
    work_key = f"{q.name}:work"
    started: list[int] = []
    swallowed: dict[int, str] = {}  # item -> its message id

    async def handler(item: int) -> None:
        started.append(item)
        if len(started) <= 2:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed[item] = current_message().id
                return  # the cancellation swallowed: the handler ends as if done
        while True:
            await client.incr(work_key)
            await asyncio.sleep(0.001)

    await q.offer_many([(i, 0) for i in range(30)])
    try:
        async with q:
            worker = q.worker(handler, concurrency=20, drain_timeout_s=30)
            task = asyncio.create_task(worker.run())
            await until(lambda: len(started) == 20, timeout_s=10)
            await asyncio.sleep(0.05)
            worker.abort()
            await asyncio.wait_for(task, 10)  # the cut takes about 0.1 s, at most 2 s
            messages = [r.getMessage() for r in caplog.records if r.name == "aiodelayq"]
            [(cut_off, handed_back)] = [(int(a), int(b)) for m in messages
                                        for a, b in re.findall(r"cut off (\d+) handler\(s\): (\d+) message", m)]
            [ended] = [m for m in messages if "ended on their own" in m]
            assert not [m for m in messages if "could not hand back" in m or "did not stop" in m], messages
            assert cut_off == handed_back == worker.stats.interrupted == 18, messages
            assert set(ended.rpartition(": ")[2].split(", ")) == set(swallowed.values()), ended
            assert (worker.stats.started, worker.stats.succeeded) == (20, 2)
            # In Redis: the 18 handed back are in flight, due again now; the 10 never started are
            # ready; the 2 that ended on their own are acked. (A bounded wait: acks are written behind.)
            await until(lambda: _counts_settle(q, in_flight=handed_back, ready=10, pending=0, dead_letters=0),
                        timeout_s=5)
            again = await q.receive_many(30, 30, timeout=5)
            redelivered = sorted(m.value for m in again if m.delivery_count == 2)
            assert redelivered == sorted(set(started) - set(swallowed))
            for m in again:
                await m.ack(confirm=True)
    finally:
        await client.delete(work_key)


async def test_consume_opens_and_closes_and_plain_mode_drops_failures(
        make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    q = make_queue(codec="json")
    handled: list[int] = []

    async def handler(item: int) -> None:
        if item == 3:
            raise ValueError("boom")
        handled.append(item)

    await q.offer_many([(i, 0) for i in range(5)])
    consumer = asyncio.create_task(q.consume(handler, reliable=False, concurrency=2))
    await until(lambda: len(handled) == 4, timeout_s=10)
    assert q.is_open
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert not q.is_open  # consume() opened it, so it closed it
    assert sorted(handled) == [0, 1, 2, 4]
    assert any("drops the item 3" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    assert await _counts_settle(q, in_flight=0, ready=0, pending=0)


async def test_steady_slow_handlers_never_run_a_message_twice(make_queue: Any) -> None:
    # Handlers slower than the fetches: messages fetched ahead must not sit out their visibility
    # timeout (1 s here) waiting for a slot, or they run twice.
    q = make_queue(codec="json")
    runs: collections.Counter[int] = collections.Counter()

    async def handler(item: int) -> None:
        runs[item] += 1
        await asyncio.sleep(0.05)

    await q.offer_many([(i, 0) for i in range(100)])
    worker = await _run(q, handler, lambda w: w.stats.succeeded == 100, 20, concurrency=4, visibility_timeout_s=1.0)
    assert set(runs) == set(range(100))
    assert max(runs.values()) == 1
    assert worker.stats.lost_leases == 0
    assert await _counts_settle(q, in_flight=0, ready=0, pending=0)


async def test_a_cancellation_a_handler_runs_into_is_a_failure_not_a_stop(make_queue: Any) -> None:
    q = make_queue(codec="json")
    calls: collections.Counter[int] = collections.Counter()

    async def handler(item: int) -> None:
        calls[item] += 1
        if item == 0 and calls[item] == 1:
            other = asyncio.ensure_future(asyncio.sleep(10))
            asyncio.get_running_loop().call_soon(other.cancel)
            await other  # raises CancelledError: not the worker's
        await asyncio.sleep(0)

    await q.offer_many([(i, 0) for i in range(5)])
    async with q:
        worker = q.worker(handler, concurrency=1, retry_backoff=ConstantBackoff(0.05))
        task = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.succeeded == 5, timeout_s=10)
        assert worker.running <= 1
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert calls == {0: 2, 1: 1, 2: 1, 3: 1, 4: 1}  # retried; the only slot lived on
    assert (worker.stats.failed, worker.stats.interrupted) == (1, 0)


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf")])
async def test_a_bad_retry_delay_falls_back_to_the_backoff(make_queue: Any, delay: float) -> None:
    q = make_queue(codec="json")
    calls: collections.Counter[int] = collections.Counter()

    async def handler(item: int) -> None:
        calls[item] += 1
        if calls[item] == 1:
            raise Retry(delay)

    await q.offer_many([(i, 0) for i in range(3)])
    await _run(q, handler, lambda w: w.stats.succeeded == 3, 10, concurrency=1, retry_backoff=ConstantBackoff(0.05))
    assert calls == {0: 2, 1: 2, 2: 2}


@pytest.mark.parametrize("options", [
    {"concurrency": 0}, {"concurrency": 2.5}, {"concurrency": True}, {"visibility_timeout_s": 0.05},
    {"visibility_timeout_s": "30"}, {"drain_timeout_s": -1}, {"drain_timeout_s": math.inf}, {"reliable": 1},
    {"retry_backoff": 5}])
async def test_bad_worker_options_are_refused_naming_the_option_wherever_a_worker_starts(
        make_queue: Any, options: dict[str, Any]) -> None:
    async def handler(item: Any) -> None:
        pass

    [name] = options
    queues = Queues("redis://127.0.0.1:1")
    for start in (lambda: make_queue().worker(handler, **options), lambda: WorkerOptions(**options),
                  lambda: queues.add_worker("q", handler, **options)):
        with pytest.raises(ConfigurationError, match=name):
            start()
    if name != "retry_backoff":  # not a process runner's option
        assert run_worker(handler, queue="q", redis_url="redis://127.0.0.1:1", **options) == 2  # before connecting


async def test_run_on_a_closed_queue_raises_and_a_queue_closed_while_it_runs_ends_it(
        make_queue: Any, qname: str) -> None:
    async def handler(item: Any) -> None:
        pass

    closed, other = make_queue(), make_queue(f"{qname}:other")
    async with closed:
        pass
    async with other:
        for worker in (closed.worker(handler), Prioritized([other, closed]).worker(handler)):
            with pytest.raises(QueueClosedError):
                await asyncio.wait_for(worker.run(), 10)
            assert worker.state == "stopped"
        running = other.worker(handler)
        task = asyncio.create_task(running.run())
        await until(lambda: running.state == "running")
    await asyncio.wait_for(task, 10)  # closed while it ran: a clean end
    assert running.state == "stopped"


class _SyncCall:
    def __call__(self, item: Any) -> None:
        pass


class _AsyncCall:
    def __init__(self, seen: list[Any]) -> None:
        self.seen = seen

    async def __call__(self, item: Any) -> None:
        self.seen.append(item)


def _sync(item: Any) -> None:
    pass


_SYNC_HANDLERS = {"lambda": lambda item: None, "def": _sync, "partial": functools.partial(_sync),
                  "sync __call__": _SyncCall(), "a class": _SyncCall, "not callable": 42}


@pytest.mark.parametrize("kind", list(_SYNC_HANDLERS))
async def test_a_handler_that_is_not_async_is_refused_wherever_a_worker_starts(
        make_queue: Any, tmp_path: Any, kind: str) -> None:
    handler: Any = _SYNC_HANDLERS[kind]
    q = make_queue()
    queues = Queues("redis://127.0.0.1:1")
    for start in (lambda: q.worker(handler), lambda: queues.add_worker("q", handler),
                  lambda: Prioritized([q]).worker(handler), lambda: Worker(q, handler, WorkerOptions())):
        with pytest.raises(ConfigurationError, match="must be an async callable"):
            start()
    with pytest.raises(ConfigurationError, match="must be an async callable"):
        await q.consume(handler)
    assert not q.is_open  # consume refused it before opening the queue
    assert run_worker(handler, queue="q", redis_url="redis://127.0.0.1:1") == 2  # before connecting
    if kind in ("def", "sync __call__"):  # the command line, on a module's attribute
        (tmp_path / "sync_handlers.py").write_text("def handle(item):\n    pass\n\n"
                                                  "class Handle:\n    def __call__(self, item):\n        pass\n\n"
                                                  "handle_object = Handle()\n")
        target = "sync_handlers:handle" if kind == "def" else "sync_handlers:handle_object"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiodelayq", "worker", target, "--queue", "q", "--redis-url", "redis://127.0.0.1:1",
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 2, err
        assert b"must be an async callable" in err


async def test_async_callables_of_every_kind_handle_items(make_queue: Any) -> None:
    seen: list[Any] = []

    async def handle(item: Any, tag: str = "def") -> None:
        seen.append((tag, item))

    class Methods:
        async def handle(self, item: Any) -> None:
            seen.append(("method", item))

    def wrapped(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(item: Any) -> Any:  # a plain function that returns the coroutine
            return function(item, "wrapped")
        return wrapper

    recorded: list[Any] = []
    handlers: dict[str, Any] = {"def": handle, "partial": functools.partial(handle, tag="partial"),
                                "method": Methods().handle, "async __call__": _AsyncCall(recorded),
                                "partial of __call__": functools.partial(_AsyncCall(recorded)),
                                "wrapped": wrapped(handle)}
    q = make_queue(codec="json")
    async with q:
        for index, (kind, handler) in enumerate(handlers.items()):
            await q.offer(index, 0)
            worker = q.worker(handler)
            task = asyncio.create_task(worker.run())
            await until(lambda: worker.stats.succeeded == 1, timeout_s=10)  # noqa: B023
            worker.stop()
            await asyncio.wait_for(task, 10)
            assert worker.stats.failed == 0, kind
    assert recorded == [3, 4]
    assert seen == [("def", 0), ("partial", 1), ("method", 2), ("wrapped", 5)]


# -- the worker process: real signals ---------------------------------------------------------------

_HANDLERS = '''
import asyncio, os, sys
from redis.asyncio import Redis

_client = None

async def record(item):
    global _client
    if _client is None:
        _client = Redis.from_url(os.environ["RECORD_URL"])
    if item.get("slow"):
        await _client.rpush(os.environ["RECORD_KEY"] + ":started", item["n"])
        await asyncio.sleep(float(item["slow"]))
    await _client.rpush(os.environ["RECORD_KEY"], item["n"])
'''

_RUN = '''
import sys
from aiodelayq.worker import run_worker
sys.exit(run_worker("worker_handlers:record", queue=sys.argv[1], redis_url=sys.argv[2], concurrency=4,
                    drain_timeout_s=float(sys.argv[3])))
'''


_CLI = "import sys; from aiodelayq.cli import main; sys.exit(main())"


async def _worker_process(spawn_consumer: Any, tmp_path: Any, redis_server: Any, q: DelayedQueue[Any],
                          record_key: str, drain_s: float, via: str = "run_worker") -> Any:
    (tmp_path / "worker_handlers.py").write_text(_HANDLERS)
    env = {"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "RECORD_URL": redis_server.url, "RECORD_KEY": record_key}
    if via == "cli":  # the console command, as an operator runs it
        return spawn_consumer(_CLI, args=["worker", "worker_handlers:record", "--queue", q.name, "--concurrency", "4",
                                          "--drain-timeout", str(drain_s), "--redis-url", redis_server.url], env=env)
    return spawn_consumer(_RUN, args=[q.name, redis_server.url, str(drain_s)], env=env)


async def _recorded(client: Redis, key: str) -> list[int]:
    return [int(x) for x in await client.lrange(key, 0, -1)]


async def _started(client: Redis, key: str, n: int) -> bool:
    return len(await _recorded(client, key + ":started")) >= n


@pytest.mark.parametrize("via", ["run_worker", "cli"])
async def test_sigterm_drains_the_worker_process(client: Redis, make_queue: Any, spawn_consumer: Any,
                                                 tmp_path: Any, redis_server: Any, drop_keys: Any, via: str) -> None:
    q = make_queue(codec="json")
    record_key = f"{q.name}:record"
    drop_keys(record_key)
    await q.offer_many([({"n": i, "slow": 0.5}, 0) for i in range(4)] + [({"n": i}, 0) for i in range(4, 40)])
    drop_keys(record_key + ":started")
    child = await _worker_process(spawn_consumer, tmp_path, redis_server, q, record_key, 30, via)
    await until(lambda: _started(client, record_key, 4), timeout_s=30)  # the 4 slots are busy
    child.send_signal(signal.SIGTERM)
    assert await child.await_exit(20) == 0
    done = await _recorded(client, record_key)
    counts = await q.counts()
    # The 4 slow ones running at the signal finished, those fetched ahead went back; nothing else was
    # lost or doubled.
    assert len(done) == len(set(done))
    assert {0, 1, 2, 3} <= set(done)
    assert counts.in_flight == 0
    assert len(done) + counts.ready == 40
    assert "draining" in child.stderr
    assert "Task was destroyed" not in child.stderr
    assert "Unclosed" not in child.stderr


async def test_a_second_signal_stops_at_once_and_hands_back(client: Redis, make_queue: Any, spawn_consumer: Any,
                                                            tmp_path: Any, redis_server: Any,
                                                            drop_keys: Any) -> None:
    q = make_queue(codec="json")
    record_key = f"{q.name}:record"
    drop_keys(record_key)
    await q.offer_many([({"n": i, "slow": 60}, 0) for i in range(6)])
    drop_keys(record_key + ":started")
    child = await _worker_process(spawn_consumer, tmp_path, redis_server, q, record_key, 60)
    await until(lambda: _started(client, record_key, 4), timeout_s=30)  # the 4 slots are busy
    child.send_signal(signal.SIGTERM)
    await until(lambda: "draining" in child.stderr, timeout_s=10)
    child.send_signal(signal.SIGINT)
    assert await child.await_exit(10) == 0
    assert await _recorded(client, record_key) == []  # the slow ones never finished
    counts = await q.counts()
    # The 4 cut off are nacked (due now, in flight); the 2 fetched ahead or never fetched are in the list.
    assert (counts.in_flight, counts.ready) == (4, 2)
    assert "stopping now" in child.stderr
    assert "Task was destroyed" not in child.stderr

