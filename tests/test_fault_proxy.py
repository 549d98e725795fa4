"""The test suite's fault-injection helpers (tests/faults.py: FaultProxy, stall_server, pause_server,
SubprocessConsumer) do what they claim, against real servers."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from aiodelayq.testing import ThrowawayServer
from tests.faults import FaultProxy, SubprocessConsumer, debug_args, pause_server, stall_server

# Run with the first server kind only: the test suite's own fault injection.
pytestmark = pytest.mark.once

if TYPE_CHECKING:  # only for annotations: pytest owns the conftest module
    from tests.conftest import ServerInfo

OwnServer = Callable[..., ThrowawayServer]
MakeClient = Callable[..., Redis]
MakeProxy = Callable[[ThrowawayServer], FaultProxy]


def _no_retry() -> Retry:
    # Explicit, because redis-py's defaults differ: Redis() retries connection errors (10 times in
    # 8.1), Redis.from_url() without `retry` does not; a retry would resend the command.
    return Retry(NoBackoff(), 0)


@pytest.fixture
def key() -> str:
    return f"aiodelayq-faults:{uuid.uuid4().hex[:12]}"


@pytest.fixture
def server(own_server: OwnServer) -> ThrowawayServer:
    """A private server: proxied connections and kills stay out of the session's server."""
    return own_server()


@pytest.fixture
def proxy(server: ThrowawayServer, make_proxy: MakeProxy) -> FaultProxy:
    return make_proxy(server)


@pytest.fixture
def direct(server: ThrowawayServer, make_client: MakeClient) -> Redis:
    return make_client(server)


async def test_proxy_forwards_normal_traffic(proxy: FaultProxy, direct: Redis, key: str,
                                             make_client: MakeClient) -> None:
    r = make_client(proxy)
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
    assert await r.set(key, "v")
    assert await r.get(key) == b"v"
    assert await direct.get(key) == b"v"  # really reached the server behind
    assert proxy.connections == 1
    assert proxy.bytes_up > 0
    assert proxy.bytes_down > 0


async def test_kill_after_send_applies_the_command_and_loses_the_reply(
        proxy: FaultProxy, direct: Redis, key: str, make_client: MakeClient) -> None:
    r = make_client(proxy, retry=_no_retry())
    await r.ping()  # the handshake passes before the fault is armed
    proxy.kill_after_send(b"INCR")
    with pytest.raises(RedisConnectionError):
        await r.incr(key)
    assert await direct.get(key) == b"1"  # applied, though the client saw only an error
    assert proxy.killed == 1
    assert await proxy.wait_killed_async(1, 1.0)
    # The fault fired once: the next INCR goes through on a fresh connection.
    assert await r.incr(key) == 2
    assert proxy.killed == 1


async def test_kill_after_send_times_and_disarm(proxy: FaultProxy, direct: Redis, key: str,
                                                make_client: MakeClient) -> None:
    r = make_client(proxy, retry=_no_retry())
    proxy.kill_after_send(b"INCR", times=2)
    for _ in range(2):
        with pytest.raises(RedisConnectionError):
            await r.incr(key)
    assert await r.incr(key) == 3
    assert proxy.killed == 2
    proxy.kill_after_send(b"INCR", times=5)
    assert proxy.disarm() == 5
    assert await r.incr(key) == 4
    assert await direct.get(key) == b"4"


def _recv_or_reset(sock: socket.socket) -> bytes:
    # A close may surface as EOF or as a reset, depending on what was still unread on either side.
    try:
        return sock.recv(64)
    except ConnectionResetError:
        return b""


def test_kill_after_send_matches_a_pattern_split_across_chunks(proxy: FaultProxy, server: ThrowawayServer,
                                                              key: str) -> None:
    k = key.encode()
    command = b"*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n" % (len(k), k)
    split = command.index(b"INCR") + 2  # "IN" | "CR..."
    proxy.kill_after_send(b"INCR")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(command[:split])
        # The proxy must have read the first half on its own before the second half is sent.
        assert proxy.wait_until(lambda p: p.bytes_up >= split, 5)
        sock.sendall(command[split:])
        assert proxy.wait_killed(1, 5)
        assert _recv_or_reset(sock) == b""  # closed, and the ":1" reply never arrived
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as direct_sock:
        direct_sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
        assert direct_sock.recv(64) == b"$1\r\n1\r\n"


async def test_kill_all_drops_connections_and_clients_reconnect(proxy: FaultProxy, key: str,
                                                                make_client: MakeClient) -> None:
    # With a retry, redis-py reconnects inside the call that met the dead connection.
    r1 = make_client(proxy, retry=Retry(NoBackoff(), 2))
    r2 = make_client(proxy, retry=Retry(NoBackoff(), 2))
    await r1.set(key, "v")
    await r2.ping()
    assert proxy.connections == 2
    assert proxy.kill_all() == 2
    assert proxy.connections == 0
    assert proxy.killed == 0  # only armed faults count as kills
    assert await r1.get(key) == b"v"
    assert proxy.connections == 1


async def test_kill_all_fails_a_client_without_retries(proxy: FaultProxy, make_client: MakeClient) -> None:
    r = make_client(proxy, retry=_no_retry())
    await r.ping()
    assert proxy.kill_all() == 1
    with pytest.raises(RedisConnectionError):
        await r.ping()
    assert await r.ping()  # the failed connection was discarded; a new one works


async def test_pause_holds_traffic_until_resume(proxy: FaultProxy, key: str, make_client: MakeClient) -> None:
    r = make_client(proxy)
    await r.set(key, "v")
    proxy.pause()
    get = asyncio.ensure_future(r.get(key))
    done, _ = await asyncio.wait({get}, timeout=0.3)
    assert not done  # held by the proxy, not failed
    proxy.resume()
    assert await asyncio.wait_for(get, 5) == b"v"


async def test_stall_resumes_by_itself(proxy: FaultProxy, key: str, make_client: MakeClient) -> None:
    r = make_client(proxy)
    await r.ping()
    loop = asyncio.get_running_loop()
    started = loop.time()
    proxy.stall(0.5)
    assert await asyncio.wait_for(r.ping(), 5)
    assert loop.time() - started >= 0.4
    started = loop.time()
    assert await r.ping()
    assert loop.time() - started < 0.4  # flowing again


def test_proxy_serves_a_subprocess_client_while_the_test_thread_blocks(proxy: FaultProxy, server: ThrowawayServer,
                                                                      key: str) -> None:
    source = (
        "import sys, redis\n"
        "r = redis.Redis.from_url(sys.argv[1])\n"
        "r.set(sys.argv[2], 'from-child')\n"
        "print('done', r.get(sys.argv[2]).decode(), flush=True)\n"
    )
    with SubprocessConsumer(source, args=[proxy.url, key]) as child:
        assert child.wait_for_line("done from-child", 20)
        assert child.wait(20) == 0
    with redis.Redis.from_url(server.url) as direct:
        assert direct.get(key) == b"from-child"


async def test_close_is_bounded_with_connections_open(server: ThrowawayServer, make_proxy: MakeProxy,
                                                      make_client: MakeClient) -> None:
    proxy = make_proxy(server)
    r = make_client(proxy, retry=_no_retry())
    await r.ping()
    proxy.pause()
    ping = asyncio.ensure_future(r.ping())
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < 2.0
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(ping, 5)
    with pytest.raises(RuntimeError):
        proxy.kill_all()
    proxy.close()  # idempotent


async def test_proxy_survives_a_server_restart(server: ThrowawayServer, proxy: FaultProxy,
                                               make_client: MakeClient) -> None:
    r = make_client(proxy)
    await r.ping()
    server.kill()
    with pytest.raises(RedisConnectionError):
        await r.ping()  # the proxy closes a client it cannot connect upstream
    server.start()  # same port
    assert await r.ping()


async def test_stall_server_blocks_other_clients(debug_server: ThrowawayServer, make_client: MakeClient) -> None:
    r = make_client(debug_server)
    await r.ping()  # connected beforehand: the handshake must not be what waits
    seconds = 1.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    thread = stall_server(debug_server.url, seconds)
    assert await asyncio.wait_for(r.ping(), seconds + 10)
    assert loop.time() - started >= 0.8 * seconds
    await asyncio.to_thread(thread.result, 10)


async def test_stall_server_without_the_debug_option_fails_clearly(own_server: OwnServer,
                                                                   redis_server: ServerInfo) -> None:
    if redis_server.kind is None:
        pytest.skip("needs a server process the tests own")
    if not debug_args(redis_server.kind):
        pytest.skip("this server kind allows DEBUG without an option")
    server = own_server()
    with pytest.raises(Exception, match="DEBUG"):
        stall_server(server.url, 1.0)


async def test_pause_server_holds_commands(server: ThrowawayServer, make_client: MakeClient) -> None:
    r = make_client(server)
    await r.ping()
    loop = asyncio.get_running_loop()
    started = loop.time()
    pause_server(server.url, 500)
    assert await asyncio.wait_for(r.ping(), 10)
    assert loop.time() - started >= 0.4


def test_subprocess_consumer_waits_for_ready_and_is_killed() -> None:
    with SubprocessConsumer("print('ready', flush=True); import time; time.sleep(60)") as child:
        assert child.wait_for_line("ready", 20) == "ready"
        assert child.poll() is None
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        assert child.lines == ["ready"]


async def test_subprocess_consumer_sigint_and_repo_on_path() -> None:
    source = (
        "import aiodelayq, time\n"
        "print('path', aiodelayq.__file__, flush=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    with SubprocessConsumer(source) as child:
        await child.await_line("ready", 20)
        path_line = child.wait_for_line(lambda line: line.startswith("path "), 1)
        assert "/aiodelayq/__init__.py" in path_line
        child.send_signal(signal.SIGINT)
        assert await child.await_exit(10) == -signal.SIGINT  # KeyboardInterrupt re-raises the signal
        assert "KeyboardInterrupt" in child.stderr


def test_subprocess_consumer_reports_a_line_that_never_comes() -> None:
    with SubprocessConsumer("import sys; print('hello'); sys.exit(3)") as child:
        with pytest.raises(AssertionError, match="stdout closed"):
            child.wait_for_line("ready", 20)
        assert child.wait(10) == 3
        assert child.lines == ["hello"]


def test_subprocess_consumer_is_killed_on_exit() -> None:
    with SubprocessConsumer("import time; print('ready'); time.sleep(60)") as child:
        child.wait_for_line("ready", 20)
    assert child.poll() == -signal.SIGKILL
