"""The exception tree: everything aiodelayq raises on purpose derives from :class:`DelayedQueueError`."""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "BackendError",
    "CallTimeoutError",
    "CodecError",
    "ConfigurationError",
    "DecodeError",
    "DelayedQueueError",
    "EncodeError",
    "InvalidDelayError",
    "InvalidHeadersError",
    "InvalidGroupError",
    "InvalidKeyError",
    "InvalidNameError",
    "ItemTooLargeError",
    "NotReplicatedError",
    "QueueClosedError",
    "QueueFullError",
    "QueueNotOpenError",
    "ScheduledKeyError",
    "ShardCountError",
    "WrongEventLoopError",
    "WrongNodeError",
]


class DelayedQueueError(Exception):
    """Root of every error aiodelayq raises on purpose."""


class InvalidDelayError(DelayedQueueError, ValueError):
    """A delay that is negative, NaN, infinite, too large or not a number/timedelta."""


class InvalidNameError(DelayedQueueError, ValueError):
    """An empty or non-``str`` queue name; on a Redis Cluster, one whose keys span slots; a sharded
    queue's name with a brace. Raised where the queue object is made: nothing was written."""


class InvalidKeyError(DelayedQueueError, ValueError):
    """An item key that is not a non-empty ``str`` of at most 1,024 UTF-8 bytes, or ``keys`` that do
    not match the items (``offer_many``). Nothing was written."""


class InvalidGroupError(InvalidKeyError):
    """An item group (``offer(..., group=...)``) that is not a non-empty ``str`` of at most 256 UTF-8
    bytes, ``groups`` that do not match the items (``offer_many``), or a group on a queue whose
    elements Java must see (``strict=True``, the legacy format). Nothing was written."""


class ScheduledKeyError(InvalidKeyError):
    """An offer with the key of a recurring schedule (``schedule()``); ``cancel(key)`` ends the
    schedule. Nothing of the call was written (of coalesced ``offer()`` calls, only this one was refused).

    Attributes:
        key: the schedule's key.
    """

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class CodecError(DelayedQueueError):
    """Base of codec failures."""


class EncodeError(CodecError, ValueError):
    """The codec could not turn an item into bytes; nothing was written to Redis."""


class DecodeError(CodecError, ValueError):
    """The codec could not turn bytes from Redis back into an item.

    Attributes:
        raw: the bytes that failed to decode.
    """

    def __init__(self, message: str, raw: bytes) -> None:
        super().__init__(message)
        self.raw = raw


class InvalidHeadersError(DelayedQueueError, ValueError):
    """Headers that are not a mapping of ``str`` to ``str``, or too large; nothing was written."""


class ItemTooLargeError(DelayedQueueError, ValueError):
    """An item larger than the queue's ``max_item_bytes`` as stored (encoded, with its headers and envelope);
    nothing of its call was written."""


class QueueFullError(DelayedQueueError):
    """The offer would take the queue's pending + ready items beyond its ``capacity``; nothing of
    its call was written (``offer_many`` is all or nothing).

    Attributes:
        room: how many more items the queue had room for when the offer was refused (0 or more).
    """

    def __init__(self, message: str, room: int) -> None:
        super().__init__(message)
        self.room = room


class QueueNotOpenError(DelayedQueueError):
    """A consuming call (``take``/``poll``/iteration) on a queue that was not opened
    (``async with queue:`` or ``await queue.open()``)."""


class QueueClosedError(QueueNotOpenError):
    """The queue was closed (``aclose()``) while or before the call waited."""


class BackendError(DelayedQueueError):
    """A Redis call failed; the redis-py exception, if any, is the ``__cause__``.

    Attributes:
        maybe_applied: ``True`` when the call reached the server and its reply was lost (a dropped
            connection, a timeout): it may have been applied. ``False`` when it certainly was not
            (refused, or never sent).
    """

    def __init__(self, message: str, *, maybe_applied: bool = False) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class CallTimeoutError(BackendError, TimeoutError):
    """No reply within the call's bound (``call_timeout_s``); see ``maybe_applied``."""


class NotReplicatedError(BackendError):
    """A durable write (``min_replicas`` or ``wait_aof``) ran on the primary, but fewer replicas (or
    AOF fsyncs) than asked confirmed it within ``replication_timeout_s``: a failover can still lose it.
    ``maybe_applied`` is always ``True``.

    Attributes:
        replicas: how many replicas confirmed it (``WAIT``'s reply; with ``wait_aof``, replicas that
            fsynced it), or ``None`` when the confirmation command itself failed.
        wanted: how many were asked for.
    """

    def __init__(self, message: str, *, replicas: int | None, wanted: int) -> None:
        super().__init__(message, maybe_applied=True)
        self.replicas = replicas
        self.wanted = wanted


class AccessDeniedError(BackendError, PermissionError):
    """The Redis user may not run a command or touch a key the queue needs (``NOPERM``, ``NOAUTH``,
    ``WRONGPASS``). Never retried."""


class WrongNodeError(BackendError):
    """A plain client reached a cluster node that does not own the queue's slot (``MOVED``/``ASK``);
    use a ``redis.asyncio.RedisCluster`` client."""


class ConfigurationError(DelayedQueueError, ValueError):
    """A bad constructor option: unknown codec or wire format, a client that decodes responses."""


class WrongEventLoopError(ConfigurationError):
    """A queue object used from an event loop other than the one it is bound to (its first use);
    create one queue object per event loop."""


class ShardCountError(ConfigurationError):
    """A queue object whose ``shards`` differs from the shard count recorded under its name (fixed for
    the queue's life; an ordinary queue counts as 1). Raised by the first call or ``open()`` and every
    call after; nothing was written.

    Attributes:
        recorded: the name's shard count in Redis (1: an ordinary queue).
        wanted: the ``shards`` this queue object was made with.
    """

    def __init__(self, message: str, *, recorded: int, wanted: int) -> None:
        super().__init__(message)
        self.recorded = recorded
        self.wanted = wanted

    @classmethod
    def refusing(cls, subject: str, *, recorded: int, wanted: int) -> ShardCountError:
        """The error of ``subject`` (the queue, or the call refused)."""
        if recorded == 1:
            message = (f"{subject} holds an ordinary (unsharded) queue: shards={wanted} refused (a queue's shard "
                       "count is fixed for its life: drain it and delete its keys first, or use another name)")
        else:
            message = (f"{subject}: the queue has {recorded} shards (recorded under its name); this queue object "
                       f"has shards={wanted}: make it with shards={recorded} (a queue's shard count is fixed for "
                       "its life)")
        return cls(message, recorded=recorded, wanted=wanted)
