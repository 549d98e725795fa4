"""Scenario ``big_item_stall`` (only when asked for): how long one big item blocks the event loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import FAR_S, Bench, log, median
from report import fmt_ms

from aiodelayq import BytesCodec, DelayedQueue, JsonCodec


async def run(bench: Bench) -> dict[str, Any]:
    """For each size in ``big_item_mbs`` (MB = 10^6 bytes) and codec (``json``: a str of that many ASCII
    characters; ``bytes``: that many bytes), ``rounds`` times (at least 3): ``await q.offer(item, 1 h)`` on
    a fresh queue while a ticker task loops on ``asyncio.sleep(0.001)`` and records the gaps between its
    wake-ups; stall = largest gap - 1 ms. Also: the offer's wall time, ``codec.encode`` alone (timed
    synchronously) and the server time of the offer script (``SLOWLOG``). Then once per case the consumer
    side: the item offered with delay 0, a queue opened on another client, ``await q.take()`` under the
    same ticker (open + transfer + pop reply + decode). Baseline: the ticker's largest gap over 1 s with
    nothing else running."""
    rounds = max(3, bench.sizes.rounds)
    out: dict[str, Any] = {"mbs": list(bench.sizes.big_item_mbs), "rounds": rounds, "tick_ms": 1.0, "cases": {}}
    async with _StallMeter(0.001) as meter:
        await asyncio.sleep(1.0)
        out["baseline_stall_ms"] = meter.stall_ms()
        for mb in bench.sizes.big_item_mbs:
            for codec_name in ("json", "bytes"):
                item: Any = "x" * mb * 1_000_000 if codec_name == "json" else b"x" * mb * 1_000_000
                codec = JsonCodec() if codec_name == "json" else BytesCodec()
                encode_ms, stalls, walls, server_ms = [], [], [], []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    codec.encode(item)
                    encode_ms.append((time.perf_counter() - t0) * 1000.0)
                    async with bench.fresh_queue("big_item_stall", "ours") as (client, name):
                        channel = DelayedQueue(bench.ctl, name).keys.channel.encode()
                        q: DelayedQueue[Any] = DelayedQueue(client, name, codec=codec_name)
                        await q.offer(0 if codec_name == "json" else b"0", FAR_S)  # warm: connection, script
                        await bench.slowlog.begin()
                        await asyncio.sleep(0.01)
                        meter.reset()
                        t0 = time.perf_counter()
                        await q.offer(item, FAR_S)
                        walls.append((time.perf_counter() - t0) * 1000.0)
                        await asyncio.sleep(0.005)  # the ticker closes its last gap
                        stalls.append(meter.stall_ms())
                        times = await bench.slowlog.end(lambda a, c=channel: a[0] == b"EVALSHA" and c in a)
                        server_ms += [max(times)] if times else []
                take_stall = await _take_stall(bench, meter, item, codec_name)
                stall, encoded = median(stalls) or 0.0, median(encode_ms) or 0.0
                case = out["cases"][f"{codec_name}_{mb}"] = {
                    "mb": mb, "codec": codec_name, "offer_stall_ms": stall, "offer_stall_ms_rounds": stalls,
                    "offer_stall_ms_per_mb": stall / mb, "offer_wall_ms": median(walls), "encode_ms": encoded,
                    "encode_ms_per_mb": encoded / mb, "server_script_ms": median(server_ms),
                    "take_stall_ms": take_stall}
                del item
                log(f"    {codec_name:5} {mb:3} MB: offer stalls the loop {fmt_ms(stall)} ({stall / mb:.2f} ms/MB), "
                    f"offer wall {fmt_ms(case['offer_wall_ms'])}, encode alone {fmt_ms(encoded)}, server script "
                    f"{fmt_ms(case['server_script_ms'])}; take stalls {fmt_ms(take_stall)}")
    return out


async def _take_stall(bench: Bench, meter: _StallMeter, item: Any, codec_name: str) -> float:
    producer, consumer = bench.client(), bench.client()
    name = bench.name("big_item_stall", "take")
    try:
        await DelayedQueue(producer, name, codec=codec_name).offer(item, 0)
        cq: DelayedQueue[Any] = DelayedQueue(consumer, name, codec=codec_name)
        await asyncio.sleep(0.01)
        meter.reset()
        async with cq:
            got = await asyncio.wait_for(cq.take(), 30.0)
        await asyncio.sleep(0.005)
        if len(got) != len(item):
            raise RuntimeError("big item came back altered")
        return meter.stall_ms()
    finally:
        await producer.aclose()
        await consumer.aclose()
        await bench.drop(name)


class _StallMeter:
    """A task that sleeps ``tick_s`` in a loop and keeps the largest gap between its wake-ups: the longest
    time the event loop was busy elsewhere (stall = gap - tick)."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s, self.max_gap = tick_s, 0.0

    async def __aenter__(self) -> _StallMeter:
        self._task = asyncio.ensure_future(self._run())
        await asyncio.sleep(0.01)
        self.reset()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        await asyncio.wait({self._task})

    def reset(self) -> None:
        self.max_gap = 0.0

    def stall_ms(self) -> float:
        return max(0.0, self.max_gap - self.tick_s) * 1000.0

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.tick_s)
            self.max_gap, last = max(self.max_gap, time.perf_counter() - last), time.perf_counter()
