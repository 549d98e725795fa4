"""The consumer side of the order examples: cancel an order nobody paid.

Run it with the CLI (``pip install 'aiodelayq[cli]'``), N handlers at a time, draining on SIGTERM:

    aiodelayq worker orders_worker:cancel_unpaid --queue orders:cancel-unpaid --concurrency 16

or as a script: ``python orders_worker.py``. ``REDIS_URL`` says where Redis is; ``ORDERS_QUEUE`` and
``ORDERS_CANCELLED`` (the list standing in for your database) let the tests use their own keys.
"""

from __future__ import annotations

import os
from typing import Any

from redis.asyncio import Redis

from aiodelayq.worker import run_worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
CANCELLED = os.environ.get("ORDERS_CANCELLED", "orders:cancelled")
_db: Redis | None = None


async def cancel_unpaid(order: dict[str, Any]) -> None:
    """Cancel the order. Raising here means "try again later" (the worker nacks with a backoff)."""
    global _db
    if _db is None:  # made in the worker's event loop, on first use
        _db = Redis.from_url(REDIS_URL)
    await _db.rpush(CANCELLED, order["order_id"])


if __name__ == "__main__":
    raise SystemExit(run_worker(cancel_unpaid, queue=os.environ.get("ORDERS_QUEUE", "orders:cancel-unpaid"),
                                redis_url=REDIS_URL, concurrency=16))
