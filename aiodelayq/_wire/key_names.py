"""Key names of one queue, exactly as Redisson's ``RedissonObject.prefixName`` builds them."""

from __future__ import annotations

from dataclasses import astuple, dataclass

from redis.crc import key_slot

from ..exceptions import InvalidNameError

__all__ = ["KEY_TYPES", "QueueKeys", "prefix_name"]

# The ``TYPE`` of each key by QueueKeys attribute; a key of another type is another program's: refused.
KEY_TYPES: dict[str, str] = {
    "destination": "list", "timeout_set": "zset", "delay_list": "list", "dead_letter": "list", "in_flight": "zset",
    "handoff": "hash", "handoff_leases": "zset", "calls": "zset", "call_replies": "hash", "key_index": "hash",
    "controls": "hash", "schedules": "hash", "tier_index": "zset", "tier_count": "string", "nacked": "zset",
    "grouped": "zset", "groups": "hash", "group_ready": "list", "dedupe_windows": "zset", "dedupe_dues": "hash",
    "event_stream": "stream",
}


def prefix_name(prefix: str, name: str) -> str:
    """Return Redisson's ``prefixName(prefix, name)``: ``prefix:{name}``, or ``prefix:name`` when
    ``name`` has its own hash tag."""
    if "{" in name:
        return f"{prefix}:{name}"
    return f"{prefix}:{{{name}}}"


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys and channel of the delayed queue whose destination list is ``name``; all but
    the first four are aiodelayq's own. Times are epoch ms.

    Attributes:
        destination: list of due payloads (Redisson: the queue's raw name; its consumers ``BLPOP`` it).
        timeout_set: zset of pending packed elements scored by due time.
        delay_list: list of the same packed elements in insertion order.
        channel: pub/sub channel carrying a new earliest due time (decimal text).
        dead_letter: list of raw entries that could not be delivered.
        in_flight: zset of received, unacknowledged messages scored by visibility deadline.
        handoff: hash of items popped for a ``take()`` and not yet handed to a caller, by pop call
            id; an entry whose lease ran out goes back to the destination.
        handoff_leases: zset of those pop call ids scored by lease deadline.
        calls: zset of recent call ids scored by their first run: a resent call within the resend
            window is not applied twice.
        call_replies: hash of the replies of those calls that a resend must repeat.
        key_index: hash of the keys of pending keyed items: field = the key's
            tag (``_wire/item_keys.py``), value = version byte 0x01 + the key and its pending
            element. Entries whose element is no longer pending are stale: ignored, then removed.
        controls: hash of the queue's controls, shared by every process:
            ``paused`` while paused; ``rate``, ``burst``, ``tokens``, ``at`` for a rate limit (a
            token bucket: items per second, its size, its level at ``at``, server ms); ``cap``, the
            concurrency limit (messages held at once); ``events``, the event stream's cap while on.
        schedules: hash of the queue's recurring items: field = the key, value =
            its record (``lua/lib/recur.lua``).
        tier_index: zset of the tier's buckets: member = a bucket's start, score = when it is
            promoted into the timeout zset (its start minus its width).
        tier_count: string, the number of items the tier's buckets hold; absent when none.
        nacked: zset of the in-flight messages nacked with a delay, scored by when they are visible
            again: they wait, and the concurrency limit does not count them.
        grouped: zset of pending grouped items (fast elements) scored by due time; Redisson never
            reads it. Once due, their payloads are admitted to ``group_ready`` up to the group limit
            at once, and the others wait in their group's list (:meth:`group_list`).
        groups: hash of the groups with due items admitted: field = the group, value = its items
            admitted (ready or in flight), + 2**20 while its list may hold items (a group under the
            limit has none waiting); the field ``""`` (no group's name) holds
            how many items wait in the ready list and the groups' lists, and a field of 300 ``#``
            (longer than a group) keeps the hash a hash table (``lua/lib/groups.lua``).
        group_ready: list of the admitted grouped payloads that no consumer holds yet, every group's
            in order of admission: consumers pop it as they pop the destination.
        dedupe_windows: zset of the keys taken by a deduplication window (``offer(...,
            dedupe_for=)``), scored by when the window ends; offers trim the ended ones.
        dedupe_dues: hash of those keys: field = the key, value = the due time of the item that
            took it (what an offer the window refuses returns).
        event_stream: stream of the queue's events while they are on (``set_events``): one entry
            per change to an item, appended by the script that makes it (``lua/lib/events.lua``).
    """

    destination: str
    timeout_set: str
    delay_list: str
    channel: str
    dead_letter: str
    in_flight: str
    handoff: str
    handoff_leases: str
    calls: str
    call_replies: str
    key_index: str
    controls: str
    schedules: str
    tier_index: str
    tier_count: str
    nacked: str
    grouped: str
    groups: str
    group_ready: str
    dedupe_windows: str
    dedupe_dues: str
    event_stream: str

    @classmethod
    def for_name(cls, name: str, *, cluster: bool = False) -> QueueKeys:
        """Build the keys for a queue name; with ``cluster``, also :meth:`check_one_slot`.

        Raises:
            InvalidNameError: ``name`` is not a non-empty ``str``; with ``cluster``, a name whose keys
                do not all hash to one slot.
        """
        if not isinstance(name, str):
            raise InvalidNameError(f"queue name must be a str, not {type(name).__name__}")
        if not name:
            raise InvalidNameError("queue name must not be empty")
        keys = cls(
            destination=name,
            timeout_set=prefix_name("redisson_delay_queue_timeout", name),
            delay_list=prefix_name("redisson_delay_queue", name),
            channel=prefix_name("redisson_delay_queue_channel", name),
            dead_letter=prefix_name("aiodelayq_dead_letter", name),
            in_flight=prefix_name("aiodelayq_in_flight", name),
            handoff=prefix_name("aiodelayq_handoff", name),
            handoff_leases=prefix_name("aiodelayq_handoff_leases", name),
            calls=prefix_name("aiodelayq_calls", name),
            call_replies=prefix_name("aiodelayq_call_replies", name),
            key_index=prefix_name("aiodelayq_keys", name),
            controls=prefix_name("aiodelayq_controls", name),
            schedules=prefix_name("aiodelayq_schedules", name),
            tier_index=prefix_name("aiodelayq_tier_index", name),
            tier_count=prefix_name("aiodelayq_tier_count", name),
            nacked=prefix_name("aiodelayq_nacked", name),
            grouped=prefix_name("aiodelayq_grouped", name),
            groups=prefix_name("aiodelayq_groups", name),
            group_ready=prefix_name("aiodelayq_groups_ready", name),
            dedupe_windows=prefix_name("aiodelayq_dedupe", name),
            dedupe_dues=prefix_name("aiodelayq_dedupe_dues", name),
            event_stream=prefix_name("aiodelayq_events", name),
        )
        if cluster:
            keys.check_one_slot()
        return keys

    def check_one_slot(self) -> None:
        """Check that every key of the queue (with its channel and a tier bucket) hashes to one Redis
        Cluster slot: a script declares them together, and a cluster refuses keys of two slots in
        one call. Names such as ``a{``, ``{}``, ``x{}y`` or ``a}b`` fail.

        Raises:
            InvalidNameError: the keys fall in more than one slot (the message states the rule and
                two keys in different slots).
        """
        slots: dict[int, str] = {}
        for key in (*astuple(self), self.tier_bucket(0), self.group_list("g{1}")):
            slots.setdefault(key_slot(key.encode()), key)
        if len(slots) > 1:
            (slot_a, key_a), (slot_b, key_b) = list(slots.items())[:2]
            raise InvalidNameError(
                f"queue name {self.destination!r} cannot be used on a Redis Cluster: all the keys of a queue must "
                f"hash to one slot, and this name's fall in {len(slots)} ({key_a!r} in slot {slot_a}, {key_b!r} in "
                f"slot {slot_b}). On a Cluster a queue name has no brace at all, or its first '{{' opens a hash "
                "tag: one or more characters, then '}' (as in '{tenant1}:orders')")

    def tier_bucket(self, start_ms: int) -> str:
        """The list of the tier's bucket that starts at ``start_ms`` (epoch ms), in the queue's slot;
        ``lua/lib/tiers.lua`` builds the same name."""
        return prefix_name(f"aiodelayq_tier_{start_ms}", self.destination)

    def group_list(self, group: str) -> str:
        """The list of a group's due items, in the queue's slot (``%`` and ``{`` in the group escaped,
        so its hash tag is the queue's); ``lua/lib/groups.lua`` builds the same name."""
        escaped = group.replace("%", "%25").replace("{", "%7B")
        return f"aiodelayq_group_{escaped}{self.groups[len('aiodelayq_groups'):]}"

    @property
    def all(self) -> tuple[str, ...]:
        """Every key of the queue but the channel and the tier's buckets."""
        return (self.destination, self.timeout_set, self.delay_list, self.dead_letter, self.in_flight,
                self.handoff, self.handoff_leases, self.calls, self.call_replies, self.key_index, self.controls,
                self.schedules, self.tier_index, self.tier_count, self.nacked, self.grouped, self.groups,
                self.group_ready, self.dedupe_windows, self.dedupe_dues, self.event_stream)
