"""Several clients and processes on one queue: every item is delivered exactly once among them."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

from redis.asyncio import Redis

from aiodelayq import DelayedQueue

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
                item = await q.poll(stop_after_idle)
                if item is None:
                    break
                got.append(item)
        await client.aclose()
        print(json.dumps(got), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
""")


async def test_several_clients_in_one_process_exactly_once(redis_server: Any, make_queue: Any,
                                                           qname: str) -> None:
    n = 1500
    clients = [Redis.from_url(redis_server.url) for _ in range(3)]
    try:
        queues = [make_queue(redis=c) for c in clients]
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
    finally:
        for q in queues:
            await q.aclose()
        for c in clients:
            await c.aclose()


async def test_several_processes_exactly_once(redis_server: Any, make_queue: Any, qname: str) -> None:
    n = 2000
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen(  # noqa: ASYNC220 - started once, read from threads below
[sys.executable, "-c", CONSUMER, redis_server.url, qname, "2.0"],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout is not None
            line = await asyncio.to_thread(p.stdout.readline)
            assert line.strip() == "ready"
        producer = make_queue()
        for start in range(0, n, 500):
            await producer.offer_many([(i, random.uniform(0, 1.0)) for i in range(start, start + 500)])
        outputs = await asyncio.gather(*(asyncio.to_thread(p.communicate, timeout=60) for p in procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    per_process = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    counts = Counter(i for got in per_process for i in got)
    assert [i for i, c in counts.items() if c > 1] == []
    assert sorted(counts) == list(range(n))
    assert sum(1 for got in per_process if got) >= 2  # the work really was shared
