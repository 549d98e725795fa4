"""What the library's ASGI apps (the metrics, the dashboard) share, with no framework imported: the
ASGI types and the answer to the lifespan protocol, so a server may run such an app alone."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "Receive", "Scope", "Send", "answer_lifespan"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """Complete a lifespan's startup and shutdown (nothing to start or stop); returns at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
