"""saq's driver for the peers benchmark (protocol: ``common.py``), with saq's defaults.

- enqueue: ``await queue.enqueue("job", i=i, due=due, scheduled=due_s)`` on ``Queue.from_url(url)``
  (``scheduled`` is epoch seconds; the enqueue script is one call per job, at most
  ``max_concurrent_ops=20`` in flight per queue object); saq has no bulk enqueue (``map``/``apply`` wait for
  the results).
- consumer: ``Worker(queue, functions=[job]).start()`` with every default: ``concurrency=10``, timers
  ``schedule=1`` s (how often scheduled jobs are moved to the queue), ``sweep=60``, ``abort=1``,
  ``worker_info=10``; dequeue by a blocking ``BLMOVE``. ``startup`` tells ``run.py`` the
  worker is ready.

Runs with ``.nox/peers-saq/bin/python`` (saq pins ``redis<8``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from importlib.metadata import version
from typing import Any

from common import Recorder, parse_args, produce, write
from saq import Queue, Worker


async def main() -> None:
    args = parse_args()
    queue = Queue.from_url(args.redis_url)
    info = {"saq": version("saq")}
    await queue.connect()  # as saq's own ``start`` does before ``Worker.start``
    try:
        if args.role == "producer":

            async def one(i: int, due: float, d: int) -> None:
                await queue.enqueue("job", i=i, due=due, scheduled=due / 1000.0)

            write(args.out, {**await produce(args, one, None), **info})
            return
        rec = Recorder(args)

        async def job(ctx: dict[str, Any], *, i: int, due: float) -> None:
            rec.record(i, due)

        async def startup(ctx: dict[str, Any]) -> None:
            rec.ready()

        worker = Worker(queue, functions=[("job", job)], startup=startup)
        rec.started()
        task = asyncio.ensure_future(worker.start())
        await rec.wait()
        await worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10.0)
        write(args.out, rec.result(**info))
    finally:
        await queue.disconnect()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
