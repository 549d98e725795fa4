"""How much a queue holds: :class:`QueueCounts`, what ``counts()``, the command line's ``stats``, the
dashboard and the metrics' gauges read."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QueueCounts"]


@dataclass(frozen=True)
class QueueCounts:
    """How much a queue holds, read in one atomic script call (:meth:`DelayedQueue.counts`).

    Attributes:
        pending: scheduled items not yet due (every element kind, Java's included).
        ready: due items waiting in the destination list.
        in_flight: messages received by reliable consumers and not acked, including nacked ones
            waiting for their redelivery (the in-flight zset holds both).
        dead_letters: entries of the dead-letter list.
        next_due_ms: the earliest due time of a pending item, epoch ms of the server clock, or
            ``None`` when nothing is pending.
        paused: whether the queue's consumers are paused (:meth:`DelayedQueue.pause`).
        rate_limit_per_s: the rate limit of its consumers together, items per second, or ``None``.
        rate_burst: the most items the rate limit lets out at once, or ``None`` without one.
        recurring: how many recurring items (:meth:`DelayedQueue.schedule`) the queue has.
        lag_ms: how late the earliest due pending item is: the server clock minus its due time, ms,
            read in the same call; 0 when no pending item is due. Items the transfer moved to the
            destination list are not in it (``ready`` counts them). A lag that keeps growing means
            no transfer runs (docs: Operating).
        tiered: how many of the ``pending`` items wait in the tier's buckets (tiered pending,
            ``tier_after_s``), not yet in the timeout zset.
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
