"""The safety poll of a single-server client's open queues: one pipelined read for many queues.

It covers what nothing announces (a lost publish, another process's moves, a dead process's lease):
each queue is looked at within ``safety_poll_s`` of its last transfer. The heads of its zset, tier
index and hand-off leases, its destination's length and ``TIME`` are read with plain commands, so an
idle queue costs four O(1) reads per period instead of a script call. A cluster's queues live on
many nodes, so there each transfer task polls by itself (``TransferTask(shared_poll=False)``).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .._redis.backoff import Backoff
from .._redis.connections import call_pipelined, classify, is_permanent
from .._util.clock import reached
from .._util.tasks import TaskOwner, wait_event
from ..exceptions import BackendError
from .transfer_task import TransferTask

__all__ = ["SafetyPoll"]

# Queues read in one pipelined write: 4 commands each, about 2 ms of server time per write.
_CHUNK = 200
# A round also takes queues due within this share of their period: a few full writes, not one per queue.
_EARLY = 0.2


class SafetyPoll:
    """One task per client and loop that looks at each registered queue at its ``poll_at`` (loop time)."""

    def __init__(self, client: Redis, tasks: TaskOwner, *, slots: asyncio.Semaphore, call_timeout_s: float) -> None:
        self._client = client
        self._slots = slots
        self._call_timeout_s = call_timeout_s
        self._transfer_tasks: set[TransferTask] = set()
        self._changed = asyncio.Event()
        self._task = tasks.supervise("aiodelayq-safety-poll", self._run, restart_after_s=1.0,
                                    wanted=lambda: bool(self._transfer_tasks))
        self.polls = 0  # pipelined reads that succeeded

    def __repr__(self) -> str:
        return f"<SafetyPoll queues={len(self._transfer_tasks)} polls={self.polls} task={self._task!r}>"

    def add(self, transfer_task: TransferTask) -> None:
        """Look at ``transfer_task``'s queue from now on (the poll starts with its first queue)."""
        self._transfer_tasks.add(transfer_task)
        self._changed.set()
        self._task.start()

    def discard(self, transfer_task: TransferTask) -> None:
        """Stop looking at ``transfer_task``'s queue."""
        self._transfer_tasks.discard(transfer_task)

    async def aclose(self, timeout_s: float) -> None:
        """Stop polling (idempotent)."""
        self._transfer_tasks.clear()
        await self._task.stop(timeout_s)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff("safety poll")
        while True:
            self._changed.clear()
            now = loop.time()
            due = [s for s in self._transfer_tasks if reached(now, s.poll_at)]
            if due:  # with them, the queues due within a fifth of their period: fewer, fuller reads
                due = [s for s in self._transfer_tasks if s.poll_at <= now + s.safety_poll_s * _EARLY]
            if not due:
                # poll_at only moves later for a registered transfer task; a new one may come sooner.
                wake_at = min((s.poll_at for s in self._transfer_tasks), default=math.inf)
                await wait_event(self._changed, wake_at - now)
                continue
            try:
                for start in range(0, len(due), _CHUNK):
                    await self._poll(due[start:start + _CHUNK])
            except BackendError as exc:
                await asyncio.sleep(backoff.failed(exc))
                continue
            backoff.succeeded()

    async def _poll(self, transfer_tasks: list[TransferTask]) -> None:
        loop = asyncio.get_running_loop()
        commands: list[tuple[Any, ...]] = [("TIME",)]
        for s in transfer_tasks:
            keys = s.keys
            commands += [("ZRANGE", keys.timeout_set, 0, 0, "WITHSCORES"),
                         ("ZRANGE", keys.tier_index, 0, 0, "WITHSCORES"),
                         ("ZRANGE", keys.handoff_leases, 0, 0, "WITHSCORES"),
                         ("LLEN", keys.destination)]
        async with self._slots:
            sent = loop.time()
            replies = await call_pipelined(self._client, commands, timeout_s=self._call_timeout_s,
                                           what=f"safety poll of {len(transfer_tasks)} queue(s)")
            received = loop.time()
        what = f"safety poll of {len(transfer_tasks)} queue(s)"
        for reply in replies:
            if isinstance(reply, ResponseError) and is_permanent(classify(what, reply, sent=True)):
                raise classify(what, reply, sent=True)  # a missing permission: logged at WARNING
        time_reply = replies[0]
        if isinstance(time_reply, ResponseError):
            raise BackendError(f"{what}: TIME failed: {time_reply}", maybe_applied=False)
        seconds, micros = time_reply
        anchor = ((sent + received) / 2, int(seconds) * 1000 + int(micros) / 1000)
        self.polls += 1
        for index, s in enumerate(transfer_tasks):
            head, tier, lease, ready = replies[1 + 4 * index:5 + 4 * index]
            if s not in self._transfer_tasks:
                continue  # closed meanwhile
            if any(isinstance(r, ResponseError) for r in (head, tier, lease, ready)):
                s.poll_refused()  # e.g. a key of another type (WRONGTYPE): the transfer reports it
                continue
            wake_ms = min((ms for ms in (_score(head), _score(tier)) if ms is not None), default=None)
            s.polled(anchor, wake_ms, _score(lease), int(ready))


def _score(reply: list[Any]) -> float | None:
    """The score of a ``ZRANGE key 0 0 WITHSCORES`` reply (RESP2 ``[member, score]`` or RESP3
    ``[[member, score]]``), ``None`` for an empty zset."""
    if not reply:
        return None
    pair = reply[0] if isinstance(reply[0], (list, tuple)) else reply
    return float(pair[1])
