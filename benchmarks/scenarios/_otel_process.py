"""The process of one variant of scenario ``otel`` (``otel.py`` starts one new process per variant: a
process sets its global tracer provider once). Not a scenario: run as

    python _otel_process.py VARIANT URL

``VARIANT``: ``plain`` (``opentelemetry`` cannot be imported, as when it is not installed), ``api``
(``import opentelemetry.trace``, no SDK tracer provider) or ``sdk`` (an SDK ``TracerProvider`` whose
``BatchSpanProcessor`` hands every span to an exporter that drops it). It prints ``ready``, then
answers each command line on stdin with one JSON line on stdout, against the server at ``URL``:

- ``offer QUEUE CALLERS SECONDS``: ``CALLERS`` tasks awaiting one ``q.offer()`` at a time for
  ``SECONDS`` (delay 1 h; the first ``offer`` on ``QUEUE`` is preceded by one unmeasured offer);
- ``fill QUEUE ITEMS``: ``ITEMS`` items due now (``offer_many`` of 1,000), the consumer queue opened and
  awaited until its transfer moved them all: ``{}``;
- ``drain QUEUE ITEMS``: ``ITEMS`` of the filled queue's items taken by ``async for item in q``;
- ``close``: the queues closed and forgotten: ``{}``;
- ``done``: ``{"otel_modules": ..., "traced": ..., "spans": ...}`` (the ``opentelemetry`` modules
  loaded, whether the library's tracer is active, the spans exported; ``sdk`` flushes first), then
  it exits.

``offer`` and ``drain`` answer ``{"items": ..., "wall_s": ..., "cpu_s": ...}``: how many, in how many
seconds of wall time and of this process's CPU time (every thread's).

A failed command: ``{"error": ...}``, and the process exits with status 1.
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
from functools import partial  # noqa: E402
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


async def _offer(queue: Any, payload: Any, delay: float, done: list[int], i: int) -> None:
    await queue.offer(payload(i), delay)
    done[0] += 1


def reply(message: Any) -> None:
    print(json.dumps(message), flush=True)


async def serve(url: str, exporter: Any) -> None:
    """Answer the commands on stdin (module docstring) until ``done``."""
    from _harness import FAR_S, concurrent_rate, payload
    from redis.asyncio import Redis

    from aiodelayq import DelayedQueue
    from aiodelayq._core.tracing import tracer

    client = Redis.from_url(url, decode_responses=False)  # the producer's
    consumer = Redis.from_url(url, decode_responses=False)
    producers: dict[str, DelayedQueue[Any]] = {}
    filled: dict[str, tuple[DelayedQueue[Any], contextlib.AsyncExitStack]] = {}
    try:
        await client.ping()
        await consumer.ping()
        reply("ready")
        while True:
            command, *args = (await asyncio.to_thread(sys.stdin.readline)).split() or ["done"]
            if command == "offer":  # as scenario ``offer`` measures ours
                name, callers, seconds = args[0], int(args[1]), float(args[2])
                if name not in producers:
                    producers[name] = DelayedQueue(client, name)
                    await producers[name].offer(payload(0), FAR_S)  # warm-up: script load
                done = [0]
                t0, cpu0 = time.perf_counter(), time.process_time()
                await concurrent_rate(partial(_offer, producers[name], payload, FAR_S, done), callers, seconds)
                reply({"items": done[0], "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0})
            elif command == "fill":  # as scenario ``drain`` prepares: every item moved before the drain
                name, items = args[0], int(args[1])
                producer: DelayedQueue[Any] = DelayedQueue(client, name)
                for start in range(0, items, 1000):
                    await producer.offer_many([(payload(i), 0) for i in range(start, min(items, start + 1000))])
                stack = contextlib.AsyncExitStack()
                q: DelayedQueue[Any] = await stack.enter_async_context(DelayedQueue(consumer, name))
                filled[name] = (q, stack)
                deadline = time.monotonic() + 60
                while await q.ready_size() < items and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                reply({})
            elif command == "drain":  # as scenario ``drain`` measures ``async for``
                name, items = args[0], int(args[1])
                q = filled[name][0]
                got = 0
                t0, cpu0 = time.perf_counter(), time.process_time()
                async for _ in q:
                    got += 1
                    if got >= items:
                        break
                reply({"items": got, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0})
            elif command == "close":  # the queues of the round
                producers.clear()
                while filled:
                    await filled.popitem()[1][1].aclose()
                reply({})
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
    finally:
        for _, stack in filled.values():
            await stack.aclose()
        await client.aclose()
        await consumer.aclose()


def main(argv: list[str]) -> int:
    variant, url = argv
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    try:
        asyncio.run(serve(url, setup(variant)))
    except Exception as exc:
        reply({"error": repr(exc)})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
