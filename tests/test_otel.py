"""OpenTelemetry through the SDK's in-memory exporters. Traces: a PRODUCER span per offer call whose
context travels in the items' headers, a CLIENT receive span per take linked to it, a CONSUMER
process span per item a worker handles (the producer's child, current in the handler); and nothing
at all, not even a header, while no SDK is set up. Metrics: the events the Prometheus metrics count."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once
from redis.asyncio import Redis

from tests.helpers import until


def _reset_global_provider() -> None:
    # The API sets its global provider once per process; the suite's other tests run without one.
    # OpenTelemetry's own test utilities (reset_trace_globals) reset it the same way.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _reset_global_provider()
        provider.shutdown()


def _named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_an_offer_is_a_producer_span_whose_context_the_item_carries(spans: InMemorySpanExporter,
                                                                        make_queue: Any) -> None:
    q = make_queue()
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        await q.offer({"order": 1}, 0, headers={"tenant": "a"})
    (send,) = _named(spans, f"send {q.name}")
    assert send.kind == SpanKind.PRODUCER
    assert send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes) == {"messaging.system": "aiodelayq", "messaging.destination.name": q.name,
                                     "messaging.operation.type": "send", "messaging.operation.name": "offer"}
    async with q:
        value, headers = await asyncio.wait_for(q.take_with_headers(), 10)
    assert value == {"order": 1}
    assert headers["tenant"] == "a"
    trace_id, span_id = headers["traceparent"].split("-")[1:3]
    assert int(trace_id, 16) == send.context.trace_id
    assert int(span_id, 16) == send.context.span_id
    (receive,) = _named(spans, f"receive {q.name}")
    assert receive.kind == SpanKind.CLIENT
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert [link.context.span_id for link in receive.links] == [send.context.span_id]


async def test_a_reliable_receive_is_a_client_span_linked_to_the_producer(spans: InMemorySpanExporter,
                                                                       make_queue: Any) -> None:
    q = make_queue()
    await q.offer("x", 0)
    (send,) = _named(spans, f"send {q.name}")
    async with q:
        message = await q.receive(30, timeout=10)
        assert message is not None
        assert await message.ack(confirm=True)
    (receive,) = _named(spans, f"receive {q.name}")
    assert receive.kind == SpanKind.CLIENT
    assert receive.attributes["messaging.operation.name"] == "receive"
    assert receive.attributes["messaging.message.id"] == message.id
    assert [link.context.span_id for link in receive.links] == [send.context.span_id]


async def test_offer_many_is_one_span_and_every_item_carries_it(spans: InMemorySpanExporter,
                                                              make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(5)], keys=[f"k{i}" for i in range(5)])
    (send,) = _named(spans, f"send {q.name}")
    assert send.attributes["messaging.batch.message_count"] == 5
    async with q:
        taken = []
        while len(taken) < 5:
            taken += await asyncio.wait_for(q.take_many_with_headers(5), 10)
    assert sorted(value for value, _ in taken) == list(range(5))
    assert {headers["traceparent"].split("-")[2] for _, headers in taken} == {f"{send.context.span_id:016x}"}


async def test_a_worker_processes_each_item_in_a_consumer_span_current_in_the_handler(
        spans: InMemorySpanExporter, make_queue: Any) -> None:
    seen: dict[str, Any] = {}

    async def handler(item: str) -> None:
        seen[item] = trace.get_current_span().get_span_context()

    for reliable in (True, False):
        q = make_queue()
        seen.clear()
        spans.clear()
        await q.offer_many([("a", 0), ("b", 0)])
        (send,) = _named(spans, f"send {q.name}")
        async with q:
            worker = q.worker(handler, reliable=reliable)
            task = asyncio.ensure_future(worker.run())
            await until(lambda: len(seen) == 2, timeout_s=10)
            worker.stop()
            await asyncio.wait_for(task, 10)
        processed = _named(spans, f"process {q.name}")
        assert len(processed) == 2
        for span in processed:
            assert span.kind == SpanKind.CONSUMER
            assert span.parent.span_id == send.context.span_id
            assert span.context.trace_id == send.context.trace_id
            assert [link.context.span_id for link in span.links] == [send.context.span_id]
            assert span.attributes["messaging.operation.type"] == "process"
        assert {c.span_id for c in seen.values()} == {s.context.span_id for s in processed}
        if reliable:
            assert all("messaging.message.id" in s.attributes for s in processed)


async def test_without_an_sdk_nothing_is_traced_and_items_are_stored_bare(client: Redis, make_queue: Any) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    q = make_queue(codec="str")
    await q.offer("plain", 60)
    (element,) = await client.zrange(q.keys.timeout_set, 0, -1)
    assert element.endswith(b"plain")
    assert b"traceparent" not in element


async def test_the_metrics_count_the_same_events_as_the_prometheus_ones(make_queue: Any) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from aiodelayq.otel import OtelMetrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = OtelMetrics(provider)
    try:
        q = make_queue(max_deliveries=1)
        await q.offer_many([(i, 0) for i in range(3)])
        async with q:
            assert sorted([await asyncio.wait_for(q.take(), 10) for _ in range(2)]) in ([0, 1], [0, 2], [1, 2])
            message = await q.receive(30, timeout=10)
            assert message is not None
            assert await message.nack(dead_letter=True)
    finally:
        metrics.uninstall()
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = [p for p in metric.data.data_points if p.attributes.get("queue") == q.name]
    assert {name: sum(p.value for p in ps) for name, ps in points.items() if name != "aiodelayq.lateness"} == {
        "aiodelayq.offered": 3, "aiodelayq.moved": 3, "aiodelayq.delivered": 3, "aiodelayq.nacked": 1,
        "aiodelayq.dead_lettered": 1}
    (lateness,) = points["aiodelayq.lateness"]
    assert lateness.count == 3
    assert points["aiodelayq.dead_lettered"][0].attributes["reason"] == "nacked"


async def test_no_context_in_the_headers_of_unsampled_offers_or_of_strict_elements(
        spans: InMemorySpanExporter, make_queue: Any) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    strict = make_queue(strict=True, codec="str")
    await strict.offer("for-java", 0)
    (send,) = _named(spans, f"send {strict.name}")  # traced, but Java reads the payload bare
    assert send.kind == SpanKind.PRODUCER
    async with strict:
        assert await asyncio.wait_for(strict.take_with_headers(), 10) == ("for-java", {})
    _reset_global_provider()
    trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))
    q = make_queue(codec="str")
    await q.offer("unsampled", 0)
    async with q:
        assert await asyncio.wait_for(q.take_with_headers(), 10) == ("unsampled", {})
