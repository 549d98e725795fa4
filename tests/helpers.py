"""Helpers shared by the tests: bounded waits and the server clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis


async def server_ms(r: Redis) -> float:
    """The server's clock in epoch milliseconds."""
    seconds, micros = await r.time()
    return seconds * 1000 + micros / 1000


async def until(predicate: Callable[[], Any], timeout_s: float = 5.0, interval_s: float = 0.01) -> None:
    """Wait until ``predicate()`` (sync or async) is truthy; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)
