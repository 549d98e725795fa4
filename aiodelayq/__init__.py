"""aiodelayq: an asyncio delayed queue on Redis that shares keys and element format with Redisson's
``RDelayedQueue``.

>>> queue = DelayedQueue(client, "orders:cancel")
>>> await queue.offer({"order": 42}, delay=timedelta(minutes=30))
>>> async with queue:
...     async for item in queue:
...         ...
"""

from ._codec import BytesCodec, Codec, JsonCodec, MsgpackCodec, StrCodec
from ._dead_letters import DeadLetter
from ._delays import delay_to_ms
from ._keyed import Offered, Pending
from ._keys import QueueKeys, prefix_name
from ._lifecycle import QueueStats
from ._messages import Message
from ._options import WireFormat
from ._pending import PendingItem, QueueCounts
from ._queue import DelayedQueue
from ._queues import Queues
from ._reliable import MessageIterator
from ._scheduler import SchedulerStats
from ._worker import Reject, Retry, Worker, WorkerStats
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
    InvalidKeyError,
    InvalidNameError,
    NotReplicatedError,
    QueueClosedError,
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
    "InvalidKeyError",
    "InvalidNameError",
    "JsonCodec",
    "Message",
    "MessageIterator",
    "MsgpackCodec",
    "NotReplicatedError",
    "Offered",
    "Pending",
    "PendingItem",
    "QueueClosedError",
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
    "WorkerStats",
    "WrongEventLoopError",
    "WrongNodeError",
    "delay_to_ms",
    "prefix_name",
]

__version__ = "0.1.0"
