"""The counters and lateness histogram of :class:`aiodelayq.prometheus.QueueMetrics` through the
OpenTelemetry metrics API (the ``otel`` extra). Traces need nothing from here (``docs/operating.md``, Traces).

Instruments are named ``aiodelayq.<counter>`` (attribute ``queue``; ``dead_lettered`` also ``reason``; unit
``{item}``, ``{call}`` for ``transfer_errors``) and the histogram ``aiodelayq.lateness`` (unit ``s``).
A process has one metrics sink: this or ``QueueMetrics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics

from . import __version__
from ._util.observe import InstalledOnce

__all__ = ["OtelMetrics"]


class OtelMetrics(InstalledOnce):
    """A metrics sink that records every queue event of this process with OpenTelemetry instruments;
    ``install()``, ``uninstall()`` and ``installed`` as :class:`aiodelayq.prometheus.QueueMetrics` has them.

    Args:
        meter_provider: where the instruments come from (the global provider by default).
        install: install as the process's sink now (:meth:`install`); ``False`` to do it later.

    Raises:
        RuntimeError: ``install`` and another sink is installed.
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None, *, install: bool = True) -> None:
        meter = metrics.get_meter("aiodelayq", __version__, meter_provider=meter_provider)

        def counter(name: str, doc: str, unit: str = "{item}") -> Any:
            return meter.create_counter(f"aiodelayq.{name}", unit=unit, description=doc)

        self._offered = counter("offered", "Items written to the pending side by offer calls of this process.")
        self._moved = counter("moved", "Due items moved to the destination list by this process's transfers.")
        self._delivered = counter("delivered", "Items and messages returned to callers by this process.")
        self._redelivered = counter("redelivered", "Messages received with delivery_count > 1.")
        self._acked = counter("acked", "Acks applied.")
        self._nacked = counter("nacked", "Nacks applied.")
        self._dead_lettered = counter("dead_lettered", "Entries this process wrote to the dead-letter list.")
        self._transfer_errors = counter("transfer_errors", "Failed transfer calls (each retried).", "{call}")
        self._lateness = meter.create_histogram(
            "aiodelayq.lateness", unit="s",
            description="Per item moved by this process: the transfer's server time minus the item's due time.")
        if install:
            self.install()

    def __repr__(self) -> str:
        return f"<OtelMetrics installed={self.installed}>"

    def offered(self, queue: str, n: int) -> None:
        """Sink event: ``n`` items offered (see :class:`aiodelayq._util.observe.MetricsSink`)."""
        self._offered.add(n, {"queue": queue})

    def moved(self, queue: str, n: int, lateness_ms: Sequence[float]) -> None:
        """Sink event: ``n`` items moved, each one's lateness in ms."""
        attributes = {"queue": queue}
        self._moved.add(n, attributes)
        for ms in lateness_ms:
            self._lateness.record(ms / 1000.0, attributes)

    def delivered(self, queue: str, n: int) -> None:
        """Sink event: ``n`` items or messages handed to callers."""
        self._delivered.add(n, {"queue": queue})

    def redelivered(self, queue: str, n: int) -> None:
        """Sink event: ``n`` received messages were redeliveries."""
        self._redelivered.add(n, {"queue": queue})

    def acked(self, queue: str, n: int) -> None:
        """Sink event: ``n`` acks applied."""
        self._acked.add(n, {"queue": queue})

    def nacked(self, queue: str, n: int) -> None:
        """Sink event: ``n`` nacks applied."""
        self._nacked.add(n, {"queue": queue})

    def dead_lettered(self, queue: str, n: int, reason: str) -> None:
        """Sink event: ``n`` dead letters written for ``reason``."""
        self._dead_lettered.add(n, {"queue": queue, "reason": reason})

    def transfer_error(self, queue: str) -> None:
        """Sink event: a transfer call failed."""
        self._transfer_errors.add(1, {"queue": queue})
