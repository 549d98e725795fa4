"""Key names, codecs and input validation (nothing half-written on bad input)."""

from __future__ import annotations

import asyncio
import json
import math
import struct
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from aiodelayq import (
    ConfigurationError,
    DelayedQueue,
    DelayedQueueError,
    EncodeError,
    InvalidDelayError,
    InvalidNameError,
    QueueKeys,
    delay_to_ms,
    prefix_name,
)
from tests.helpers import server_ms


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


@pytest.mark.parametrize(("delay", "expected"), [
    (0, 0), (1, 1000), (0.1, 100), (0.0015, 2), (timedelta(minutes=30), 1_800_000),
    (timedelta(microseconds=1), 1), (2.5, 2500),
    # Long delays stay exact (a relative noise allowance made an hour 3 ms short, a day 86 ms).
    (3600, 3_600_000), (1800.0, 1_800_000), (86_400, 86_400_000), (4e9, 4_000_000_000_000), (0.1 + 0.2, 300),
])
def test_delay_conversion_rounds_up_to_ms(delay: Any, expected: int) -> None:
    assert delay_to_ms(delay) == expected


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, -math.inf, timedelta(seconds=-1),
                                   True, "5", None, 1e300])
async def test_bad_delay_raises_and_writes_nothing(client: Redis, make_queue: Any, delay: Any) -> None:
    q = make_queue()
    with pytest.raises(InvalidDelayError) as info:
        await q.offer("x", delay)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidDelayError):
        await q.offer_many([("ok", 1), ("bad", delay)])
    assert await client.exists(q.keys.timeout_set, q.keys.delay_list) == 0


async def test_unencodable_item_raises_codec_error_and_writes_nothing(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    with pytest.raises(EncodeError):
        await q.offer(object(), 1)
    with pytest.raises(EncodeError):
        await q.offer({"nan": math.nan}, 1)
    with pytest.raises(EncodeError):
        await q.offer_many([({"ok": 1}, 1), ({1, 2}, 1)])
    with pytest.raises(EncodeError):
        await make_queue(codec="str").offer(b"not str", 1)
    with pytest.raises(EncodeError):
        await make_queue(codec="bytes").offer("not bytes", 1)
    assert await client.exists(q.keys.timeout_set, q.keys.delay_list) == 0


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
    decoding = make_client(decode_responses=True)
    with pytest.raises(ConfigurationError):
        DelayedQueue(decoding, "q")


class UpperCodec:
    def encode(self, obj: Any) -> bytes:
        return str(obj).upper().encode()

    def decode(self, data: bytes) -> str:
        return data.decode().lower()


@pytest.mark.parametrize(("codec", "items"), [
    ("json", [{"order": 1, "tags": ["a", "é"]}, [1, 2.5, None], "text", 7]),
    ("str", ["plain", "ünïcode", ""]),
    ("bytes", [b"\x00\xff raw", b"", bytes(range(256))]),
    ("msgpack", [{"a": [1, 2]}, b"bin", "s", 3.5]),
    (UpperCodec(), ["hello"]),
])
async def test_codecs_round_trip_through_redis(make_queue: Any, codec: Any, items: list[Any]) -> None:
    q = make_queue(codec=codec)
    await q.offer_many([(item, 0) for item in items])
    assert await q.read_all() == items
    async with q:
        got = [await q.take() for _ in items]
    assert sorted(map(repr, got)) == sorted(map(repr, items))


@pytest.mark.parametrize(("wire_format", "strict", "id_len"), [
    ("redisson", False, 20), ("redisson", True, 8), ("redisson-legacy", False, None)])
async def test_element_layout_matches_wire_format(client: Redis, make_queue: Any, wire_format: str,
                                                  strict: bool, id_len: int | None) -> None:
    q = make_queue(codec="str", wire_format=wire_format, strict=strict)
    await q.offer("payload", 60)
    [element] = await client.zrange(q.keys.timeout_set, 0, -1)
    if id_len is None:  # legacy dLc0
        assert len(element) == 8 + 8 + len("payload")
        assert struct.unpack_from("<Q", element, 8)[0] == len("payload")
    else:  # Bc0Lc0
        assert element[0] == id_len
        assert len(element) == 1 + id_len + 8 + len("payload")
        assert struct.unpack_from("<Q", element, 1 + id_len)[0] == len("payload")
    if id_len == 20:
        assert element[1:5] == b"adq\x01"
    assert element.endswith(b"payload")
    # Fast elements stay out of Redisson's insertion-order list; strict ones are in both.
    assert await client.lrange(q.keys.delay_list, 0, -1) == ([] if id_len == 20 else [element])
    assert q.strict == (id_len != 20)


async def test_offer_uses_the_server_clock(client: Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 30.0)  # this producer's clock is 30 s fast
    q = make_queue()
    before = await server_ms(client)
    due = await q.offer("x", 10)
    after = await server_ms(client)
    assert before + 10_000 - 1 <= due <= after + 10_000 + 1
    [(_, score)] = await client.zrange(q.keys.timeout_set, 0, 0, withscores=True)
    assert score == due


async def test_offer_many_is_one_round_trip_and_keeps_order(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([])
    await q.offer("warm-up", 0)  # the first offer also asks the server for its 'L' layout, once
    await q.clear()
    calls_before = await _script_calls(client, q.keys.destination)
    dues = await q.offer_many([(i, 100 - i) for i in range(100)])
    assert await _script_calls(client, q.keys.destination) - calls_before == 1
    assert len(dues) == 100
    assert dues == sorted(dues, reverse=True)
    assert await q.size() == 100
    assert await q.read_all() == list(range(99, -1, -1))  # due order: item i is due in 100 - i s
    assert await q.offer_many([]) == []


async def _script_calls(client: Redis, key: str) -> int:
    """Script calls the server holding ``key`` has run (on a cluster, that key's primary)."""
    if isinstance(client, RedisCluster):
        await client.initialize()  # the slot map, before asking it for a node
        stats = await client.info("commandstats", target_nodes=client.get_node_from_key(key))
    else:
        stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


async def test_concurrent_offers_share_round_trips_and_keep_their_own_results(client: Redis,
                                                                             make_queue: Any) -> None:
    q = make_queue()
    calls_before = await _script_calls(client, q.keys.destination)
    dues = await asyncio.gather(*(q.offer(i, i / 1000) for i in range(200)))
    calls = await _script_calls(client, q.keys.destination) - calls_before
    assert calls < 20  # coalesced, not one script call per offer
    assert await q.size() == 200
    # Each caller got its own item's due time: the one the zset holds for its payload (a fast
    # element ends with the payload; the calls may have different bases, so compare exactly).
    held = {json.loads(m[29:]): int(s) for m, s in await client.zrange(q.keys.timeout_set, 0, -1, withscores=True)}
    assert [held[i] for i in range(200)] == dues
    bad = [q.offer(i, 0) for i in range(3)] + [q.offer(object(), 0)]
    results = await asyncio.gather(*bad, return_exceptions=True)
    assert isinstance(results[3], EncodeError)  # only the bad offer fails
    assert all(isinstance(r, int) for r in results[:3])
