"""Scenario ``otel``: what OpenTelemetry tracing costs on the hot paths (``offer``, ``async for``), with
``opentelemetry`` absent, imported without an SDK, and with an SDK tracer provider set."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from _harness import Bench, Child, cpu_placement, log, median, ratio

PROCESS = Path(__file__).resolve().with_name("_otel_process.py")
VARIANTS = ("plain", "api", "sdk")
OPS = ("offer", "drain")  # offer(); async for
METRICS = ("items_per_s", "cpu_us_per_item")
SLICES = 5  # per round, each variant's offer window and drain, cut into turns of the three processes
BOUND_S = 120.0  # for each command: longer than this is a failure, not a measurement


async def _ask(child: Child, *command: Any) -> Any:
    """One command to a variant's process: its JSON answer."""
    answer = json.loads(await child.line(BOUND_S, " ".join(map(str, command))))
    if isinstance(answer, dict) and "error" in answer:
        raise child.fail(answer["error"])
    return answer


async def _turns(procs: dict[str, Child], commands: dict[str, list[Any]], sums: dict[str, dict[str, float]]) -> None:
    """``SLICES`` times, each process in turn (in the order of ``commands``) runs its command; its
    answers are added up in ``sums``."""
    for _ in range(SLICES):
        for v, command in commands.items():
            answer = await _ask(procs[v], *command)
            for key in sums[v]:
                sums[v][key] += answer[key]


async def run(bench: Bench) -> dict[str, Any]:
    """One new process of this interpreter per variant (a process sets its global tracer provider once),
    all three started before the first measurement and used in turn: ``plain``, where ``opentelemetry``
    cannot be imported (an import hook fails it, as when it is not installed; redis-py imports it by itself
    when it is): the reference; ``api``, ``import opentelemetry.trace`` and no SDK tracer provider (the
    library makes no span and writes no header); ``sdk``, an SDK ``TracerProvider`` whose
    ``BatchSpanProcessor`` hands every span to an exporter that drops it: the cost of making the spans,
    not of sending them.

    ``otel_rounds`` rounds, each measuring every variant on new queues: ``offer_callers`` tasks awaiting one
    ``q.offer()`` at a time (delay 1 h, as scenario ``offer``) for ``otel_offer_seconds``; then
    ``otel_items`` items due before the consumer starts, moved by the queue's transfer (not timed), drained
    by ``async for item in q`` (as scenario ``drain``; in ``sdk`` the items carry the ``traceparent`` of the
    traced ``offer_many`` that filled the queue). The offer window and the drain are cut into ``SLICES``
    turns, the processes taking turns (the first rotating from round to round) so that the three see the
    same load; the three on CPU 0, the server on the others, so that none runs where the others do not.
    Items per second (wall time) and the process's CPU time per item (every thread's), medians of the
    rounds, the rates' ratios to ``plain``; the spans ``sdk`` exported. After each round ``sdk`` makes, alone,
    the receive span a traced take makes per item: what tracing adds to an item of ``async for`` (its µs
    over ``plain``'s) against that span, the SDK's own work."""
    s = bench.sizes
    span_us: list[float] = []  # the SDK's own receive span, µs (sdk, between the rounds' drains)
    got: dict[str, dict[str, dict[str, list[float]]]] = {
        v: {op: {m: [] for m in METRICS} for op in OPS} for v in VARIANTS}
    # This process on CPU 0, the server on the others; the variants' processes inherit CPU 0.
    with cpu_placement(bench.server, []) as placement:
        procs: dict[str, Child] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # the SDK's defaults
        try:
            for variant in VARIANTS:  # one at a time: the start-up is not what is measured
                procs[variant] = await Child.start([sys.executable, str(PROCESS), variant, bench.url], stdin=True,
                                                   env=env)
                await procs[variant].line(BOUND_S)  # "ready"
            for rnd in range(s.otel_rounds):
                order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
                names = {v: (bench.name("otel", f"{v}-offer"), bench.name("otel", f"{v}-drain")) for v in order}
                sums = {v: {op: {"items": 0.0, "wall_s": 0.0, "cpu_s": 0.0} for op in OPS} for v in order}
                try:
                    await _turns(procs, {v: ["offer", names[v][0], s.offer_callers, s.otel_offer_seconds / SLICES]
                                         for v in order}, {v: sums[v]["offer"] for v in order})
                    for v in order:
                        await _ask(procs[v], "fill", names[v][1], s.otel_items)
                    await _turns(procs, {v: ["drain", names[v][1], s.otel_items // SLICES] for v in order},
                                 {v: sums[v]["drain"] for v in order})
                    for v in order:
                        await _ask(procs[v], "close")
                    spans = await _ask(procs["sdk"], "spans", s.otel_items // 10)
                    span_us.append(spans["wall_s"] * 1e6 / spans["items"])
                finally:
                    await bench.drop(*(n for pair in names.values() for n in pair))
                for v in order:
                    for op, t in sums[v].items():
                        got[v][op]["items_per_s"].append(t["items"] / t["wall_s"])
                        got[v][op]["cpu_us_per_item"].append(t["cpu_s"] * 1e6 / t["items"])
                log(f"    round {rnd + 1}: " + "; ".join(
                    f"{v} offer {got[v]['offer']['items_per_s'][-1]:,.0f}/s, async for "
                    f"{got[v]['drain']['items_per_s'][-1]:,.0f}/s" for v in VARIANTS))
            done = {v: await _ask(procs[v], "done") for v in VARIANTS}
        finally:
            for proc in procs.values():
                await proc.stop(10.0)
    # Each variant is what it says, or the measurement means nothing.
    if done["plain"]["otel_modules"]:
        raise RuntimeError(f"otel plain: {done['plain']['otel_modules']} opentelemetry modules loaded")
    for v, d in done.items():
        if d["traced"] != (v == "sdk"):
            raise RuntimeError(f"otel {v}: the library's tracer is {'active' if d['traced'] else 'inactive'}")
    if not done["sdk"]["spans"]:
        raise RuntimeError("otel sdk: no span exported")
    med = {v: {op: {m: median(got[v][op][m]) for m in METRICS} for op in OPS} for v in VARIANTS}
    added_us = 1e6 / med["sdk"]["drain"]["items_per_s"] - 1e6 / med["plain"]["drain"]["items_per_s"]
    return {"callers": s.offer_callers, "seconds": s.otel_offer_seconds, "items": s.otel_items,
            "rounds": s.otel_rounds, "placement": placement, "sdk_span_us": median(span_us),
            "traced_drain_added_us": added_us, "added_over_span": added_us / median(span_us),
            "variants": {v: {**{op: {**med[v][op], "rounds": got[v][op]} for op in OPS},
                             "otel_modules": done[v]["otel_modules"], "spans": done[v]["spans"]} for v in VARIANTS},
            "ratio": {v: {op: ratio(med[v][op]["items_per_s"], med["plain"][op]["items_per_s"]) for op in OPS}
                      for v in VARIANTS[1:]}}
