"""aiodelayq's driver for the peers benchmark (protocol: ``common.py``), with its defaults.

- enqueue: ``await q.offer(item, delay=s)`` per job; bulk: ``await q.offer_many([(item, s), ...])``;
- consumer: ``async with q: async for item in q`` (one process, one loop), ``DelayedQueue`` defaults
  (``codec="json"``, fast mode, ``transfer_batch=500``, ``safety_poll_s=5``).

Run by ``run.py`` with the interpreter that runs it and ``PYTHONPATH`` set to this checkout, so the
``aiodelayq`` measured is the one next to this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from common import Recorder, parse_args, produce, write
from redis.asyncio import Redis

import aiodelayq
from aiodelayq import DelayedQueue


async def main() -> None:
    args = parse_args()
    client = Redis.from_url(args.redis_url, decode_responses=False)
    info = {"aiodelayq": aiodelayq.__version__, "aiodelayq_file": aiodelayq.__file__}
    try:
        q: DelayedQueue[dict[str, Any]] = DelayedQueue(client, args.name)
        if args.role == "producer":

            async def one(i: int, due: float, d: int) -> None:
                await q.offer({"i": i, "due": due}, delay=d / 1000.0)

            async def bulk(batch: list[tuple[int, float, int]]) -> None:
                await q.offer_many([({"i": i, "due": due}, d / 1000.0) for i, due, d in batch])

            write(args.out, {**await produce(args, one, bulk), **info})
            return
        rec = Recorder(args)

        async def consume() -> None:
            async for item in q:
                rec.record(item["i"], item["due"])

        rec.started()
        async with q:
            rec.ready()
            task = asyncio.ensure_future(consume())
            await rec.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        write(args.out, rec.result(**info))
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
