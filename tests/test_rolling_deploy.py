"""Rolling deploys across the key and dead-letter formats (issue 11): the previous release, taken from
git history, consumes what this one writes, and this one reads what the previous one wrote."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

# The last commit before keys, the key index and dead-letter envelopes.
PREVIOUS_RELEASE = "f7ce44e"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's package, extracted from git history."""
    target = tmp_path_factory.mktemp("previous-release")
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "aiodelayq"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"previous release {PREVIOUS_RELEASE} not in this checkout's git history: {exc}")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True, timeout=60)
    return target


OLD_CONSUMER = textwrap.dedent("""
    import asyncio, json, sys
    from redis.asyncio import Redis
    import aiodelayq
    from aiodelayq import DelayedQueue

    async def main(url, name, count):
        assert "previous-release" in aiodelayq.__file__, aiodelayq.__file__
        async with DelayedQueue(Redis.from_url(url), name) as q:
            got = [await asyncio.wait_for(q.take(), 10) for _ in range(count)]
            print(json.dumps({"got": got, "dead": [d.hex() for d in await q.dead_letters()]}), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
""")


async def test_the_previous_release_consumes_keyed_items_and_sees_raw_dead_letters(
        previous_release: Path, redis_server: Any, client: Redis, make_queue: Any, qname: str) -> None:
    q = make_queue(codec="json", max_deliveries=1)
    # A dead letter in the new envelope.
    await q.offer("poison", 0)
    async with q:
        msg = await q.receive(visibility_timeout=30, timeout=5)
        assert msg is not None
        assert await msg.nack(dead_letter=True)
    [envelope] = await client.lrange(q.keys.dead_letter, 0, -1)
    # Keyed and unkeyed items, strict ones too, due while only the old release consumes.
    await q.offer_many([(i, 0.2) for i in range(5)], keys=[f"k{i}" for i in range(5)])
    await q.offer_many([(i, 0.2) for i in range(5, 10)])
    await make_queue(q.name, codec="json", strict=True).offer_many([(i, 0.2) for i in range(10, 15)],
                                                                   keys=[f"k{i}" for i in range(10, 15)])
    env = {**os.environ, "PYTHONPATH": str(previous_release)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", OLD_CONSUMER, redis_server.url, qname, "15",
                                                stdout=asyncio.subprocess.PIPE, env=env,
                                                cwd=previous_release)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    result = json.loads(out)
    assert sorted(result["got"]) == list(range(15))  # keyed elements are plain elements to it
    assert result["dead"] == [envelope.hex()]  # the old dead_letters() shows the envelope's raw bytes
    # Its transfer left the index entries behind: stale, so the keys read as absent and are free.
    assert await q.get("k0") is None
    assert (await q.offer("again", 60, key="k0")).added


async def test_what_the_previous_release_wrote_is_read(previous_release: Path, redis_server: Any,
                                                       make_queue: Any, qname: str) -> None:
    writer = textwrap.dedent("""
        import asyncio, sys
        from redis.asyncio import Redis
        import aiodelayq
        from aiodelayq import DelayedQueue

        async def main(url, name):
            assert "previous-release" in aiodelayq.__file__, aiodelayq.__file__
            client = Redis.from_url(url)
            q = DelayedQueue(client, name)
            await q.offer_many([(i, 0.1) for i in range(5)])
            await client.rpush(q.keys.dead_letter, b'"old-dead"')  # as its consumers wrote them: raw

        asyncio.run(main(sys.argv[1], sys.argv[2]))
    """)
    env = {**os.environ, "PYTHONPATH": str(previous_release)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", writer, redis_server.url, qname, env=env,
                                                cwd=previous_release)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    q = make_queue(codec="json")
    [letter] = await q.dead_letters()
    assert (letter.value, letter.reason) == ("old-dead", "unknown")
    assert (letter.delivery_count, letter.dead_at_ms) == (None, None)
    async with q:
        assert sorted([await asyncio.wait_for(q.take(), 5) for _ in range(5)]) == list(range(5))
    assert await q.requeue_dead_letters() == 1
