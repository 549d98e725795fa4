"""aiodelayq: an asyncio delayed queue on Redis that shares keys and element format with Redisson's
``RDelayedQueue``.

>>> queue = DelayedQueue(client, "orders:cancel")
>>> await queue.offer({"order": 42}, delay=timedelta(minutes=30))
>>> async with queue:
...     async for item in queue:
...         ...
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .exceptions import (
    AccessDeniedError,
    BackendError,
    CallTimeoutError,
    CodecError,
    ConfigurationError,
    DecodeError,
    DelayedQueueError,
    EncodeError,
    InvalidDelayError,
    InvalidGroupError,
    InvalidHeadersError,
    InvalidKeyError,
    InvalidNameError,
    ItemTooLargeError,
    NotReplicatedError,
    QueueClosedError,
    QueueFullError,
    QueueNotOpenError,
    ScheduledKeyError,
    ShardCountError,
    WrongEventLoopError,
    WrongNodeError,
)

if TYPE_CHECKING:
    from ._consuming.current import current_headers, current_message
    from ._consuming.handler import Reject, Retry
    from ._consuming.messages import Message
    from ._consuming.priority import Prioritized
    from ._consuming.reliable import MessageIterator
    from ._consuming.worker_outcomes import WorkerStats
    from ._consuming.worker_slots import Worker
    from ._contents.contents import PendingItem
    from ._contents.counts import QueueCounts
    from ._contents.dead_letters import DeadLetter
    from ._contents.event_stream import EventKind, QueueEvent
    from ._options import WireFormat, WorkerOptions
    from ._producing.keyed import Offered, Pending
    from ._queue import DelayedQueue
    from ._runtime.lifecycle import QueueStats
    from ._runtime.transfer_task import TransferStats
    from ._web import Queues
    from ._wire.codec import BytesCodec, Codec, JsonCodec, MsgpackCodec, StrCodec
    from ._wire.delays import delay_to_ms
    from ._wire.elements import ElementKind
    from ._wire.key_names import QueueKeys, prefix_name

__all__ = [
    "AccessDeniedError",
    "BackendError",
    "CallTimeoutError",
    "BytesCodec",
    "Codec",
    "CodecError",
    "ConfigurationError",
    "DeadLetter",
    "DecodeError",
    "DelayedQueue",
    "DelayedQueueError",
    "ElementKind",
    "EncodeError",
    "EventKind",
    "InvalidDelayError",
    "InvalidGroupError",
    "InvalidHeadersError",
    "InvalidKeyError",
    "InvalidNameError",
    "ItemTooLargeError",
    "JsonCodec",
    "Message",
    "MessageIterator",
    "MsgpackCodec",
    "NotReplicatedError",
    "Offered",
    "Pending",
    "PendingItem",
    "Prioritized",
    "QueueClosedError",
    "QueueFullError",
    "QueueCounts",
    "QueueEvent",
    "QueueKeys",
    "QueueNotOpenError",
    "QueueStats",
    "Queues",
    "ScheduledKeyError",
    "Reject",
    "Retry",
    "TransferStats",
    "ShardCountError",
    "StrCodec",
    "WireFormat",
    "Worker",
    "WorkerOptions",
    "WorkerStats",
    "WrongEventLoopError",
    "WrongNodeError",
    "current_headers",
    "current_message",
    "delay_to_ms",
    "prefix_name",
]

__version__ = "0.1.0"

# Every public name but the exceptions, and the module defining it: imported on first access (PEP
# 562), so ``import aiodelayq`` (and with it the command line's ``--help``) loads neither redis-py
# nor asyncio, and a process loads only the parts it uses.
_LAZY = {
    "current_headers": "._consuming.current",
    "current_message": "._consuming.current",
    "Message": "._consuming.messages",
    "Prioritized": "._consuming.priority",
    "MessageIterator": "._consuming.reliable",
    "Reject": "._consuming.handler",
    "Retry": "._consuming.handler",
    "Worker": "._consuming.worker_slots",
    "WorkerStats": "._consuming.worker_outcomes",
    "WireFormat": "._options",
    "ElementKind": "._wire.elements",
    "WorkerOptions": "._options",
    "DeadLetter": "._contents.dead_letters",
    "EventKind": "._contents.event_stream",
    "QueueEvent": "._contents.event_stream",
    "Offered": "._producing.keyed",
    "Pending": "._producing.keyed",
    "PendingItem": "._contents.contents",
    "QueueCounts": "._contents.counts",
    "DelayedQueue": "._queue",
    "QueueStats": "._runtime.lifecycle",
    "TransferStats": "._runtime.transfer_task",
    "Queues": "._web",
    "BytesCodec": "._wire.codec",
    "Codec": "._wire.codec",
    "JsonCodec": "._wire.codec",
    "MsgpackCodec": "._wire.codec",
    "StrCodec": "._wire.codec",
    "delay_to_ms": "._wire.delays",
    "QueueKeys": "._wire.key_names",
    "prefix_name": "._wire.key_names",
}

if not TYPE_CHECKING:  # for type checkers, the imports above define these names

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(import_module(module, __name__), name)
        globals()[name] = value  # found directly from now on
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
