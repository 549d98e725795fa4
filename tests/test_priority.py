"""Priorities between queues: one worker over several queues, in strict order or by weight; a
fetch that waits on all of them loses and doubles nothing."""

from __future__ import annotations

import asyncio
import functools
import random
from collections import Counter
from typing import Any

import pytest

from aiodelayq import ConfigurationError, DelayedQueue, Prioritized, WorkerOptions, current_headers
from tests.helpers import until


def _queues(make_queue: Any, qname: str, n: int) -> list[DelayedQueue[Any]]:
    return [make_queue(f"{qname}-{i}") for i in range(n)]


@pytest.mark.parametrize("reliable", [True, False])
async def test_a_strict_worker_serves_a_queue_only_while_the_ones_before_it_are_empty(
        make_queue: Any, qname: str, reliable: bool) -> None:
    urgent, normal, bulk = queues = _queues(make_queue, qname, 3)
    for rank, q in enumerate(queues):
        await q.offer_many([(f"{rank}-{i}", 0) for i in range(20)], headers=[{"rank": str(rank)}] * 20)
    handled: list[tuple[str, dict[str, str]]] = []
    for q in queues:
        await q.open()
    for q in queues:
        await until(lambda q=q: _all_ready(q, 20))
    worker = Prioritized([urgent, normal, bulk]).worker(
        functools.partial(_record, handled), WorkerOptions(concurrency=1, reliable=reliable))
    running = asyncio.create_task(worker.run())
    await until(lambda: len(handled) == 60, timeout_s=20)
    worker.stop()
    await asyncio.wait_for(running, 10)
    ranks = [int(item.split("-")[0]) for item, _ in handled]
    assert ranks == sorted(ranks)  # every urgent item before any normal one, normal before bulk
    assert sorted(item for item, _ in handled) == sorted(f"{r}-{i}" for r in range(3) for i in range(20))
    assert all(headers == {"rank": item.split("-")[0]} for item, headers in handled)


async def _record(handled: list[tuple[str, dict[str, str]]], item: str) -> None:
    handled.append((item, current_headers()))


async def _all_ready(q: DelayedQueue[Any], n: int) -> bool:
    return await q.ready_size() == n


async def test_weights_share_the_fetches_in_proportion_and_none_starves(make_queue: Any, qname: str) -> None:
    heavy, light = _queues(make_queue, qname, 2)
    await heavy.offer_many([("heavy", 0)] * 300)
    await light.offer_many([("light", 0)] * 300)
    both = Prioritized([heavy, light], weights=[3, 1], rng=random.Random(7))
    served: Counter[str] = Counter()
    async with heavy, light:
        await until(lambda: _all_ready(heavy, 300))
        await until(lambda: _all_ready(light, 300))
        for _ in range(200):
            [msg] = await both.receive_many(1, 30, timeout=5)
            served[msg.value] += 1
            await msg.ack()
    assert served["heavy"] + served["light"] == 200
    assert 120 <= served["heavy"] <= 180, served  # 150 expected; a seeded draw, not a timing
    assert served["light"] >= 20


async def test_a_fetch_waiting_on_every_queue_takes_what_comes_and_loses_nothing(
        make_queue: Any, qname: str) -> None:
    first, second = _queues(make_queue, qname, 2)
    both = Prioritized([first, second])
    async with first, second:
        waiting = asyncio.create_task(both.receive_many(10, 30, timeout=10))
        await asyncio.sleep(0.2)  # both queues' receives are waiting
        await second.offer("late", 0)
        got = await asyncio.wait_for(waiting, 10)
        assert [m.value for m in got] == ["late"]
        await got[0].ack()
        # Items arriving in both while waiting: each is delivered once, by this fetch or the next.
        values: list[str] = []
        waiting = asyncio.create_task(both.take_many_with_headers(10, timeout=10))
        await asyncio.sleep(0.2)
        await asyncio.gather(first.offer("a", 0), second.offer("b", 0))
        values += [item for item, _ in await asyncio.wait_for(waiting, 10)]
        while len(values) < 2:
            values += [item for item, _ in await both.take_many_with_headers(10, timeout=5)]
        assert sorted(values) == ["a", "b"]
        # A waiting fetch cancelled: the items offered afterwards are all still there.
        waiting = asyncio.create_task(both.receive_many(10, 30, timeout=10))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await first.offer("after", 0)
        [msg] = await both.receive_many(10, 30, timeout=5)
        assert msg.value == "after"


@pytest.mark.parametrize(("queues", "weights", "names"), [
    (0, None, "at least one"),
    (-1, None, "twice"),
    (2, [1], "weights"),
    (2, [1, 0], "weights"),
    (2, [1, -2], "weights"),
    (2, [1, True], "weights"),
    (2, [1, float("nan")], "weights"),
])
def test_bad_priorities_are_refused_naming_the_option(make_queue: Any, qname: str, queues: int,
                                                      weights: list[float] | None, names: str) -> None:
    made = _queues(make_queue, qname, max(queues, 1))
    given = [] if queues == 0 else [made[0], made[0]] if queues < 0 else made
    with pytest.raises(ConfigurationError, match=names):
        Prioritized(given, weights=weights)
