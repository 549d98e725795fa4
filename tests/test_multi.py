"""Several clients and processes on one queue: every item is delivered exactly once among them."""

from __future__ import annotations

import asyncio
import json
import random
import textwrap
from collections import Counter
from typing import Any

from aiodelayq import DelayedQueue
from tests.helpers import first_line

CONSUMER = textwrap.dedent("""
    import asyncio, json, sys
    from redis.asyncio import Redis
    from aiodelayq import DelayedQueue

    async def main(url, name, stop_after_idle):
        client = Redis.from_url(url)
        got = []
        async with DelayedQueue(client, name) as q:
            print("ready", flush=True)
            while True:
                # The first item may come seconds later (the other interpreters still starting
                # on a busy machine); after it, an idle stop_after_idle ends the run.
                item = await q.poll(stop_after_idle if got else 30)
                if item is None:
                    break
                got.append(item)
        await client.aclose()
        print(json.dumps(got), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
""")


async def test_several_clients_in_one_process_exactly_once(make_client: Any, make_queue: Any) -> None:
    n = 1500
    queues = [make_queue(redis=make_client()) for _ in range(3)]
    for q in queues:
        await q.open()
    await queues[0].offer_many([(i, random.uniform(0, 1.0)) for i in range(n)])
    got: list[int] = []

    async def consume(q: DelayedQueue[int]) -> None:
        while (item := await q.poll(1.5)) is not None:
            got.append(item)

    await asyncio.gather(*(consume(q) for q in queues for _ in range(2)))
    counts = Counter(got)
    assert [i for i, c in counts.items() if c > 1] == []
    assert sorted(counts) == list(range(n))
    assert sum(1 for q in queues if q.stats.moved > 0) >= 1


async def test_several_processes_exactly_once(redis_server: Any, make_queue: Any, qname: str,
                                              spawn_consumer: Any) -> None:
    n = 2000
    children = [spawn_consumer(CONSUMER, args=[redis_server.url, qname, "2.0"]) for _ in range(3)]
    for child in children:
        assert (await first_line(child)).strip() == "ready"
    producer = make_queue()
    for start in range(0, n, 500):
        await producer.offer_many([(i, random.uniform(0, 1.0)) for i in range(start, start + 500)])
    await asyncio.gather(*(child.await_exit(60) for child in children))
    per_process = [json.loads(child.lines[-1]) for child in children]
    counts = Counter(i for got in per_process for i in got)
    assert [i for i, c in counts.items() if c > 1] == []
    assert sorted(counts) == list(range(n))
    assert sum(1 for got in per_process if got) >= 2  # the work really was shared
