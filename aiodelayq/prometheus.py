"""Prometheus metrics for aiodelayq queues: ``pip install 'aiodelayq[prometheus]'``.

>>> metrics = QueueMetrics()
>>> metrics.track(queue)
>>> app.mount("/metrics", metrics.asgi_app())

Counters count what this process did (``sum`` over processes); gauges read Redis (``max``, not ``sum``).
See ``docs/metrics.md``.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import Collector
except ImportError as exc:  # the core never imports this module: only users of the extra do
    raise ImportError("aiodelayq.prometheus needs prometheus-client: pip install 'aiodelayq[prometheus]'") from exc

from ._contents.counts import QueueCounts
from ._util.asgi import ASGIApp, Receive, Scope, Send, answer_lifespan
from ._util.observe import InstalledOnce

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["LATENESS_BUCKETS_S", "QueueMetrics"]

log = logging.getLogger("aiodelayq")

LATENESS_BUCKETS_S: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                         10.0, 30.0, 60.0)
"""Default buckets of ``lateness_seconds``, seconds: 1 ms (a punctual transfer) to 60 s (an outage)."""



class CountedQueue(Protocol):
    """What :meth:`QueueMetrics.track` needs of a queue (a :class:`~aiodelayq.DelayedQueue` has it)."""

    @property
    def name(self) -> str:
        """The queue name: the ``queue`` label."""

    async def counts(self) -> QueueCounts:
        """Pending, ready, in-flight and dead-letter counts in one call."""


class _Lateness:
    """One queue's lateness histogram: a count per bucket (not cumulative; the last is +Inf) and the sum,
    seconds. Not a ``prometheus_client.Histogram``: its ``observe()`` takes a lock per item, which halves the
    transfer rate of a full backlog (benchmarks/, scenario ``transfer``)."""

    __slots__ = ("counts", "sum_s")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.sum_s = 0.0


class _Series:
    """One queue's labelled children, looked up once: ``labels()`` takes a lock, and the sink runs per call."""

    __slots__ = ("acked", "delivered", "lateness", "moved", "nacked", "offered", "redelivered", "transfer_errors")

    def __init__(self, m: QueueMetrics, queue: str) -> None:
        self.offered = m.offered_total.labels(queue)
        self.moved = m.moved_total.labels(queue)
        self.delivered = m.delivered_total.labels(queue)
        self.redelivered = m.redelivered_total.labels(queue)
        self.acked = m.acked_total.labels(queue)
        self.nacked = m.nacked_total.labels(queue)
        self.transfer_errors = m.transfer_errors_total.labels(queue)
        self.lateness = _Lateness(len(m.lateness_buckets_s))


class QueueMetrics(InstalledOnce):
    """Prometheus metrics of aiodelayq queues, and the sink (:class:`aiodelayq._util.observe.MetricsSink`)
    that feeds them.

    Counters (label ``queue``; ``dead_lettered_total`` also ``reason``) and the histogram
    ``lateness_seconds`` count this process's events; gauges of tracked queues are read from Redis at each
    scrape (:meth:`refresh`). Each metric's help text says what it counts; every name starts with
    ``namespace`` + ``_``.

    Args:
        registry: where the metrics are registered (``prometheus_client.REGISTRY`` by default; a
            second ``QueueMetrics`` on the same registry raises ``ValueError``: duplicated names).
        namespace: the metric name prefix.
        lateness_buckets_s: histogram buckets, seconds.
        refresh_timeout_s: bound of one gauge refresh, seconds (a queue whose counts are not back by
            then counts as a failed read).
        install: install as the process's sink now (:meth:`install`); ``False`` to do it later.

    Raises:
        RuntimeError: ``install`` and another sink is installed.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY, namespace: str = "aiodelayq", *,
                 lateness_buckets_s: Sequence[float] = LATENESS_BUCKETS_S, refresh_timeout_s: float = 5.0,
                 install: bool = True) -> None:
        self.registry = registry
        self.namespace = namespace
        self.refresh_timeout_s = refresh_timeout_s

        def counter(name: str, doc: str, labels: Sequence[str] = ("queue",)) -> Counter:
            return Counter(name, doc, labelnames=labels, namespace=namespace, registry=registry)

        self.offered_total = counter("offered", "Items written to the pending side by offer calls of this process.")
        self.moved_total = counter("moved", "Due items moved to the destination list by this process's transfers.")
        self.delivered_total = counter("delivered", "Items returned by take/poll/async for and messages returned "
                                       "by receive in this process.")
        self.redelivered_total = counter("redelivered", "Messages received with delivery_count > 1.")
        self.acked_total = counter("acked", "Acks applied.")
        self.nacked_total = counter("nacked", "Nacks applied (dead_letter=True and nacks of a last delivery "
                                    "included).")
        self.dead_lettered_total = counter("dead_lettered", "Entries this process wrote to the dead-letter list, "
                                           "by reason.", ("queue", "reason"))
        self.transfer_errors_total = counter("transfer_errors", "Failed transfer calls (each retried).")
        self.scrape_errors_total = counter("scrape_errors", "Failed reads of a tracked queue's counts (its gauges "
                                           "are absent from that scrape).")
        bounds = sorted(float(b) for b in lateness_buckets_s if b != float("inf"))
        if not bounds:
            raise ValueError("lateness_buckets_s needs at least one finite bucket")
        self.lateness_buckets_s: tuple[float, ...] = tuple(bounds)
        self._bounds_ms = [b * 1000.0 for b in bounds]
        self._series: dict[str, _Series] = {}
        self._tracked: dict[str, CountedQueue] = {}
        self._snapshot: dict[str, QueueCounts] = {}
        self._failing: set[str] = set()  # queues whose latest read failed (logged once per streak)
        self._refreshing: asyncio.Task[None] | None = None
        self._collector = _QueueCollector(self)
        registry.register(self._collector)
        if install:
            self.install()

    def __repr__(self) -> str:
        return f"<QueueMetrics {self.namespace!r} tracked={sorted(self._tracked)} installed={self.installed}>"

    def __enter__(self) -> QueueMetrics:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    def _of(self, queue: str) -> _Series:
        series = self._series.get(queue)
        if series is None:
            series = self._series[queue] = _Series(self, queue)
        return series

    def offered(self, queue: str, n: int) -> None:
        """Sink event: ``n`` items offered (see :class:`aiodelayq._util.observe.MetricsSink`)."""
        self._of(queue).offered.inc(n)

    def moved(self, queue: str, n: int, lateness_ms: Sequence[float]) -> None:
        """Sink event: ``n`` items moved, each one's lateness in ms."""
        series = self._of(queue)
        series.moved.inc(n)
        if lateness_ms:
            counts, bounds = series.lateness.counts, self._bounds_ms
            for ms in lateness_ms:
                counts[bisect_left(bounds, ms)] += 1  # the first bucket whose bound is >= ms ("le")
            series.lateness.sum_s += sum(lateness_ms) / 1000.0

    def delivered(self, queue: str, n: int) -> None:
        """Sink event: ``n`` items or messages handed to callers."""
        self._of(queue).delivered.inc(n)

    def redelivered(self, queue: str, n: int) -> None:
        """Sink event: ``n`` received messages were redeliveries."""
        self._of(queue).redelivered.inc(n)

    def acked(self, queue: str, n: int) -> None:
        """Sink event: ``n`` acks applied."""
        self._of(queue).acked.inc(n)

    def nacked(self, queue: str, n: int) -> None:
        """Sink event: ``n`` nacks applied."""
        self._of(queue).nacked.inc(n)

    def dead_lettered(self, queue: str, n: int, reason: str) -> None:
        """Sink event: ``n`` dead letters written for ``reason``."""
        self.dead_lettered_total.labels(queue, reason).inc(n)

    def transfer_error(self, queue: str) -> None:
        """Sink event: a transfer call failed."""
        self._of(queue).transfer_errors.inc()

    def track(self, queue: CountedQueue) -> None:
        """Export the gauges of ``queue`` (one :meth:`~aiodelayq.DelayedQueue.counts` call per scrape,
        O(1) per count). It need not be open; it must belong to the event loop that serves the scrapes.
        A second queue object of the same name replaces the first."""
        self._tracked[queue.name] = queue

    def untrack(self, queue: CountedQueue | str) -> None:
        """Stop exporting the gauges of ``queue`` (an object or a name); its counters stay."""
        name = queue if isinstance(queue, str) else queue.name
        self._tracked.pop(name, None)
        self._snapshot.pop(name, None)
        self._failing.discard(name)

    async def refresh(self) -> None:
        """Read the counts of every tracked queue, concurrently, bounded by ``refresh_timeout_s``.
        Concurrent callers share one read (a scrape that arrives meanwhile gets its result). A queue
        whose read fails (Redis down) is counted in ``scrape_errors_total``, logged at WARNING once
        per streak of failures, and left out of the gauges until a read succeeds; this never raises
        for it. A cancelled caller stops waiting; the shared read completes for the others."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(self._refresh(),
                                                                             name="aiodelayq-metrics-refresh")
            task.add_done_callback(self._refreshed)
        await asyncio.shield(task)

    def _refreshed(self, task: asyncio.Task[None]) -> None:
        if self._refreshing is task:
            self._refreshing = None
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have left

    async def _refresh(self) -> None:
        tracked = list(self._tracked.items())
        if not tracked:
            self._snapshot = {}
            return
        reads = {asyncio.ensure_future(queue.counts()): name for name, queue in tracked}
        try:
            _, late = await asyncio.wait(reads, timeout=self.refresh_timeout_s)
        finally:
            for read in reads:
                if not read.done():
                    read.cancel()  # cancels its call (which drops its connection)
                    read.add_done_callback(_retrieve)
        snapshot: dict[str, QueueCounts] = {}
        for read, name in reads.items():
            if read in late or read.cancelled():
                self._failed(name, TimeoutError(f"no answer within {self.refresh_timeout_s} s"))
                continue
            error = read.exception()
            if error is None:
                snapshot[name] = read.result()
                if name in self._failing:
                    self._failing.discard(name)
                    log.info("metrics read the counts of %r again", name)
            elif isinstance(error, Exception):
                self._failed(name, error)
            else:
                raise error  # KeyboardInterrupt, SystemExit in a read: not a metrics matter
        # One may have been untracked while this read ran.
        self._snapshot = {name: counts for name, counts in snapshot.items() if name in self._tracked}

    def _failed(self, name: str, error: Exception) -> None:
        self.scrape_errors_total.labels(name).inc()
        if name not in self._failing:
            self._failing.add(name)
            log.warning("metrics could not read the counts of %r (%s); its gauges are left out until "
                        "a read succeeds (counters are unaffected)", name, error)

    def snapshot(self) -> dict[str, QueueCounts]:
        """The counts of the latest :meth:`refresh`, by queue name (failed reads left out)."""
        return dict(self._snapshot)

    def lateness(self) -> dict[str, tuple[list[tuple[float, int]], float]]:
        """The lateness histogram by queue name: cumulative ``(upper bound s, count)`` pairs (the last
        bound ``inf``) and the sum, seconds."""
        out: dict[str, tuple[list[tuple[float, int]], float]] = {}
        for queue, series in list(self._series.items()):
            counts, total = list(series.lateness.counts), series.lateness.sum_s  # copies: another thread may read
            cumulative, running = [], 0
            for bound, count in zip((*self.lateness_buckets_s, float("inf")), counts, strict=True):
                running += count
                cumulative.append((bound, running))
            out[queue] = cumulative, total
        return out

    async def render(self, accept: str = "") -> tuple[bytes, str]:
        """Refresh the gauges, then the registry in the exposition format ``accept`` (an HTTP
        ``Accept`` header) asks for: ``(body, content type)``. Prometheus' text format by default,
        OpenMetrics when asked."""
        await self.refresh()
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type

    def asgi_app(self) -> ASGIApp:
        """An ASGI app serving the metrics on every path (GET/HEAD; 405 otherwise): mount it in
        FastAPI/Starlette (``app.mount("/metrics", metrics.asgi_app())``) or serve it with uvicorn.
        It answers the lifespan protocol, so a server may run it alone."""

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "lifespan":
                await answer_lifespan(receive, send)
                return
            if scope["type"] != "http":
                return
            method = scope.get("method", "GET")
            if method not in ("GET", "HEAD"):
                await _respond(send, 405, b"method not allowed\n", "text/plain; charset=utf-8", extra=[
                    (b"allow", b"GET, HEAD")])
                return
            accept = b", ".join(v for k, v in scope.get("headers", ()) if k.lower() == b"accept").decode("latin-1")
            body, content_type = await self.render(accept)
            await _respond(send, 200, body, content_type, head=method == "HEAD")

        return app

    async def aiohttp_handler(self, request: web.Request) -> web.Response:
        """An aiohttp handler serving the metrics: ``app.router.add_get("/metrics",
        metrics.aiohttp_handler)`` (needs aiohttp, which the extra does not install)."""
        from aiohttp import web

        body, content_type = await self.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})


class _QueueCollector(Collector):
    """The lateness histogram and the gauges of the latest refresh (prometheus collects synchronously)."""

    def __init__(self, owner: QueueMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterable[Metric]:
        # Registration checks names against describe(), so collect() is not run before a refresh.
        return self._families({}, {})

    def collect(self) -> Iterable[Metric]:
        return self._families(self._owner.snapshot(), self._owner.lateness())

    def _families(self, snapshot: dict[str, QueueCounts],
                  lateness: dict[str, tuple[list[tuple[float, int]], float]]) -> Iterator[Metric]:
        ns = self._owner.namespace
        histogram = HistogramMetricFamily(f"{ns}_lateness_seconds", "Per item moved by this process: the "
                                          "transfer's server time minus the item's due time.", labels=("queue",))
        for queue, (buckets, total) in sorted(lateness.items()):
            histogram.add_metric((queue,), [(_le(bound), count) for bound, count in buckets], total)
        yield histogram
        fields = (("pending", "Pending items (not yet due), every element kind.", "pending"),
                  ("ready", "Due items waiting in the destination list.", "ready"),
                  ("in_flight", "Messages received and not yet settled.", "in_flight"),
                  ("dead_letters", "Entries of the dead-letter list.", "dead_letters"))
        for name, doc, attr in fields:
            family = GaugeMetricFamily(f"{ns}_{name}", doc, labels=("queue",))
            for queue, counts in sorted(snapshot.items()):
                family.add_metric((queue,), getattr(counts, attr))
            yield family
        due = GaugeMetricFamily(f"{ns}_next_due_timestamp_seconds",
                                "Due time of the earliest pending item, epoch seconds of the Redis server's clock "
                                "(absent when nothing is pending); far in the past means transfers are stuck.",
                                labels=("queue",))
        for queue, counts in sorted(snapshot.items()):
            if counts.next_due_ms is not None:
                due.add_metric((queue,), counts.next_due_ms / 1000.0)
        yield due
        lag = GaugeMetricFamily(f"{ns}_lag_seconds", "How late the earliest due pending item is: the server clock "
                                "minus its due time, seconds (0 when none is due); growing means no transfer runs.",
                                labels=("queue",))
        for queue, counts in sorted(snapshot.items()):
            lag.add_metric((queue,), counts.lag_ms / 1000.0)
        yield lag
        paused = GaugeMetricFamily(f"{ns}_paused", "1 while the queue's consumers are paused, else 0.",
                                   labels=("queue",))
        rate = GaugeMetricFamily(f"{ns}_rate_limit_per_second", "The rate limit of the queue's consumers together, "
                                 "items per second (absent without one).", labels=("queue",))
        cap = GaugeMetricFamily(f"{ns}_concurrency_limit", "The most messages the queue's reliable consumers "
                                "hold at once, together (absent without a limit).", labels=("queue",))
        groups = GaugeMetricFamily(f"{ns}_groups", "Groups of the queue with due items waiting or messages in "
                                   "flight.", labels=("queue",))
        for queue, counts in sorted(snapshot.items()):
            paused.add_metric((queue,), 1.0 if counts.paused else 0.0)
            if counts.rate_limit_per_s is not None:
                rate.add_metric((queue,), counts.rate_limit_per_s)
            if counts.concurrency_limit is not None:
                cap.add_metric((queue,), counts.concurrency_limit)
            groups.add_metric((queue,), counts.groups)
        yield paused
        yield rate
        yield cap
        yield groups


async def _respond(send: Send, status: int, body: bytes, content_type: str, *, head: bool = False,
                   extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    headers = [(b"content-type", content_type.encode("latin-1")), (b"content-length", str(len(body)).encode()),
               *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


def _le(bound: float) -> str:
    """A bucket's ``le`` label as prometheus_client writes it (``0.001``, ``60.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(bound)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A read given up on: mark its outcome retrieved (it was counted as a failure already)."""
    if not task.cancelled():
        task.exception()
