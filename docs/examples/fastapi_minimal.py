import os
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, FastAPI

from aiodelayq import DelayedQueue, Queues

queues = Queues(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
queues.add("orders:cancel-unpaid")
app = FastAPI(lifespan=queues.lifespan)  # opens the client and queues, closes them in order
Queue = Annotated[DelayedQueue[dict], Depends(queues.dependency("orders:cancel-unpaid"))]

@app.post("/orders/{order_id}", status_code=201)
async def place_order(order_id: int, queue: Queue) -> dict:
    due_ms = await queue.offer({"order_id": order_id}, delay=timedelta(minutes=30), key=f"order-{order_id}")
    return {"order_id": order_id, "cancel_due_ms": int(due_ms)}
