"""Key names of one queue, exactly as Redisson's ``RedissonObject.prefixName`` builds them."""

from __future__ import annotations

from dataclasses import dataclass

from .exceptions import InvalidNameError

__all__ = ["QueueKeys", "prefix_name"]


def prefix_name(prefix: str, name: str) -> str:
    """Return Redisson's ``prefixName(prefix, name)``.

    ``prefix:{name}`` puts every key of the queue in the cluster slot of ``name``; a name that
    already carries a ``{...}`` hash tag is used as is (``prefix:name``) so its own tag still decides.
    """
    if "{" in name:
        return f"{prefix}:{name}"
    return f"{prefix}:{{{name}}}"


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys and channel of the delayed queue whose destination list is ``name``.

    Attributes:
        destination: list of due payloads, consumed with ``BLPOP`` (Redisson: the queue's raw name).
        timeout_set: zset of pending packed elements scored by due time in epoch milliseconds.
        delay_list: list of the same packed elements in insertion order.
        channel: pub/sub channel carrying a new earliest due time (epoch ms, decimal text).
        dead_letter: list of raw entries that could not be delivered (aiodelayq only).
        in_flight: zset of received, unacknowledged messages scored by visibility deadline (epoch
            ms); aiodelayq's reliable consumption only.
    """

    destination: str
    timeout_set: str
    delay_list: str
    channel: str
    dead_letter: str
    in_flight: str

    @classmethod
    def for_name(cls, name: str) -> QueueKeys:
        """Build the keys for a queue name.

        Raises:
            InvalidNameError: ``name`` is not a non-empty ``str``.
        """
        if not isinstance(name, str):
            raise InvalidNameError(f"queue name must be a str, not {type(name).__name__}")
        if not name:
            raise InvalidNameError("queue name must not be empty")
        return cls(
            destination=name,
            timeout_set=prefix_name("redisson_delay_queue_timeout", name),
            delay_list=prefix_name("redisson_delay_queue", name),
            channel=prefix_name("redisson_delay_queue_channel", name),
            dead_letter=prefix_name("aiodelayq_dead_letter", name),
            in_flight=prefix_name("aiodelayq_in_flight", name),
        )
