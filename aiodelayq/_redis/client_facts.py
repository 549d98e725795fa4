"""What the library learns once per client, kept weakly by client."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

from .._wire.clock import ServerClock
from .._wire.elements import InsertionStamps
from .connections import AnyRedis
from .retry import call_idempotent

__all__ = ["ClientFacts", "facts_for"]


@dataclass(eq=False)
class ClientFacts:
    """What the library learns once per client (it holds no reference to the client).

    Attributes:
        long_format: ``struct`` format of the server's native ``L`` (``None`` until asked).
        long_format_ask: the request in flight, shared by concurrent first producers.
        eviction_checked: whether the ``maxmemory-policy`` check was started.
        stamps: insertion stamps of this client's fast elements.
        clock: the estimate of the server's clock (``_wire/clock.py``).
    """

    long_format: str | None = None
    long_format_ask: asyncio.Future[str] | None = None
    eviction_checked: bool = False
    stamps: InsertionStamps = field(default_factory=InsertionStamps)
    clock: ServerClock = field(default_factory=ServerClock)


_facts: weakref.WeakKeyDictionary[AnyRedis, ClientFacts] = weakref.WeakKeyDictionary()


def facts_for(client: AnyRedis) -> ClientFacts:
    """The facts of ``client`` (made on first use)."""
    facts = _facts.get(client)
    if facts is None:
        facts = _facts[client] = ClientFacts()
    return facts


async def server_ms_at(client: AnyRedis, issued: float, *, route: str, timeout_s: float) -> int:
    """The server's clock at loop time ``issued`` (epoch ms): the client's estimate, or one ``TIME``
    read (on ``route``'s node) when it has none.

    Raises:
        BackendError: the read failed within ``timeout_s``.
    """
    clock = facts_for(client).clock
    estimate = clock.server_ms(issued)
    if estimate is not None:
        return estimate
    loop = asyncio.get_running_loop()
    sent = loop.time()
    seconds, micros = await call_idempotent(client, "TIME", what="read the server clock", timeout_s=timeout_s,
                                            route=route)
    server_ms = int(seconds) * 1000 + int(micros) // 1000
    clock.observe(sent, loop.time(), server_ms)
    return clock.server_ms(issued) or server_ms
