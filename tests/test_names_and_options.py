"""A queue's name and the Redis keys it maps to (Redisson's names, one cluster slot), and the names and
options ``DelayedQueue(client, name, ...)`` refuses when it is built."""

from __future__ import annotations

import math
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
    WorkerOptions,
    prefix_name,
)


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
