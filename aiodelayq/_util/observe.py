"""Events and counters: every event of a queue is reported once, to its :class:`Events`, which counts
it (what ``queue.stats`` shows) and passes it on to the metrics hook, so the two never disagree.

The metrics hook is one optional, process-wide sink.

Zero dependencies, and free when unused: ``hook.sink`` is ``None`` by default and every place that
reports reads it once per batch or call (``if hook.sink is not None: ...``), never per item. The only
extra work a sink causes in Redis is the lateness of moved items: with a sink installed the transfer
script also reads the due scores of what it moves (see ``_scripts/lua/transfer.lua``, and
:func:`transfer_limit`). ``aiodelayq.prometheus`` is the ready-made sink; anything that implements
:class:`MetricsSink` can be installed instead (e.g. a StatsD or OpenTelemetry bridge).

Events are called on the event loop's thread, with the queue's name (its destination list), after
the Redis call they describe succeeded (``delivered``: when the caller gets the items; the take pump's
``undecodable`` dead letters: when decided, the FINISH that writes them follows). A sink must be
quick and must not block: it runs inline in the transfer task, the take pump and the settler. A
sink that raises is logged (ERROR, once per sink) and otherwise ignored: metrics never break
delivery.
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
    """What the queue reports, per queue name, counted per batch or call (``n`` items).

    Which calls report what: ``offered`` after an offer call wrote its items; ``moved`` after a
    transfer (the transfer task's, or one run inside a consumer's pop) of this process; ``delivered`` when
    ``take``/``take_many``/``poll``/``async for`` return items or ``receive``/``receive_many``/
    ``messages`` return messages; ``acked``/``nacked``/``dead_lettered`` when Redis confirmed the
    settle (written-behind acks included, once their call came back).
    """

    def offered(self, queue: str, n: int) -> None:
        """``n`` items were written to the pending side by one offer call (a keyed offer that found
        its key pending and changed nothing is not counted)."""

    def moved(self, queue: str, n: int, lateness_ms: Sequence[float]) -> None:
        """One transfer moved ``n`` due items to the destination list; ``lateness_ms`` has one entry per
        moved item: the transfer's server time minus the item's due time, in milliseconds (>= 0,
        sub-millisecond resolution). Empty when the transfer ran without lateness (the sink was
        installed while the call was in flight)."""

    def delivered(self, queue: str, n: int) -> None:
        """A consumer call returned ``n`` items (plain) or messages (reliable)."""

    def redelivered(self, queue: str, n: int) -> None:
        """Of the messages a reliable receive returned, ``n`` had ``delivery_count`` > 1."""

    def acked(self, queue: str, n: int) -> None:
        """``n`` acks were applied (one SETTLE call)."""

    def nacked(self, queue: str, n: int) -> None:
        """``n`` nacks were applied (one SETTLE call), ``nack(dead_letter=True)`` and nacks of a last
        delivery (which dead-letter) included."""

    def dead_lettered(self, queue: str, n: int, reason: str) -> None:
        """``n`` entries were written to the dead-letter list for ``reason``: ``malformed`` (a pending
        element that is not a valid element, found by a transfer, or an in-flight entry that is not
        a message, found by a receive), ``max_deliveries`` (a message out of deliveries, at a receive
        or at a nack of its last delivery), ``nacked`` (``nack(dead_letter=True)``), ``undecodable`` (a
        payload the codec cannot decode) or ``expired`` (an item past its expiry when due for a
        delivery)."""

    def transfer_error(self, queue: str) -> None:
        """A transfer call failed (it is retried with backoff)."""


class _Guarded:
    """Forwards to the installed sink; an exception there is logged once and swallowed (it is the
    metrics' bug, never the queue's: delivery goes on)."""

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
    """The process's one sink slot. An object, not a module global, so that modules import it by
    name (``from .._util.observe import hook``) and still see every :func:`install`.

    Attributes:
        sink: the installed sink (guarded), or ``None``: nothing is reported and transfers do not
            measure lateness.
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
    """Stop reporting. With ``expected``, only if that sink is the installed one (so a component
    never removes a sink someone else installed after it)."""
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
    """The events of one queue object (or of the transfer task the queue objects of one client
    and name share), this process only: each is counted in :attr:`counts` and, for those the metrics
    know, passed on to the installed sink. A component reports an event here and nowhere else.

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
    """The limit argument of a transfer script call (TRANSFER ``ARGV[1]``, POP ``ARGV[4]``) for at most
    ``batch`` elements: negative when a sink is installed, which makes the script also return each
    moved item's lateness (it then reads the due scores: ``WITHSCORES``); ``batch`` as is otherwise,
    so without a sink the call is exactly what it was."""
    return batch if hook.sink is None else -batch
