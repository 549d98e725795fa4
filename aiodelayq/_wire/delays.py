"""Delays as Redis takes them: a user's seconds or ``timedelta`` in whole milliseconds, rounded up."""

from __future__ import annotations

import math
from datetime import timedelta

from ..exceptions import InvalidDelayError

__all__ = ["MAX_DELAY_MS", "MIN_VISIBILITY_TIMEOUT_S", "delay_to_ms", "positive_ms", "visibility_ms"]

# Scores are doubles: keep due times exact integers (2**53 ms is ~285,000 years).
MAX_DELAY_MS = 2**52

MIN_VISIBILITY_TIMEOUT_S = 0.1
"""The shortest visibility timeout anywhere (``receive``, ``messages``, workers): 100 ms."""

# Float noise ignored before rounding up: 0.1 s is 100.00000000000001 ms and must stay 100 ms, while
# 1e-9 s must become 1 ms. The relative part is a few doubles' precision: more would make long delays early.
_NOISE_MS = 1e-6
_NOISE_RELATIVE = 1e-15


def delay_to_ms(delay: float | timedelta, name: str = "delay") -> int:
    """Convert a delay (seconds, or a ``timedelta``) to whole milliseconds, rounding up (never early;
    a positive delay is at least 1 ms). ``name`` names the value in errors.

    Raises:
        InvalidDelayError: negative, NaN, infinite, too large, or not a number/``timedelta``.
    """
    if isinstance(delay, timedelta):
        micros = (delay.days * 86_400 + delay.seconds) * 1_000_000 + delay.microseconds
        if micros < 0:
            raise InvalidDelayError(f"{name} must not be negative, got {delay!r}")
        delay_ms = -(-micros // 1000)
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
        if math.isnan(seconds) or math.isinf(seconds):
            raise InvalidDelayError(f"{name} must be finite, got {delay!r}")
        if seconds < 0:
            raise InvalidDelayError(f"{name} must not be negative, got {delay!r}")
        ms = seconds * 1000.0
        delay_ms = math.ceil(ms - max(_NOISE_MS, ms * _NOISE_RELATIVE)) if ms > 0 else 0
        if ms > 0 and delay_ms == 0:
            delay_ms = 1
    else:
        raise InvalidDelayError(f"{name} must be seconds (int/float) or a timedelta, not {type(delay).__name__}")
    if delay_ms > MAX_DELAY_MS:
        raise InvalidDelayError(f"{name} {delay!r} is too large (max {MAX_DELAY_MS} ms)")
    return int(delay_ms)


def positive_ms(value: float | timedelta, name: str) -> int:
    """A span above 0 (seconds, or a ``timedelta``) in whole ms; ``name`` names it in errors.

    Raises:
        InvalidDelayError: zero, negative, NaN, infinite, too large, or not a number/``timedelta``.
    """
    ms = delay_to_ms(value, name)
    if ms == 0:
        raise InvalidDelayError(f"{name} must be more than 0 s, got {value!r}")
    return ms


def visibility_ms(visibility_timeout: float | timedelta) -> int:
    """A visibility timeout (seconds or ``timedelta``) in whole ms, at least ``MIN_VISIBILITY_TIMEOUT_S``.

    Raises:
        InvalidDelayError: a bad value (as :func:`delay_to_ms`) or one under the minimum.
    """
    vt_ms = delay_to_ms(visibility_timeout, "visibility_timeout")
    if vt_ms < MIN_VISIBILITY_TIMEOUT_S * 1000:
        raise InvalidDelayError(f"visibility_timeout must be at least {MIN_VISIBILITY_TIMEOUT_S:g} s, "
                                f"got {visibility_timeout!r}")
    return vt_ms
