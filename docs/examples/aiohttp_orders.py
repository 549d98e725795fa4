"""Orders with aiohttp: the same three routes as ``fastapi_orders.py``. Run:
``python aiohttp_orders.py --port 8080`` (``REDIS_URL``, ``ORDERS_QUEUE``, ``ORDERS_STATES``,
``CANCEL_AFTER_S``).
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

from aiohttp import web

from aiodelayq import Queues

QUEUE = os.environ.get("ORDERS_QUEUE", "orders:cancel-unpaid")
STATES = os.environ.get("ORDERS_STATES", "orders:states")  # order id -> "paid" or "cancelled"
CANCEL_AFTER = timedelta(seconds=float(os.environ.get("CANCEL_AFTER_S", 30 * 60)))

queues = Queues(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
queues.add(QUEUE, codec="json")
routes = web.RouteTableDef()


@routes.post("/orders/{order_id}")
async def place_order(request: web.Request) -> web.Response:
    order_id = int(request.match_info["order_id"])
    due = await queues[QUEUE].offer({"order_id": order_id}, CANCEL_AFTER, key=f"order-{order_id}")
    return web.json_response({"order_id": order_id, "cancel_due_ms": int(due), "scheduled": due.added}, status=201)


@routes.post("/orders/{order_id}/paid")
async def order_paid(request: web.Request) -> web.Response:
    order_id = int(request.match_info["order_id"])
    db = queues.client
    if await db.hsetnx(STATES, str(order_id), "paid"):  # the first state recorded: paid
        await queues[QUEUE].cancel(f"order-{order_id}")  # not needed any more (fell due: the worker leaves it)
    elif await db.hget(STATES, str(order_id)) != b"paid":
        raise web.HTTPConflict(text="too late: the order was cancelled")
    return web.json_response({"order_id": order_id, "paid": True})


def make_app() -> web.Application:
    app = web.Application()
    app.add_routes(routes)
    # Opens the client and queue at startup; at shutdown (SIGTERM, SIGINT) closes the queue, then
    # the client, after the requests in flight are done.
    app.cleanup_ctx.append(queues.cleanup_ctx)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8080)
    web.run_app(make_app(), host="127.0.0.1", port=parser.parse_args().port)
