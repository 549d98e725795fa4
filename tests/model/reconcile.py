"""The check after every step: the queue's contents (a :class:`~tests.model.observe.Snapshot`)
matched with the model, token by token (:class:`Reconciling`, a part of
:class:`~tests.model.model.Model`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

from .observe import Seen, Snapshot
from .state import Incarnation, Span, State, Token, Violation, Window, expiry_fits

__all__ = ["Reconciling"]


def _seen_expiry(s: Seen) -> Span | None:
    return None if s.expires_at_ms is None else (s.expires_at_ms, s.expires_at_ms)


class Reconciling:
    """The model's check: :meth:`reconcile` keeps, for each token, the alternative the server shows."""

    max_deliveries: int | None
    items: dict[str, Token]
    occurrences: dict[tuple[str, int], Token]
    incarnations: dict[str, Incarnation]
    schedules: dict[str, list[Incarnation | None]]
    paused: list[bool]
    caps: list[int | None]
    windows: dict[str, list[Window | None]]
    dead_order: list[Token]
    messages: dict[str, Token]
    unseen_possible: bool
    taken_occurrences: Counter[str]
    _current_pending: int
    _in_handoff: int

    def _all_tokens(self) -> Iterable[Token]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def reconcile(self, snap: Snapshot, unconfirmed: Callable[[int], int], faulted: bool) -> None:
        """Match every element of ``snap`` with the model: each token found exactly once, where one of
        its alternatives allows (which then becomes its state), every element explained. Raises
        :class:`Violation` listing every mismatch, with the snapshot and the model."""
        problems: list[str] = []
        now = snap.now_ms
        self._current_pending = self._in_handoff = 0
        plain: dict[str, list[Seen]] = defaultdict(list)
        occs: dict[tuple[str, int], list[Seen]] = defaultdict(list)
        for s in snap.seen:
            if s.schedule_key is None:
                plain[s.value].append(s)
            else:
                occs[(s.schedule_key, s.occurrence)].append(s)
        for value, token in self.items.items():
            self._settle(token, plain.pop(value, []), now, unconfirmed, faulted, problems)
        for value, seen in plain.items():
            problems.append(f"{value!r} is in the queue but the model has no such item: {[s.describe() for s in seen]}")
        self._reconcile_schedules(snap, occs, problems)
        for ident, token in self.occurrences.items():
            seen = occs.pop(ident, [])
            # A take names no occurrence: one of this value's takes since the last reconcile explains an
            # occurrence that was ready, or pending and due by now (it fell due and went between two checks).
            if (not seen and self.taken_occurrences[token.value] > 0
                    and any(a.kind == "ready" or (a.kind == "scheduled" and a.due[0] <= now) for a in token.alts)):
                self.taken_occurrences[token.value] -= 1
                token.set(State("gone", taken=True), note="taken (ready or due before)")
                continue
            self._settle(token, seen, now, unconfirmed, faulted, problems)
        self.taken_occurrences.clear()
        for (key, number), seen in occs.items():
            if seen:
                self._new_occurrence(key, number, seen, snap, problems)
        self._check_batches(problems)
        self._check_due_order(snap, problems)
        if snap.stale_index:
            problems.append(f"the key index names keys whose element is not pending: {snap.stale_index}")
        if snap.delay_list:
            problems.append(f"Redisson's delay list holds {snap.delay_list} elements (only fast elements written)")
        if snap.paused not in self.paused:
            problems.append(f"paused is {snap.paused}, the model allows {self.paused}")
        self.paused = [snap.paused]
        if snap.cap not in self.caps:
            problems.append(f"the concurrency limit is {snap.cap}, the model allows {self.caps}")
        self.caps = [snap.cap]
        self._reconcile_windows(snap, problems)
        self.dead_order = self._dead_order(snap)
        if problems:
            raise Violation("\n".join(["the queue differs from the model:", *problems, "--- the queue:",
                                       snap.describe(), "--- the model:", self.describe()]))
        self.unseen_possible = False

    def _reconcile_windows(self, snap: Snapshot, problems: list[str]) -> None:
        """Keep each key's window alternatives that the stored windows fit: an open one (its end and
        due time within the alternative's bounds), or none open (no alternative window, or one that
        may have ended by now)."""
        now, stored = snap.now_ms, snap.open_windows()
        for key in sorted(set(self.windows) | set(stored)):
            alts = self.windows.get(key, [None])
            if key in stored:
                end, due = stored[key]
                if not any(w is not None and w.end[0] <= end <= w.end[1] and w.due[0] <= due <= w.due[1]
                           for w in alts):
                    problems.append(f"key {key!r} has a window until {end} (due {due}); the model allows {alts}")
                    continue
                self.windows[key] = [Window((end, end), (due, due))]
            elif not any(w is None or w.end[0] <= now for w in alts):
                problems.append(f"key {key!r} has no open window; the model's is open: {alts}")
            else:
                self.windows[key] = [None]

    def _settle(self, token: Token, seen: list[Seen], now: int, unconfirmed: Callable[[int], int], faulted: bool,
                problems: list[str]) -> None:
        """Keep the alternatives of ``token`` that ``seen`` (its elements in the snapshot) fit."""
        if any(a.kind == "gone" and a.taken for a in token.alts):
            lingering = [s for s in seen if s.where == "handoff"]  # a delivered pop not forgotten yet
            if lingering and faulted:
                seen = [s for s in seen if s.where != "handoff"]
        fitting: list[State] = []
        for alt in token.alts:
            fit = self._fit(token, alt, seen, now, unconfirmed, faulted)
            if fit is not None:
                fitting.append(fit)
        if not fitting:
            where = ", ".join(s.describe() for s in seen) or "nowhere"
            problems.append(f"{token.name} is {where}; the model allows: {token.describe()}")
            return
        if fitting[0].kind == "ready" and seen and seen[0].where == "handoff":
            self._in_handoff += 1
        if fitting[0].message_id is not None:
            self.messages[fitting[0].message_id] = token
        # The first fit, and one that differs in what the server cannot show: whether the holder's
        # element was released (its ack, nack and extend then say False).
        kept = [fitting[0], *[f for f in fitting[1:] if f.released != fitting[0].released][:1]]
        if kept != token.alts:
            token.set(*kept, note=f"seen {', '.join(s.where for s in seen) or 'nowhere'}")

    def _fit(self, token: Token, alt: State, seen: list[Seen], now: int, unconfirmed: Callable[[int], int],
             faulted: bool) -> State | None:
        """``alt`` as ``seen`` shows it (its new state), or ``None`` if ``seen`` does not fit it."""
        if alt.kind == "gone":
            return alt if not seen else None
        if len(seen) != 1:
            return None
        s = seen[0]
        if s.headers != token.headers or s.group != token.group:
            return None
        if alt.kind in ("scheduled", "ready"):
            if s.where == "pending":
                if alt.kind == "ready" or not alt.due[0] <= (s.score or 0) <= alt.due[1] or s.key != alt.key:
                    return None
                if not expiry_fits(alt.expires, s.expires_at_ms):
                    return None
                assert s.score is not None
                if alt.life is not None and s.expires_at_ms is not None and s.expires_at_ms < s.score + alt.life:
                    return None  # it would expire less than `expires` after its due time
                return replace(alt, due=(s.score, s.score), expires=_seen_expiry(s), why="")
            if s.where in ("ready", "handoff"):
                if alt.due[0] > now:  # moved before its due time
                    return None
                if s.where == "handoff" and not faulted:
                    return None  # a pop's items are handed out or given back within a round trip
                if not expiry_fits(alt.expires, s.expires_at_ms):
                    return None
                return replace(alt, kind="ready", key=None, expires=_seen_expiry(s), why="")
            if s.where == "dead" and s.reason == "expired":
                if alt.expires is None or alt.expires[0] > now or alt.due[0] > now:
                    return None
                if alt.life is not None and alt.due[0] + alt.life > now:
                    return None  # expired less than `expires` after its due time
                return State("dead", count=s.delivery_count or 0, reason="expired")
            if s.where == "in_flight" and self.unseen_possible and alt.due[0] <= now:
                # Received by a call whose reply never reached its caller, not released since.
                return State("in_flight", message_id=s.message_id, count=s.delivery_count or 0,
                             deadline=(s.score or 0, s.score or 0), expires=alt.expires, why="unseen delivery")
            return None
        if alt.kind == "in_flight":
            if alt.behind is not None and unconfirmed(alt.behind[0]) <= alt.behind[1]:
                return None  # an ack written behind lands, or the library reports it as not confirmed
            if s.where == "in_flight" and s.message_id == alt.message_id:
                if s.delivery_count == alt.count and alt.deadline[0] <= (s.score or 0) <= alt.deadline[1]:
                    return replace(alt, deadline=(s.score or 0,) * 2, why="")
                passed = alt.deadline[0] <= now
                if passed and s.delivery_count == alt.count and (s.score or 0) <= now:
                    # redelivered into a prefetch nobody came for or to a receive undone, then given
                    # back (count lowered, visible now)
                    return replace(alt, deadline=(s.score or 0,) * 2, released=True, why="")
                if passed and self.unseen_possible and (s.delivery_count or 0) > alt.count:
                    return replace(alt, count=s.delivery_count or 0, deadline=(s.score or 0,) * 2,
                                   why="unseen redelivery")
                return None
            if s.where == "dead" and alt.deadline[0] <= now:
                count = s.delivery_count or 0
                counted = count == alt.count or (self.unseen_possible and count > alt.count)
                if s.reason == "max_deliveries" and self.max_deliveries is not None and counted \
                        and count >= self.max_deliveries:
                    return State("dead", count=count, reason="max_deliveries")
                if s.reason == "expired" and alt.expires is not None and alt.expires[0] <= now and counted:
                    return State("dead", count=count, reason="expired")
            return None
        if alt.kind == "dead":
            if s.where == "dead" and s.reason == alt.reason and s.delivery_count == alt.count:
                return alt
            return None
        raise AssertionError(alt)

    def _check_due_order(self, snap: Snapshot, problems: list[str]) -> None:
        """The ready list is in due order (the transfer moves what is due in score order, and appends
        it), among the items whose due time the model knows: an item due earlier behind one due later
        only if its offer may have reached Redis after that one was moved (an offer held past its own
        due time is moved at once, behind what was moved before it arrived)."""
        seen: dict[str | None, list[State]] = defaultdict(list)  # per list: the destination, each group's
        for s in snap.at("ready"):
            token = self.items.get(s.value) if s.schedule_key is None else None
            if token is None or not token.certain or token.alts[0].due[0] != token.alts[0].due[1]:
                continue
            later = token.alts[0]
            for earlier in seen[s.group]:
                if later.due[0] < earlier.due[0] and later.landed < earlier.due[0]:
                    problems.append(f"the ready list is not in due order: {s.value!r} (due {later.due[0]}, offered "
                                    f"by {later.landed}) behind an item due {earlier.due[0]}")
            seen[s.group].append(later)

    def _check_batches(self, problems: list[str]) -> None:
        batches: dict[int, list[Token]] = defaultdict(list)
        for token in self.items.values():
            if token.batch is not None and token.certain:
                batches[token.batch].append(token)
        for tokens in batches.values():
            outcomes = {"gone" if t.alts[0].kind == "gone" and not t.alts[0].taken else "landed" for t in tokens}
            if len(outcomes) > 1:
                problems.append(f"offer_many applied in part: {[t.describe() for t in tokens]}")
            for t in tokens:
                t.batch = None

    def _reconcile_schedules(self, snap: Snapshot, occs: dict[tuple[str, int], list[Seen]],
                             problems: list[str]) -> None:
        """Each live schedule: its record, and exactly one current occurrence, pending (under its key,
        on its grid) or ready."""
        for key in sorted(set(self.schedules) | set(snap.records)):
            alts = self.schedules.get(key, [None])
            record = snap.records.get(key)
            if record is None:
                if None not in alts:
                    problems.append(f"schedule {key!r} has no record; the model has {alts}")
                self.schedules[key] = [None]
                continue
            current = [s for s in occs.get((key, record.occurrence), []) if s.where in ("pending", "ready", "handoff")]
            if len(current) != 1:
                problems.append(f"schedule {key!r} (record {record}) has {len(current)} current occurrences pending or "
                                f"ready, not one: {[s.describe() for s in current]}")
                fitting = [i for i in alts if i is not None]
            else:
                fitting = [i for i in alts if i is not None and i.value == current[0].value
                           and i.every_ms == record.every_ms and i.anchor[0] <= record.anchor_ms <= i.anchor[1]]
                s = current[0]
                if s.where == "pending":
                    assert s.score is not None
                    if s.key != key:
                        problems.append(f"the pending occurrence of {key!r} is indexed under {s.key!r}")
                    if (s.score - record.anchor_ms) % record.every_ms or s.score <= record.anchor_ms:
                        problems.append(f"the pending occurrence of {key!r} is due {s.score}, off its grid "
                                        f"({record.anchor_ms} + k * {record.every_ms})")
            if not fitting:
                problems.append(f"schedule {key!r}: record {record} fits none of the model's {alts}")
                continue
            inc = fitting[0]
            inc.anchor = (record.anchor_ms, record.anchor_ms)
            self.schedules[key] = [inc]
            for s in current:  # the current occurrence is the schedule's, not a token of its own
                if s.where == "pending":
                    occs[(key, record.occurrence)].remove(s)
                    self._current_pending += 1

    def _new_occurrence(self, key: str, number: int, seen: list[Seen], snap: Snapshot, problems: list[str]) -> None:
        """An occurrence seen for the first time outside the pending zset: it becomes a token (it must
        then be delivered once, or stay)."""
        if len(seen) != 1:
            problems.append(f"occurrence {number} of {key!r} is in {len(seen)} places: {[s.describe() for s in seen]}")
            return
        s = seen[0]
        inc = self.incarnations.get(s.value)
        if inc is None or inc.key != key or s.headers != inc.headers:
            problems.append(f"an occurrence no schedule made: {s.describe()}")
            return
        token = Token(s.value, s.headers, [], key, number)
        if s.where == "handoff":
            self._in_handoff += 1
        if s.where in ("ready", "handoff"):  # due by now, at the latest
            token.set(State("ready", due=(snap.now_ms, snap.now_ms)), note=f"seen {s.where}")
        elif s.where == "in_flight" and self.unseen_possible:
            token.set(State("in_flight", message_id=s.message_id, count=s.delivery_count or 0,
                            deadline=(s.score or 0,) * 2, why="unseen delivery"), note="seen in flight")
            self.messages[s.message_id or ""] = token
        else:
            problems.append(f"an occurrence where none can be: {s.describe()} (record {snap.records.get(key)})")
            return
        self.occurrences[(key, number)] = token

    def _dead_order(self, snap: Snapshot) -> list[Token]:
        order = []
        for s in snap.at("dead"):
            if s.schedule_key is None:
                token = self.items.get(s.value)
            else:
                token = self.occurrences.get((s.schedule_key, s.occurrence))
            if token is not None:
                order.append(token)
        return order

    # -- what is left -----------------------------------------------------------------------------

    def undelivered_names(self) -> set[str]:
        """The items pending or ready (to be handed out by a take or a receive)."""
        return {t.name for t in self._all_tokens() if t.alts[0].kind in ("scheduled", "ready")}

    def unfinished(self) -> dict[str, int]:
        """Every item still to be handed out (by its due time) or settled (by its deadline)."""
        out = {}
        for token in self._all_tokens():
            state = token.alts[0]
            if state.kind in ("scheduled", "ready"):
                out[token.name] = state.due[0]
            elif state.kind == "in_flight":
                out[token.name] = state.deadline[0]
        return out

    def holds(self, message_id: str, count: int) -> bool:
        """Whether delivery ``count`` of message ``message_id`` is in flight."""
        token = self.messages.get(message_id)
        return token is not None and any(a.kind == "in_flight" and a.message_id == message_id and a.count == count
                                         and not a.released for a in token.alts)

    @property
    def in_handoff(self) -> bool:
        """The last check found popped items in the hand-off (given back at the end of its lease)."""
        return self._in_handoff > 0

    # -- counts --------------------------------------------------------------------------------------

    def expected_counts(self, snap: Snapshot) -> dict[str, int]:
        """What ``counts()`` must say, from the model once reconciled with ``snap`` (whose split of
        pending and ready, and hand-off, only the server's clock decides)."""
        kinds: Counter[str] = Counter()
        for token in self._all_tokens():
            kinds[token.alts[0].kind] += 1
        live = sum(1 for alts in self.schedules.values() if alts != [None])
        return {"pending+ready": kinds["scheduled"] + kinds["ready"] + self._current_pending - self._in_handoff,
                "in_flight": kinds["in_flight"], "dead_letters": kinds["dead"], "recurring": live}
