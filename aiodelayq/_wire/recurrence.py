"""When a recurring item's occurrences fall due: ``every=`` periods and ``cron=`` expressions (pure
functions, no I/O). Cron expressions are parsed by croniter, the extra ``aiodelayq[cron]``, imported
on first use."""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..exceptions import ConfigurationError

__all__ = ["CRON_LISTED", "cron_spec", "cron_times"]

CRON_LISTED = 128
"""Due times of a cron schedule listed ahead in its record (a consumer lists more when few are left)."""


def _croniter() -> Any:
    try:
        return importlib.import_module("croniter")
    except ImportError as exc:
        raise ConfigurationError("cron= needs the croniter package: pip install 'aiodelayq[cron]'") from exc


def cron_spec(cron: object, tz: object) -> str:
    """The spec a schedule record keeps: the expression and the time zone name (``UTC`` by
    default), a newline between.

    Raises:
        ConfigurationError: croniter is missing, ``cron`` is not a valid cron expression, or ``tz``
            is not a known IANA time zone name.
    """
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigurationError(f"cron must be a cron expression (str), not {cron!r}")
    croniter = _croniter()
    if not croniter.croniter.is_valid(cron) or "\n" in cron:
        raise ConfigurationError(f"cron {cron!r} is not a valid cron expression")
    zone = "UTC" if tz is None else tz
    if not isinstance(zone, str):
        raise ConfigurationError(f"tz must be an IANA time zone name (str), not {tz!r}")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(f"tz {zone!r} is not a known time zone: {exc}") from exc
    return f"{cron}\n{zone}"


def cron_times(spec: str, after_ms: int, count: int | None = None) -> list[int]:
    """The first ``count`` (default ``CRON_LISTED``) due times (epoch ms) of ``spec`` strictly after
    ``after_ms``.

    Raises:
        ConfigurationError: croniter is missing.
    """
    expression, zone = spec.split("\n", 1)
    start = datetime.fromtimestamp(after_ms / 1000, ZoneInfo(zone))
    it = _croniter().croniter(expression, start)
    wanted = CRON_LISTED if count is None else count
    times: list[int] = []
    for _ in range(4 * wanted):  # bounded: a parser that stops advancing (a time zone edge) cannot hang us
        at = round(it.get_next(float) * 1000)
        if at > after_ms and (not times or at > times[-1]):
            times.append(at)
            if len(times) == wanted:
                break
    return times
