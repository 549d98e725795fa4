"""arq's driver for the peers benchmark (protocol: ``common.py``), with arq's defaults.

- enqueue: ``await pool.enqueue_job("job", i, due, _defer_by=s)`` on ``create_pool(RedisSettings)`` (one
  ``WATCH``/``EXISTS``/``MULTI``/``PSETEX``/``ZADD``/``EXEC`` per job); arq has no bulk call.
- consumer: ``Worker(functions=[job], redis_settings=...).run()``, which is what ``arq`` / ``run_worker``
  run, with every default: ``max_jobs=10``, ``poll_delay=0.5`` s, ``queue_read_limit=100`` (max(5 x
  max_jobs, 100)), ``keep_result=3600`` s, signal handlers on. The one difference from the CLI: no
  logging set up, so the per-job log lines are not printed (that would cost arq time, not save it).
  ``on_startup`` tells ``run.py`` the worker is ready (it runs after the pool is created, before polling).

Runs with ``.nox/peers-arq/bin/python`` (arq pins ``redis<6``).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import arq
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker, func
from common import Recorder, parse_args, produce, write


async def produce_main(args: Any, settings: RedisSettings) -> None:
    pool = await create_pool(settings)
    try:

        async def one(i: int, due: float, d: int) -> None:
            await pool.enqueue_job("job", i, due, _defer_by=d / 1000.0)

        write(args.out, {**await produce(args, one, None), "arq": arq.VERSION})
    finally:
        await pool.aclose()


def consume_main(args: Any, settings: RedisSettings) -> None:
    state: dict[str, Any] = {}

    async def job(ctx: dict[str, Any], i: int, due: float) -> None:
        state["rec"].record(i, due)

    async def stop_when_done(worker: Worker, rec: Recorder) -> None:
        await rec.wait()
        assert worker.main_task is not None
        worker.main_task.cancel()  # run() then closes the worker (waits for running jobs)

    async def on_startup(ctx: dict[str, Any]) -> None:
        rec: Recorder = state["rec"]
        rec.ready()
        state["watcher"] = asyncio.ensure_future(stop_when_done(state["worker"], rec))

    # Worker takes the current event loop (asyncio.get_event_loop) and run() drives it, like arq's CLI.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    state["rec"] = Recorder(args)
    # func(..., name=): the job function is a closure here, so its qualified name is not "job".
    worker = Worker(functions=[func(job, name="job")], redis_settings=settings, on_startup=on_startup)
    state["worker"] = worker
    state["rec"].started()
    worker.run()
    write(args.out, state["rec"].result(arq=arq.VERSION, jobs_complete=worker.jobs_complete,
                                         jobs_failed=worker.jobs_failed))
    loop.close()


def main() -> None:
    args = parse_args()
    settings = RedisSettings.from_dsn(args.redis_url)
    if args.role == "producer":
        asyncio.run(produce_main(args, settings))
    else:
        consume_main(args, settings)


if __name__ == "__main__":
    main()
    sys.exit(0)
