"""A reference implementation of Redisson's ``RDelayedQueue`` design (>= 3.21.1), driven from redis-py
(asyncio): what a straightforward Python port of Redisson does, with Redisson's own offer and transfer
scripts (``tests/redisson_scripts.py``), so that every scenario can run against it and against aiodelayq
in the same run, on the same server (``benchmarks/README.md``, "Ours and the reference").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.redisson_scripts import OFFER_CURRENT, TRANSFER_CURRENT  # noqa: E402

TRANSFER_LIMIT = 100  # Redisson's transfer script moves at most 100 elements per call
RUN_NOW_MS = 10  # Redisson runs the transfer at once when the next due time is at most this far away

# Compact JSON, byte for byte what aiodelayq's "json" codec writes, so both store the same payloads.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _prefix_name(prefix: str, name: str) -> str:  # Redisson's RedissonObject.prefixName
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


@dataclass
class ScriptShas:
    """SHA1s of the two Redisson scripts (``SCRIPT LOAD`` once per server; the SHA1 never changes)."""

    offer: str = ""
    transfer: str = ""

    async def load(self, client: Redis) -> ScriptShas:
        self.offer = await client.script_load(OFFER_CURRENT)
        self.transfer = await client.script_load(TRANSFER_CURRENT)
        return self


class ReferenceSubscriber:
    """One ``PubSub`` connection shared by many reference queues; register them, then ``start()``."""

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._queues: dict[bytes, ReferenceQueue] = {}
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._confirmed = 0
        self._all_confirmed = asyncio.Event()

    def register(self, queue: ReferenceQueue) -> None:
        self._queues[queue.channel.encode()] = queue

    async def start(self, timeout_s: float = 30.0) -> None:
        """Subscribe every registered channel and wait (bounded) for all confirmations."""
        self._pubsub = self._client.pubsub()
        channels = list(self._queues)
        for i in range(0, len(channels), 500):
            await self._pubsub.subscribe(*channels[i:i + 500])
        self._task = asyncio.get_running_loop().create_task(self._read(), name="reference-subscriber")
        if channels:
            await asyncio.wait_for(self._all_confirmed.wait(), timeout_s)

    async def _read(self) -> None:
        while True:
            message = await self._pubsub.get_message(timeout=1.0)
            queue = self._queues.get(message.get("channel")) if message else None
            if queue is None:
                continue
            if message["type"] == "subscribe":
                self._confirmed += 1
                if self._confirmed >= len(self._queues):
                    self._all_confirmed.set()
                queue.kick()
            elif message["type"] == "message":
                with contextlib.suppress(ValueError, TypeError):
                    queue.schedule(int(message["data"]))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 5.0)
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pubsub.aclose(), 5.0)
        self._task = self._pubsub = None


class ReferenceQueue:
    """Redisson's delayed queue, the Python way (see the module docstring)."""

    def __init__(self, client: Redis, name: str) -> None:
        self.client = client
        self.destination = name
        self.timeout_set = _prefix_name("redisson_delay_queue_timeout", name)
        self.delay_list = _prefix_name("redisson_delay_queue", name)
        self.channel = _prefix_name("redisson_delay_queue_channel", name)
        self.transfers = self.errors = 0
        self.shas = ScriptShas()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._worker: asyncio.Task[None] | None = None
        self._take_conn: Any = None
        self._stopping = False

    async def prepare(self, shas: ScriptShas | None = None) -> ReferenceQueue:
        """Load the scripts (or share ``shas`` already loaded on the same server)."""
        self.shas = shas if shas is not None else await ScriptShas().load(self.client)
        return self

    # -- producing -----------------------------------------------------------------------------------

    def _offer_args(self, item: Any, due_ms: int) -> list[Any]:
        return ["EVALSHA", self.shas.offer, 4, self.destination, self.timeout_set, self.delay_list, self.channel,
                due_ms, os.urandom(8), _JSON.encode(item).encode()]

    async def offer(self, item: Any, delay_s: float) -> int:
        """One offer script call; returns the due time (client epoch ms)."""
        due = int(time.time() * 1000) + int(delay_s * 1000)
        await self.client.execute_command(*self._offer_args(item, due))
        return due

    async def offer_many(self, pairs: Iterable[tuple[Any, float]], *, absolute: bool = False) -> list[int]:
        """One round trip: a pipeline (``transaction=False``) of one offer script per ``(item, delay_s)``,
        or per ``(item, due epoch ms)`` when ``absolute`` (to fill a backlog due in the past)."""
        pipe = self.client.pipeline(transaction=False)
        dues = []
        for item, when in pairs:
            due = int(when) if absolute else int(time.time() * 1000) + int(when * 1000)
            pipe.execute_command(*self._offer_args(item, due))
            dues.append(due)
        await pipe.execute()
        return dues

    # -- the transfer task (QueueTransferTask) --------------------------------------------------

    def start(self, subscriber: ReferenceSubscriber) -> None:
        """Start the worker and register with ``subscriber`` (whose subscribe confirmation runs the first
        transfer). Call before ``subscriber.start()``."""
        self._loop = asyncio.get_running_loop()
        self._worker = self._loop.create_task(self._run(), name=f"reference-transfer:{self.destination}")
        subscriber.register(self)

    def schedule(self, due_ms: float | None) -> None:
        """Redisson's ``scheduleTask``: replace the timer (unconditionally) or run now if due within 10 ms."""
        if due_ms is None or self._loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        delay_ms = due_ms - time.time() * 1000.0
        if delay_ms > RUN_NOW_MS:
            self._timer = self._loop.call_at(self._loop.time() + delay_ms / 1000.0, self.kick)
        else:
            self.kick()

    def kick(self) -> None:
        if self._worker is not None:
            self._wake.set()

    async def _run(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                reply = await self.client.execute_command("EVALSHA", self.shas.transfer, 3, self.destination,
                                                          self.timeout_set, self.delay_list, int(time.time() * 1000),
                                                          TRANSFER_LIMIT)
            except Exception:  # Redisson logs and re-schedules 5 s later
                self.errors += 1
                self.schedule(time.time() * 1000.0 + 5000.0)
                continue
            self.transfers += 1
            self.schedule(float(reply) if reply is not None else None)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the timer and let the worker finish the script call in flight, then end (not cancelled
        mid-call: redis-py can swallow a cancellation that arrives with the reply); cancelled only if it
        has not ended within ``timeout_s``."""
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._worker is not None:
            self._wake.set()
            done, _ = await asyncio.wait({self._worker}, timeout=timeout_s)
            if not done:
                self._worker.cancel()
                await asyncio.wait({self._worker}, timeout=timeout_s)
            self._worker = None
        if self._take_conn is not None:
            conn, self._take_conn = self._take_conn, None
            with contextlib.suppress(Exception):
                await conn.disconnect()
            await self.client.connection_pool.release(conn)

    # -- consuming -----------------------------------------------------------------------------------

    async def take(self, timeout_s: float = 1.0) -> Any:
        """``BLPOP`` on this queue's own connection; the decoded item, or ``None`` after ``timeout_s``."""
        if self._take_conn is None:
            self._take_conn = await self.client.connection_pool.get_connection()
        await self._take_conn.send_command("BLPOP", self.destination, timeout_s)
        reply = await self._take_conn.read_response(timeout=timeout_s + 5.0)
        return None if reply is None else json.loads(reply[1])


@contextlib.asynccontextmanager
async def consuming(client: Redis, name: str, shas: ScriptShas | None = None) -> AsyncIterator[ReferenceQueue]:
    """A reference queue whose transfer task and subscriber run for the block (its first transfer on
    the subscribe confirmation), stopped on the way out."""
    ref = await ReferenceQueue(client, name).prepare(shas)
    sub = ReferenceSubscriber(client)
    ref.start(sub)
    try:
        await sub.start()
        yield ref
    finally:
        await ref.stop()
        await sub.aclose()


async def take_one(url: str, name: str) -> None:
    """The reference's consumer process (scenario ``startup``): the transfer task and the subscriber
    started, ``take()`` until an item comes, then ``delivered <epoch s>`` printed."""
    client = Redis.from_url(url)
    try:
        async with consuming(client, name) as ref:
            while await ref.take(1.0) is None:
                pass
            print(f"delivered {time.time():.6f}", flush=True)
    finally:
        await client.aclose()
