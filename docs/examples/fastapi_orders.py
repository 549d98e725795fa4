"""Orders with FastAPI: place an order (its cancellation is scheduled, keyed by the order), pay it, look
at what is scheduled. The worker (``orders_worker.py``) cancels the orders whose cancellation falls due
unpaid. Which came first, the payment or the cancellation, is the order's state (a Redis hash here,
your database in an app of yours): the first one recorded wins, so paying twice answers the same, and
``409`` means the order was cancelled. Run: ``uvicorn fastapi_orders:app`` (``REDIS_URL``,
``ORDERS_QUEUE``, ``ORDERS_STATES``, ``CANCEL_AFTER_S``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException

from aiodelayq import DelayedQueue, Queues

QUEUE = os.environ.get("ORDERS_QUEUE", "orders:cancel-unpaid")
STATES = os.environ.get("ORDERS_STATES", "orders:states")  # order id -> "paid" or "cancelled"
CANCEL_AFTER = timedelta(seconds=float(os.environ.get("CANCEL_AFTER_S", 30 * 60)))

queues = Queues(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
queues.add(QUEUE, codec="json")
# The lifespan makes the client and the queue in uvicorn's event loop, and on shutdown (SIGTERM)
# closes the queue, then the client, after the requests in flight are done.
app = FastAPI(lifespan=queues.lifespan)
Cancellations = Annotated[DelayedQueue[dict[str, Any]], Depends(queues.dependency(QUEUE))]


@app.post("/orders/{order_id}", status_code=201)
async def place_order(order_id: int, cancellations: Cancellations) -> dict[str, Any]:
    """Schedule the cancellation; placing the same order twice schedules it once."""
    due = await cancellations.offer({"order_id": order_id}, CANCEL_AFTER, key=f"order-{order_id}")
    return {"order_id": order_id, "cancel_due_ms": int(due), "scheduled": due.added}


@app.post("/orders/{order_id}/paid")
async def order_paid(order_id: int, cancellations: Cancellations) -> dict[str, Any]:
    """Record the payment unless the order was cancelled first (409); paying again answers the same."""
    db = queues.client
    if await db.hsetnx(STATES, str(order_id), "paid"):  # the first state recorded: paid
        # Its cancellation is not needed any more. If it fell due meanwhile, the worker finds the
        # order paid and leaves it.
        await cancellations.cancel(f"order-{order_id}")
    elif await db.hget(STATES, str(order_id)) != b"paid":
        raise HTTPException(409, "too late: the order was cancelled")
    return {"order_id": order_id, "paid": True}


@app.get("/orders/scheduled")
async def scheduled(cancellations: Cancellations) -> dict[str, Any]:
    """What is scheduled: counts and the next ten cancellations."""
    counts = await cancellations.counts()
    upcoming = await cancellations.peek(10)
    return {"pending": counts.pending, "next": [{"key": p.key, "due_ms": p.due_ms} for p in upcoming]}
