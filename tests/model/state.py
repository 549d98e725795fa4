"""The model's vocabulary: a call's :class:`Outcome`, where an item may be (:class:`State`), an item
and its alternatives (:class:`Token`), a schedule (:class:`Incarnation`), what a consumer was handed
(:class:`Delivery`), and :class:`Violation`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["GONE", "INF", "Delivery", "Incarnation", "Kind", "Outcome", "Span", "State", "Token", "Violation",
           "Window", "expiry_fits", "span_text"]

INF = 2**62

Kind = Literal["scheduled", "ready", "in_flight", "dead", "gone"]
Span = tuple[int, int]


class Violation(AssertionError):
    """The queue did something the docs do not allow."""


@dataclass(frozen=True)
class Outcome:
    """What a call did: its result or error, and the server's clock just before and after it."""

    result: Any
    error: BaseException | None
    t0: int
    t1: int
    faulty: bool = False  # a fault was armed or running during the call, or the library logged a failure

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def maybe(self) -> bool:
        """The call failed and may have been applied (``BackendError.maybe_applied``)."""
        return self.error is not None and bool(getattr(self.error, "maybe_applied", False))

    @property
    def surely_not(self) -> bool:
        """The call failed and was certainly not applied."""
        return self.error is not None and not self.maybe


@dataclass(frozen=True)
class Window:
    """A key's open deduplication window: when it ends, and the due time of the item that took the
    key (the bounds of each). A key's alternatives are windows, or ``None``: no open window."""

    end: Span
    due: Span

    def describe(self) -> str:
        return f"window until {span_text(self.end)} (due {span_text(self.due)})"


@dataclass(frozen=True)
class State:
    """One place an item may be (a token holds one, or several while uncertain)."""

    kind: Kind
    due: Span = (0, 0)  # scheduled, ready: the due time's bounds
    key: str | None = None  # scheduled: pending under this key
    expires: Span | None = None  # scheduled, ready, in_flight: the expiry's bounds (None: none)
    message_id: str | None = None  # in_flight
    count: int = 0  # in_flight, dead: the delivery count
    deadline: Span = (0, 0)  # in_flight: the visibility deadline's bounds
    reason: str | None = None  # dead
    life: int | None = None  # scheduled: the offer's expires (ms): its expiry is at least this long after its due time
    landed: int = 0  # scheduled, ready: written (offered, rescheduled, requeued) at this server time at the latest
    behind: tuple[int, int] | None = None  # in_flight kept for an ack written behind: (client, unconfirmed before)
    released: bool = False  # in_flight: past its deadline, redelivered and given back (a prefetch nobody
    # came for, a receive undone): the message is as it was, but its holder's element is not, so the
    # holder's ack, nack and extend say False
    taken: bool = False  # gone: handed to a take() caller
    why: str = ""  # for an alternative: the uncertainty it stands for

    def describe(self) -> str:
        out: list[str] = [self.kind]
        if self.kind in ("scheduled", "ready"):
            out.append(f"due {span_text(self.due)}")
            if self.key is not None:
                out.append(f"key {self.key!r}")
        if self.kind == "in_flight":
            out.append(f"msg {self.message_id} count {self.count} deadline {span_text(self.deadline)}")
        if self.kind == "dead":
            out.append(f"{self.reason} count {self.count}")
        if self.expires is not None:
            out.append(f"expires {span_text(self.expires)}")
        if self.why:
            out.append(f"({self.why})")
        return " ".join(out)


def span_text(span: Span) -> str:
    """A span for a message: one number when exact, ``[lo, hi]`` otherwise."""
    lo, hi = span
    return str(lo) if lo == hi else f"[{lo}, {'inf' if hi >= INF else hi}]"


GONE = State("gone")


@dataclass
class Token:
    """An item (or a seen occurrence of a recurring item) and where it may be."""

    value: str
    headers: dict[str, str]
    alts: list[State]
    schedule_key: str | None = None
    occurrence: int | None = None
    batch: int | None = None  # tokens of one call that was all or nothing
    group: str | None = None  # the group it was offered in
    history: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.schedule_key is None:
            return repr(self.value)
        return f"occurrence {self.occurrence} of {self.schedule_key!r} ({self.value!r})"

    @property
    def certain(self) -> bool:
        return len(self.alts) == 1

    def set(self, *alts: State, note: str) -> None:
        unique: list[State] = []
        for alt in alts:
            if alt not in unique:
                unique.append(alt)
        self.alts = unique
        self.history.append(f"{note}: {' | '.join(a.describe() for a in unique)}")

    def describe(self) -> str:
        return f"{self.name}: {' | '.join(a.describe() for a in self.alts)}; history: {self.history[-6:]}"


@dataclass
class Incarnation:
    """One ``schedule()`` call's schedule: its item, period and grid (due at anchor + k * every)."""

    key: str
    value: str
    every_ms: int
    anchor: Span
    headers: dict[str, str]
    first_deliveries: int = 0  # occurrences handed to callers for the first time
    requeued: int = 0  # occurrences requeued from the dead-letter list (each may come once more)

    def due_by(self, t: int) -> int:
        """How many occurrences can have fallen due by ``t`` (server ms) at most."""
        first = self.anchor[0] + self.every_ms
        return 0 if t < first else (t - self.anchor[0]) // self.every_ms


@dataclass(frozen=True)
class Delivery:
    """One item or message a consumer call returned."""

    client: int
    value: str
    headers: dict[str, str]
    message_id: str | None = None
    count: int = 1
    due_ms: int | None = None
    deadline_ms: int | None = None
    expires_at_ms: int | None = None
    schedule_key: str | None = None
    occurrence: int | None = None
    group: str | None = None


def expiry_fits(expected: Span | None, seen: int | None) -> bool:
    """Whether an expiry ``seen`` (epoch ms, ``None``: none) is within ``expected``'s bounds."""
    if expected is None or seen is None:
        return expected is None and seen is None
    return expected[0] <= seen <= expected[1]
