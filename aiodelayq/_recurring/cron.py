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
    """The spec a schedule record keeps: the expression and time zone name (default ``UTC``),
    newline-separated. 5 fields, 6 with seconds last, or a croniter ``@`` name; must match some date.

    Raises:
        ConfigurationError: croniter is missing; ``cron`` is not a valid cron expression (another
            number of fields, such as croniter's 7th, the year) or matches no date (``0 0 30 2 *``:
            February 30th); or ``tz`` is not a known IANA time zone name.
    """
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigurationError(f"cron must be a cron expression (str), not {cron!r}")
    croniter = _croniter()
    fields = cron.split()
    if not (len(fields) in (5, 6) or (len(fields) == 1 and fields[0].startswith("@"))):
        raise ConfigurationError(f"cron {cron!r} has {len(fields)} fields: a cron expression has 5 (minute hour "
                                 "day-of-month month day-of-week), or 6 with seconds last")
    if not croniter.croniter.is_valid(cron) or "\n" in cron:
        raise ConfigurationError(f"cron {cron!r} is not a valid cron expression")
    zone = "UTC" if tz is None else tz
    if not isinstance(zone, str):
        raise ConfigurationError(f"tz must be an IANA time zone name (str), not {tz!r}")
    try:
        start = datetime.now(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(f"tz {zone!r} is not a known time zone: {exc}") from exc
    try:
        croniter.croniter(cron, start).get_next(float)
    except croniter.CroniterBadDateError as exc:
        raise ConfigurationError(f"cron {cron!r} matches no date (such as February 30th): {exc}") from exc
    return f"{cron}\n{zone}"


def cron_times(spec: str, after_ms: int, count: int | None = None) -> list[int]:
    """The first ``count`` (default ``CRON_LISTED``) due times (epoch ms) of ``spec`` strictly after
    ``after_ms``; fewer (none) once it matches no further date.

    Raises:
        ConfigurationError: croniter is missing.
    """
    expression, zone = spec.split("\n", 1)
    start = datetime.fromtimestamp(after_ms / 1000, ZoneInfo(zone))
    croniter = _croniter()
    it = croniter.croniter(expression, start)
    wanted = CRON_LISTED if count is None else count
    times: list[int] = []
    for _ in range(4 * wanted):  # bounded: a parser that stops advancing (a time zone edge) cannot hang us
        try:
            at = round(it.get_next(float) * 1000)
        except croniter.CroniterBadDateError:
            break  # no further date (a record another program or version wrote: cron_spec refuses these)
        if at > after_ms and (not times or at > times[-1]):
            times.append(at)
            if len(times) == wanted:
                break
    return times
