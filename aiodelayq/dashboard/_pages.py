"""What the dashboard's pages show, read from Redis, and the chart geometry and text formatting of the
templates."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from redis.exceptions import RedisError

from .._admin.durations import format_duration
from .._admin.reads import count_each, server_now_ms
from .._admin.scan import scan_queues
from .._contents.counts import QueueCounts
from .._redis.connections import AnyRedis
from .._wire.key_names import QueueKeys
from ..exceptions import BackendError

__all__ = ["Chart", "DueHistogram", "QueueList", "Row", "count_queues", "due_histogram", "find_queues",
           "format_utc", "make_chart", "preview", "queue_histogram"]


# Bounds of one listing of the queues by SCAN: the CLI's `ls` defaults.
SCAN_LIMIT = 1000
SCAN_MAX_CALLS = 100
# Bound of one page's own calls (TIME, the ZCOUNT pipeline), seconds; the queue's calls have theirs.
CALL_TIMEOUT_S = 5.0
# Most tier buckets the histogram counts (LLEN each): a day of one-minute buckets.
MAX_BUCKETS = 1440

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS


@dataclass(frozen=True)
class QueueList:
    """The queues the index shows.

    Attributes:
        names: queue names, in the order given or sorted when found by ``SCAN``.
        note: why the list may be incomplete (``None`` when it is complete).
        shards: when found by ``SCAN``, the shard count of each sharded queue among ``names`` (the
            others are ordinary queues'); ``None`` for names given: each count is read.
    """

    names: list[str]
    note: str | None
    shards: dict[str, int] | None = None


async def find_queues(client: AnyRedis) -> QueueList:
    """The queues of the server (on a Cluster, of every primary), found by ``SCAN`` as ``aiodelayq ls``
    finds them: at most :data:`SCAN_LIMIT` names and :data:`SCAN_MAX_CALLS` calls per key prefix."""
    found = await scan_queues(client, "*", SCAN_LIMIT, SCAN_MAX_CALLS)
    return QueueList(found.names, found.note, found.shards)


@dataclass(frozen=True)
class Row:
    """One queue of the index: its counts, or why they could not be read."""

    name: str
    counts: QueueCounts | None
    error: str | None = None


async def count_queues(client: AnyRedis, names: Sequence[str], shards: Mapping[str, int] | None = None) -> list[Row]:
    """The counts of each queue (:func:`~aiodelayq._admin.reads.count_each`), in input order
    (``shards``: as :attr:`QueueList.shards`). A queue whose read fails has its error instead (a
    user whose ACL covers other queues only, say); when every read fails, the first failure is raised.

    Raises:
        BackendError: every read failed (Redis down, or refusing them all).
    """
    results = await asyncio.gather(*count_each(client, names, shards), return_exceptions=True)
    rows = []
    for name, result in zip(names, results, strict=True):
        if isinstance(result, QueueCounts):
            rows.append(Row(name, result))
        elif isinstance(result, (BackendError, RedisError, OSError, asyncio.TimeoutError)):
            rows.append(Row(name, None, f"{type(result).__name__}: {result}"))
        else:
            raise result
    if rows and all(row.counts is None for row in rows):
        first = next(r for r in results if isinstance(r, BaseException))
        raise first
    return rows


def is_empty(counts: QueueCounts) -> bool:
    """Nothing of the queue is in Redis: no items, no dead letters, no controls, no schedules."""
    return (counts.pending == counts.ready == counts.in_flight == counts.dead_letters == counts.recurring == 0
            and not counts.paused and counts.rate_limit_per_s is None and counts.concurrency_limit is None
            and counts.group_concurrency == 1)


# -- the due-time histogram ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DueHistogram:
    """Pending items by due time, against the server's clock. Items waiting in the tier's buckets
    (tiered pending) count at their bucket's start (at most a minute before their due time); beyond
    the first :data:`MAX_BUCKETS` buckets due within 24 hours, and beyond 24 hours, in ``later``.

    Attributes:
        now_ms: the server's clock when it was read (epoch ms).
        overdue: items due at ``now_ms`` or before (a transfer moves them soon; see ``lag``).
        hour: items due in each 5-minute step of the next hour (``(now + i*5 min, now + (i+1)*5 min]``).
        day: items due in each hour of the next 24.
        later: items due more than 24 hours from now.
    """

    now_ms: int
    overdue: int
    hour: list[int]
    day: list[int]
    later: int


async def due_histogram(client: AnyRedis, keys: QueueKeys) -> DueHistogram:
    """Count the pending zset by due time: ``TIME`` (on the queue's node), then 38 ``ZCOUNT``, the
    tier's count and the buckets that start within 24 hours in one pipeline, then an ``LLEN`` of
    each of those in another (on a cluster all go to the queue's slot). Read-only, O(log N) each.
    The two pipelines are not one snapshot: a bucket promoted between them counts as empty."""
    now = await server_now_ms(client, route=keys.timeout_set)
    day_end = now + 24 * HOUR_MS
    async with client.pipeline(transaction=False) as pipe:
        pipe.zcount(keys.timeout_set, "-inf", now)
        for step_ms, steps in ((5 * MINUTE_MS, 12), (HOUR_MS, 24)):
            for i in range(steps):
                pipe.zcount(keys.timeout_set, f"({now + i * step_ms}", now + (i + 1) * step_ms)
        pipe.zcount(keys.timeout_set, f"({day_end}", "+inf")
        pipe.get(keys.tier_count)
        pipe.zrangebyscore(keys.tier_index, "-inf", day_end, start=0, num=MAX_BUCKETS)
        *counts, tiered, listed = await asyncio.wait_for(pipe.execute(), CALL_TIMEOUT_S)
    replies = [int(n) for n in counts]
    starts = [start for start in (int(member) for member in listed) if start <= day_end]
    if starts:
        async with client.pipeline(transaction=False) as pipe:
            for start in starts:
                pipe.llen(keys.tier_bucket(start))
            sizes = [int(n) for n in await asyncio.wait_for(pipe.execute(), CALL_TIMEOUT_S)]
        overdue, hour, day, counted = replies[0], replies[1:13], replies[13:37], 0
        for start, size in zip(starts, sizes, strict=True):
            counted += size
            if start <= now:
                overdue += size
                continue
            step = (start - now - 1) // (5 * MINUTE_MS)
            if step < len(hour):
                hour[step] += size
            day[(start - now - 1) // HOUR_MS] += size
        replies = [overdue, *hour, *day, replies[37] + max(0, int(tiered or 0) - counted)]
    elif tiered:
        replies[37] += int(tiered)
    return DueHistogram(now, replies[0], replies[1:13], replies[13:37], replies[37])


async def queue_histogram(client: AnyRedis, shard_keys: Sequence[QueueKeys]) -> DueHistogram:
    """The :func:`due_histogram` of a queue's keys, or of a sharded queue's shards at once, summed
    step by step (each shard counted against its own node's clock; ``now_ms`` is the first's)."""
    parts = await asyncio.gather(*(due_histogram(client, keys) for keys in shard_keys))
    if len(parts) == 1:
        return parts[0]
    hour = [sum(step) for step in zip(*(p.hour for p in parts), strict=True)]
    day = [sum(step) for step in zip(*(p.day for p in parts), strict=True)]
    return DueHistogram(parts[0].now_ms, sum(p.overdue for p in parts), hour, day, sum(p.later for p in parts))


@dataclass(frozen=True)
class Bar:
    """One bar of a chart, in SVG user units."""

    x: float
    y: float
    width: float
    height: float
    count: int
    title: str
    label_y: float


@dataclass(frozen=True)
class Tick:
    """A label under the x axis."""

    x: float
    text: str


@dataclass(frozen=True)
class Chart:
    """A bar chart, drawn as inline SVG by the template.

    Attributes:
        title: what it counts.
        width, height: the SVG's size; ``left``, ``top``, ``right``, ``bottom``: the plot area.
        bars: one per step; ``ticks``: the x labels; ``peak``: the y axis' top value.
        total: the sum of the bars.
    """

    title: str
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    bars: list[Bar]
    ticks: list[Tick]
    peak: int
    total: int


def make_chart(title: str, counts: Sequence[int], start_ms: int, step_ms: int, tick_every: int,
               tick_unit_ms: int, tick_suffix: str) -> Chart:
    """The geometry of a bar chart of ``counts``, bar ``i`` covering ``(start + i*step, start + (i+1)*step]``."""
    width, height, left, top, right, bottom = 720, 176, 44, 24, 712, 148
    peak = max(max(counts, default=0), 1)
    slot = (right - left) / max(len(counts), 1)
    gap = max(1.0, slot * 0.15)
    bars = []
    for i, count in enumerate(counts):
        h = (bottom - top) * count / peak
        begin, end = start_ms + i * step_ms, start_ms + (i + 1) * step_ms
        bars.append(Bar(x=round(left + i * slot + gap / 2, 2), y=round(bottom - h, 2), width=round(slot - gap, 2),
                        height=round(h, 2), count=count,
                        title=f"{_hm(begin)}-{_hm(end)} UTC: {count:,} due",
                        label_y=round(bottom - h - 4, 2)))
    ticks = [Tick(x=round(left + i * slot, 2), text=f"+{i * step_ms // tick_unit_ms}{tick_suffix}")
             for i in range(0, len(counts) + 1, tick_every)]
    ticks[0] = Tick(x=left, text=f"now {_hm(start_ms)}")
    return Chart(title, width, height, left, top, right, bottom, bars, ticks, peak, sum(counts))


def _hm(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M")


# -- text ------------------------------------------------------------------------------------------------

PREVIEW_CHARS = 300


def preview(raw: bytes | None, limit: int = PREVIEW_CHARS) -> str:
    """A payload as text: UTF-8 as it is (JSON, text), anything else as a bytes literal; cut at ``limit``
    characters (``…`` then)."""
    if raw is None:
        return ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = repr(raw)
    return text if len(text) <= limit else text[:limit] + "…"


def format_utc(ms: int | None) -> str:
    """An epoch-ms instant as ``2026-11-22 12:03:15 UTC`` (``-`` for ``None``)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_rate(counts: QueueCounts) -> str:
    """The rate limit as ``10/s (burst 20)``, ``-`` without one."""
    if counts.rate_limit_per_s is None:
        return "-"
    burst = f" (burst {counts.rate_burst})" if counts.rate_burst is not None else ""
    return f"{counts.rate_limit_per_s:g}/s{burst}"


def relative(due_ms: int | None, now_ms: int) -> str:
    """``in 4 min 03 s`` / ``2.1 s ago`` against the server clock."""
    if due_ms is None:
        return "-"
    delta = due_ms - now_ms
    return f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(delta)} ago"


def as_text(value: Any) -> str:
    """Headers and other small values for a table cell."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
