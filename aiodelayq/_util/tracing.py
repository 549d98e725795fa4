"""OpenTelemetry traces, natively through ``opentelemetry-api`` (the ``otel`` extra).

Spans follow the messaging semantic conventions (send, receive, process). Free when unused: nothing
here imports ``opentelemetry``, and without an SDK provider no span is made and no header written.
The context goes into headers only for sampled spans and fast elements: strict or legacy elements are
shared with Java consumers, which read the payload bare.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["SYSTEM", "links_to", "now_ns", "process_span", "receive_span", "send_span", "tracer", "with_context"]

# No registered messaging.system value covers a Redis delayed queue (BullMQ uses "bullmq").
SYSTEM = "aiodelayq"

_cached: tuple[object, Any] = (None, None)  # (the provider, its tracer for this library)
_UNKNOWN = object()


def tracer() -> Tracer | None:
    """The library's tracer when an SDK tracer provider is set, else ``None`` (cheap per call)."""
    global _cached
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    # None until a provider is set; reading it first skips get_tracer_provider(), which reads the
    # environment on every call.
    if getattr(api, "_TRACER_PROVIDER", _UNKNOWN) is None:
        return None
    provider = api.get_tracer_provider()
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None
    if _cached[0] is not provider:
        _cached = (provider, provider.get_tracer("aiodelayq"))
    found: Tracer = _cached[1]
    return found


def _attributes(queue: str, operation_type: str, operation_name: str, count: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.destination.name": queue,
                                  "messaging.operation.type": operation_type,
                                  "messaging.operation.name": operation_name}
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    return attributes


@contextmanager
def send_span(found: Tracer, queue: str, count: int, key: str | None = None, *,
              inject: bool = True) -> Iterator[dict[str, str]]:
    """A PRODUCER span around one offer call of ``count`` items; yields the trace context for every
    item's headers, empty unless ``inject`` and the span is sampled."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    attributes = _attributes(queue, "send", "offer_many" if count != 1 else "offer", count)
    if key is not None:
        attributes["messaging.message.id"] = key
    with found.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        if inject and span.get_span_context().trace_flags.sampled:
            propagate.inject(carrier)
        yield carrier


def with_context(headers: Mapping[str, str] | None, carrier: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with the trace context added (a ``traceparent`` the caller set is kept)."""
    return {**carrier, **headers} if headers else dict(carrier)


def links_to(headers_of: Sequence[Mapping[str, str]]) -> list[Any]:
    """Links to the producer contexts found in ``headers_of`` (items without one have none)."""
    from opentelemetry import propagate, trace

    links = []
    for headers in headers_of:
        if "traceparent" in headers:
            context = trace.get_current_span(propagate.extract(headers)).get_span_context()
            if context.is_valid:
                links.append(trace.Link(context))
    return links


def receive_span(found: Tracer, queue: str, operation_name: str, started_ns: int,
                 headers_of: Sequence[Mapping[str, str]], message_id: str | None = None) -> None:
    """A CLIENT span for one ``take``/``receive`` call that began at ``started_ns`` (``time.time_ns()``)
    and returned ``len(headers_of)`` items, linked to their producers; ended now."""
    from opentelemetry.trace import SpanKind

    attributes = _attributes(queue, "receive", operation_name, len(headers_of))
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    span: Span = found.start_span(f"receive {queue}", kind=SpanKind.CLIENT, attributes=attributes,
                                  links=links_to(headers_of), start_time=started_ns)
    span.end()


@contextmanager
def process_span(found: Tracer, queue: str, headers: Mapping[str, str], message_id: str | None = None,
                 delivery_count: int | None = None) -> Iterator[None]:
    """A CONSUMER span around one handler call: the child of the item's producer context and linked to it."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    attributes = _attributes(queue, "process", "process", 1)
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    if delivery_count is not None:
        attributes["messaging.message.delivery_count"] = delivery_count
    parent = propagate.extract(headers) if "traceparent" in headers else None
    with found.start_as_current_span(f"process {queue}", context=parent, kind=SpanKind.CONSUMER,
                                     attributes=attributes, links=links_to([headers]) if parent else None):
        yield


def now_ns() -> int:
    """Wall clock ns, a span's start time."""
    return time.time_ns()
