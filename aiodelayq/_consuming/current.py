"""What a worker's handler is running on: :func:`current_message` and :func:`current_headers`.

The worker sets them in the slot task that awaits the handler, before each call; tasks the handler
starts copy them with the rest of its context.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from .messages import Message

__all__ = ["CURRENT_HEADERS", "CURRENT_MESSAGE", "current_headers", "current_message"]

CURRENT_MESSAGE: ContextVar[Message[Any] | None] = ContextVar("aiodelayq_message", default=None)
CURRENT_HEADERS: ContextVar[dict[str, str] | None] = ContextVar("aiodelayq_headers", default=None)


def current_message() -> Message[Any] | None:
    """The message a reliable worker's handler is running on (its ``headers``, ``id``,
    ``delivery_count``, ``expires_at_ms``...), in the handler and the tasks it starts; ``None``
    elsewhere and in a plain worker (``reliable=False``), which has no messages."""
    return CURRENT_MESSAGE.get()


def current_headers() -> dict[str, str]:
    """The headers of the item a worker's handler is running on, reliable or plain (``{}`` when it
    has none, and outside a handler)."""
    message = CURRENT_MESSAGE.get()
    if message is not None:
        return message.headers
    return CURRENT_HEADERS.get() or {}
