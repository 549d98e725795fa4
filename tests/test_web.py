"""The web examples (docs/examples) for real: uvicorn and aiohttp servers on free loopback ports, orders
POSTed with httpx, a worker process cancelling what falls due; then SIGTERM mid-load: clean exits,
every accepted order cancelled exactly once, nothing lost. Also Queues on its own (open/close order,
reopening, in-process workers)."""

from __future__ import annotations

import asyncio
import collections
import signal
import socket
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiodelayq import ConfigurationError, DelayedQueue, QueueNotOpenError, Queues
from tests.faults import REPO_ROOT
from tests.helpers import llen_is, until

EXAMPLES = REPO_ROOT / "docs" / "examples"
UNCLEAN = ("Task was destroyed", "Unclosed", "never awaited", "Traceback")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(redis_url: str, queue: str, cancelled: str, **extra: str) -> dict[str, str]:
    # ResourceWarnings (unclosed sockets, transports) are silent unless asked for. The orders' states
    # live beside the list of cancelled orders.
    return {"PYTHONPATH": f"{EXAMPLES}:{REPO_ROOT}", "REDIS_URL": redis_url, "ORDERS_QUEUE": queue,
            "ORDERS_CANCELLED": cancelled, "ORDERS_STATES": f"{cancelled}:states",
            "PYTHONWARNINGS": "always::ResourceWarning", **extra}


def _start_server(spawn: Any, kind: str, port: int, env: dict[str, str]) -> Any:
    if kind == "fastapi":
        source = "import sys; from uvicorn.main import main; sys.exit(main())"
        args = ["fastapi_orders:app", "--host", "127.0.0.1", "--port", str(port), "--app-dir", str(EXAMPLES)]
    else:
        source = f"import runpy, sys; sys.argv = ['aiohttp_orders.py', '--port', '{port}']; " \
                 f"runpy.run_path({str(EXAMPLES / 'aiohttp_orders.py')!r}, run_name='__main__')"
        args = []
    return spawn(source, args=args, env=env)


async def _serve(spawn: Any, kind: str, env: dict[str, str]) -> tuple[Any, int]:
    """The example app serving on a free port, and that port: a port another process took between
    :func:`_free_port` and the bind (tests run on two workers) is another port's try."""
    for _ in range(5):
        port = _free_port()
        child = _start_server(spawn, kind, port, env)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            try:
                await _wait_http(http, child)
            except AssertionError:
                if "address already in use" not in str(child.stderr):
                    raise
                continue
        return child, port
    raise AssertionError("no free port in 5 tries")


async def _wait_http(http: httpx.AsyncClient, child: Any) -> None:
    async def up() -> bool:
        assert child.poll() is None, f"server exited:\n{child.stderr}"
        try:
            await http.get("/")
        except httpx.TransportError:
            return False
        return True

    await until(up, timeout_s=30, interval_s=0.05)


async def _exited_cleanly(server: Any, kind: str) -> None:
    code = await server.await_exit(30)
    # uvicorn re-raises the SIGTERM it handled once it has shut down (the exit status then says
    # "terminated by SIGTERM", as without it); the log says whether the lifespan shutdown ran.
    assert code in ((0, -signal.SIGTERM) if kind == "fastapi" else (0,)), server.stderr
    if kind == "fastapi":
        assert "Application shutdown complete" in server.stderr, server.stderr
    assert not [w for w in UNCLEAN if w in server.stderr], server.stderr


async def _place(http: httpx.AsyncClient, ids: range, accepted: set[int], limit: asyncio.Semaphore) -> None:
    async def one(order_id: int) -> None:
        async with limit:
            try:
                response = await http.post(f"/orders/{order_id}")
            except httpx.TransportError:
                return  # the server is going away: this order was never accepted
        if response.status_code == 201:
            accepted.add(order_id)

    await asyncio.gather(*(one(i) for i in ids))


@pytest.mark.parametrize("kind", ["fastapi", "aiohttp"])
async def test_web_app_and_worker_process_deliver_each_order_once_through_sigterm(
        kind: str, client: Redis, make_queue: Any, spawn_consumer: Any, redis_server: Any, drop_keys: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="json")
    cancelled_key = f"{q.name}:cancelled"
    drop_keys(cancelled_key, f"{cancelled_key}:states")
    env = _env(redis_server.url, q.name, cancelled_key, CANCEL_AFTER_S="0.3")
    server, port = await _serve(spawn_consumer, kind, env)
    worker = spawn_consumer(f"import runpy; runpy.run_path({str(EXAMPLES / 'orders_worker.py')!r}, "
                            "run_name='__main__')", env=env)
    accepted: set[int] = set()
    paid: set[int] = set()
    limit = asyncio.Semaphore(20)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        # Steady traffic: orders placed; every fifth paid at once (its cancellation cancelled).
        await _place(http, range(0, 300), accepted, limit)
        for order_id in range(0, 300, 5):
            response = await http.post(f"/orders/{order_id}/paid")
            if response.status_code == 200:
                paid.add(order_id)
        assert len(accepted) == 300
        # Then SIGTERM in the middle of a burst.
        burst = asyncio.create_task(_place(http, range(300, 1300), accepted, limit))
        await until(lambda: len(accepted) >= 400, timeout_s=30)
        server.send_signal(signal.SIGTERM)
        await burst
    await _exited_cleanly(server, kind)
    assert 400 <= len(accepted) < 1300  # the burst was cut by the shutdown
    # Every accepted, unpaid order is cancelled exactly once by the worker process.
    expected = accepted - paid

    async def all_cancelled() -> bool:
        return len(await client.lrange(cancelled_key, 0, -1)) >= len(expected)

    await until(all_cancelled, timeout_s=60, interval_s=0.1)
    worker.send_signal(signal.SIGTERM)
    assert await worker.await_exit(30) == 0
    assert not [w for w in UNCLEAN if w in worker.stderr], worker.stderr
    done = collections.Counter(int(x) for x in await client.lrange(cancelled_key, 0, -1))
    assert set(done) == expected
    assert max(done.values()) == 1
    assert await q.counts() == type(await q.counts())(0, 0, 0, 0, None)


@pytest.mark.parametrize("kind", ["fastapi", "aiohttp"])
async def test_paying_twice_answers_the_same_and_409_means_the_order_was_cancelled(
        kind: str, client: Redis, make_queue: Any, spawn_consumer: Any, redis_server: Any, drop_keys: Any) -> None:
    q: DelayedQueue[Any] = make_queue(codec="json")
    cancelled_key = f"{q.name}:cancelled"
    drop_keys(cancelled_key, f"{cancelled_key}:states")
    env = _env(redis_server.url, q.name, cancelled_key, CANCEL_AFTER_S="0.5")
    server, port = await _serve(spawn_consumer, kind, env)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

        async def pay(order_id: int) -> tuple[int, Any]:
            response = await http.post(f"/orders/{order_id}/paid")
            return response.status_code, response.json() if response.status_code == 200 else response.text

        for order_id in (1, 2, 3):
            assert (await http.post(f"/orders/{order_id}")).status_code == 201
        # Paid in time, then paid again: the same answer, not "too late".
        assert [await pay(1), await pay(1)] == [(200, {"order_id": 1, "paid": True})] * 2
        # The cancellations of 2 and 3 fall due (this process's transfers move them; no worker runs).
        async with make_queue(q.name, codec="json") as mover:
            await until(lambda: llen_is(client, mover, 2), timeout_s=10)
        # Paid after its cancellation fell due, before any worker handled it: paid, twice.
        assert [await pay(3), await pay(3)] == [(200, {"order_id": 3, "paid": True})] * 2
        # The worker cancels 2, and leaves 3 (paid) and 1 (its cancellation was cancelled).
        worker = spawn_consumer(f"import runpy; runpy.run_path({str(EXAMPLES / 'orders_worker.py')!r}, "
                                "run_name='__main__')", env=env)
        await until(lambda: _counts_settle(q, pending=0, ready=0, in_flight=0), timeout_s=30, interval_s=0.05)
        assert await client.lrange(cancelled_key, 0, -1) == [b"2"]
        # Paid after the worker cancelled it: 409, every time; the others still answer paid.
        for _ in range(2):
            status, text = await pay(2)
            assert status == 409
            assert "too late: the order was cancelled" in text
        for order_id in (1, 3):
            assert await pay(order_id) == (200, {"order_id": order_id, "paid": True})
        server.send_signal(signal.SIGTERM)
    await _exited_cleanly(server, kind)
    worker.send_signal(signal.SIGTERM)
    assert await worker.await_exit(30) == 0
    assert not [w for w in UNCLEAN if w in worker.stderr], worker.stderr
    assert await client.lrange(cancelled_key, 0, -1) == [b"2"]
    assert await client.hgetall(f"{cancelled_key}:states") == {b"1": b"paid", b"2": b"cancelled", b"3": b"paid"}


async def _counts_settle(q: DelayedQueue[Any], **expected: int) -> bool:
    counts = await q.counts()
    return all(getattr(counts, name) == value for name, value in expected.items())


async def test_the_readme_example_runs_as_is(own_server: Any, spawn_consumer: Any) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    example = (EXAMPLES / "fastapi_minimal.py").read_text()
    assert f"```python\n{example}```" in readme
    assert len(example.splitlines()) <= 17
    server = own_server()
    port = _free_port()
    child = spawn_consumer("import sys; from uvicorn.main import main; sys.exit(main())",
                           args=["fastapi_minimal:app", "--port", str(port), "--app-dir", str(EXAMPLES)],
                           env={"REDIS_URL": server.url, "PYTHONWARNINGS": "always::ResourceWarning"})
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        await _wait_http(http, child)
        response = await http.post("/orders/42")
    assert response.status_code == 201
    assert response.json()["order_id"] == 42
    redis = Redis.from_url(server.url)
    try:
        q: DelayedQueue[Any] = DelayedQueue(redis, "orders:cancel-unpaid")
        pending = await q.get("order-42")
        assert pending is not None
        assert pending.value == {"order_id": 42}
    finally:
        await redis.aclose()
    child.send_signal(signal.SIGTERM)
    await _exited_cleanly(child, "fastapi")


# -- Queues on its own -------------------------------------------------------------------------------

async def test_queues_opens_in_order_and_reopens(redis_server: Any, qname: str, drop_keys: Any) -> None:
    # A URL (a plain client made at each open), or on a cluster a function making a cluster client.
    queues = Queues(redis_server.url) if not redis_server.cluster else \
        Queues(lambda: RedisCluster.from_url(redis_server.url))
    queues.add(qname, codec="json")
    dependency = queues.dependency(qname)
    with pytest.raises(QueueNotOpenError):
        queues[qname]
    made = []
    for round_ in range(2):  # a second open makes a new client and new queues
        async with queues:
            q = dependency()
            assert q is queues[qname]
            assert q.name == qname
            await q.offer({"round": round_}, 60)
            made.append((queues.client, q))
        assert not queues.is_open
    assert made[0][0] is not made[1][0]
    assert made[0][1] is not made[1][1]
    redis: Any = RedisCluster.from_url(redis_server.url) if redis_server.cluster else Redis.from_url(redis_server.url)
    try:
        assert await DelayedQueue(redis, qname).size() == 2
        await redis.delete(*DelayedQueue(redis, qname).keys.all)
    finally:
        await redis.aclose()
    with pytest.raises(ConfigurationError):
        queues.add(qname, codec="str")  # other options for a declared name
    with pytest.raises(ConfigurationError):
        queues.dependency("never-declared")


async def test_queues_run_workers_and_drain_them_before_closing(client: Redis, make_queue: Any) -> None:
    probe = make_queue(codec="json")  # deletes the keys after the test
    queues = Queues(client)  # a given client: used as is, not closed
    handled: list[int] = []
    release = asyncio.Event()

    async def handler(item: int) -> None:
        if item == 0:
            await release.wait()  # running when the group closes: drained, not cut off
        handled.append(item)

    queues.add_worker(probe.name, handler, concurrency=4, drain_timeout_s=10)
    async with queues:
        await queues[probe.name].offer_many([(i, 0) for i in range(10)])
        await until(lambda: len(handled) == 9, timeout_s=10)
        with pytest.raises(ConfigurationError):
            queues.add("late")
        closing = asyncio.create_task(queues.aclose())
        await until(lambda: queues.state == "closing" and queues.workers[0].state == "draining")
        release.set()
        await closing
    assert sorted(handled) == list(range(10))
    assert await client.ping()  # not closed: the group did not make it
    assert await probe.counts() == type(await probe.counts())(0, 0, 0, 0, None)
