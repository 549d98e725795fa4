"""Scenario ``drain``: a backlog of due items drained by one consumer, against the server popping the same
items from a zset by itself, with where a drained item's time goes."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import hiredis
from _harness import Bench, alternate, fill, payload, ratio, until

from aiodelayq import DelayedQueue
from aiodelayq._scripts import QueueScripts
from aiodelayq._wire.codec import JsonCodec, batch_decoder

# The consumers, in the order of a round; ``raw_pop`` is the server alone (see run).
MODES = ("raw_pop", "take_many_1000", "take_many", "async_for", "receive_many_ack", "messages_ack", "worker16",
         "worker16_grouped", "worker16_events", "take_many_1000_e2e")
RELIABLE = ("receive_many_ack", "messages_ack", "worker16", "worker16_grouped", "worker16_events")
GROUP_SIZE = 100  # items per group of the grouped drain
RAW_BATCH = 1000
# The commands a drain's scripts run, by what they do to an item (INFO commandstats counts them in EVALSHA too).
STEPS = {"zset read": ("zrangebyscore",), "zset remove": ("zremrangebyrank", "zrank", "zrem"),
         "list push": ("rpush",), "list pop": ("lpop",), "hand-off record": ("hset", "hdel", "hget", "zadd")}


async def _raw_pop(client: Any, name: str, n: int) -> float:
    """The server alone: ``MULTI`` of ``ZRANGE z 0 999`` + ``ZREMRANGEBYRANK z 0 999`` until the zset of
    ``n`` payloads (ours' bytes) is empty; items/s. Its key is the queue's name: the cleanup deletes it."""
    codec = JsonCodec()
    for b in range(0, n, RAW_BATCH):
        await client.zadd(name, {codec.encode(payload(i)): i for i in range(b, min(n, b + RAW_BATCH))})
    got = 0
    t0 = time.perf_counter()
    while got < n:
        pipe = client.pipeline(transaction=True)
        pipe.zrange(name, 0, RAW_BATCH - 1)
        pipe.zremrangebyrank(name, 0, RAW_BATCH - 1)
        got += len((await pipe.execute())[0])
    return n / (time.perf_counter() - t0)


async def _drain(q: DelayedQueue[Any], client: Any, mode: str, n: int) -> None:
    got = 0
    if mode.startswith("take_many"):
        batch = 100 if mode == "take_many" else RAW_BATCH
        while got < n:
            got += len(await q.take_many(batch))
    elif mode == "async_for":
        async for _ in q:
            got += 1
            if got >= n:
                break
    elif mode.startswith("worker16"):
        finished = asyncio.Event()

        async def handler(_item: Any) -> None:  # a no-op handler: the worker's own cost
            nonlocal got
            got += 1
            if got >= n:
                finished.set()

        worker = q.worker(handler, concurrency=16)
        running = asyncio.create_task(worker.run())
        await finished.wait()
        worker.stop()
        await running
    elif mode == "receive_many_ack":
        while got < n:
            for message in await q.receive_many(100, 30.0):
                await message.ack()
                got += 1
    else:
        async for message in q.messages(30.0):
            await message.ack()
            got += 1
            if got >= n:
                break
    if mode in RELIABLE:  # acks are written behind: a reliable drain ends when the last is in Redis
        await until(lambda: client.zcard(q.keys.in_flight), lambda n: n == 0, 3600.0, 0.001)


async def _commandstats(bench: Bench) -> dict[str, int]:  # µs spent in each command so far
    return {k.removeprefix("cmdstat_"): int(v["usec"]) for k, v in (await bench.ctl.info("commandstats")).items()}


def _client_parts(n: int) -> dict[str, float]:
    """Client CPU µs per item of the parts measured alone: the parse of a POP reply of 1,000 payloads
    (hiredis, as redis-py reads it) and the decode of its payloads, as the pump reads them (one call)."""
    decode_all = batch_decoder(codec := JsonCodec())
    assert decode_all is not None
    raws = [codec.encode(payload(i)) for i in range(RAW_BATCH)]
    reply = b"*%d\r\n" % len(raws) + b"".join(b"$%d\r\n%s\r\n" % (len(r), r) for r in raws)
    reader = hiredis.Reader()
    rounds = max(1, n // RAW_BATCH)

    def us_per_item(step: Callable[[], Any]) -> float:
        t0 = time.process_time()
        for _ in range(rounds):
            step()
        return (time.process_time() - t0) / (rounds * RAW_BATCH) * 1e6

    return {"reply parse": us_per_item(lambda: (reader.feed(reply), reader.gets())),
            "decode": us_per_item(lambda: decode_all(raws))}


async def _breakdown(bench: Bench, n: int) -> dict[str, Any]:
    """``take_many(1000)`` of ``n`` due items once more, measured instead of timed: the server's µs per
    item in TRANSFER and POP (``SLOWLOG``) and in each step of theirs (``INFO commandstats``), and the
    client's CPU µs per item: the parts measured alone, and the rest (the pump, the calls, the loop)."""
    async with bench.fresh_queue("drain", "breakdown", clients=2) as (producer, consumer, name):
        await fill(DelayedQueue(producer, name), n, 0)
        shas = {QueueScripts.transfer.sha.encode(): "TRANSFER", QueueScripts.pop.sha.encode(): "POP"}
        await bench.slowlog.begin(0)
        before = await _commandstats(bench)
        cpu0 = time.process_time()
        async with DelayedQueue(consumer, name) as q:
            await _drain(q, consumer, "take_many_1000", n)
        cpu = (time.process_time() - cpu0) / n * 1e6
        after = await _commandstats(bench)
        entries = await bench.ctl.slowlog_get(100_000) if bench.slowlog.enabled else []
        await bench.slowlog.end(lambda _: False)
    per_script: dict[str, float] = {}
    for e in entries:
        args = bytes(e["command"]).split(b" ")
        if args[0] == b"EVALSHA" and (label := shas.get(args[1] if len(args) > 1 else b"")):
            per_script[label] = per_script.get(label, 0.0) + e["duration"] / n
    used = {k: after[k] - before.get(k, 0) for k in after}
    steps = {step: sum(used.get(c, 0) for c in commands) / n for step, commands in STEPS.items()}
    scripts_us = used.get("evalsha", 0) / n
    parts = _client_parts(n)
    return {"server_us_per_item": {"by_script": per_script, "by_step": {
                **steps, "Lua and the rest": scripts_us - sum(steps.values())}, "scripts": scripts_us},
            "client_us_per_item": {**parts, "the rest": cpu - sum(parts.values()), "cpu": cpu}}


async def _grouped_server_us(bench: Bench, n: int, groups: int) -> float:
    """Server µs per item (``INFO commandstats``: the scripts' time) of ``take_many(1000)`` draining ``n``
    due items in ``groups`` groups."""
    async with bench.fresh_queue("drain", f"groups{groups}", clients=2) as (producer, consumer, name):
        await fill(DelayedQueue(producer, name), n, 0, groups=groups)
        before = await _commandstats(bench)
        async with DelayedQueue(consumer, name) as q:
            await _drain(q, consumer, "take_many_1000", n)
        return ((await _commandstats(bench)).get("evalsha", 0) - before.get("evalsha", 0)) / n


# Rounds of the grouped server-time measure: each a drain in 10 groups and one in as many groups as items.
GROUPED_ROUNDS = 3


async def _grouped_rounds(bench: Bench, n: int) -> dict[str, Any]:
    """:func:`_grouped_server_us` at 10 groups and at ``n``, in turn, ``GROUPED_ROUNDS`` times: each
    one's median, and the median of the rounds' ratios (a round's two drains meet the same swings of
    the machine's speed; one drain's time per item spans up to 2x from run to run)."""
    runs: list[tuple[float, float]] = []
    for r in range(GROUPED_ROUNDS):
        few, many = await _grouped_server_us(bench, n, 10), await _grouped_server_us(bench, n, n)
        print(f"    round {r + 1} grouped server µs per item: 10 groups {few:.2f}, {n:,} groups {many:.2f}")
        runs.append((few, many))
    return {"10": statistics.median(few for few, _ in runs), str(n): statistics.median(many for _, many in runs),
            "ratio": statistics.median(many / few for few, many in runs)}


async def run(bench: Bench) -> dict[str, Any]:
    """``drain_items`` items due before the consumer opens (filled with ``offer_many``), moved to the destination
    list by the queue's own transfer, then timed from the first take until the last item (the last ack in Redis
    for the reliable ones), in one process: ``take_many(1000)`` and ``take_many(100)`` in a loop, ``async for item
    in q``, ``receive_many(100)`` with an ``ack()`` of each message, a sequential ``async for msg in
    q.messages(30): await msg.ack()``, and the worker (``q.worker(no-op handler, concurrency=16).run()``), the
    worker on items in groups of ``GROUP_SIZE`` (group concurrency 1) and with the event stream on
    (``worker16_events``). ``take_many_1000_e2e``: ``take_many(1000)`` timed from the open, the items still in the
    timeout zset. ``raw_pop``: the server popping the same payloads from a zset by itself (``MULTI`` of ``ZRANGE z
    0 999`` and ``ZREMRANGEBYRANK z 0 999``). Each consumer drains ``drain_rounds`` times, the consumers in turn
    (in reverse every other round); its rate is its items over its total time. This machine's speed swings by up
    to 2x for a second or more: many short drains in turn meet the same swings. Ratios against ``raw_pop``,
    ``take_many(100)``, and ``async for`` for the worker. Then one ``take_many(1000)`` drain measured for the
    breakdown (:func:`_breakdown`), and the server's time per grouped item in 10 groups and in ``group_items``
    groups (:func:`_grouped_rounds`)."""
    s = bench.sizes

    async def measure(mode: str) -> float:
        n = s.drain_items
        async with bench.fresh_queue("drain", mode, clients=2) as (producer, consumer, name):
            if mode == "raw_pop":
                return await _raw_pop(producer, name, n)
            await fill(DelayedQueue(producer, name), n, 0, groups=n // GROUP_SIZE if "grouped" in mode else 0)
            t0 = time.perf_counter()
            async with DelayedQueue(consumer, name) as q:
                await q.set_events(10 * n if mode == "worker16_events" else None)  # an event per delivery and ack
                if mode != "take_many_1000_e2e":  # all moved first: the consumer alone is timed
                    await until(q.counts, lambda counts: counts.ready >= n, 60)
                    t0 = time.perf_counter()
                await _drain(q, consumer, mode, n)
                return n / (time.perf_counter() - t0)

    ours = await alternate(MODES, s.drain_rounds, measure, "items_per_s", flip=True)
    for got in ours.values():  # equal drains: their items over their total time
        got["items_per_s"] = statistics.harmonic_mean(got["rounds"])
    rate = {mode: ours[mode]["items_per_s"] for mode in MODES}
    return {"items": s.drain_items, "drains": s.drain_rounds, "ours": ours,
            "ratio": {"take_many_1000_vs_raw_pop": ratio(rate["take_many_1000"], rate["raw_pop"]),
                      "take_many_1000_e2e_vs_raw_pop": ratio(rate["take_many_1000_e2e"], rate["raw_pop"]),
                      **{mode: ratio(rate[mode], rate["take_many"]) for mode in MODES[3:-2]},
                      "worker16_vs_async_for": ratio(rate["worker16"], rate["async_for"]),
                      "worker16_grouped_vs_worker16": ratio(rate["worker16_grouped"], rate["worker16"]),
                      "worker16_events_vs_worker16": ratio(rate["worker16_events"], rate["worker16"])},
            "breakdown": await _breakdown(bench, s.drain_items),
            "grouped_server_us": await _grouped_rounds(bench, s.group_items)}

