"""The consumer side of the order examples: cancel an order nobody paid.

Run it with the CLI (``pip install 'aiodelayq[cli]'``), N handlers at a time, draining on SIGTERM:

    aiodelayq worker orders_worker:cancel_unpaid --queue orders:cancel-unpaid --concurrency 16

or as a script: ``python orders_worker.py``. ``REDIS_URL`` says where Redis is; ``ORDERS_QUEUE``,
``ORDERS_STATES`` (each order's state: "paid" or "cancelled", whichever was recorded first) and
``ORDERS_CANCELLED`` (the list of cancelled orders; with the states, your database) let the tests use
their own keys.
"""

from __future__ import annotations

import os
from typing import Any

from redis.asyncio import Redis

from aiodelayq.worker import run_worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
STATES = os.environ.get("ORDERS_STATES", "orders:states")
CANCELLED = os.environ.get("ORDERS_CANCELLED", "orders:cancelled")
_db: Redis | None = None


async def cancel_unpaid(order: dict[str, Any]) -> None:
    """Cancel the order unless it was paid first. Raising here means "try again later" (the worker
    nacks with a backoff)."""
    global _db
    if _db is None:  # made in the worker's event loop, on first use
        _db = Redis.from_url(REDIS_URL)
    order_id = str(order["order_id"])
    # The first state recorded wins: "cancelled" here, or "paid" by the web app. A redelivery (the
    # worker stopped before the ack) finds "cancelled" and cancels again: keep that idempotent.
    if await _db.hsetnx(STATES, order_id, "cancelled") or await _db.hget(STATES, order_id) == b"cancelled":
        await _db.rpush(CANCELLED, order_id)


if __name__ == "__main__":
    raise SystemExit(run_worker(cancel_unpaid, queue=os.environ.get("ORDERS_QUEUE", "orders:cancel-unpaid"),
                                redis_url=REDIS_URL, concurrency=16))
