"""The process of one variant of scenario ``otel`` (``otel.run`` says what each variant is): ``python
_otel_process.py VARIANT URL``. It prints ``ready``, then answers each command line on stdin with one JSON
line (``{"error": ...}`` and exit status 1 for a failed command):

- ``offer QUEUE CALLERS SECONDS``: as scenario ``offer`` measures ours (one unmeasured offer first);
- ``fill QUEUE ITEMS``: items due now, the consumer queue opened and awaited until its transfer moved them;
- ``drain QUEUE ITEMS``: that many of the filled queue's items taken by ``async for item in q``;
- ``spans N``: ``sdk``: N of the receive spans a traced take makes per item, linked to a producer;
- ``close``: the round's queues closed;
- ``done``: the ``opentelemetry`` modules loaded, whether the library's tracer is active, the spans
  exported (``sdk`` flushes first); then it exits.

``offer``, ``drain`` and ``spans`` answer ``{"items", "wall_s", "cpu_s"}`` (this process's CPU time, every thread's).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Not the scenario modules next to this file (``keys``, ``memory``, ...) on the path: the benchmark's.
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    del sys.path[0]
sys.path.insert(0, str(HERE.parent))

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import importlib.abc  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

VARIANTS = ("plain", "api", "sdk")


class _NoOpentelemetry(importlib.abc.MetaPathFinder):
    """Makes ``import opentelemetry...`` fail as when the package is not installed (redis-py 8.1
    imports it by itself when it is)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "opentelemetry" or fullname.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: variant plain)", name=fullname)


def setup(variant: str) -> Any:
    """Prepare this process for ``variant``, before anything imports redis-py or aiodelayq; returns the
    exporter (``sdk``), else ``None``."""
    if variant == "plain":
        sys.meta_path.insert(0, _NoOpentelemetry())
        return None
    import opentelemetry.trace

    if variant == "api":
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DropExporter(SpanExporter):
        """Counts the spans and drops them: the cost measured is making them, not sending them."""

        spans = 0

        def export(self, spans: Any) -> SpanExportResult:
            DropExporter.spans += len(spans)
            return SpanExportResult.SUCCESS

    exporter = DropExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    opentelemetry.trace.set_tracer_provider(provider)
    return exporter


def reply(message: Any) -> None:
    print(json.dumps(message), flush=True)


async def serve(url: str, exporter: Any) -> None:
    """Answer the commands on stdin (module docstring) until ``done``."""
    from _harness import FAR_S, concurrent_rate, fill, payload, until
    from redis.asyncio import Redis

    from aiodelayq import DelayedQueue
    from aiodelayq._util.tracing import receive_span, tracer

    client = Redis.from_url(url, decode_responses=False)  # the producer's
    consumer = Redis.from_url(url, decode_responses=False)
    producers: dict[str, DelayedQueue[Any]] = {}
    filled: dict[str, DelayedQueue[Any]] = {}
    round_queues = contextlib.AsyncExitStack()
    try:
        await client.ping()
        await consumer.ping()
        reply("ready")
        while True:
            command, *args = (await asyncio.to_thread(sys.stdin.readline)).split() or ["done"]
            t0, cpu0, done = time.perf_counter(), time.process_time(), 0
            if command == "offer":  # as scenario ``offer`` measures ours
                name, callers, seconds = args[0], int(args[1]), float(args[2])
                if name not in producers:
                    producers[name] = DelayedQueue(client, name)
                    await producers[name].offer(payload(0), FAR_S)  # warm-up: script load
                    t0, cpu0 = time.perf_counter(), time.process_time()

                async def offer(i: int, q: DelayedQueue[Any] = producers[name]) -> None:
                    nonlocal done
                    await q.offer(payload(i), FAR_S)
                    done += 1

                await concurrent_rate(offer, callers, seconds)
            elif command == "fill":  # as scenario ``drain`` prepares: every item moved before the drain
                name, items = args[0], int(args[1])
                await fill(DelayedQueue(client, name), items, 0)
                q = filled[name] = await round_queues.enter_async_context(DelayedQueue(consumer, name))
                await until(q.ready_size, lambda ready, items=items: ready >= items, 60)
                reply({})
                continue
            elif command == "drain":  # as scenario ``drain`` measures ``async for``
                async for _ in filled[args[0]]:
                    done += 1
                    if done >= int(args[1]):
                        break
            elif command == "spans":  # the SDK's own work for one traced take of an item: its receive span
                headers, found, done = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}, tracer(), int(args[0])
                for _ in range(done):
                    receive_span(found, "spans", "take", time.time_ns(), [headers])
            elif command == "close":  # the queues of the round
                producers.clear()
                filled.clear()
                await round_queues.aclose()
                reply({})
                continue
            elif command == "done":
                spans = None
                if exporter is not None:
                    import opentelemetry.trace

                    opentelemetry.trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
                    spans = exporter.spans
                otel = sum(1 for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry."))
                reply({"otel_modules": otel, "traced": tracer() is not None, "spans": spans})
                return
            else:
                raise ValueError(f"unknown command {command!r}")
            reply({"items": done, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0})
    finally:
        await round_queues.aclose()
        await client.aclose()
        await consumer.aclose()


if __name__ == "__main__":
    variant, url = sys.argv[1:3]
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    try:
        asyncio.run(serve(url, setup(variant)))
    except Exception as exc:
        reply({"error": repr(exc)})
        raise
