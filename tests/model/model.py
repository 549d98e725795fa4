"""The model: what one queue must hold, and what each public call may answer.

Every item the test offers is a :class:`Token` (its payload is unique: ``i<n>``), and so is every
occurrence of a recurring item once it is seen outside the pending zset (its identity is its
schedule's key and occurrence number, which its envelope carries everywhere). A token's
:class:`State` says where the item must be: ``scheduled`` (pending, or ready once its due time has
passed: the transfer moves it on its own), ``ready`` (known moved: no longer pending), ``in_flight``
(a message: its id, delivery count, visibility deadline), ``dead`` (reason, count) or ``gone``.

Where a call's outcome is legitimately uncertain (it raised with ``maybe_applied=True``; a cancel of
an item whose due time passed may have found it moved; a written-behind ack may not have landed), a
token carries several *alternatives*, and the next :meth:`Model.reconcile` keeps the one the server
shows, failing when none fits. Every uncertainty is named where it is made, so a shrunk failure
says which alternatives the model allowed.

Times are the server's (epoch ms): every call is bracketed by ``TIME`` reads (``t0``, ``t1``) on a
direct connection, and a due time known only within bounds is kept as ``(lo, hi)``.

Each public call the machine makes has one method here, of the same name, taking the call's
:class:`Outcome` (adding a call: the package's docstring). The check after every step is
:meth:`Model.reconcile` (``reconcile.py``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from .reconcile import Reconciling
from .state import (
    GONE,
    INF,
    Delivery,
    Incarnation,
    Outcome,
    Span,
    State,
    Token,
    Violation,
    Window,
    expiry_fits,
    span_text,
)
from .tally import tally

# One item of an offer: value, delay ms, key, headers, expires ms, group.
Offering = tuple[str, int, str | None, dict[str, str], int | None, str | None]

__all__ = ["Model"]

# How far ahead of the server's clock a producer's estimate of it may be: less than a round trip.
CLOCK_AHEAD_MS = 100


class Model(Reconciling):
    """The expected contents of one queue (shared by the test's two queue objects)."""

    def __init__(self, max_deliveries: int | None) -> None:
        self.max_deliveries = max_deliveries
        self.items: dict[str, Token] = {}  # plain items by value
        self.occurrences: dict[tuple[str, int], Token] = {}  # seen occurrences by (schedule key, number)
        self.incarnations: dict[str, Incarnation] = {}  # every schedule() call's, by its item
        self.schedules: dict[str, list[Incarnation | None]] = {}  # live schedule of each key (alternatives)
        self.paused: list[bool] = [False]
        self.caps: list[int | None] = [None]  # the concurrency limit (alternatives)
        self.windows: dict[str, list[Window | None]] = {}  # each key's deduplication window (alternatives)
        self.dead_order: list[Token] = []  # the dead-letter list as last seen, oldest first
        self.messages: dict[str, Token] = {}  # every message id received, and its token
        self.unseen_possible = False  # a receive met a fault: deliveries nobody saw may have been counted
        self.taken_occurrences: Counter[str] = Counter()  # occurrences taken since the last reconcile
        self._current_pending = 0  # live schedules whose current occurrence was pending at the last reconcile
        self._in_handoff = 0  # tokens found in the hand-off at the last reconcile
        self._ids = itertools.count()
        self._batches = itertools.count(1)

    # -- names ------------------------------------------------------------------------------------

    def new_value(self) -> str:
        return f"i{next(self._ids)}"

    def new_schedule_value(self) -> str:
        return f"s{next(self._ids)}"

    def _token(self, value: str, headers: dict[str, str], *alts: State, note: str, batch: int | None = None,
               group: str | None = None) -> Token:
        token = Token(value, headers, [], batch=batch, group=group)
        token.set(*alts, note=note)
        self.items[value] = token
        return token

    def keyed(self, key: str) -> list[Token]:
        """The tokens that may be the pending item of ``key``."""
        return [t for t in self.items.values() if any(a.kind == "scheduled" and a.key == key for a in t.alts)]

    def describe(self) -> str:
        lines = [f"paused {self.paused}; concurrency limit {self.caps}; unseen deliveries possible: "
                 f"{self.unseen_possible}"]
        for key, alts in sorted(self.schedules.items()):
            shown = [None if i is None else (i.value, i.every_ms, i.anchor) for i in alts]
            lines.append(f"  schedule {key!r}: {shown}")
        for key, windows in sorted(self.windows.items()):
            if windows != [None]:
                lines.append(f"  key {key!r}: {[None if w is None else w.describe() for w in windows]}")
        for token in [*self.items.values(), *self.occurrences.values()]:
            if token.alts != [GONE]:
                lines.append(f"  {token.describe()}")
        return "\n".join(lines)

    # -- producing ----------------------------------------------------------------------------------

    def offer(self, value: str, delay_ms: int, key: str | None, replace_: bool, headers: dict[str, str],
              expires_ms: int | None, out: Outcome, group: str | None = None, window_ms: int | None = None) -> None:
        """``offer(value, delay, key=, replace=, headers=, expires=, group=, dedupe_for=)``."""
        self._offers([(value, delay_ms, key, headers, expires_ms, group)], replace_, out,
                     [out.result] if out.ok else None, window_ms)

    def offer_many(self, entries: list[Offering], replace_: bool,
                   out: Outcome, window_ms: int | None = None) -> None:
        """``offer_many([(value, delay), ...], keys=, replace=, headers=, expires=, groups=, dedupe_for=)``: as
        many offers in order, one call (the lists are small): all or nothing."""
        if out.ok and len(out.result) != len(entries):
            raise Violation(f"offer_many of {len(entries)} items returned {len(out.result)} due times")
        self._offers(entries, replace_, out, list(out.result) if out.ok else None, window_ms)

    def _offers(self, entries: list[Offering], replace_: bool,
                out: Outcome, results: list[Any] | None, window_ms: int | None = None) -> None:
        """Keyed items follow their key's window: an item written with ``window_ms`` opens it (ending
        ``window_ms`` after the call ran), and an open one refuses the key's offers while its item is
        not pending."""
        if out.surely_not:
            return
        # One call, all or nothing: its unkeyed items land together (a keyed one may find its key
        # pending, an earlier item of the list's included, and not land).
        batch = next(self._batches) if len(entries) > 1 and out.maybe else None
        for index, (value, delay_ms, key, headers, expires_ms, group) in enumerate(entries):
            if results is None:  # maybe applied, maybe not, as a whole
                due: Span = (out.t0 + delay_ms, INF)  # landed late (held by a stall): later, never earlier
                expires = None if expires_ms is None else (due[0] + expires_ms, INF)
                if key is not None and replace_:
                    for old in self.keyed(key):
                        old.set(*old.alts, *[replace(a, kind="gone", why="maybe replaced") for a in old.alts
                                             if a.kind == "scheduled" and a.key == key], note="offer maybe replaced")
                self._token(value, headers, replace(GONE, why="offer maybe not applied"),
                            State("scheduled", due, key, expires, life=expires_ms, landed=INF,
                                  why="offer maybe applied"),
                            note=f"offer raised {out.error!r}", batch=batch if key is None else None, group=group)
                if key is not None and window_ms is not None:
                    self.windows[key] = [*self.windows.get(key, [None]),
                                         Window((out.t0 + window_ms, INF), (out.t0 + delay_ms, INF))]
                continue
            result = results[index]
            due_ms = int(result)
            fresh = key is None or result.added or result.replaced
            if fresh and not out.t0 + delay_ms <= due_ms <= out.t1 + delay_ms:
                raise Violation(f"offer of {value!r} (delay {delay_ms} ms) returned due {due_ms}, not within "
                                f"[{out.t0 + delay_ms}, {out.t1 + delay_ms}]: due times count from the call")
            # The expiry is the issue time + delay + expires, the issue time from the producer's
            # estimate of the server clock: never behind it, ahead by less than the fastest round trip
            # of the last 10 s (the due time reads the same estimate, once more: they can differ).
            expires = None if expires_ms is None else (out.t0 + delay_ms + expires_ms,
                                                       out.t1 + CLOCK_AHEAD_MS + delay_ms + expires_ms)
            if key is None:
                self._token(value, headers, State("scheduled", (due_ms, due_ms), None, expires, life=expires_ms,
                                                  landed=out.t1), note="offered", group=group)
                continue
            olds = self.keyed(key)
            windows = self.windows.get(key, [None])
            if result.deduplicated == result.added:
                raise Violation(f"offer of key {key!r}: added={result.added} and deduplicated={result.deduplicated}")
            if result.added and not result.replaced and all(w is not None and w.end[0] > out.t1 for w in windows):
                raise Violation(f"offer of key {key!r} added an item while the key's window was open: "
                                f"{[w.describe() for w in windows if w is not None]}")
            if result.added and window_ms is not None:
                tally("offer: opened a window")
                self.windows[key] = [Window((out.t0 + window_ms, out.t1 + window_ms), (due_ms, due_ms))]
            elif result.added and not result.replaced:
                self.windows[key] = [None]  # none was open at the call: any had ended
            if not result.added and self._refused_by_window(olds, key, windows, due_ms, out):
                self.items[value] = Token(value, headers, [GONE], history=["offer refused by the key's window"])
                continue
            if result.replaced:
                if not result.added:
                    raise Violation(f"offer of key {key!r}: replaced={result.replaced} but added={result.added}")
                self._pending_now(olds, key, out, f"offer(key={key!r}, replace=True) replaced a pending item",
                                  then=GONE)
            elif result.added:
                self._moved(olds, key, out, f"offer(key={key!r}) added, so the key's item was no longer pending")
            else:
                self._pending_now(olds, key, out, f"offer(key={key!r}) found the key pending", then=None,
                                  due=due_ms)
                self.items[value] = Token(value, headers, [GONE], history=["offer found the key pending"])
                continue
            self._token(value, headers, State("scheduled", (due_ms, due_ms), key, expires, life=expires_ms,
                                              landed=out.t1), note="offered", group=group)

    def _refused_by_window(self, olds: list[Token], key: str, windows: list[Window | None], due_ms: int,
                           out: Outcome) -> bool:
        """An offer of ``key`` wrote nothing and returned ``due_ms``: whether the key's open window
        (rather than its pending item) may explain it. When only the window does, the key's item was not
        pending; when either may, the item's alternatives stay as they were."""
        fits = [w for w in windows if w is not None and w.end[1] > out.t0 and w.due[0] <= due_ms <= w.due[1]]
        if not fits:
            return False
        pending = any(a.kind == "scheduled" and a.key == key and a.due[0] <= due_ms <= a.due[1]
                      for t in olds for a in t.alts)
        if not pending:
            self._moved(olds, key, out, f"offer(key={key!r}) was refused by the key's window, not by a pending item")
        tally("offer: refused by its key's window" if not pending else "offer: key pending, its window open")
        self.windows[key] = list(fits)
        return True

    def _pending_now(self, olds: list[Token], key: str, out: Outcome, what: str, then: State | None,
                     due: int | None = None) -> None:
        """``olds`` (the tokens that may hold ``key``): one of them was pending under ``key`` when the
        call ran; it becomes ``then`` (``None``: unchanged). When several may have been, each keeps
        both outcomes (that one, or moved before the call)."""
        fits = [(t, a) for t in olds for a in t.alts
                if a.kind == "scheduled" and a.key == key and (due is None or a.due[0] <= due <= a.due[1])]
        if not fits:
            raise Violation(f"{what}, but the model has no pending item of {key!r}"
                            f"{'' if due is None else f' due {due}'}: {[t.describe() for t in olds]}")
        chosen: dict[int, tuple[Token, State]] = {}
        for token, alt in fits:
            chosen.setdefault(id(token), (token, alt))
        holders = set(chosen)
        for token in olds:
            if id(token) not in holders:
                self._moved([token], key, out, f"{what}: another item held {key!r}")
        for token, alt in chosen.values():
            if due is not None:
                alt = replace(alt, due=(due, due))
            after = alt if then is None else then
            if len(holders) == 1:
                token.set(after, note=what)
            else:
                moved = [replace(a, kind="ready", key=None, why="moved before the call")
                         for a in token.alts if a.kind == "scheduled" and a.key == key and a.due[0] <= out.t1]
                token.set(replace(after, why="one of several"), *moved, note=what)

    def _moved(self, olds: list[Token], key: str, out: Outcome, what: str) -> None:
        """The tokens that may hold ``key`` were not pending under it when the call ran: transferred
        (their due time had come) or never there."""
        for token in olds:
            alts = []
            for a in token.alts:
                if a.kind == "scheduled" and a.key == key:
                    if a.due[0] <= out.t1:
                        alts.append(replace(a, kind="ready", key=None, why=""))
                else:
                    alts.append(a)
            if not alts:
                raise Violation(f"{what}, but {token.name} was pending under it and not yet due "
                                f"(t1={out.t1}): {token.describe()}")
            token.set(*alts, note=what)

    def cancel(self, key: str, out: Outcome) -> None:
        """``cancel(key)`` of a plain item's key."""
        olds = self.keyed(key)
        if out.surely_not:
            return
        if out.maybe:
            for token in olds:
                token.set(*token.alts, *[replace(GONE, why="cancel maybe applied") for a in token.alts
                                         if a.kind == "scheduled" and a.key == key], note="cancel raised")
            return
        if out.result:
            self._pending_now(olds, key, out, f"cancel({key!r}) returned True", then=GONE)
        else:
            self._moved(olds, key, out, f"cancel({key!r}) returned False")

    def reschedule(self, key: str, delay_ms: int, out: Outcome) -> None:
        """``reschedule(key, delay)``."""
        olds = self.keyed(key)
        if out.surely_not:
            return
        if out.maybe:
            for token in olds:
                token.set(*token.alts, *[replace(a, due=(out.t0 + delay_ms, INF), life=None, landed=INF,
                                                 why="reschedule maybe applied")
                                         for a in token.alts if a.kind == "scheduled" and a.key == key],
                          note="reschedule raised")
            return
        if out.result is None:
            self._moved(olds, key, out, f"reschedule({key!r}) returned None")
            return
        due = int(out.result)
        if not out.t0 + delay_ms <= due <= out.t1 + delay_ms:
            raise Violation(f"reschedule({key!r}, {delay_ms} ms) returned {due}, not within "
                            f"[{out.t0 + delay_ms}, {out.t1 + delay_ms}]")
        fits = [(t, a) for t in olds for a in t.alts if a.kind == "scheduled" and a.key == key]
        if not fits:
            raise Violation(f"reschedule({key!r}) returned {due}, but the model has no pending item of the key")
        token, alt = fits[0]
        token.set(replace(alt, due=(due, due), life=None, landed=out.t1, why=""), note=f"rescheduled to {due}")

    def get(self, key: str, out: Outcome) -> None:
        """``get(key)``: the pending item of ``key`` (its value, due time, headers, expiry), or ``None``."""
        if not out.ok:
            return
        olds = self.keyed(key)
        pending = out.result
        if pending is None:
            self._moved(olds, key, out, f"get({key!r}) returned None")
            return
        fits = [(t, a) for t in olds for a in t.alts if a.kind == "scheduled" and a.key == key
                and t.value == pending.value and a.due[0] <= pending.due_ms <= a.due[1]
                and t.headers == pending.headers and t.group == pending.group
                and expiry_fits(a.expires, pending.expires_at_ms)]
        if pending.key != key or pending.recurring or not fits:
            raise Violation(f"get({key!r}) returned {pending}; the model has {[t.describe() for t in olds]}")
        token, alt = fits[0]
        for other in olds:
            if other is not token:
                self._moved([other], key, out, f"get({key!r}) returned another item")
        token.set(replace(alt, due=(pending.due_ms, pending.due_ms), why=""), note=f"get({key!r})")

    # -- recurring items ----------------------------------------------------------------------------

    def schedule(self, key: str, value: str, every_ms: int, headers: dict[str, str], out: Outcome) -> None:
        """``schedule(key, value, every=)``: replaces the key's schedule (its pending occurrence too)."""
        if out.surely_not:
            return
        old = self.schedules.get(key, [None])
        if out.maybe:
            inc = Incarnation(key, value, every_ms, (out.t0, INF), headers)
            self.incarnations[value] = inc
            self.schedules[key] = [*old, inc]
            return
        due = int(out.result)
        if not out.t0 + every_ms <= due <= out.t1 + every_ms:
            raise Violation(f"schedule({key!r}, every={every_ms} ms) returned {due}, not within "
                            f"[{out.t0 + every_ms}, {out.t1 + every_ms}]: the first one is a period from now")
        inc = Incarnation(key, value, every_ms, (due - every_ms, due - every_ms), headers)
        self.incarnations[value] = inc
        self.schedules[key] = [inc]
        self._drop_keyed(key, out, "a schedule replaced the key's item")

    def offer_on_schedule_key(self, value: str, delay_ms: int, key: str, out: Outcome) -> None:
        """``offer(value, delay, key=k, replace=True)`` where ``k`` is a schedule pool's key: refused
        with ``ScheduledKeyError`` (the result is the error), nothing written, while ``k``'s schedule
        is live; an ordinary keyed offer otherwise."""
        alts = self.schedules.get(key, [None])
        if out.ok and isinstance(out.result, Exception):
            live: list[Incarnation | None] = [i for i in alts if i is not None]
            if not live:
                raise Violation(f"offer(key={key!r}) refused ({out.result!r}), but the key has no schedule")
            self.schedules[key] = live
            return
        if out.ok:
            if None not in alts:
                raise Violation(f"offer(key={key!r}) was added though the key's schedule is live: {alts}")
            self.schedules[key] = [None]
        self._offers([(value, delay_ms, key, {}, None, None)], True, out, [out.result] if out.ok else None)

    def _drop_keyed(self, key: str, out: Outcome, what: str) -> None:
        """A call removed the pending item of ``key``, if any: the plain items that may hold it are
        gone, or were moved before (their due time had come)."""
        for token in self.keyed(key):
            alts: list[State] = []
            for a in token.alts:
                if a.kind == "scheduled" and a.key == key:
                    alts.append(replace(GONE, why=what))
                    if a.due[0] <= out.t1:
                        alts.append(replace(a, kind="ready", key=None, why="moved before"))
                else:
                    alts.append(a)
            token.set(*alts, note=what)

    def unschedule(self, key: str, out: Outcome) -> None:
        """``cancel(key)`` of a schedule's key: the schedule and its pending occurrence go."""
        if out.surely_not:
            return
        old = self.schedules.get(key, [None])
        if out.maybe:
            self.schedules[key] = [*old, None] if None not in old else old
            return
        live = [i for i in old if i is not None]
        if self.keyed(key):  # a plain item under a schedule's key (offer_on_schedule_key)
            if out.result:
                self._drop_keyed(key, out, f"cancel({key!r}) returned True")
            else:
                self._moved(self.keyed(key), key, out, f"cancel({key!r}) returned False")
            self.schedules[key] = [None]
            return
        if out.result and not live:
            raise Violation(f"cancel({key!r}) returned True, but the key has no schedule (nor pending item)")
        if not out.result and None not in old:
            raise Violation(f"cancel({key!r}) returned False, but the key's schedule was live: {live}")
        self.schedules[key] = [None]

    # -- controls, clear, dead letters --------------------------------------------------------------

    def pause(self, paused: bool, out: Outcome) -> None:
        """``pause()`` (``paused=True``) or ``resume()``."""
        if out.ok:
            self.paused = [paused]
        elif out.maybe:
            self.paused = sorted({*self.paused, paused})

    def concurrency_limit(self, limit: int | None, out: Outcome) -> None:
        """``set_concurrency_limit(limit)``."""
        if out.ok:
            self.caps = [limit]
        elif out.maybe:
            self.caps = sorted({*self.caps, limit}, key=lambda cap: -1 if cap is None else cap)

    def clear(self, out: Outcome) -> None:
        """``clear()``: every pending item and every schedule goes; ready, in-flight and dead stay."""
        if out.surely_not:
            return
        for token in self._all_tokens():
            alts: list[State] = []
            for a in token.alts:
                if a.kind != "scheduled":
                    alts.append(a)
                    continue
                if out.maybe:
                    alts += [a, replace(GONE, why="clear maybe applied")]
                    continue
                alts.append(replace(GONE, why="cleared"))
                if a.due[0] <= out.t1:  # its due time may have come: moved to the ready list before
                    alts.append(replace(a, kind="ready", key=None, why="moved before the clear"))
            if alts != token.alts:
                token.set(*alts, note="clear")
        for key, alts_ in self.schedules.items():
            self.schedules[key] = [*alts_, None] if out.maybe and None not in alts_ else [None] if out.ok else alts_

    def requeue(self, limit: int | None, delay_ms: int, out: Outcome) -> None:
        """``requeue_dead_letters(limit, delay)``: the oldest dead letters become pending, unkeyed,
        without their expiry."""
        if out.surely_not:
            return
        dead = [t for t in self.dead_order if t.certain and t.alts[0].kind == "dead"]
        n = len(dead) if limit is None else min(limit, len(dead))
        due: Span = (out.t0 + delay_ms, out.t1 + delay_ms if out.ok else INF)
        if out.ok and out.result != n:
            raise Violation(f"requeue_dead_letters({limit}) returned {out.result}, the list held {len(dead)}")
        for token in dead[:n]:
            back = State("scheduled", due, landed=out.t1 if out.ok else INF,
                         why="" if out.ok else "requeue maybe applied")
            token.set(back, *token.alts, note="requeue raised") if out.maybe else token.set(back, note="requeued")
            if token.schedule_key is not None:
                self.incarnations[token.value].requeued += 1

    def purge(self, out: Outcome) -> None:
        """``purge_dead_letters()``."""
        if out.surely_not:
            return
        dead = [t for t in self.dead_order if t.certain and t.alts[0].kind == "dead"]
        if out.ok and out.result != len(dead):
            raise Violation(f"purge_dead_letters() returned {out.result}, the list held {len(dead)}")
        for token in dead:
            token.set(*([*token.alts, GONE] if out.maybe else [GONE]), note="purged")

    # -- consuming ----------------------------------------------------------------------------------

    def take(self, deliveries: list[Delivery], out: Outcome) -> None:
        """``take_many_with_headers(n, timeout)``: each item handed out once, when due, unexpired."""
        if deliveries and self.paused == [True]:
            raise Violation(f"take() handed out {[d.value for d in deliveries]} while the queue was paused")
        for d in deliveries:
            inc = self.incarnations.get(d.value)
            if inc is not None:
                self._first_occurrence_delivery(inc, d, out)
                self.taken_occurrences[d.value] += 1
                continue
            token = self._handed_out(d, out, "take()")
            token.set(State("gone", taken=True), note=f"taken by client {d.client}")

    def receive(self, deliveries: list[Delivery], vt_ms: int, out: Outcome) -> None:
        """``receive_many(n, visibility_timeout, timeout)``: first deliveries as for take; a
        redelivery only after the previous deadline, with the count one higher."""
        if out.faulty or out.error is not None:
            self.unseen_possible = True
        if deliveries and self.paused == [True]:
            raise Violation(f"receive() handed out {[d.value for d in deliveries]} while the queue was paused")
        for d in deliveries:
            assert d.deadline_ms is not None
            if not out.t0 + vt_ms <= d.deadline_ms <= out.t1 + vt_ms:
                raise Violation(f"message {d.value!r} has deadline {d.deadline_ms}, not within "
                                f"[{out.t0 + vt_ms}, {out.t1 + vt_ms}] (visibility timeout {vt_ms} ms)")
            if d.count == 1:
                if d.due_ms is not None:
                    raise Violation(f"first delivery of {d.value!r} has due_ms {d.due_ms} (None expected)")
                if d.schedule_key is not None:
                    inc = self.incarnations.get(d.value)
                    if inc is None or inc.key != d.schedule_key:
                        raise Violation(f"an occurrence of unknown schedule {d.schedule_key!r}: {d.value!r}")
                    self._first_occurrence_delivery(inc, d, out)
                    assert d.occurrence is not None
                    token = self.occurrences.get((d.schedule_key, d.occurrence))
                    if token is None:
                        token = Token(d.value, d.headers, [], d.schedule_key, d.occurrence)
                        self.occurrences[(d.schedule_key, d.occurrence)] = token
                    elif not any(a.kind in ("ready", "scheduled") for a in token.alts):
                        raise Violation(f"{token.name} received as a first delivery, but it was {token.describe()}")
                else:
                    token = self._handed_out(d, out, "receive()")
                    offered = {a.expires for a in token.alts if a.kind in ("scheduled", "ready")}
                    if not any(expiry_fits(e, d.expires_at_ms) for e in offered):
                        raise Violation(f"{token.name} received with expires_at_ms {d.expires_at_ms}, the model "
                                        f"has {offered}")
                expires = None if d.expires_at_ms is None else (d.expires_at_ms, d.expires_at_ms)
                assert d.message_id is not None
                self.messages[d.message_id] = token
                token.set(State("in_flight", message_id=d.message_id, count=1, deadline=(d.deadline_ms,) * 2,
                                expires=expires), note=f"received by client {d.client}")
                continue
            token = self._message_token(d)
            prev = [a for a in token.alts if a.kind == "in_flight" and a.message_id == d.message_id]
            if not prev:
                raise Violation(f"redelivery {d.count} of {token.name}, which was not in flight: {token.describe()}")
            alt = prev[0]
            if alt.deadline[0] > out.t1:
                raise Violation(f"{token.name} redelivered (count {d.count}) at {out.t1} at the latest, before its "
                                f"deadline {span_text(alt.deadline)}")
            if d.count != alt.count + 1 and not (self.unseen_possible and d.count > alt.count + 1):
                raise Violation(f"{token.name} redelivered with count {d.count} after count {alt.count}")
            if d.count == alt.count + 1 and d.due_ms is not None and not alt.deadline[0] <= d.due_ms <= alt.deadline[1]:
                raise Violation(f"{token.name} redelivered with due_ms {d.due_ms}, its deadline was "
                                f"{span_text(alt.deadline)}")
            if alt.expires is not None and alt.expires[1] <= out.t0:
                raise Violation(f"{token.name} redelivered though it had expired at {span_text(alt.expires)}")
            token.set(replace(alt, count=d.count, deadline=(d.deadline_ms,) * 2, behind=None, released=False, why=""),
                      note=f"redelivered to client {d.client}")

    def _first_occurrence_delivery(self, inc: Incarnation, d: Delivery, out: Outcome) -> None:
        if d.headers != inc.headers:
            raise Violation(f"occurrence of {inc.key!r} delivered with headers {d.headers}, scheduled with "
                            f"{inc.headers}")
        inc.first_deliveries += 1
        allowed = inc.due_by(out.t1) + inc.requeued
        if inc.first_deliveries > allowed:
            raise Violation(f"schedule {inc.key!r} (every {inc.every_ms} ms from {span_text(inc.anchor)}): "
                            f"{inc.first_deliveries} occurrences handed out by {out.t1}, at most {allowed} "
                            "can have fallen due (early, or one handed out twice)")

    def _handed_out(self, d: Delivery, out: Outcome, call: str) -> Token:
        """The token of a plain item a consumer was handed for the first time (checked)."""
        token = self.items.get(d.value)
        if token is None:
            raise Violation(f"{call} handed out {d.value!r}, which was never offered")
        fits = [a for a in token.alts if a.kind in ("scheduled", "ready")]
        if not fits:
            raise Violation(f"{call} handed out {token.name} again (or after it was cancelled): {token.describe()}")
        if all(a.due[0] > out.t1 for a in fits):
            raise Violation(f"{call} handed out {token.name} at {out.t1} at the latest, before it was due: "
                            f"{token.describe()}")
        if all(a.expires is not None and a.expires[1] <= out.t0 for a in fits):
            raise Violation(f"{call} handed out {token.name} at {out.t0} at the earliest, after it expired: "
                            f"{token.describe()}")
        if d.headers != token.headers:
            raise Violation(f"{call} handed out {token.name} with headers {d.headers}, offered with {token.headers}")
        if d.message_id is not None and d.group != token.group:
            raise Violation(f"{call} handed out {token.name} in group {d.group!r}, offered in {token.group!r}")
        return token

    def _message_token(self, d: Delivery) -> Token:
        if d.schedule_key is not None:
            assert d.occurrence is not None
            token = self.occurrences.get((d.schedule_key, d.occurrence))
        else:
            token = self.items.get(d.value)
        if token is None:
            raise Violation(f"a redelivery (count {d.count}) of {d.value!r}, never delivered before")
        return token

    def _held(self, what: str, message_id: str, count: int, out: Outcome) -> tuple[Token, State | None]:
        """The token of a message and its alternative in flight as delivery ``count``, if any (``None``
        too when the call surely did not run). A call that answered must say whether it was."""
        token = self._by_message(message_id)
        current = [a for a in token.alts if a.kind == "in_flight" and a.message_id == message_id and a.count == count
                   and not a.released]
        if out.surely_not:
            return token, None
        others = [a for a in token.alts if a not in current]
        if out.ok and not (current if out.result else others):
            raise Violation(f"{what} of delivery {count} of {token.name} returned {out.result}, but it was "
                            f"{'' if current else 'not '}in flight as that delivery: {token.describe()}")
        if out.ok and not out.result:
            if current:  # the answer rules out the alternatives in which it held the message
                token.set(*others, note=f"{what} said it was not in flight")
            return token, None
        return token, (current[0] if current else None)

    def settle(self, message_id: str, count: int, mode: str, delay_ms: int, client: int, unconfirmed: int,
               out: Outcome, written_behind: bool = False) -> None:
        """``msg.ack()``, ``msg.nack(delay)``, ``msg.nack(dead_letter=True)`` (``mode``: ack, nack,
        dead): ``True`` exactly when this delivery was still in flight."""
        token, alt = self._held(mode, message_id, count, out)
        if alt is None:
            return
        if mode == "ack":
            after = [State("gone")]
            if written_behind:
                after.append(replace(alt, behind=(client, unconfirmed), why="ack written behind, maybe not landed"))
        elif mode == "dead":
            after = [State("dead", count=count, reason="nacked")]
        elif self.max_deliveries is not None and count >= self.max_deliveries:
            after = [State("dead", count=count, reason="max_deliveries")]
        else:
            late = out.t1 + delay_ms if out.ok else INF
            after = [replace(alt, deadline=(out.t0 + delay_ms, late), behind=None, why="")]
        if out.maybe:
            after = [*token.alts, *[replace(a, why=f"{mode} maybe applied") for a in after]]
        token.set(*after, note=f"{mode} by client {client}")

    def extend(self, message_id: str, count: int, vt_ms: int, out: Outcome, deadline_ms: int) -> None:
        """``msg.extend(visibility_timeout)``: ``True`` exactly when this delivery is in flight."""
        token, alt = self._held("extend", message_id, count, out)
        if alt is None:
            return
        if out.ok:
            if not out.t0 + vt_ms <= deadline_ms <= out.t1 + vt_ms:
                raise Violation(f"extend({vt_ms} ms) of {token.name} set deadline {deadline_ms}, not within "
                                f"[{out.t0 + vt_ms}, {out.t1 + vt_ms}]")
            token.set(replace(alt, deadline=(deadline_ms, deadline_ms)), note="extended")
        else:
            token.set(*token.alts, replace(alt, deadline=(out.t0 + vt_ms, INF), why="extend maybe applied"),
                      note="extend raised")

    def _by_message(self, message_id: str) -> Token:
        try:
            return self.messages[message_id]
        except KeyError:
            raise Violation(f"no token for message {message_id}") from None

    def _all_tokens(self) -> Iterable[Token]:
        return itertools.chain(self.items.values(), self.occurrences.values())
