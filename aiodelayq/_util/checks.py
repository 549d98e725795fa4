"""The one validator of user-given numbers: every message names the option.

A duration is finite seconds (``int``/``float``, never ``bool``) or a :class:`datetime.timedelta`;
option names carry the unit (``call_timeout_s``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

from ..exceptions import ConfigurationError, InvalidDelayError, ItemTooLargeError

__all__ = ["check_item_bytes", "check_max_items", "check_timeout", "count", "positive", "seconds", "seconds_text"]


def seconds_text(value: float) -> str:
    """``value`` seconds in words: ``1 second``, ``0.1 seconds``, ``30 seconds``."""
    return f"{value:g} second" if value == 1 else f"{value:g} seconds"


def seconds(name: str, value: object, *, minimum_s: float = 0.0, above_minimum: bool = False) -> float:
    """``value`` as finite seconds (a number or a ``timedelta``), at least ``minimum_s`` (strictly above
    it with ``above_minimum``); else a ConfigurationError."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise ConfigurationError(f"{name} must be seconds (int or float) or a timedelta, not {value!r}")
    if math.isnan(result) or math.isinf(result):
        raise ConfigurationError(f"{name} must be a finite number of seconds, not {value!r}")
    if result < minimum_s or (above_minimum and result == minimum_s):
        bound = "more than" if above_minimum else "at least"
        raise ConfigurationError(f"{name} must be {bound} {seconds_text(minimum_s)}, not {value!r}")
    return result


def count(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an ``int`` (never a ``bool``) from ``minimum`` to ``maximum``; else a ConfigurationError."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(f"{name} must be an int, not {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        span = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ConfigurationError(f"{name} must be an int {span}, not {value!r}")
    return value


def positive(name: str, value: object) -> float:
    """``value`` as a finite number above 0 (never a ``bool``), e.g. a rate; else a ConfigurationError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigurationError(f"{name} must be a number (int or float), not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a finite number above 0, not {value!r}")
    return float(value)


def check_timeout(timeout: float | None, label: str = "timeout") -> None:
    """Accept ``None`` or a number of seconds >= 0.

    Raises:
        InvalidDelayError: anything else (negative, NaN, a bool, a string...).
    """
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or math.isnan(timeout) or timeout < 0):
        raise InvalidDelayError(f"{label} must be None or seconds >= 0, got {timeout!r}")


def check_max_items(max_items: object) -> int:
    """Accept an ``int`` >= 1 (a batch size).

    Raises:
        ConfigurationError: anything else.
    """
    if not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1:
        raise ConfigurationError(f"max_items must be an int >= 1, got {max_items!r}")
    return max_items


def check_item_bytes(max_item_bytes: int | None, payloads: Sequence[bytes]) -> None:
    """Refuse the first of ``payloads`` (as stored, in their envelope) longer than ``max_item_bytes``
    (``None``: no limit).

    Raises:
        ItemTooLargeError: one is longer (nothing was written).
    """
    if max_item_bytes is None:
        return
    for index, payload in enumerate(payloads):
        if len(payload) > max_item_bytes:
            which = "the item" if len(payloads) == 1 else f"item {index}"
            raise ItemTooLargeError(f"{which} is {len(payload)} bytes as stored (encoded, with its headers and "
                                    f"envelope), over max_item_bytes={max_item_bytes}; nothing was written")
