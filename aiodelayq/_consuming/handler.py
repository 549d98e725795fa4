"""A worker's handler: what it must be (:func:`check_handler`), and what it raises to steer the
worker (:class:`Retry`, :class:`Reject`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..exceptions import ConfigurationError

__all__ = ["Reject", "Retry", "check_handler"]

T = TypeVar("T")


def check_handler(handler: Callable[[T], Awaitable[object]], what: str = "handler"
                  ) -> Callable[[T], Awaitable[object]]:
    """``handler``, if it is an async callable (``async def``, a partial or ``functools.wraps``
    wrapper of one, an ``async def __call__``, or ``inspect.markcoroutinefunction``).

    Raises:
        ConfigurationError: anything else (a plain function or lambda, a class, a non-callable),
            naming ``what``.
    """
    if not _is_async_callable(handler):
        raise ConfigurationError(
            f"{what} must be an async callable taking one item ('async def', a functools.partial of one, or an "
            f"object with 'async def __call__'), not {handler!r}: a worker awaits what it returns. For a lambda "
            "that returns a coroutine, use functools.partial; run blocking code from an 'async def' with "
            "'await asyncio.to_thread(work, item)'")
    return handler


def _is_async_callable(obj: object, depth: int = 0) -> bool:
    if not callable(obj) or depth > 10:
        return False
    if inspect.iscoroutinefunction(obj):  # functions, methods, partials of them, marked functions
        return True
    if isinstance(obj, functools.partial):
        return _is_async_callable(obj.func, depth + 1)
    if not isinstance(obj, type) and inspect.iscoroutinefunction(type(obj).__call__):
        return True  # an instance whose class has 'async def __call__'
    wrapped = getattr(obj, "__wrapped__", None)
    return wrapped is not None and _is_async_callable(wrapped, depth + 1)


class Retry(Exception):
    """Raised by a handler: deliver the message again after ``delay_s`` seconds (``None``: the
    worker's backoff). It counts as a delivery, so ``max_deliveries`` still applies."""

    def __init__(self, delay_s: float | None = None) -> None:
        super().__init__(f"retry in {delay_s} s" if delay_s is not None else "retry")
        self.delay_s = delay_s


class Reject(Exception):
    """Raised by a handler: no retry can fix this item; dead-letter it now (reason ``"nacked"``)."""
