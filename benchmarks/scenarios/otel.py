"""Scenario ``otel``: what OpenTelemetry tracing costs on the hot paths (``offer``, ``async for``), with
``opentelemetry`` absent, imported without an SDK, and with an SDK tracer provider set."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from _harness import Bench, cpu_placement, log, median, ratio

PROCESS = Path(__file__).resolve().with_name("_otel_process.py")
VARIANTS = ("plain", "api", "sdk")
OPS = ("offer", "drain")  # offer(); async for
METRICS = ("items_per_s", "cpu_us_per_item")
SLICES = 5  # per round, each variant's offer window and drain, cut into turns of the three processes
BOUND_S = 120.0  # for each command: longer than this is a failure, not a measurement


class _Variant:
    """One process of ``_otel_process.py``: commands in, one JSON line out for each."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, errors: IO[bytes]) -> None:
        self.name, self.proc, self.errors = name, proc, errors

    @classmethod
    async def start(cls, variant: str, url: str, errors: IO[bytes]) -> _Variant:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # the SDK's defaults
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(PROCESS), variant, url, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=errors)
        self = cls(variant, proc, errors)
        await self._answer()  # "ready"
        return self

    async def ask(self, *command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((" ".join(map(str, command)) + "\n").encode())
        await self.proc.stdin.drain()
        answer: dict[str, Any] = await self._answer()
        return answer

    async def _answer(self) -> Any:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), BOUND_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"otel {self.name}: no answer within {BOUND_S:g} s") from None
        answer = json.loads(line) if line.strip() else {"error": f"exit {await self.proc.wait()}"}
        if isinstance(answer, dict) and "error" in answer:
            self.errors.seek(0)
            raise RuntimeError(f"otel {self.name}: {answer['error']}: "
                               f"{self.errors.read().decode(errors='replace')[-2000:]}")
        return answer

    async def stop(self) -> None:
        """Its stdin closed (it exits at the end of its input), then killed if still running after 10 s."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10.0)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def _turns(procs: dict[str, _Variant], commands: dict[str, list[Any]],
                 sums: dict[str, dict[str, float]]) -> None:
    """``SLICES`` times, each process in turn (in the order of ``commands``) runs its command; its
    answers are added up in ``sums``."""
    for _ in range(SLICES):
        for v, command in commands.items():
            answer = await procs[v].ask(*command)
            for key in sums[v]:
                sums[v][key] += answer[key]


async def run(bench: Bench) -> dict[str, Any]:
    """One new process of this interpreter per variant (a process sets its global tracer provider
    once), all three started before the first measurement and used in turn:

    - ``plain``: ``opentelemetry`` cannot be imported (an import hook makes it fail, as when it is not
      installed; redis-py imports it by itself when it is): the reference;
    - ``api``: ``import opentelemetry.trace``, no SDK tracer provider (the no-op API: the library makes
      no span and writes no header);
    - ``sdk``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` handing the spans to an exporter
      that drops them (its ``export`` returns ``SUCCESS``): the cost of making the spans, not of
      sending them.

    ``otel_rounds`` rounds, each measuring every variant: ``offer_callers`` tasks awaiting one
    ``q.offer()`` at a time on a new queue (delay 1 h; as scenario ``offer``) for ``otel_offer_seconds``;
    then in every process ``otel_items`` items due before the consumer starts, moved by the queue's
    transfer (not timed), and drained by ``async for item in q`` (as scenario ``drain``; in ``sdk`` the
    items carry the ``traceparent`` of the traced ``offer_many`` that filled the queue). The offer
    window and the drain are cut into ``SLICES`` turns, the processes taking turns (the first of each
    round rotating), so that the three see the same load on a shared machine; the three processes are
    on CPU 0 and the server on the others (``_harness.cpu_placement``; the processes inherit the
    affinity of this one), so that none of them runs on a CPU the others do not.

    Items per second (wall time), and the process's CPU time per item (every thread's: the span
    processor's too), in each round over its turns; medians of the rounds, the rates' ratios to
    ``plain``; the spans the ``sdk`` process exported."""
    s = bench.sizes
    got: dict[str, dict[str, dict[str, list[float]]]] = {
        v: {op: {m: [] for m in METRICS} for op in OPS} for v in VARIANTS}
    # This process on CPU 0, the server on the others; the variants' processes inherit CPU 0.
    with cpu_placement(bench.server, []) as placement, tempfile.TemporaryFile() as err_plain, \
            tempfile.TemporaryFile() as err_api, tempfile.TemporaryFile() as err_sdk:  # their stderr
        errors = {"plain": err_plain, "api": err_api, "sdk": err_sdk}
        procs: dict[str, _Variant] = {}
        try:
            for variant in VARIANTS:  # one at a time: the start-up is not what is measured
                procs[variant] = await _Variant.start(variant, bench.url, errors[variant])
            for rnd in range(s.otel_rounds):
                order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
                names = {v: (bench.name("otel", f"{v}-offer"), bench.name("otel", f"{v}-drain")) for v in order}
                sums = {v: {op: {"items": 0.0, "wall_s": 0.0, "cpu_s": 0.0} for op in OPS} for v in order}
                try:
                    await _turns(procs, {v: ["offer", names[v][0], s.offer_callers, s.otel_offer_seconds / SLICES]
                                         for v in order}, {v: sums[v]["offer"] for v in order})
                    for v in order:
                        await procs[v].ask("fill", names[v][1], s.otel_items)
                    await _turns(procs, {v: ["drain", names[v][1], s.otel_items // SLICES] for v in order},
                                 {v: sums[v]["drain"] for v in order})
                    for v in order:
                        await procs[v].ask("close")
                finally:
                    await bench.drop(*(n for pair in names.values() for n in pair))
                for v in order:
                    for op, t in sums[v].items():
                        got[v][op]["items_per_s"].append(t["items"] / t["wall_s"])
                        got[v][op]["cpu_us_per_item"].append(t["cpu_s"] * 1e6 / t["items"])
                log(f"    round {rnd + 1}: " + "; ".join(
                    f"{v} offer {got[v]['offer']['items_per_s'][-1]:,.0f}/s, async for "
                    f"{got[v]['drain']['items_per_s'][-1]:,.0f}/s" for v in VARIANTS))
            done = {v: await procs[v].ask("done") for v in VARIANTS}
        finally:
            for proc in procs.values():
                await proc.stop()
    # Each variant is what it says, or the measurement means nothing.
    if done["plain"]["otel_modules"]:
        raise RuntimeError(f"otel plain: {done['plain']['otel_modules']} opentelemetry modules loaded")
    for v, d in done.items():
        if d["traced"] != (v == "sdk"):
            raise RuntimeError(f"otel {v}: the library's tracer is {'active' if d['traced'] else 'inactive'}")
    if not done["sdk"]["spans"]:
        raise RuntimeError("otel sdk: no span exported")
    med = {v: {op: {m: median(got[v][op][m]) for m in METRICS} for op in OPS} for v in VARIANTS}
    return {"callers": s.offer_callers, "seconds": s.otel_offer_seconds, "items": s.otel_items,
            "rounds": s.otel_rounds, "placement": placement,
            "variants": {v: {**{op: {**med[v][op], "rounds": got[v][op]} for op in OPS},
                             "otel_modules": done[v]["otel_modules"], "spans": done[v]["spans"]} for v in VARIANTS},
            "ratio": {v: {op: ratio(med[v][op]["items_per_s"], med["plain"][op]["items_per_s"]) for op in OPS}
                      for v in VARIANTS[1:]}}
