"""How much a queue holds: :class:`QueueCounts`, what ``counts()``, the command line's ``stats``, the
dashboard and the metrics' gauges read."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QueueCounts"]


@dataclass(frozen=True)
class QueueCounts:
    """How much a queue holds, read in one atomic script call (:meth:`DelayedQueue.counts`).

    Attributes:
        pending: scheduled items not yet due (every element kind, Java's included, grouped ones too).
        ready: due items waiting in the destination list and in the groups' lists.
        in_flight: received messages not acked, nacked ones awaiting redelivery included.
        dead_letters: entries of the dead-letter list.
        next_due_ms: the earliest pending due time (server epoch ms), or ``None``.
        paused: whether the queue's consumers are paused (:meth:`DelayedQueue.pause`).
        rate_limit_per_s: the consumers' shared rate limit (items per second), or ``None``.
        rate_burst: the rate limit's burst (items), or ``None``.
        recurring: how many recurring items (:meth:`DelayedQueue.schedule`) the queue has.
        lag_ms: server clock minus the earliest due pending item's due time (ms; 0 when none is due);
            a growing lag means no transfer runs.
        tiered: how many ``pending`` items wait in the tier's buckets (``tier_after_s``).
        concurrency_limit: the most messages reliable consumers hold at once
            (:meth:`DelayedQueue.set_concurrency_limit`), or ``None``.
        groups: how many groups have due items waiting or messages in flight (:meth:`DelayedQueue.offer`'s
            ``group``).
        group_concurrency: the most messages of one group reliable consumers hold at once
            (:meth:`DelayedQueue.set_group_concurrency`; 1 unless set).
        deduplicating: how many keys an open deduplication window holds (:meth:`DelayedQueue.offer`'s
            ``dedupe_for``); they are not items, and no other count includes them.
    """

    pending: int
    ready: int
    in_flight: int
    dead_letters: int
    next_due_ms: int | None
    paused: bool = False
    rate_limit_per_s: float | None = None
    rate_burst: int | None = None
    recurring: int = 0
    lag_ms: int = 0
    tiered: int = 0
    concurrency_limit: int | None = None
    groups: int = 0
    group_concurrency: int = 1
    deduplicating: int = 0
