"""How the commands show things: rich tables for people, plain dicts for ``--json``, and the time and
value formats both use. Times are relative to the *server's* clock (``now_ms``), as due times are."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._admin.durations import format_duration
from .._admin.reads import QueueRow
from .._contents.contents import PendingItem
from .._contents.counts import QueueCounts
from .._contents.dead_letters import DeadLetter
from .._contents.event_stream import QueueEvent
from ._doctor import Finding

__all__ = ["counts_json", "counts_table", "dead_letter_json", "dead_letters_table", "event_json", "event_line",
           "iso_utc", "make_console", "pending_json", "pending_table", "print_json", "relative", "show_value"]

# Tables cut longer values (`--json` has them whole): one payload must not flood a terminal.
MAX_CELL = 200

# For output that is not a terminal: rich's 80 columns would wrap rows and break `| grep`. COLUMNS wins.
PIPE_WIDTH = 200


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr), wide when not a terminal."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, highlight=False, width=PIPE_WIDTH)
    return console


def print_json(document: Any) -> None:
    """``document`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def relative(at_ms: int, now_ms: int) -> str:
    """``at_ms`` relative to ``now_ms``: ``"in 12.3 s"``, ``"2.1 s ago"``, minutes/hours/days when longer,
    ``"now"`` within 50 ms."""
    delta_s = (at_ms - now_ms) / 1000.0
    span = abs(delta_s)
    if span < 0.05:  # would print as "0.0 s": say it plainly
        return "now"
    if span < 100:
        text = f"{span:.1f} s"
    elif span < 100 * 60:
        text = f"{span / 60:.1f} min"
    elif span < 48 * 3600:
        text = f"{span / 3600:.1f} h"
    else:
        text = f"{span / 86400:.1f} d"
    return f"in {text}" if delta_s >= 0 else f"{text} ago"


def iso_utc(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC with milliseconds, e.g. ``2025-11-25T03:30:00.123Z``."""
    moment = datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def show_value(value: Any) -> str:
    """A decoded item as one readable string: JSON where it can be, ``repr`` for bytes and the rest."""
    if isinstance(value, bytes | bytearray):
        return repr(bytes(value))
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=repr)
    except (TypeError, ValueError):  # e.g. bytes keys or NaN from msgpack
        return repr(value)


def _json_value(value: Any) -> Any:
    """``value`` made of JSON types only (bytes and other non-JSON parts as their ``repr``)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=repr))
    except (TypeError, ValueError):
        return repr(value)


def _cell(text: str) -> Text:
    """A table cell that shows ``text`` as is: a payload like ``[bold]`` is not rich markup."""
    return Text(text if len(text) <= MAX_CELL else text[:MAX_CELL - 1] + "…")


def _moment(at_ms: int, now_ms: int) -> str:
    return f"{relative(at_ms, now_ms)} ({iso_utc(at_ms)})"


def _next_due(counts_due: int | None, now_ms: int) -> str:
    return "-" if counts_due is None else relative(counts_due, now_ms)


def lag(ms: int) -> str:
    """A lag for people: ``0``, else as :func:`aiodelayq._admin.durations.format_duration` writes a duration."""
    return "0" if ms <= 0 else format_duration(ms)


def counts_table(rows: Sequence[QueueRow], now_ms: int, *, title: str | None = None,
                 caption: str | None = None) -> Table:
    """One row per queue: pending, ready, in flight, dead letters, next due (relative), lag (how late
    the earliest due pending item is) and its controls (paused, rate limit)."""
    table = Table(title=title, caption=caption, box=box.SQUARE)
    table.add_column("queue", overflow="fold")  # a name is never cut: folded onto more lines
    for header in ("pending", "ready", "in flight", "dead letters"):
        table.add_column(header, justify="right")
    table.add_column("next due")
    table.add_column("lag", justify="right")
    table.add_column("controls")
    for row in rows:
        c = row.counts
        table.add_row(_cell(row.name), str(c.pending), str(c.ready), str(c.in_flight), str(c.dead_letters),
                      _next_due(c.next_due_ms, now_ms), lag(c.lag_ms), _controls(c))
    return table


def _controls(c: QueueCounts) -> str:
    """``paused``, ``100/s (burst 100)``, ``at most 20 held``, ``3 groups (2 at a time)``, ``3 recurring``,
    ``5 keys deduplicating``, several, or ``-``."""
    shown = ["paused"] if c.paused else []
    if c.rate_limit_per_s is not None:
        shown.append(f"{c.rate_limit_per_s:g}/s (burst {c.rate_burst})")
    if c.concurrency_limit is not None:
        shown.append(f"at most {c.concurrency_limit} held")
    if c.groups or c.group_concurrency != 1:
        shown.append(f"{c.groups} group{'s' if c.groups != 1 else ''} ({c.group_concurrency} at a time)")
    if c.recurring:
        shown.append(f"{c.recurring} recurring")
    if c.deduplicating:
        shown.append(f"{c.deduplicating} key{'s' if c.deduplicating != 1 else ''} deduplicating")
    return ", ".join(shown) or "-"


def counts_json(row: QueueRow, now_ms: int) -> dict[str, Any]:
    """One queue's counts for ``--json``."""
    c = row.counts
    return {"name": row.name, "pending": c.pending, "ready": c.ready, "in_flight": c.in_flight,
            "dead_letters": c.dead_letters, "next_due_ms": c.next_due_ms,
            "next_due_in_ms": None if c.next_due_ms is None else c.next_due_ms - now_ms, "lag_ms": c.lag_ms,
            "paused": c.paused,
            "rate_limit_per_s": c.rate_limit_per_s, "rate_burst": c.rate_burst,
            "concurrency_limit": c.concurrency_limit, "groups": c.groups, "group_concurrency": c.group_concurrency,
            "recurring": c.recurring, "deduplicating": c.deduplicating}


def _marker(decodable: bool, malformed: bool = False, headers: dict[str, str] | None = None,
            expires_at_ms: int | None = None, now_ms: int = 0, recurring: bool = False,
            group: str | None = None) -> str:
    marks = ["malformed" if malformed else "" if decodable else "undecodable", "recurring" if recurring else ""]
    if group is not None:
        marks.append(f"group {group}")
    if expires_at_ms is not None:
        marks.append(f"expires {relative(expires_at_ms, now_ms)}")
    if headers:
        marks.append(f"{len(headers)} header(s)")
    return ", ".join(mark for mark in marks if mark)


def pending_table(items: Sequence[PendingItem[Any]], now_ms: int, *, title: str, caption: str) -> Table:
    """Pending items soonest first: due (relative and ISO), key, value (raw bytes when undecodable)."""
    table = Table(title=title, caption=caption, box=box.SQUARE)
    table.add_column("due")
    table.add_column("at (UTC)")
    table.add_column("key", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_column("!")
    for item in items:
        value = show_value(item.value) if item.decodable else repr(item.raw)
        table.add_row(relative(item.due_ms, now_ms), iso_utc(item.due_ms), _cell(item.key or ""), _cell(value),
                      _marker(item.decodable, item.malformed, item.headers, item.expires_at_ms, now_ms, item.recurring,
                              item.group))
    return table


def pending_json(item: PendingItem[Any], now_ms: int) -> dict[str, Any]:
    """One pending item for ``--json``; ``raw_b64`` is the exact payload (whole element if malformed)."""
    return {"due_ms": item.due_ms, "due_in_ms": item.due_ms - now_ms, "due_iso": iso_utc(item.due_ms),
            "key": item.key, "value": _json_value(item.value) if item.decodable else None,
            "decodable": item.decodable, "malformed": item.malformed, "recurring": item.recurring,
            "group": item.group, "headers": item.headers,
            "expires_at_ms": item.expires_at_ms, "raw_b64": base64.b64encode(item.raw).decode()}


def dead_letters_table(letters: Sequence[DeadLetter[Any]], now_ms: int, *, title: str, caption: str) -> Table:
    """Dead letters oldest first: when and why each died, its deliveries, its value (or raw bytes)."""
    table = Table(title=title, caption=caption, box=box.SQUARE)
    table.add_column("#", justify="right")
    table.add_column("died")
    table.add_column("reason")
    table.add_column("deliveries", justify="right")
    table.add_column("value", overflow="fold")
    table.add_column("!")
    for index, letter in enumerate(letters):
        died = "-" if letter.dead_at_ms is None else _moment(letter.dead_at_ms, now_ms)
        value = show_value(letter.value) if letter.decodable else repr(letter.raw)
        deliveries = "-" if letter.delivery_count is None else str(letter.delivery_count)
        table.add_row(str(index), died, letter.reason, deliveries, _cell(value),
                      _marker(letter.decodable, headers=letter.headers))
    return table


def dead_letter_json(letter: DeadLetter[Any]) -> dict[str, Any]:
    """One dead letter for ``--json``; ``raw_b64`` is the exact payload."""
    return {"reason": letter.reason, "delivery_count": letter.delivery_count, "dead_at_ms": letter.dead_at_ms,
            "dead_at_iso": None if letter.dead_at_ms is None else iso_utc(letter.dead_at_ms),
            "value": _json_value(letter.value) if letter.decodable else None, "decodable": letter.decodable,
            "headers": letter.headers, "expires_at_ms": letter.expires_at_ms,
            "raw_b64": base64.b64encode(letter.raw).decode()}


def doctor_lines(findings: Sequence[Finding]) -> list[str]:
    """One line per finding: ``FAIL eviction    127.0.0.1:6379  what it saw -> what to do``."""
    width = max((len(f.where) for f in findings), default=0)
    return [f"{f.status.upper():<4} {f.check:<11} {f.where:<{width}}  {f.saw}" + (f" -> {f.todo}" if f.todo else "")
            for f in findings]


def event_json(event: QueueEvent) -> dict[str, Any]:
    """One event for ``events --json`` (a JSON object a line): its fields, and ``at_iso``."""
    return {"id": event.id, "kind": event.kind, "at_ms": event.at_ms, "at_iso": iso_utc(event.at_ms),
            "key": event.key, "message_id": event.message_id, "group": event.group, "reason": event.reason,
            "delivery_count": event.delivery_count}


def event_line(event: QueueEvent) -> str:
    """One event as a line: its time (UTC), its kind, then the fields it has."""
    quoted = {name: json.dumps(value, ensure_ascii=False)
              for name, value in (("key", event.key), ("group", event.group)) if value is not None}
    fields = (("key", quoted.get("key")), ("message", event.message_id), ("group", quoted.get("group")),
              ("deliveries", event.delivery_count), ("reason", event.reason))
    return " ".join([iso_utc(event.at_ms), f"{event.kind:<13}",
                     *(f"{name}={value}" for name, value in fields if value is not None)]).rstrip()
