"""A queue's name and the Redis keys it maps to (Redisson's names, one cluster slot), and the names and
options ``DelayedQueue(client, name, ...)`` refuses when it is built."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from aiodelayq import (
    ConfigurationError,
    DelayedQueue,
    DelayedQueueError,
    InvalidNameError,
    QueueKeys,
    Queues,
    WorkerOptions,
    prefix_name,
)
from aiodelayq._options import QueueOptions
from aiodelayq.dashboard import Dashboard
from aiodelayq.testing import ThrowawayCluster
from aiodelayq.worker import run_worker


def test_prefix_name_follows_redisson() -> None:
    assert prefix_name("redisson_delay_queue", "orders") == "redisson_delay_queue:{orders}"
    assert prefix_name("redisson_delay_queue", "{tenant1}:orders") == "redisson_delay_queue:{tenant1}:orders"


@pytest.mark.parametrize("name", ["orders", "orders:cancel", "{tenant7}:orders", "a{b}c"])
def test_all_keys_share_one_cluster_slot(name: str) -> None:
    keys = QueueKeys.for_name(name)
    slots = {key_slot(k.encode()) for k in (keys.destination, keys.timeout_set, keys.delay_list,
                                            keys.channel, keys.dead_letter, keys.in_flight)}
    assert len(slots) == 1


def test_keys_of_seed_queue() -> None:
    keys = QueueKeys.for_name("zlyx")
    assert (keys.destination, keys.timeout_set, keys.delay_list, keys.channel) == (
        "zlyx", "redisson_delay_queue_timeout:{zlyx}", "redisson_delay_queue:{zlyx}",
        "redisson_delay_queue_channel:{zlyx}")


@pytest.mark.parametrize("name", ["", None, b"bytes"])
async def test_bad_names_are_rejected(client: Redis, name: Any) -> None:
    with pytest.raises(InvalidNameError) as info:
        DelayedQueue(client, name)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, DelayedQueueError)


async def test_bad_options_raise_configuration_error(client: Redis, make_client: Any) -> None:
    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", codec="pickle")
    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", codec=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", wire_format="kryo")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", transfer_batch=0)
    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", safety_poll_s=math.nan)
    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", max_deliveries=0)
    decoding = make_client(decode_responses=True)
    with pytest.raises(ConfigurationError):
        DelayedQueue(decoding, "q")


@pytest.mark.parametrize(("options", "message"), [
    ({"tier_after_s": 0.5}, "tier_after_s must be at least 1 second, not 0.5"),
    ({"safety_poll_s": 0}, "safety_poll_s must be more than 0 seconds, not 0"),
    ({"lag_warning_s": -2}, "lag_warning_s must be more than 0 seconds, not -2"),
])
async def test_a_duration_below_its_minimum_is_refused_in_plain_words(
        client: Redis, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        DelayedQueue(client, "q", **options)
    assert str(refused.value) == message
    with pytest.raises(ConfigurationError) as refused:
        WorkerOptions(visibility_timeout_s=0.05)
    assert str(refused.value) == "visibility_timeout_s must be at least 0.1 seconds, not 0.05"


# Names whose keys do not all hash to one cluster slot: a '{' that opens no hash tag (no '}' after it,
# or nothing between), or a '}' with no '{' (the prefixed keys take the tag before it, the list none).
_SPLIT_NAMES = ["a{", "{}", "x{}y", "{}{tag}", "a}b"]


def _split(name: str) -> str:
    """``name`` made unique to a test run, its braces kept where they split it."""
    return f"aiodelayq-test:{uuid.uuid4().hex[:10]}:{name}"


@pytest.mark.parametrize("name", _SPLIT_NAMES)
async def test_a_name_a_cluster_cannot_use_works_on_a_single_server(single_server: Any, client: Redis,
                                                                    drop_keys: Any, name: str) -> None:
    # Each of its keys hashes whole, or to another tag: one server holds them all anyway.
    q: DelayedQueue[str] = DelayedQueue(client, _split(name), safety_poll_s=0.2)
    drop_keys(*q.keys.all)
    assert len({key_slot(k.encode()) for k in (*q.keys.all, q.keys.channel)}) > 1
    await q.offer("due", 0.05)
    await q.offer("keyed", 60, key="k")
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "due"
    assert (await q.get("k")).value == "keyed"  # type: ignore[union-attr]
    assert await q.cancel("k")
    assert await q.size() == 0


@pytest.mark.topology
async def test_a_cluster_client_refuses_a_name_whose_keys_span_slots_where_the_queue_is_made(
        cluster: ThrowawayCluster, cluster_clients: Any) -> None:
    rc = cluster_clients(cluster)
    for bare in _SPLIT_NAMES:
        name = _split(bare)
        with pytest.raises(InvalidNameError, match="hash to one slot") as info:
            DelayedQueue(rc, name)
        message = str(info.value)
        assert repr(name) in message
        assert "its first '{' opens a hash tag" in message
        with pytest.raises(InvalidNameError, match="hash to one slot"):
            Queues(rc).add(name)
        with pytest.raises(InvalidNameError, match="hash to one slot"):
            Queues(rc).add_worker(name, _handler)
        with pytest.raises(ConfigurationError, match="hash to one slot"):
            Dashboard(rc, queues=[name])
        with pytest.raises(InvalidNameError, match="hash to one slot"):
            DelayedQueue(rc, name, shards=3)
        assert not await rc.exists(*QueueKeys.for_name(name).all[:1])  # nothing written
    # Names whose keys share a slot work on the cluster, a hash tag of their own or not.
    for name in (_split("orders"), "{" + _split("tenant") + "}:orders", _split("a{b}c")):
        q: DelayedQueue[str] = DelayedQueue(rc, name)
        try:
            await q.offer("x", 60, key="k")
            assert await q.size() == 1
        finally:
            await q.clear()
            await q.aclose()


async def _handler(item: Any) -> None:
    pass


def _mirrors(function: Any, options: type, *, every: bool) -> list[str]:
    """How ``function``'s keywords differ from the fields of ``options`` they mirror (name, annotation,
    default); ``every``: it must take every field."""
    params = inspect.signature(function).parameters
    wrong = []
    for f in dataclasses.fields(options):
        if not f.init:  # derived in __post_init__
            continue
        if f.name not in params:
            wrong += [f"{function.__qualname__} lacks {f.name}"] if every else []
            continue
        p = params[f.name]
        if (p.annotation, p.default) != (f.type, f.default):
            wrong.append(f"{function.__qualname__}({f.name}: {p.annotation} = {p.default!r}) but "
                         f"{options.__name__}.{f.name}: {f.type} = {f.default!r}")
    return wrong


def test_the_entry_points_take_each_option_as_its_options_object_declares_it() -> None:
    # The options objects declare each option once; the entry points spell them out for editors.
    queue_params = set(inspect.signature(DelayedQueue.__init__).parameters) - {"self", "client", "name", "shards"}
    assert queue_params == {f.name for f in dataclasses.fields(QueueOptions) if f.init}
    wrong = _mirrors(DelayedQueue.__init__, QueueOptions, every=True)
    for entry in (DelayedQueue.worker, DelayedQueue.consume, Queues.add_worker):
        wrong += _mirrors(entry, WorkerOptions, every=True)
    wrong += _mirrors(run_worker, WorkerOptions, every=False)  # no retry_backoff: a command line has no object
    assert wrong == []
