"""The ``receive`` span of a ``take`` or ``receive`` call that returned items (while an
OpenTelemetry SDK is set up, see ``_util/tracing.py``), for the plain and the sharded consumers alike.
A caller passes the call itself, made untraced: ``if traced and (found := tracer()) is not None:
return await traced_take(found, name, self.get(..., with_headers=True, traced=False), with_headers)``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from .._util.tracing import now_ns, receive_span
from .messages import Message

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["traced_receive", "traced_take"]

M = TypeVar("M", bound=Message[Any])


async def traced_take(found: Tracer, queue: str, pairs: Awaitable[list[tuple[Any, dict[str, str]]]],
                      with_headers: bool) -> list[Any]:
    """Await ``pairs``, a take call's ``(item, headers)`` pairs, as a ``receive`` span of ``queue``;
    returns them ``with_headers``, else their items."""
    started_ns = now_ns()
    got = await pairs
    if got:
        receive_span(found, queue, "take", started_ns, [headers for _, headers in got])
    return got if with_headers else [value for value, _ in got]


async def traced_receive(found: Tracer, queue: str, messages: Awaitable[list[M]]) -> list[M]:
    """Await ``messages``, a receive call's, as a ``receive`` span of ``queue``; returns them."""
    started_ns = now_ns()
    got = await messages
    if got:
        receive_span(found, queue, "receive", started_ns, [m.headers for m in got],
                     got[0].id if len(got) == 1 else None)
    return got
