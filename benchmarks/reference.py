"""A reference implementation of Redisson's ``RDelayedQueue`` design, driven from redis-py (asyncio).

Method
------
It is what a straightforward Python port of Redisson (>= 3.21.1) would do, so that every benchmark
scenario can be run against it and against aiodelayq in the same run, on the same server:

- **Scripts.** Redisson's own offer and transfer scripts in the current (``Bc0Lc0``) element format,
  imported from ``tests/redisson_scripts.py`` (the repository root is put on ``sys.path``). They are
  loaded once with ``SCRIPT LOAD`` and called with ``EVALSHA``.
- **offer.** One script call per item: due = this client's ``time.time() * 1000 + delay`` (Redisson
  uses the client clock), 8 random bytes as the element id, the JSON-encoded payload.
- **Batch offer.** Redisson has no batch offer; the closest a user gets is one round trip carrying many
  offer scripts: a redis-py pipeline (``transaction=False``) of one ``EVALSHA`` per item.
- **Transfer scheduler.** Like Redisson's ``QueueTransferTask``: on the channel's subscribe
  confirmation run the transfer once; run the transfer script (``limit 100``, client time) and schedule
  the next run from the returned next due time, and from every due time published on the channel.
  Scheduling cancels the previous timer unconditionally (as Redisson does) and runs at once when the due
  time is at most 10 ms away. The timer is ``loop.call_at`` (Redisson uses a Netty ``HashedWheelTimer``,
  whose tick is coarser, so this reference is, if anything, more punctual than Redisson). Transfer
  calls never overlap: a wake-up during a call runs one more call after it. There is no safety poll.
- **Subscriber.** One redis-py ``PubSub`` connection per client shared by every reference queue (a
  reader task dispatches messages to queues by channel).
- **take.** ``BLPOP`` on a connection of its own, one item per call (Redisson's ``take()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.redisson_scripts import OFFER_CURRENT, TRANSFER_CURRENT  # noqa: E402

__all__ = ["ReferenceQueue", "ReferenceStats", "ReferenceSubscriber", "ScriptShas", "reference_keys"]

TRANSFER_LIMIT = 100  # Redisson's transfer script moves at most 100 elements per call
RUN_NOW_MS = 10  # Redisson runs the transfer at once when the next due time is at most this far away


# Compact JSON, byte for byte what aiodelayq's "json" codec writes, so both store the same payloads.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _prefix_name(prefix: str, name: str) -> str:
    # Redisson's RedissonObject.prefixName
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


@dataclass(frozen=True)
class RefKeys:
    destination: str
    timeout_set: str
    delay_list: str
    channel: str


def reference_keys(name: str) -> RefKeys:
    """The four Redisson keys of queue ``name``."""
    return RefKeys(name, _prefix_name("redisson_delay_queue_timeout", name),
                   _prefix_name("redisson_delay_queue", name), _prefix_name("redisson_delay_queue_channel", name))


@dataclass
class ReferenceStats:
    transfers: int = 0
    moved: int = 0
    errors: int = 0
    transfer_rtts_ms: list[float] = field(default_factory=list)


@dataclass
class ScriptShas:
    """SHA1s of the two Redisson scripts (``SCRIPT LOAD`` once per client; the SHA1 never changes)."""

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
        self._queues[queue.keys.channel.encode()] = queue

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
            if message is None:
                continue
            queue = self._queues.get(message.get("channel"))
            if queue is None:
                continue
            if message["type"] == "subscribe":
                self._confirmed += 1
                if self._confirmed >= len(self._queues):
                    self._all_confirmed.set()
                queue.on_subscribed()
            elif message["type"] == "message":
                with contextlib.suppress(ValueError, TypeError):
                    queue.schedule(int(message["data"]))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 5.0)
            self._task = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pubsub.aclose(), 5.0)
            self._pubsub = None


class ReferenceQueue:
    """Redisson's delayed queue, the Python way (see the module docstring)."""

    def __init__(self, client: Redis, name: str, *, limit: int = TRANSFER_LIMIT) -> None:
        self.client = client
        self.keys = reference_keys(name)
        self.limit = limit
        self.stats = ReferenceStats()
        self._shas = ScriptShas()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._worker: asyncio.Task[None] | None = None
        self._take_conn: Any = None
        self._stopping = False

    async def prepare(self, shas: ScriptShas | None = None) -> ReferenceQueue:
        """Load the scripts (or share ``shas`` already loaded on the same server)."""
        self._shas = shas if shas is not None else await ScriptShas().load(self.client)
        return self

    @property
    def shas(self) -> ScriptShas:
        return self._shas

    # -- producing -----------------------------------------------------------------------------------

    def _offer_args(self, item: Any, delay_s: float) -> tuple[list[Any], int]:
        due = int(time.time() * 1000) + int(delay_s * 1000)
        return self._offer_args_at(item, due), due

    def _offer_args_at(self, item: Any, due_ms: int) -> list[Any]:
        assert self._shas.offer, "call prepare() first"
        k = self.keys
        payload = _JSON.encode(item).encode()
        return ["EVALSHA", self._shas.offer, 4, k.destination, k.timeout_set, k.delay_list, k.channel,
                due_ms, os.urandom(8), payload]

    async def offer(self, item: Any, delay_s: float) -> int:
        """One offer script call; returns the due time (client epoch ms)."""
        args, due = self._offer_args(item, delay_s)
        await self._call(args)
        return due

    async def offer_pipeline(self, pairs: Iterable[tuple[Any, float]]) -> list[int]:
        """One round trip: a pipeline (``transaction=False``) of one offer script per ``(item, delay_s)``."""
        pipe = self.client.pipeline(transaction=False)
        dues = []
        for item, delay_s in pairs:
            args, due = self._offer_args(item, delay_s)
            pipe.execute_command(*args)
            dues.append(due)
        await pipe.execute()
        return dues

    async def offer_at_pipeline(self, pairs: Iterable[tuple[Any, int]]) -> None:
        """Like :meth:`offer_pipeline` with absolute due times (client epoch ms); used to fill a backlog whose
        due times lie in the past."""
        pipe = self.client.pipeline(transaction=False)
        for item, due_ms in pairs:
            pipe.execute_command(*self._offer_args_at(item, due_ms))
        await pipe.execute()

    async def _call(self, args: list[Any]) -> Any:
        try:
            return await self.client.execute_command(*args)
        except NoScriptError:  # the server lost its script cache: load (same SHA1) and retry once
            await self._shas.load(self.client)
            return await self.client.execute_command(*args)

    # -- the transfer scheduler (QueueTransferTask) ------------------------------------------------------

    def start(self, subscriber: ReferenceSubscriber) -> None:
        """Register with ``subscriber`` (whose subscribe confirmation runs the first transfer) and start
        the worker. Call before ``subscriber.start()``."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._worker = self._loop.create_task(self._run(), name=f"reference-transfer:{self.keys.destination}")
        subscriber.register(self)

    def on_subscribed(self) -> None:
        self._kick()

    def schedule(self, due_ms: float | None) -> None:
        """Redisson's ``scheduleTask``: replace the timer (unconditionally) or run now if due within 10 ms."""
        if due_ms is None or self._loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        delay_ms = due_ms - time.time() * 1000.0
        if delay_ms > RUN_NOW_MS:
            self._timer = self._loop.call_at(self._loop.time() + delay_ms / 1000.0, self._kick)
        else:
            self._kick()

    def _kick(self) -> None:
        if self._wake is not None and self._worker is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                next_due = await self.transfer_once()
            except Exception:  # Redisson logs and re-schedules 5 s later
                self.stats.errors += 1
                self.schedule(time.time() * 1000.0 + 5000.0)
                continue
            self.schedule(next_due)

    async def transfer_once(self) -> float | None:
        """One transfer script call (client time, limit 100); returns the next due time or ``None``."""
        assert self._shas.transfer, "call prepare() first"
        k = self.keys
        t0 = time.perf_counter()
        reply = await self._call(["EVALSHA", self._shas.transfer, 3, k.destination, k.timeout_set, k.delay_list,
                                  int(time.time() * 1000), self.limit])
        self.stats.transfer_rtts_ms.append((time.perf_counter() - t0) * 1000.0)
        self.stats.transfers += 1
        return float(reply) if reply is not None else None

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the scheduler: cancel the timer and let the worker finish the script call in flight (it is not
        cancelled mid-call: a cancelled redis-py read was seen to be swallowed), then end; cancelled only if
        it has not ended within ``timeout_s``."""
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._worker is not None:
            self._kick()
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

    # -- consuming ------------------------------------------------------------------------------------

    async def take(self, timeout_s: float = 1.0) -> Any:
        """``BLPOP`` on this queue's own connection; the decoded item, or ``None`` after ``timeout_s``."""
        if self._take_conn is None:
            self._take_conn = await self.client.connection_pool.get_connection()
        await self._take_conn.send_command("BLPOP", self.keys.destination, timeout_s)
        reply = await self._take_conn.read_response(timeout=timeout_s + 5.0)
        return None if reply is None else json.loads(reply[1])


def encode_item(item: Any) -> bytes:
    """The payload bytes this reference (and aiodelayq's ``"json"`` codec) stores for ``item``."""
    return _JSON.encode(item).encode()
