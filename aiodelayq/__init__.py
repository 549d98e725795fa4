"""aiodelayq: an asyncio delayed queue on Redis that shares keys and element format with Redisson's
``RDelayedQueue``.

>>> queue = DelayedQueue(client, "orders:cancel")
>>> await queue.offer({"order": 42}, delay=timedelta(minutes=30))
>>> async with queue:
...     async for item in queue:
...         ...
"""

from ._consuming.current import current_headers, current_message
from ._consuming.messages import Message
from ._consuming.priority import Prioritized
from ._consuming.reliable import MessageIterator
from ._consuming.worker import Reject, Retry, Worker, WorkerStats
from ._options import WireFormat, WorkerOptions
from ._producing.dead_letters import DeadLetter
from ._producing.keyed import Offered, Pending
from ._producing.pending import PendingItem, QueueCounts
from ._queue import DelayedQueue
from ._runtime.lifecycle import QueueStats
from ._runtime.scheduler import SchedulerStats
from ._web import Queues
from ._wire.codec import BytesCodec, Codec, JsonCodec, MsgpackCodec, StrCodec
from ._wire.delays import delay_to_ms
from ._wire.key_names import QueueKeys, prefix_name
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
    InvalidHeadersError,
    InvalidKeyError,
    InvalidNameError,
    ItemTooLargeError,
    NotReplicatedError,
    QueueClosedError,
    QueueFullError,
    QueueNotOpenError,
    WrongEventLoopError,
    WrongNodeError,
)

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
    "EncodeError",
    "InvalidDelayError",
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
    "QueueKeys",
    "QueueNotOpenError",
    "QueueStats",
    "Queues",
    "Reject",
    "Retry",
    "SchedulerStats",
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
