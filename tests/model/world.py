"""What one example runs against: an event loop, two clients through fault proxies, a queue object
on each, a direct admin connection for the checks, and the faults.

Hypothesis's state machines are synchronous, so each example owns an event loop and every rule
drives it with :meth:`World.run` (the library's background tasks run only then: between rules its
timers wait, and catch up at the next rule, as they would after a pause of the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from redis.asyncio import Redis

from aiodelayq import BackendError, DelayedQueue, QueueCounts
from aiodelayq._consuming.reliable import ReliableConsumer
from aiodelayq._consuming.take import TakePump
from aiodelayq._scripts import QueueScripts
from tests.faults import FaultProxy

from .observe import Snapshot, snapshot
from .state import Outcome, Violation

__all__ = ["CALL_TIMEOUT_S", "LOST_REPLY_SCRIPTS", "OUTAGE_MS", "Config", "Fault", "World"]

_T = TypeVar("_T")

CALL_TIMEOUT_S = 0.5
# An outage holds a client's traffic past its calls' bound; the longer one also past the 1 s after
# which a script no longer takes the issue time its call carries (the producer's clock estimate).
OUTAGE_MS = (700, 1200)
# The scripts whose replies a "lost reply" fault drops (the next call of that script on that client:
# a rule's own call, or the library's background work): every script the rules' calls run.
LOST_REPLY_SCRIPTS = {name: getattr(QueueScripts, name.lower()) for name in (
    "OFFER", "CANCEL", "RESCHEDULE", "GET", "SCHEDULE", "SET_CONTROLS", "CLEAR", "REQUEUE", "PURGE",
    "TRANSFER", "POP", "FINISH", "RECEIVE", "RELEASE_CALL", "SETTLE", "EXTEND")}
RUN_BOUND_S = 60.0  # one rule's bound: past it, the rule hangs (each call is bounded far below it)
QUIESCE_BOUND_S = 3.0  # prefetched items and messages go back within a round trip, settles within a call


@dataclass(frozen=True)
class Config:
    """An example's queue options."""

    max_deliveries: int | None = 3


@dataclass(frozen=True)
class Fault:
    """A fault injected between steps, on one client's proxy.

    ``kill``: every connection of the client dropped (its pool and its pub/sub connection).
    ``lost-reply``: the next call of ``script`` on the client is applied and its reply lost.
    ``stall``: the client's traffic held for ``ms``, shorter than the call timeout.
    ``outage``: held for ``ms``, longer than the call timeout, cut short when the next step ends:
    that step's calls may fail, with ``maybe_applied``.
    """

    kind: str
    client: int
    script: str = ""
    ms: int = 0

    def __repr__(self) -> str:
        extra = self.script or (f"{self.ms} ms" if self.ms else "")
        return f"Fault({self.kind!r}, client={self.client}{', ' + extra if extra else ''})"


class _Warnings(logging.Handler):
    """Counts the library's WARNINGs and ERRORs: a failure it retried past, which a step must know
    of (a receive that failed inside may have counted a delivery nobody saw)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


class _Shown(NamedTuple):
    """A pending item as peek() shows it, or as the keys hold it."""

    due: int
    value: str | None
    key: str | None
    headers: tuple[tuple[str, str], ...]
    expires_at_ms: int | None
    recurring: bool
    group: str | None = None


class World:
    """One example's loop, clients, queues and faults on a server behind two fault proxies."""

    def __init__(self, server_url: str, proxies: list[FaultProxy], config: Config) -> None:
        self.config = config
        self.proxies = proxies
        self.name = f"aiodelayq-model:{uuid.uuid4().hex[:10]}"
        self.loop = asyncio.new_event_loop()
        self.faulted = False  # a fault was injected since the last check
        self.armed = False  # a fault may still act (until the end of the next step)
        self.outage_until = 0.0  # loop time an outage ends: it outlasts the step it fails
        self.warnings = _Warnings()
        logging.getLogger("aiodelayq").addHandler(self.warnings)
        self.admin = self.run(self._client(server_url))
        self.clients = [self.run(self._client(p.url)) for p in proxies]
        self.queues: list[DelayedQueue[str]] = [
            DelayedQueue(c, self.name, codec="str", max_deliveries=config.max_deliveries, call_timeout_s=CALL_TIMEOUT_S,
                         safety_poll_s=1.0, close_timeout_s=2.0, lag_warning_s=None)
            for c in self.clients]
        # The checks read through a queue object of their own, on the direct connection.
        self.reader: DelayedQueue[str] = DelayedQueue(self.admin, self.name, codec="str", call_timeout_s=10.0)
        for q in self.queues:
            self.run(q.open())

    @staticmethod
    async def _client(url: str) -> Redis:
        return Redis.from_url(url)

    # -- running ---------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, _T], bound_s: float = RUN_BOUND_S) -> _T:
        """Drive the loop until ``coro`` ends (a step that runs past ``bound_s`` hangs: it fails)."""
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, bound_s))
        except asyncio.TimeoutError:
            raise Violation(f"a step did not end within {bound_s} s") from None

    async def server_ms(self) -> int:
        seconds, micros = await self.admin.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def call(self, make: Callable[[], Awaitable[Any]]) -> Outcome:
        """Run one public call, bracketed by the server's clock; a ``BackendError`` is its outcome."""
        faulty, warned = self.armed, self.warnings.count
        t0 = await self.server_ms()
        try:
            result, error = await make(), None
        except BackendError as exc:
            result, error = None, exc
        if self.warnings.count > warned:
            self.faulted = True  # the library met a failure of its own (a call past its bound)
        return Outcome(result, error, t0, await self.server_ms(), faulty or self.warnings.count > warned)

    def sleep(self, ms: int) -> None:
        self.run(asyncio.sleep(ms / 1000))

    # -- faults ----------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        proxy = self.proxies[fault.client]
        if fault.kind == "kill":
            proxy.kill_all()
        elif fault.kind == "lost-reply":
            proxy.kill_after_send(LOST_REPLY_SCRIPTS[fault.script].sha.encode())
        elif fault.kind in ("stall", "outage"):
            proxy.stall(fault.ms / 1000)
            if fault.kind == "outage":
                self.outage_until = max(self.outage_until, self.loop.time() + fault.ms / 1000)
        else:
            raise ValueError(fault.kind)
        self.faulted = self.armed = True

    def clear_faults(self) -> None:
        """End every fault still armed or running (held traffic flows again, in order); an outage
        runs its full length first (what it held then lands long after it was sent)."""
        if not self.armed:
            return
        if (left := self.outage_until - self.loop.time()) > 0:
            self.sleep(int(left * 1000) + 1)
        for proxy in self.proxies:
            proxy.disarm()
            proxy.resume()
        self.armed = False

    # -- checks ----------------------------------------------------------------------------------

    def _idle(self, q: DelayedQueue[str]) -> bool:
        """Nothing held by the queue object: no pop in flight or unfinished, no prefetched item or
        message, no settle or undo of a receive waiting."""
        pump, reliable = q._life.pump(), q._life.reliable()
        assert isinstance(pump, TakePump)  # an ordinary queue's
        assert isinstance(reliable, ReliableConsumer)
        return (not pump._buffer and not pump._handoff.pops and not reliable._buffer and reliable.settler.idle
                and not reliable._side_tasks)

    def _traffic(self) -> tuple[int, ...]:
        return tuple(n for p in self.proxies for n in (p.bytes_up, p.bytes_down))

    async def quiesce(self) -> bool:
        """Wait (bounded) until the queue objects hold nothing, the hand-off is empty and, after a
        fault, the traffic a stall held has landed (the proxies' byte counts stand still)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + QUIESCE_BOUND_S
        traffic = self._traffic()
        while True:
            if self.faulted:
                await asyncio.sleep(0.02)
                traffic, before = self._traffic(), traffic
                if traffic != before:
                    continue
            if all(self._idle(q) for q in self.queues) and not await self.admin.exists(self.queues[0].keys.handoff):
                return True
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)

    async def observe(self) -> tuple[Snapshot, QueueCounts, bool]:
        """The queue's contents once quiet, and ``counts()``, ``size()`` and ``ready_size()`` checked
        against them (read until no transfer ran in between)."""
        quiet = await self.quiesce()
        snap = await snapshot(self.admin, self.queues[0].keys)
        for _ in range(20):
            first = await self.reader.counts()
            size, ready = await self.reader.size(), await self.reader.ready_size()
            grouped_ready = int(await self.admin.hget(self.queues[0].keys.groups, "") or 0)  # (the lists' total)
            again = await self.reader.counts()
            if (first.pending, first.ready) == (again.pending, again.ready):
                break
        else:
            raise Violation("counts() never read the same twice in a row: transfers never stop")
        problems = []
        if size != first.pending:
            problems.append(f"size() {size} != counts().pending {first.pending}")
        if ready != first.ready - grouped_ready:
            problems.append(f"ready_size() {ready} != counts().ready {first.ready} - {grouped_ready} in groups' lists")
        in_lists = len(snap.at("pending")) + len(snap.at("ready"))
        if first.pending + first.ready != in_lists:
            problems.append(f"counts() pending {first.pending} + ready {first.ready} != {in_lists} in the keys")
        if first.pending > len(snap.at("pending")):
            problems.append(f"counts().pending {first.pending} > {len(snap.at('pending'))} pending a moment before")
        for name, seen in (("in_flight", "in_flight"), ("dead_letters", "dead")):
            if getattr(first, name) != len(snap.at(seen)):  # type: ignore[arg-type]
                problems.append(f"counts().{name} {getattr(first, name)} != {len(snap.at(seen))} in the keys")  # type: ignore[arg-type]
        if first.deduplicating > len(snap.open_windows()):  # (read after it: some may have ended since)
            problems.append(f"counts().deduplicating {first.deduplicating} > {len(snap.open_windows())} windows "
                            "open a moment before")
        if first.recurring != len(snap.records):
            problems.append(f"counts().recurring {first.recurring} != {len(snap.records)} schedule records")
        if first.paused != snap.paused:
            problems.append(f"counts().paused {first.paused} != {snap.paused} in the keys")
        if first.concurrency_limit != snap.cap:
            problems.append(f"counts().concurrency_limit {first.concurrency_limit} != {snap.cap} in the keys")
        problems += await self._check_peek(snap)
        if problems:
            raise Violation("\n".join(["counts() disagrees with the keys:", *problems, snap.describe()]))
        return snap, first, quiet

    async def _check_peek(self, snap: Snapshot) -> list[str]:
        """``peek()`` shows what the keys hold pending (each with its due time, key, headers, expiry
        and whether it recurs), soonest first; only what fell due since the snapshot may be gone."""
        pending = [_Shown(s.score or 0, s.value, s.key, tuple(sorted(s.headers.items())), s.expires_at_ms,
                          s.schedule_key is not None, s.group) for s in snap.at("pending")]
        peeked = await self.reader.peek(1000)
        after = await self.server_ms()
        got = [_Shown(p.due_ms, p.value, p.key, tuple(sorted(p.headers.items())), p.expires_at_ms, p.recurring,
                      p.group) for p in peeked]
        problems = [f"peek() shows {g}, not pending a moment before" for g in got if g not in pending]
        problems += [f"peek() leaves out {p}, pending and not due" for p in pending if p.due > after and p not in got]
        if [g.due for g in got] != sorted(g.due for g in got):
            problems.append(f"peek() is not in due order: {got}")
        return problems

    def unconfirmed(self, client: int) -> int:
        return self.queues[client].stats.unconfirmed_settles

    # -- the end -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the queues and clients, delete the queue's keys, close the loop (every step bounded)."""
        logging.getLogger("aiodelayq").removeHandler(self.warnings)
        try:
            self.clear_faults()
        finally:
            try:
                self.run(self._close(), bound_s=30)
            finally:
                with contextlib.suppress(Exception):
                    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()

    async def _close(self) -> None:
        await asyncio.gather(*(q.aclose() for q in self.queues), return_exceptions=True)
        keys = self.queues[0].keys
        await self.admin.delete(*keys.all)
        for client in [*self.clients, self.admin]:
            await client.aclose()
