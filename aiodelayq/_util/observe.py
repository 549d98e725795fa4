"""Events and counters: every event of a queue is reported once, to its :class:`Events`, which counts
it (``queue.stats``) and passes it on to the one process-wide metrics sink, so the two never disagree.

Free when unused: reporters read ``hook.sink`` once per batch or call, never per item; only with a
sink does the transfer script read the due scores for lateness (:func:`transfer_limit`).

Events run on the loop's thread after the Redis call they describe succeeded. A sink runs inline in
the transfer task, the take pump and the settler, so it must not block; one that raises is logged
once and ignored: metrics never break delivery.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["Events", "Hook", "InstalledOnce", "MetricsSink", "hook", "install", "installed", "transfer_limit",
           "uninstall"]

log = logging.getLogger("aiodelayq")


class MetricsSink(Protocol):
    """What the queue reports, per queue name, counted per batch or call (``n`` items), after Redis
    confirmed the call (written-behind acks once their call came back)."""

    def offered(self, queue: str, n: int) -> None:
        """``n`` items were written to the pending side by one offer call (a keyed offer that found
        its key pending and changed nothing is not counted)."""

    def moved(self, queue: str, n: int, lateness_ms: Sequence[float]) -> None:
        """One transfer moved ``n`` due items; ``lateness_ms``: per item, server time minus due time
        (ms, >= 0), or empty when the sink was installed while the call was in flight."""

    def delivered(self, queue: str, n: int) -> None:
        """A consumer call returned ``n`` items (plain) or messages (reliable)."""

    def redelivered(self, queue: str, n: int) -> None:
        """Of the messages a reliable receive returned, ``n`` had ``delivery_count`` > 1."""

    def acked(self, queue: str, n: int) -> None:
        """``n`` acks were applied (one SETTLE call)."""

    def nacked(self, queue: str, n: int) -> None:
        """``n`` nacks were applied (one SETTLE call), dead-lettering ones included."""

    def dead_lettered(self, queue: str, n: int, reason: str) -> None:
        """``n`` entries were dead-lettered for ``reason``: ``malformed``, ``max_deliveries``,
        ``nacked``, ``undecodable`` or ``expired``."""

    def transfer_error(self, queue: str) -> None:
        """A transfer call failed (it is retried with backoff)."""


class _Guarded:
    """Forwards to the installed sink; an exception there is logged once and swallowed."""

    __slots__ = ("_reported", "inner")

    def __init__(self, inner: MetricsSink) -> None:
        self.inner = inner
        self._reported = False

    def _failed(self, event: str) -> None:
        if not self._reported:
            self._reported = True
            log.exception("metrics sink %r failed on %s (reported once; its later errors are ignored)",
                          self.inner, event)

    def offered(self, queue: str, n: int) -> None:
        try:
            self.inner.offered(queue, n)
        except Exception:
            self._failed("offered")

    def moved(self, queue: str, n: int, lateness_ms: Sequence[float]) -> None:
        try:
            self.inner.moved(queue, n, lateness_ms)
        except Exception:
            self._failed("moved")

    def delivered(self, queue: str, n: int) -> None:
        try:
            self.inner.delivered(queue, n)
        except Exception:
            self._failed("delivered")

    def redelivered(self, queue: str, n: int) -> None:
        try:
            self.inner.redelivered(queue, n)
        except Exception:
            self._failed("redelivered")

    def acked(self, queue: str, n: int) -> None:
        try:
            self.inner.acked(queue, n)
        except Exception:
            self._failed("acked")

    def nacked(self, queue: str, n: int) -> None:
        try:
            self.inner.nacked(queue, n)
        except Exception:
            self._failed("nacked")

    def dead_lettered(self, queue: str, n: int, reason: str) -> None:
        try:
            self.inner.dead_lettered(queue, n, reason)
        except Exception:
            self._failed("dead_lettered")

    def transfer_error(self, queue: str) -> None:
        try:
            self.inner.transfer_error(queue)
        except Exception:
            self._failed("transfer_error")


class Hook:
    """The process's one sink slot: an object, so modules that import ``hook`` by name see every
    :func:`install`.

    Attributes:
        sink: the installed sink (guarded), or ``None``.
    """

    __slots__ = ("sink",)

    def __init__(self) -> None:
        self.sink: MetricsSink | None = None

    def __repr__(self) -> str:
        return f"<Hook sink={installed()!r}>"


hook = Hook()


def install(new: MetricsSink) -> MetricsSink | None:
    """Report every queue's events of this process to ``new`` from now on; returns the sink it
    replaces (``None`` if none). Calls in flight may still report to the previous one."""
    previous = installed()
    hook.sink = _Guarded(new)
    return previous


def uninstall(expected: MetricsSink | None = None) -> None:
    """Stop reporting; with ``expected``, only if that sink is the installed one."""
    if expected is None or installed() is expected:
        hook.sink = None


def installed() -> MetricsSink | None:
    """The sink given to :func:`install`, or ``None``."""
    current = hook.sink
    return current.inner if isinstance(current, _Guarded) else current


_S = TypeVar("_S", bound="InstalledOnce")


class InstalledOnce:
    """``install()``, ``uninstall()`` and ``installed`` of a ready-made sink (the Prometheus and the
    OpenTelemetry metrics): one sink per process."""

    @property
    def installed(self) -> bool:
        """Whether this is the process's sink."""
        current: object = installed()
        return current is self

    def install(self: _S) -> _S:
        """Make this the process's sink (idempotent): every queue's events count from now on.

        Raises:
            RuntimeError: another sink is installed (uninstall it first).
        """
        current: object = installed()
        if current is not None and current is not self:
            raise RuntimeError(f"another aiodelayq metrics sink is installed: {current!r}")
        if current is None:
            install(self)  # type: ignore[arg-type]  # the subclass implements MetricsSink
        return self

    def uninstall(self) -> None:
        """Stop counting (idempotent; leaves another installed sink alone)."""
        uninstall(self)  # type: ignore[arg-type]


class Events:
    """The events of one queue object (or of a shared transfer task), this process only: counted in
    :attr:`counts` and passed on to the installed sink.

    Attributes:
        queue: the queue's name (its destination list).
        counts: by event name; ``dead_lettered:<reason>`` per reason; the library's own events (calls
            and what they found, items given back or recovered) through :meth:`count`.
    """

    __slots__ = ("counts", "queue")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.counts: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"<Events {self.queue!r} {dict(self.counts)}>"

    def count(self, event: str, n: int = 1) -> None:
        """An event the metrics do not have (e.g. ``pop_calls``, ``returned``): counted only."""
        self.counts[event] += n

    def offered(self, n: int) -> None:
        """See :meth:`MetricsSink.offered`."""
        self.counts["offered"] += n
        sink = hook.sink
        if sink is not None:
            sink.offered(self.queue, n)

    def moved(self, n: int, lateness_ms: Sequence[float] = ()) -> None:
        """See :meth:`MetricsSink.moved`."""
        self.counts["moved"] += n
        sink = hook.sink
        if sink is not None:
            sink.moved(self.queue, n, lateness_ms)

    def delivered(self, n: int) -> None:
        """See :meth:`MetricsSink.delivered`."""
        self.counts["delivered"] += n
        sink = hook.sink
        if sink is not None:
            sink.delivered(self.queue, n)

    def redelivered(self, n: int) -> None:
        """See :meth:`MetricsSink.redelivered`."""
        self.counts["redelivered"] += n
        sink = hook.sink
        if sink is not None:
            sink.redelivered(self.queue, n)

    def acked(self, n: int) -> None:
        """See :meth:`MetricsSink.acked`."""
        self.counts["acked"] += n
        sink = hook.sink
        if sink is not None:
            sink.acked(self.queue, n)

    def nacked(self, n: int) -> None:
        """See :meth:`MetricsSink.nacked`."""
        self.counts["nacked"] += n
        sink = hook.sink
        if sink is not None:
            sink.nacked(self.queue, n)

    def dead_lettered(self, n: int, reason: str) -> None:
        """See :meth:`MetricsSink.dead_lettered`."""
        self.counts[f"dead_lettered:{reason}"] += n
        sink = hook.sink
        if sink is not None:
            sink.dead_lettered(self.queue, n, reason)

    def transfer_error(self) -> None:
        """See :meth:`MetricsSink.transfer_error`."""
        self.counts["transfer_errors"] += 1
        sink = hook.sink
        if sink is not None:
            sink.transfer_error(self.queue)


def transfer_limit(batch: int) -> int:
    """The limit argument of a transfer script call for at most ``batch`` elements: negative when a
    sink is installed, which makes the script also return each moved item's lateness."""
    return batch if hook.sink is None else -batch
