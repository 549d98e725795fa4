"""The roles a :class:`~aiodelayq.DelayedQueue` delegates to, one protocol each. An ordinary queue
fills them with one queue's parts (``queue_parts.py``), a sharded one with composites over its
shards' (``_sharding/sharded.py``); the facade names only these types.

===============  =======================================  =========================
role             ordinary queue                           sharded queue
===============  =======================================  =========================
Producing        _producing/producer.py Producer          _sharding/offers.py
Contents         _contents/contents.py QueueContents      _sharding/contents.py
KeyedCalls       _producing/keyed.py KeyedItems           _sharding/keyed.py
Recurring        _recurring/schedules.py Schedules        _sharding/keyed.py
DeadLetterCalls  _contents/dead_letters.py DeadLetters    _sharding/dead_letters.py
ControlCalls     _consuming/controls.py Controls          _sharding/controls.py
EventCalls       _contents/event_stream.py EventStream    _sharding/event_stream.py
Life             _runtime/lifecycle.py Lifecycle          _sharding/lifecycle.py
Taker            _consuming/take.py TakePump              _sharding/take.py
Receiver         _consuming/reliable.py ReliableConsumer  _sharding/receive.py
===============  =======================================  =========================
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from .._consuming.reliable import Receiver
from .._contents.contents import PendingItem
from .._contents.counts import QueueCounts
from .._contents.dead_letters import DeadLetter
from .._contents.event_stream import QueueEvent
from .._producing.keyed import Pending
from .._runtime.lifecycle import QueueStats, State
from .._wire.key_names import QueueKeys

__all__ = ["ControlCalls", "Contents", "DeadLetterCalls", "EventCalls", "KeyedCalls", "Life", "Parts", "Producing",
           "Recurring", "Taker"]


class Producing(Protocol):
    """Writes items: ``offer`` and ``offer_many`` (their arguments as the facade's, checked here)."""

    async def offer(self, item: Any, delay: float | timedelta, key: str | None = None, replace: bool = False,
                    headers: Mapping[str, str] | None = None, expires: float | timedelta | None = None,
                    group: str | None = None, dedupe_for: float | timedelta | None = None,
                    dedupe_by_content: bool = False) -> int: ...

    async def offer_many(self, pairs: Sequence[tuple[Any, float | timedelta]],
                         keys: Sequence[str | None] | None = None, replace: bool = False,
                         headers: Sequence[Mapping[str, str] | None] | None = None,
                         expires: float | timedelta | Sequence[float | timedelta | None] | None = None,
                         groups: Sequence[str | None] | None = None, dedupe_for: float | timedelta | None = None,
                         dedupe_by_content: bool = False) -> list[int]: ...


class Contents(Protocol):
    """Reads and edits what the queue holds, pending and ready."""

    async def size(self) -> int: ...
    async def ready_size(self) -> int: ...
    async def counts(self) -> QueueCounts: ...
    async def peek(self, limit: int) -> list[PendingItem[Any]]: ...
    async def contains(self, item: Any) -> bool: ...
    async def read_all(self) -> list[Any]: ...
    async def remove(self, items: Iterable[Any], *, first_only: bool) -> int: ...
    async def clear(self) -> None: ...


class KeyedCalls(Protocol):
    """The calls on an item by its key."""

    async def cancel(self, key: str) -> bool: ...
    async def reschedule(self, key: str, delay: float | timedelta) -> int | None: ...
    async def get(self, key: str) -> Pending[Any] | None: ...


class Recurring(Protocol):
    """Starts or replaces a recurring item (``cancel`` of its key ends it: :class:`KeyedCalls`)."""

    async def schedule(self, key: str, item: Any, *, every: float | timedelta | None, cron: str | None,
                       tz: str | None, headers: Mapping[str, str] | None) -> int: ...


class DeadLetterCalls(Protocol):
    """Reads, requeues and purges the dead-letter list."""

    async def read(self, limit: int | None) -> list[DeadLetter[Any]]: ...
    async def requeue(self, limit: int | None, delay: float | timedelta) -> int: ...
    async def purge(self) -> int: ...


class ControlCalls(Protocol):
    """Pause, resume, the rate limit, the concurrency limit and the group limit of the queue's consumers."""

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def is_paused(self) -> bool: ...
    async def set_rate_limit(self, per_second: float | None, burst: int | None = None) -> None: ...
    async def set_concurrency_limit(self, limit: int | None) -> None: ...
    async def set_group_concurrency(self, limit: int) -> None: ...


class EventCalls(Protocol):
    """The queue's event stream: turned on or off, read."""

    async def set_maxlen(self, maxlen: int | None) -> None: ...
    async def last(self, n: int) -> list[QueueEvent]: ...
    def read(self, start: str, follow: bool, closed: Callable[[], bool]) -> AsyncIterator[QueueEvent]: ...


class Taker(Protocol):
    """Serves ``take``/``poll``: waits for due items and pops them."""

    async def get(self, timeout_s: float | None, max_items: int = 1, *, once: bool = False,
                  with_headers: bool = False, traced: bool = True) -> list[Any]: ...
    def get_prefetched(self) -> Any: ...


class Life(Protocol):
    """The queue object's event loop, its opening and closing, and its consumers while open."""

    @property
    def state(self) -> State: ...
    def bind_loop(self) -> None: ...
    async def enter(self) -> None: ...
    async def open(self) -> None: ...
    async def aclose(self) -> None: ...
    def pump(self) -> Taker: ...
    def reliable(self) -> Receiver[Any]: ...
    def stats(self) -> QueueStats: ...


class Parts(Protocol):
    """Everything a queue object delegates to, one part per role."""

    @property
    def producer(self) -> Producing: ...
    @property
    def pending(self) -> Contents: ...
    @property
    def keyed(self) -> KeyedCalls: ...
    @property
    def schedules(self) -> Recurring: ...
    @property
    def dead(self) -> DeadLetterCalls: ...
    @property
    def controls(self) -> ControlCalls: ...
    @property
    def event_stream(self) -> EventCalls: ...
    @property
    def life(self) -> Life: ...
    def shard_keys(self) -> tuple[QueueKeys, ...]: ...
