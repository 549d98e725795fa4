"""The state machine: random sequences of the public calls on two queue objects of one queue, faults
between them, and the model checked after every step.

Each rule makes one public call on one of the two clients (through :meth:`QueueMachine.step`, which
brackets it with the server's clock and ends any fault the step ran under), then hands the call's
:class:`~tests.model.model.Outcome` to the model method of the same name, which checks the answer and
updates what the queue must hold. After every step, :meth:`QueueMachine.check` reads the queue's keys
in one transaction and reconciles them with the model (``Model.reconcile``), and ``counts()``,
``size()`` and ``ready_size()`` with the keys.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, get_args

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from aiodelayq import EventKind, Message, ScheduledKeyError
from aiodelayq._wire.elements import unwrap
from tests.faults import FaultProxy

from .model import Model
from .observe import Snapshot
from .state import Delivery, Outcome, Violation
from .tally import tally
from .world import CALL_TIMEOUT_S, LOST_REPLY_SCRIPTS, OUTAGE_MS, Config, Fault, World

__all__ = ["QueueMachine"]

TRACE = bool(os.environ.get("AIODELAYQ_MODEL_TRACE"))  # print every call, its outcome and how long it took

CLIENT = st.integers(0, 1)
DELAY_MS = st.sampled_from([0, 20, 60, 150, 300])
KEY = st.sampled_from(["k0", "k1", "k2"])
GROUPS = ("g0", "g1")
GROUP = st.sampled_from([None, None, *GROUPS])
SCHEDULE_KEY = st.sampled_from(["r0", "r1"])
HEADERS = st.sampled_from([{}, {}, {"tenant": "acme"}, {"trace": "t-1", "tenant": "ü"}])
EXPIRES_MS = st.sampled_from([None, None, 40, 250, 1000])
WINDOW_MS = st.sampled_from([None, None, 200, 1500])  # a keyed offer's dedupe_for
EVERY_MS = st.sampled_from([120, 250, 500])
VISIBILITY_MS = st.sampled_from([200, 600, 1500])  # 1.5 s: prefetch, and acks written behind
TIMEOUT_S = st.sampled_from([0.01, 0.1, 0.3])
PICK = st.integers(0, 15)
SETTLE = st.sampled_from(["ack", "ack", "ack-confirmed", "nack", "nack-dead", "extend"])
FAULT = st.one_of(  # outages are the slow ones (over a second each): one fault in eight
    st.builds(Fault, st.just("kill"), CLIENT),
    st.builds(Fault, st.just("kill"), CLIENT),
    st.builds(Fault, st.just("lost-reply"), CLIENT, st.sampled_from(list(LOST_REPLY_SCRIPTS))),
    st.builds(Fault, st.just("lost-reply"), CLIENT, st.sampled_from(list(LOST_REPLY_SCRIPTS))),
    st.builds(Fault, st.just("lost-reply"), CLIENT, st.sampled_from(list(LOST_REPLY_SCRIPTS))),
    st.builds(Fault, st.just("stall"), CLIENT, ms=st.sampled_from([30, 100, 300])),
    st.builds(Fault, st.just("stall"), CLIENT, ms=st.sampled_from([30, 100, 300])),
    st.builds(Fault, st.just("outage"), CLIENT, ms=st.sampled_from([OUTAGE_MS[0]] * 3 + [OUTAGE_MS[1]])),
)
# Each call runs after a fault one time in four: the fault's client, kind and length drawn with it.
FAULTS = st.one_of(st.none(), st.none(), st.none(), FAULT)
HELD_MESSAGES = 12  # the most Message objects kept to settle later (the oldest go: abandoned)


class QueueMachine(RuleBasedStateMachine):
    """Two queue objects of one queue on a real server, each client behind a fault proxy."""

    def __init__(self, server_url: str, proxies: list[FaultProxy]) -> None:
        super().__init__()
        self.server_url, self.proxies = server_url, proxies
        self.world: World | None = None
        self.model = Model(None)
        self.held: list[tuple[int, Message[str]]] = []
        # The concurrency limit: a receive handed out messages under it (checked at the next check), and
        # whether an extend took back a message past its deadline since it was set (then held may exceed it).
        self.limited_delivery = False
        self.limit_revived = False
        self.group_limit = 1  # the highest group limit set in the example (lowering takes nothing back)
        # The event stream: on for the example (set_events), and the deliveries whose confirmed ack said True.
        self.events_on = False
        self.acked: set[tuple[str, int]] = set()

    @initialize(max_deliveries=st.sampled_from([None, 2, 3]), limit=st.sampled_from([None, None, 1, 2]),
                items=st.lists(st.tuples(DELAY_MS, st.none() | KEY, HEADERS, EXPIRES_MS, GROUP), max_size=6),
                events=st.booleans())
    def start(self, max_deliveries: int | None, limit: int | None,
              items: list[tuple[int, str | None, dict[str, str], int | None, str | None]], events: bool) -> None:
        """A queue (with this ``max_deliveries`` for both queue objects, this concurrency limit from
        the start, and its event stream on or off), and a few items offered."""
        if TRACE:
            print(f"--- example: max_deliveries={max_deliveries}, concurrency limit={limit}", flush=True)
        self.world = World(self.server_url, self.proxies, Config(max_deliveries))
        self.model = Model(max_deliveries)
        self.events_on, self.acked = events, set()
        if events:
            out = self.step(lambda: self.w.queues[0].set_events(1_000_000))
            if out.error is not None:
                raise out.error
        if limit is not None:
            self.concurrency_limit(0, limit, None)
        if items:
            self.offer_many(0, items, False, None)

    def teardown(self) -> None:
        if self.world is not None:
            self.world.close()

    # -- helpers -----------------------------------------------------------------------------------

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    def step(self, make: Callable[[], Awaitable[Any]], fault: Fault | None = None, call: str = "") -> Outcome:
        """Run one public call, after injecting ``fault`` (which ends with the step); ``call`` names
        it in the summary (default: the rule's name)."""
        call = call or sys._getframe(1).f_code.co_name
        if fault is not None:
            tally(f"fault: {fault.kind}", quiet=True)
            if TRACE:
                print(f"  inject {fault!r}", flush=True)
            self.w.inject(fault)
        started = time.monotonic()
        tally(f"call: {call}", quiet=True)
        try:
            out = self.w.run(self.w.call(make))
        finally:
            self.w.clear_faults()
        if out.error is not None:
            tally(f"{call}: {type(out.error).__name__}, maybe_applied={out.maybe}")
        if TRACE:
            what = out.result if out.error is None else repr(out.error)
            print(f"  {call}: {what!r:.150} [{out.t0}-{out.t1}] "
                  f"{time.monotonic() - started:.3f} s", flush=True)
        return out

    def message(self, pick: int) -> tuple[int, Message[str]] | None:
        """A held message (``None`` when none is held: the rule does nothing). Rules are always
        enabled, whatever the server did: Hypothesis replays a sequence of draws, and a precondition
        that depends on an outcome (a receive that got nothing) would change what is drawn."""
        return self.held[pick % len(self.held)] if self.held else None

    # -- producing ---------------------------------------------------------------------------------

    @rule(c=CLIENT, delay=DELAY_MS, key=st.none() | KEY, replace=st.booleans(), headers=HEADERS, expires=EXPIRES_MS,
          group=GROUP, window=WINDOW_MS, fault=FAULTS)
    def offer(self, c: int, delay: int, key: str | None, replace: bool, headers: dict[str, str],
              expires: int | None, group: str | None, window: int | None, fault: Fault | None) -> None:
        value, q = self.model.new_value(), self.w.queues[c]
        kwargs: dict[str, Any] = {"headers": headers or None, "expires": None if expires is None else expires / 1000,
                                  "group": group}
        if key is None:
            window = None
        else:
            kwargs.update(key=key, replace=replace, dedupe_for=None if window is None else window / 1000)
        out = self.step(lambda: q.offer(value, delay / 1000, **kwargs), fault)
        self.model.offer(value, delay, key, replace and key is not None, headers, expires, out, group, window)

    @rule(c=CLIENT, entries=st.lists(st.tuples(DELAY_MS, st.none() | KEY, HEADERS, EXPIRES_MS, GROUP), min_size=1,
                                     max_size=5),
          replace=st.booleans(), window=WINDOW_MS, fault=FAULTS)
    def offer_many(self, c: int, entries: list[tuple[int, str | None, dict[str, str], int | None, str | None]],
                   replace: bool, fault: Fault | None, window: int | None = None) -> None:
        q = self.w.queues[c]
        items = [(self.model.new_value(), delay, key, headers, expires, group)
                 for delay, key, headers, expires, group in entries]
        keys = [item[2] for item in items]
        groups = [item[5] for item in items]
        keyed = any(k is not None for k in keys)
        window = window if keyed else None
        out = self.step(lambda: q.offer_many(
            [(item[0], item[1] / 1000) for item in items],
            keys=keys if keyed else None, replace=replace,
            headers=[item[3] or None for item in items],
            expires=[None if item[4] is None else item[4] / 1000 for item in items],
            groups=groups if any(g is not None for g in groups) else None,
            dedupe_for=None if window is None else window / 1000), fault)
        self.model.offer_many(items, replace and keyed, out, window)

    @rule(c=CLIENT, key=KEY, fault=FAULTS)
    def cancel(self, c: int, key: str, fault: Fault | None) -> None:
        q = self.w.queues[c]
        self.model.cancel(key, self.step(lambda: q.cancel(key), fault))

    @rule(c=CLIENT, key=KEY, delay=DELAY_MS, fault=FAULTS)
    def reschedule(self, c: int, key: str, delay: int, fault: Fault | None) -> None:
        q = self.w.queues[c]
        self.model.reschedule(key, delay, self.step(lambda: q.reschedule(key, delay / 1000), fault))

    @rule(c=CLIENT, key=KEY, fault=FAULTS)
    def get(self, c: int, key: str, fault: Fault | None) -> None:
        q = self.w.queues[c]
        self.model.get(key, self.step(lambda: q.get(key), fault))

    # -- recurring items ---------------------------------------------------------------------------

    @rule(c=CLIENT, key=SCHEDULE_KEY, every=EVERY_MS, headers=HEADERS, fault=FAULTS)
    def schedule(self, c: int, key: str, every: int, headers: dict[str, str], fault: Fault | None) -> None:
        value, q = self.model.new_schedule_value(), self.w.queues[c]
        out = self.step(lambda: q.schedule(key, value, every=every / 1000, headers=headers or None), fault)
        self.model.schedule(key, value, every, headers, out)

    @rule(c=CLIENT, key=SCHEDULE_KEY, fault=FAULTS)
    def unschedule(self, c: int, key: str, fault: Fault | None) -> None:
        q = self.w.queues[c]
        self.model.unschedule(key, self.step(lambda: q.cancel(key), fault))

    @rule(c=CLIENT, key=SCHEDULE_KEY, delay=DELAY_MS, fault=FAULTS)
    def offer_on_schedule_key(self, c: int, key: str, delay: int, fault: Fault | None) -> None:
        """``offer(..., key=k, replace=True)`` with a key of the schedules' pool: refused while its
        schedule is live, an ordinary keyed offer otherwise."""
        value, q = self.model.new_value(), self.w.queues[c]

        async def offer() -> Any:
            try:
                return await q.offer(value, delay / 1000, key=key, replace=True)
            except ScheduledKeyError as exc:  # the outcome the model checks
                return exc

        self.model.offer_on_schedule_key(value, delay, key, self.step(offer, fault))

    # -- controls, clear, dead letters -------------------------------------------------------------

    @rule(c=CLIENT, paused=st.sampled_from([True, False, False]), fault=FAULTS)
    def pause(self, c: int, paused: bool, fault: Fault | None) -> None:
        q = self.w.queues[c]
        self.model.pause(paused, self.step(q.pause if paused else q.resume, fault))

    @rule(c=CLIENT, limit=st.sampled_from([None, None, 1, 2, 3]), fault=FAULTS)
    def concurrency_limit(self, c: int, limit: int | None, fault: Fault | None) -> None:
        """``set_concurrency_limit(limit)``, then 100 ms: messages prefetched before it (held 50 ms at
        most) are given back, so every delivery after it came from a RECEIVE that applied it."""
        q = self.w.queues[c]

        async def set_limit() -> None:
            await q.set_concurrency_limit(limit)
            await asyncio.sleep(0.1)

        self.model.concurrency_limit(limit, self.step(set_limit, fault))
        self.limit_revived = False

    @rule(c=CLIENT, limit=st.sampled_from([1, 1, 2]), fault=FAULTS)
    def group_concurrency(self, c: int, limit: int, fault: Fault | None) -> None:
        """``set_group_concurrency(limit)``: checked through the groups' bookkeeping (see :meth:`check`)."""
        q = self.w.queues[c]
        out = self.step(lambda: q.set_group_concurrency(limit), fault)
        if out.error is not None and not out.maybe and not out.faulty:
            raise out.error
        self.group_limit = max(self.group_limit, limit)

    @rule(c=CLIENT, fault=FAULTS)
    def clear(self, c: int, fault: Fault | None) -> None:
        self.model.clear(self.step(self.w.queues[c].clear, fault))

    @rule(c=CLIENT, purge=st.booleans(), limit=st.none() | st.integers(1, 3), delay=DELAY_MS, fault=FAULTS)
    def dead_letters(self, c: int, purge: bool, limit: int | None, delay: int, fault: Fault | None) -> None:
        """``requeue_dead_letters(limit, delay)`` or ``purge_dead_letters()``."""
        q = self.w.queues[c]
        if purge:
            self.model.purge(self.step(q.purge_dead_letters, fault))
        else:
            out = self.step(lambda: q.requeue_dead_letters(limit, delay=delay / 1000), fault)
            self.model.requeue(limit, delay, out)

    # -- consuming ---------------------------------------------------------------------------------

    @rule(c=CLIENT, n=st.integers(1, 4), timeout=TIMEOUT_S, fault=FAULTS)
    def take(self, c: int, n: int, timeout: float, fault: Fault | None) -> None:
        q = self.w.queues[c]
        out = self.step(lambda: q.take_many_with_headers(n, timeout), fault)
        if out.error is not None:
            raise out.error
        self.model.take([Delivery(c, value, headers) for value, headers in out.result], out)

    @rule(c=CLIENT, n=st.integers(1, 3), vt=VISIBILITY_MS, timeout=TIMEOUT_S, fault=FAULTS)
    def receive(self, c: int, n: int, vt: int, timeout: float, fault: Fault | None) -> None:
        """``receive_many(n, vt, timeout)``; the messages are held, for a later ``settle``."""
        self.receive_then(c, n, vt, timeout, None, fault)

    @rule(c=CLIENT, n=st.integers(1, 3), vt=VISIBILITY_MS, timeout=TIMEOUT_S, then=SETTLE, fault=FAULTS)
    def receive_and_settle(self, c: int, n: int, vt: int, timeout: float, then: str, fault: Fault | None) -> None:
        """``receive_many(n, vt, timeout)``, each message then settled at once (``then``: as ``settle``'s
        ``how``, with a 60 ms nack delay), and held still (a later settle finds it settled)."""
        self.receive_then(c, n, vt, timeout, then, fault)

    def receive_then(self, c: int, n: int, vt: int, timeout: float, then: str | None, fault: Fault | None) -> None:
        q = self.w.queues[c]
        out = self.step(lambda: q.receive_many(n, vt / 1000, timeout), fault, "receive")
        messages: list[Message[str]] = out.result or []
        deliveries = []
        for msg in messages:
            item = unwrap(msg._element[32:])
            deliveries.append(Delivery(c, msg.value, msg.headers, msg.id, msg.delivery_count, msg.due_ms,
                                       msg.deadline_ms, msg.expires_at_ms, item.schedule_key,
                                       item.occurrence if item.schedule_key is not None else None, msg.group))
        for d in deliveries:
            tally("receive: a redelivery" if d.count > 1 else "receive: a first delivery")
        self.model.receive(deliveries, vt, out)
        if deliveries and len(self.model.caps) == 1 and self.model.caps[0] is not None:
            self.limited_delivery = True
        self.held = [*self.held, *((c, m) for m in messages)][-HELD_MESSAGES:]
        if then is not None:
            for msg in messages:
                self.settle_message(c, msg, then, 60, vt, None)

    @rule(pick=PICK, how=SETTLE, delay=DELAY_MS, vt=VISIBILITY_MS, fault=FAULTS)
    def settle(self, pick: int, how: str, delay: int, vt: int, fault: Fault | None) -> None:
        """``ack()`` (``ack``: written behind when it may be; ``ack-confirmed``), ``nack(delay)``,
        ``nack(dead_letter=True)`` or ``extend(vt)`` of a message received earlier (any of them: it
        may have been redelivered since, to either client, or settled)."""
        if (held := self.message(pick)) is not None:
            self.settle_message(*held, how, delay, vt, fault)

    def settle_message(self, c: int, msg: Message[str], how: str, delay: int, vt: int, fault: Fault | None) -> None:
        if how == "extend":
            deadline = msg.deadline_ms
            out = self.step(lambda: msg.extend(vt / 1000), fault, "extend")
            self.model.extend(msg.id, msg.delivery_count, vt, out, msg.deadline_ms)
            if out.result is not None and deadline <= out.t1:
                self.limit_revived = True  # held again past its deadline, whatever the limit
            return
        before = self.w.unconfirmed(c)
        behind = [False]

        async def settle_call() -> bool:
            if how in ("nack", "nack-dead"):
                return await msg.nack(delay / 1000, dead_letter=how == "nack-dead")
            # Written behind: the queue's default, with more than call_timeout_s of the deadline left.
            behind[0] = how == "ack" and not msg.settled and msg.remaining_s > CALL_TIMEOUT_S
            return await msg.ack(confirm=True if how == "ack-confirmed" else None)

        out = self.step(settle_call, fault, how)
        if how == "ack-confirmed" and out.ok and out.result is True:
            self.acked.add((msg.id, msg.delivery_count))
        mode = {"ack": "ack", "ack-confirmed": "ack", "nack": "nack", "nack-dead": "dead"}[how]
        self.model.settle(msg.id, msg.delivery_count, mode, delay, c, before, out, written_behind=behind[0])
        self._settled(msg, out)

    def _settled(self, msg: Message[str], out: Outcome) -> None:
        if out.ok and out.result:
            self.held = [(c, m) for c, m in self.held if m is not msg]

    # -- time and faults ---------------------------------------------------------------------------

    @rule(ms=st.sampled_from([30, 150, 400]), fault=FAULTS)
    def wait(self, ms: int, fault: Fault | None) -> None:
        """Time passes: items fall due, deadlines pass, the library's background work runs."""
        self.step(lambda: asyncio.sleep(ms / 1000), fault)

    @rule(c=CLIENT)
    def drain(self, c: int) -> None:
        """Liveness: every item pending or ready now is handed out within 5 s of its due time, and
        every message in flight now comes back within 5 s of its deadline (each then acked), or dies
        (expired, or past ``max_deliveries``); for what was overdue when the drain began, within 5 s
        of that (only a consumer's call hands out, and none may have run since: a group's next item
        waits for its message in flight). Not while paused: then nothing may come (which every take
        and receive checks)."""
        if self.model.paused != [False]:
            return
        self.w.clear_faults()
        q = self.w.queues[c]
        self.check()
        targets = self.model.unfinished()
        start = self.w.run(self.w.server_ms())
        while True:
            left = {name: at for name, at in self.model.unfinished().items() if name in targets}
            if not left:
                return
            now = self.w.run(self.w.server_ms())
            # A safety poll of 1 s five times over; 25 s with popped items in the hand-off (a fault
            # cut their pop off: its 20 s lease brings them back).
            bound = max(min(max(at, start), now) for at in left.values()) + (
                25_000 if self.model.in_handoff else 5_000)
            if now > bound:
                raise Violation(f"not delivered in time (server time {now}): {sorted(left)}\n{self.model.describe()}")
            taken = False
            if any(name in self.model.undelivered_names() for name in left):
                out = self.step(lambda: q.take_many_with_headers(10, 0.2))
                if out.error is not None:
                    raise out.error
                self.model.take([Delivery(c, value, headers) for value, headers in out.result], out)
                taken = bool(out.result)
            # A receive, unless a take got items and none left is in flight: one that gets items every
            # time (a recurring item's occurrences) must not starve the messages in flight (whose
            # group's next items wait for them).
            if not taken or not all(name in self.model.undelivered_names() for name in left):
                self.receive_then(c, 10, 300, 0.2, None, None)
                self.check()  # the receive may have dead-lettered messages past their deadline
                for client, msg in [(k, m) for k, m in self.held if m.deadline_ms and not m.settled]:
                    if client == c and self.model.holds(msg.id, msg.delivery_count):
                        self.settle_message(client, msg, "ack-confirmed", 0, 0, None)
            self.check()

    # -- the check ---------------------------------------------------------------------------------

    def _check_events(self, snap: Snapshot) -> None:
        """The event stream against what the keys hold and the calls answered: off, no stream key; on,
        ids in order, known kinds, a ``delivered`` event for every message in flight (its id and
        count), one ``acked`` for every confirmed ack that said True, at least as many ``offered`` and
        ``requeued`` as items pending or ready (occurrences of schedules aside), and at least as many
        ``dead_lettered`` and ``expired`` as dead letters."""
        if not self.events_on:
            if snap.events is not None:
                raise Violation(f"an event stream while events are off: {snap.events[:5]}")
            return
        events = snap.events or []
        problems = []
        order = [tuple(int(x) for x in e.id.split("-")) for e in events]
        if order != sorted(set(order)):
            problems.append("the events' ids are not in order")
        unknown = {e.kind for e in events} - set(get_args(EventKind))
        if unknown:
            problems.append(f"events of unknown kinds {unknown}")
        kinds = [e.kind for e in events]
        delivered = {(e.message_id, e.delivery_count) for e in events if e.kind == "delivered"}
        missing = [(s.value, s.message_id, s.delivery_count) for s in snap.at("in_flight")
                   if (s.message_id, s.delivery_count) not in delivered]
        if missing:
            problems.append(f"messages in flight without their 'delivered' event: {missing}")
        acked = {(e.message_id, e.delivery_count) for e in events if e.kind == "acked"}
        if self.acked - acked:
            problems.append(f"confirmed acks without their 'acked' event: {sorted(self.acked - acked)}")
        waiting = [s for s in snap.seen if s.where in ("pending", "ready") and s.schedule_key is None]
        if len(waiting) > kinds.count("offered") + kinds.count("requeued"):
            problems.append(f"{len(waiting)} items pending or ready, {kinds.count('offered')} 'offered' and "
                            f"{kinds.count('requeued')} 'requeued' events")
        if len(snap.at("dead")) > kinds.count("dead_lettered") + kinds.count("expired"):
            problems.append(f"{len(snap.at('dead'))} dead letters, {kinds.count('dead_lettered')} 'dead_lettered' "
                            f"and {kinds.count('expired')} 'expired' events")
        if problems:
            raise Violation("\n".join(["the event stream:", *problems, snap.describe()]))
        tally("check: events checked", quiet=True)

    def _check_groups(self, snap: Snapshot) -> None:
        """The groups' bookkeeping matches what the keys hold (``lua/lib/groups.lua``): a field per
        group with items admitted (ready or in flight), flagged while any wait in its list, never more
        in flight than the group limit, ``""`` the items waiting in the ready list and all the lists;
        and no group has items waiting while it has room to admit them."""
        flying: dict[str, int] = {}
        for s in snap.at("in_flight"):
            if s.group is not None:
                flying[s.group] = flying.get(s.group, 0) + 1
        admitted = {group: flying.get(group, 0) + snap.group_ready.get(group, 0)
                    for group in {*flying, *snap.group_ready}}
        waiting = {group: n for group, n in snap.group_lists.items() if n}
        problems = []
        # A group's field: admitted + 2**20 while its list may hold items (set while it holds some; it
        # may stay set on an empty list until the next admission finds it short); "" the items
        # waiting in the ready list and the lists.
        flag = {group: value >= 2**20 for group, value in snap.groups_hash.items() if group}
        expected = {group: admitted.get(group, 0) + (2**20 if waiting.get(group) or flag.get(group) else 0)
                    for group in {*waiting, *admitted}}
        if waiting or snap.group_ready:
            expected[""] = sum(waiting.values()) + sum(snap.group_ready.values())
        if snap.groups_hash != expected:
            problems.append(f"the groups hash {snap.groups_hash} != {expected} (lists {waiting}, in flight {flying}, "
                            f"ready {snap.group_ready})")
        if any(n > self.group_limit for n in flying.values()):
            problems.append(f"more messages of a group in flight than the group limit ({self.group_limit}): {flying}")
        for group in waiting:
            if admitted.get(group, 0) < snap.group_limit:
                problems.append(f"group {group!r} has items waiting and room, but they are not admitted")
        if flying:
            tally("check: a group's message in flight")
        if problems:
            raise Violation("\n".join(["the groups' bookkeeping:", *problems, snap.describe()]))

    @invariant()
    def check(self) -> None:
        if self.world is None:
            return
        started = time.monotonic()
        snap, counts, quiet = self.w.run(self.w.observe())
        if TRACE:
            print(f"  check: {len(snap.seen)} elements, quiet={quiet} {time.monotonic() - started:.3f} s", flush=True)
        if not quiet and not self.w.faulted:
            raise Violation("a queue object held prefetched items, messages or settles (or the hand-off kept "
                            f"entries) for over 3 s without a fault:\n{snap.describe()}")
        self.model.reconcile(snap, self.w.unconfirmed, self.w.faulted)
        if self.limited_delivery and not self.limit_revived and snap.cap is not None:
            tally("check: deliveries under a concurrency limit")
        if self.limited_delivery and not self.limit_revived and snap.cap is not None and snap.held > snap.cap:
            raise Violation(f"a receive handed out messages, and {snap.held} are held under a concurrency limit "
                            f"of {snap.cap}:\n{snap.describe()}")
        self._check_groups(snap)
        self._check_events(snap)
        self.limited_delivery = False
        for where in ("pending", "ready", "in_flight", "dead"):
            if snap.at(where):
                tally(f"check: something {where}")
        expected = self.model.expected_counts(snap)
        got = {"pending+ready": counts.pending + counts.ready, "in_flight": counts.in_flight,
               "dead_letters": counts.dead_letters, "recurring": counts.recurring}
        if got != expected:
            raise Violation(f"counts() {got} != the model's {expected}\n{snap.describe()}\n{self.model.describe()}")
        if not self.w.armed:
            self.w.faulted = False
