"""The driver of the Python peers (aiodelayq, arq, saq) for the peers benchmark, each with its framework's
idiomatic calls and default settings (``--peer``; each driver's docstring says which). ``bullmq_peer.mjs``
does the same in JavaScript; keep the two in step. Standard library only, but for the peer: it runs with
its peer's own interpreter (``.nox/peers-<peer>/bin/python``), where nothing of this repository is
installed (aiodelayq: this checkout on ``PYTHONPATH``).

Protocol with ``run.py``:

- ``--role producer``: enqueue ``--total`` jobs, write a JSON summary to ``--out``, exit.
- ``--role consumer``: start the framework's worker, print ``ready`` on stdout once it consumes, record every
  job it is handed, and stop when every job arrived (then ``GRACE_S`` more, to see duplicates), when
  ``--bound-s`` passed since the worker was started, or at the epoch-ms deadline sent on stdin as
  ``deadline <ms>``, whichever comes first; then write the JSON summary to ``--out``.

Job ``i`` carries ``{"i": i, "due": due_ms}``, where ``due_ms`` is the producer's wall clock just before the
enqueue call plus the job's delay: the consumer's lateness is its wall clock on receipt minus ``due``
(producer and consumer share the machine, hence the clock).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

GOLDEN = 0.6180339887498949
GRACE_S = 1.0  # after the last job arrived, to catch duplicates delivered late

SendOne = Callable[[int, float, int], Awaitable[Any]]  # (i, due_ms, delay_ms)
SendBulk = Callable[[list[tuple[int, float, int]]], Awaitable[Any]]


def delay_ms(i: int, lo: int, hi: int) -> int:
    """Delay of job ``i``: uniform over ``[lo, hi]`` ms by the golden-ratio sequence, so every peer (and the
    JavaScript driver, same IEEE arithmetic) gets the very same delays without sharing a random generator."""
    return lo + int(((i * GOLDEN) % 1.0) * (hi - lo + 1))


def now_ms() -> float:
    return time.time() * 1000.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", choices=sorted(DRIVERS), required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--name", default="peers", help="queue name")
    p.add_argument("--role", choices=("producer", "consumer"), required=True)
    p.add_argument("--scenario", choices=("A", "B", "C"), required=True)
    p.add_argument("--total", type=int, required=True)
    p.add_argument("--delay-min-ms", type=int, default=1000)
    p.add_argument("--delay-max-ms", type=int, default=1000)
    p.add_argument("--mode", choices=("single", "bulk"), default="single",
                   help="producer: one call per job with --in-flight calls outstanding, or the bulk call")
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--batch", type=int, default=1000, help="jobs per bulk call")
    p.add_argument("--bound-s", type=float, default=None, help="consumer: stop this long after the worker started")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


async def produce(args: argparse.Namespace, send_one: SendOne, send_bulk: SendBulk | None) -> None:
    """Enqueue jobs ``0 .. total-1``: ``--in-flight`` concurrent callers of ``send_one`` (each takes the next
    job when its call returned), or ``send_bulk`` of ``--batch`` jobs, one call at a time; write the summary.
    The rate is jobs enqueued over the wall time from the first call to the last reply."""
    total, lo, hi = args.total, args.delay_min_ms, args.delay_max_ms
    failed: list[int] = []
    errors: list[str] = []
    last_due = 0.0
    next_i = 0

    async def caller() -> None:
        nonlocal next_i, last_due
        while next_i < total:
            i = next_i
            next_i += 1
            d = delay_ms(i, lo, hi)
            due = now_ms() + d
            last_due = max(last_due, due)
            try:
                await send_one(i, due, d)
            except Exception as exc:  # reported, not raised: a failed call is a result too
                failed.append(i)
                errors.append(repr(exc))

    t0 = time.perf_counter()
    if args.mode == "single":
        await asyncio.gather(*(caller() for _ in range(args.in_flight)))
    elif send_bulk is None:
        raise SystemExit("this peer has no bulk call")
    else:
        for start in range(0, total, args.batch):
            base, ids = now_ms(), range(start, min(total, start + args.batch))
            batch = [(i, base + d, d) for i, d in zip(ids, (delay_ms(i, lo, hi) for i in ids), strict=True)]
            try:
                await send_bulk(batch)
            except Exception as exc:
                failed += [i for i, _, _ in batch]
                errors.append(repr(exc))
            last_due = max(last_due, max(d for _, d, _ in batch))
    seconds = time.perf_counter() - t0
    ok = total - len(failed)
    args.out.write_text(json.dumps({"enqueued": ok, "failed": len(failed), "failed_ids": failed[:100],
                                    "errors": errors[:5], "seconds": seconds, "rate": ok / seconds if seconds > 0
                                    else None, "last_due_ms": last_due, "mode": args.mode}))


class Recorder:
    """What a consumer saw: per job its lateness, duplicates, and when it started and last got a new job."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.total = args, args.total
        self.seen: set[int] = set()
        self.late_ms: list[float] = []
        self.duplicates = self.out_of_range = 0
        self.t_start_ms = self.t_last_ms = self.deadline_ms = None  # epoch ms
        self.stopped = ""

    def started(self) -> None:
        """Call right before the worker is started: the drain rate (scenario B) is timed from here."""
        self.t_start_ms = now_ms()
        if self.args.bound_s is not None:
            self.deadline_ms = self.t_start_ms + self.args.bound_s * 1000.0

    def ready(self) -> None:
        """The worker consumes: tell ``run.py`` (and start listening for a deadline on stdin)."""
        print("ready", flush=True)
        threading.Thread(target=self._read_stdin, daemon=True).start()

    def record(self, i: int, due_ms: float) -> None:
        now = now_ms()
        if not 0 <= i < self.total:
            self.out_of_range += 1
        elif i in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(i)
            self.late_ms.append(now - due_ms)
            self.t_last_ms = now

    def _read_stdin(self) -> None:
        # A daemon thread: it may stay blocked on stdin at exit without holding the process up.
        for line in sys.stdin:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "deadline":
                self.deadline_ms = min(self.deadline_ms or math.inf, float(parts[1]))

    async def wait(self) -> None:
        """Return when every job arrived (plus ``GRACE_S``) or the deadline passed (checked every 10 ms)."""
        while len(self.seen) < self.total:
            if self.deadline_ms is not None and now_ms() >= self.deadline_ms:
                self.stopped = "deadline"
                return
            await asyncio.sleep(0.01)
        self.stopped = "all"
        await asyncio.sleep(GRACE_S)

    def write(self, **extra: Any) -> None:
        self.args.out.write_text(json.dumps({
            "received": len(self.seen), "duplicates": self.duplicates, "out_of_range": self.out_of_range,
            "late_ms": self.late_ms, "t_start_ms": self.t_start_ms, "t_last_ms": self.t_last_ms,
            "deadline_ms": self.deadline_ms, "stopped": self.stopped, **extra}))


async def aiodelayq_driver(args: argparse.Namespace) -> None:
    """aiodelayq, this checkout's (first on ``PYTHONPATH``): enqueue ``await q.offer(item, delay=s)`` per job;
    bulk ``await q.offer_many([(item, s), ...])``; consumer ``async with q: async for item in q`` (one process,
    one loop) with ``DelayedQueue``'s defaults (``codec="json"``, fast mode, ``transfer_batch=500``,
    ``safety_poll_s=5``)."""
    from redis.asyncio import Redis

    from aiodelayq import DelayedQueue

    client = Redis.from_url(args.redis_url, decode_responses=False)
    try:
        q: DelayedQueue[dict[str, Any]] = DelayedQueue(client, args.name)
        if args.role == "producer":

            async def one(i: int, due: float, d: int) -> None:
                await q.offer({"i": i, "due": due}, delay=d / 1000.0)

            async def bulk(batch: list[tuple[int, float, int]]) -> None:
                await q.offer_many([({"i": i, "due": due}, d / 1000.0) for i, due, d in batch])

            return await produce(args, one, bulk)
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
        rec.write()
    finally:
        await client.aclose()


async def saq_driver(args: argparse.Namespace) -> None:
    """saq (``.nox/peers-saq``, which pins ``redis<8``): enqueue ``await queue.enqueue("job", i=i, due=due,
    scheduled=due_s)`` on ``Queue.from_url(url)`` (``scheduled`` is epoch seconds; one script call per job, at
    most ``max_concurrent_ops=20`` in flight per queue object); no bulk enqueue (``map``/``apply`` wait for
    the results). Consumer ``Worker(queue, functions=[job]).start()`` with every default: ``concurrency=10``,
    timers ``schedule=1`` s (how often scheduled jobs are moved to the queue), ``sweep=60``, ``abort=1``,
    ``worker_info=10``; dequeue by a blocking ``BLMOVE``; ``startup`` says the worker is ready."""
    from saq import Queue, Worker

    queue = Queue.from_url(args.redis_url)
    await queue.connect()  # as saq's own ``start`` does before ``Worker.start``
    try:
        if args.role == "producer":

            async def one(i: int, due: float, d: int) -> None:
                await queue.enqueue("job", i=i, due=due, scheduled=due / 1000.0)

            return await produce(args, one, None)
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
        rec.write()
    finally:
        await queue.disconnect()


def arq_driver(args: argparse.Namespace) -> None:
    """arq (``.nox/peers-arq``, which pins ``redis<6``): enqueue ``await pool.enqueue_job("job", i, due,
    _defer_by=s)`` on ``create_pool(RedisSettings)`` (one ``WATCH``/``EXISTS``/``MULTI``/``PSETEX``/``ZADD``/
    ``EXEC`` per job); no bulk call. Consumer ``Worker(functions=[job], redis_settings=...).run()``, what
    ``arq``/``run_worker`` run, with every default: ``max_jobs=10``, ``poll_delay=0.5`` s,
    ``queue_read_limit=100`` (max(5 x max_jobs, 100)), ``keep_result=3600`` s, signal handlers on; unlike
    the CLI no logging set up, so no per-job log lines (they would cost arq time, not save it).
    ``on_startup`` (after the pool is created, before polling) says the worker is ready."""
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    settings = RedisSettings.from_dsn(args.redis_url)
    if args.role == "producer":

        async def producer() -> None:
            pool = await create_pool(settings)
            try:
                await produce(args, lambda i, due, d: pool.enqueue_job("job", i, due, _defer_by=d / 1000.0), None)
            finally:
                await pool.aclose()

        return asyncio.run(producer())
    rec = Recorder(args)
    state: dict[str, Any] = {}

    async def job(ctx: dict[str, Any], i: int, due: float) -> None:
        rec.record(i, due)

    async def stop_when_done() -> None:
        await rec.wait()
        state["worker"].main_task.cancel()  # run() then closes the worker (waits for running jobs)

    async def on_startup(ctx: dict[str, Any]) -> None:
        rec.ready()
        state["watcher"] = asyncio.ensure_future(stop_when_done())

    # Worker takes the current event loop (asyncio.get_event_loop) and run() drives it, like arq's CLI.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # func(..., name=): the job function is a closure here, so its qualified name is not "job".
    worker = state["worker"] = Worker(functions=[func(job, name="job")], redis_settings=settings,
                                      on_startup=on_startup)
    rec.started()
    worker.run()
    rec.write(jobs_complete=worker.jobs_complete, jobs_failed=worker.jobs_failed)
    loop.close()


DRIVERS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "aiodelayq": aiodelayq_driver, "saq": saq_driver, "arq": arq_driver}

if __name__ == "__main__":
    arguments = parse_args()
    ran = DRIVERS[arguments.peer](arguments)
    if asyncio.iscoroutine(ran):
        asyncio.run(ran)
