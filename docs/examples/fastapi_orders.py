"""Orders with FastAPI: place an order (a cancellation is scheduled, keyed by the order), pay it (the
cancellation is cancelled), look at what is scheduled. The worker (``orders_worker.py``) cancels what
falls due. Run: ``uvicorn fastapi_orders:app`` (``REDIS_URL``, ``ORDERS_QUEUE``, ``CANCEL_AFTER_S``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException

from aiodelayq import DelayedQueue, Queues

QUEUE = os.environ.get("ORDERS_QUEUE", "orders:cancel-unpaid")
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
    """Paid in time: the cancellation goes away (409 if it already fell due)."""
    if not await cancellations.cancel(f"order-{order_id}"):
        raise HTTPException(409, "too late: the cancellation already fell due")
    return {"order_id": order_id, "paid": True}


@app.get("/orders/scheduled")
async def scheduled(cancellations: Cancellations) -> dict[str, Any]:
    """What is scheduled: counts and the next ten cancellations."""
    counts = await cancellations.counts()
    upcoming = await cancellations.peek(10)
    return {"pending": counts.pending, "next": [{"key": p.key, "due_ms": p.due_ms} for p in upcoming]}
