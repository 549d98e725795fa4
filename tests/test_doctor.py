"""``aiodelayq doctor``'s checks on real servers: each finding says what it saw, and fails only on
what puts pending items at risk (an evicting policy, a replica as the primary, a stalled queue, a
user missing a permission)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiodelayq import DelayedQueue, QueueKeys
from aiodelayq._redis.acl import minimal_acl_rules
from aiodelayq.cli._doctor import Finding, diagnose
from aiodelayq.testing import server_version

pytestmark = pytest.mark.usefixtures("redis_server")


def _by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def _has_acl_dryrun(redis_server: Any) -> bool:
    """ACL DRYRUN: Redis and Valkey >= 7.0 (older servers: the ACL check can only warn)."""
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    return version >= (7, 0)


async def test_a_plain_server_warns_of_no_persistence_and_no_replica(own_server: Any, make_client: Any,
                                                                    make_queue: Any, redis_server: Any) -> None:
    server = own_server()
    client = make_client(server)
    q = make_queue("orders", redis=client)
    await q.offer("x", 60)
    found = _by_check(await diagnose(client, ["orders"]))
    assert {c: f.status for c, f in found.items()} == {
        "server": "ok", "eviction": "ok", "persistence": "warn", "replication": "warn", "commands": "ok",
        "clock": "ok", "acl": "ok" if _has_acl_dryrun(redis_server) else "warn", "keys": "ok", "lag": "ok",
        "format": "ok"}
    assert found["server"].where == f"127.0.0.1:{server.port}"
    assert found["lag"].where == "orders"
    assert "1 fast" in found["format"].saw
    assert found["persistence"].todo is not None
    assert "appendonly yes" in found["persistence"].todo


async def test_an_allkeys_policy_fails(own_server: Any, make_client: Any) -> None:
    client = make_client(own_server(**{"maxmemory-policy": "allkeys-lru", "appendonly": "yes"}))
    found = _by_check(await diagnose(client, []))
    assert found["eviction"].status == "fail"
    assert "allkeys-lru" in found["eviction"].saw
    assert found["persistence"].status == "ok"


async def test_a_stalled_queue_fails_with_its_lag(make_client: Any, make_queue: Any) -> None:
    client = make_client()
    q = make_queue(redis=client)  # never opened: nothing moves what falls due
    await q.offer("due", 0)
    await asyncio.sleep(0.3)
    found = _by_check(await diagnose(client, [q.name], max_lag_s=0.2))
    assert found["lag"].status == "fail"
    assert "no transfer moves them" in found["lag"].saw


async def test_a_replica_fails_and_its_primary_counts_it(own_server: Any, make_client: Any) -> None:
    primary = own_server()
    replica = own_server()
    await make_client(replica).execute_command("REPLICAOF", "127.0.0.1", str(primary.port))
    primary_client = make_client(primary)
    for _ in range(100):
        if (await primary_client.info("replication"))["connected_slaves"] == 1:
            break
        await asyncio.sleep(0.05)
    found = _by_check(await diagnose(make_client(replica), []))
    assert found["replication"].status == "fail"
    found = _by_check(await diagnose(primary_client, []))
    assert found["replication"].status == "ok"
    assert "1 replica(s)" in found["replication"].saw


async def test_a_user_missing_a_permission_fails_naming_it(make_client: Any, own_server: Any,
                                                          redis_server: Any) -> None:
    if not _has_acl_dryrun(redis_server):
        pytest.skip("ACL DRYRUN needs Redis or Valkey >= 7.0 (the check warns on older servers)")
    server = own_server()
    admin = make_client(server)
    rules = [r for r in minimal_acl_rules("orders") if r != "+lpop"]
    await admin.execute_command("ACL", "SETUSER", "no-lpop", "on", ">secret", *rules)
    user = make_client(server, username="no-lpop", password="secret")
    found = _by_check(await diagnose(admin, ["orders"], acl_user="no-lpop"))
    assert found["acl"].status == "fail"
    assert "lpop" in found["acl"].saw
    # As the user itself: it may not run ACL DRYRUN, which is a warning; its reads still work.
    found = _by_check(await diagnose(user, ["orders"]))
    assert found["acl"].status == "warn"
    assert found["lag"].status == "ok"


async def test_legacy_elements_warn_under_the_default_wire_format(make_client: Any, make_queue: Any) -> None:
    client = make_client()
    legacy = make_queue(redis=client, wire_format="redisson-legacy")
    await legacy.offer("x", 60)
    found = _by_check(await diagnose(client, [legacy.name]))
    assert found["format"].status == "warn"
    assert "1 legacy" in found["format"].saw
    assert _by_check(await diagnose(client, [legacy.name], wire_format="redisson-legacy"))["format"].status == "ok"
    await make_queue(legacy.name, redis=client).offer("y", 60)  # a fast element beside it
    found = _by_check(await diagnose(client, [legacy.name], wire_format="redisson-legacy"))
    assert found["format"].status == "warn"
    assert "mixed" in found["format"].saw



async def test_a_sharded_queue_is_checked_shard_by_shard(make_client: Any, drop_keys: Any, qname: str) -> None:
    client = make_client()
    q: DelayedQueue[Any] = DelayedQueue(client, f"{qname}-sharded", shards=3)
    drop_keys(*QueueKeys.for_name(q.name).all, *(key for keys in q.shard_keys for key in keys.all))
    await q.offer_many([(i, 0) for i in range(3)])  # one due item on each shard, never moved
    await asyncio.sleep(0.3)
    lags = [f for f in await diagnose(client, [q.name], max_lag_s=0.2) if f.check == "lag"]
    assert [f.where for f in lags] == [keys.destination for keys in q.shard_keys]
    assert {f.status for f in lags} == {"fail"}
