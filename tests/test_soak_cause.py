"""A delivery counted that no consumer saw, as the soak (``tests/stress/stress.py``) finds them.

A RECEIVE counts its deliveries when it runs. When its caller never gets the reply (every attempt's
reply lost within ``call_timeout_s``: ``BackendError`` with ``maybe_applied``), the queue undoes the
call by its id in the background (RELEASE_CALL). The undo finds the messages only while they are in
flight as that delivery: once their visibility deadline has passed, the next RECEIVE redelivers them
with the count raised, and an undo that lands after that finds nothing, so the count keeps a delivery
nobody saw. In the soak, stalls of the server or the network longer than the visibility timeout hold
the reply and the undo alike; here the proxy holds the undo.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import BackendError, DelayedQueue
from aiodelayq._scripts import QueueScripts
from tests.faults import FaultProxy
from tests.helpers import llen_is, server_past, until

CALL_TIMEOUT_S = 0.5


async def _receive_without_reply(q: DelayedQueue[str], proxy: FaultProxy, visibility_timeout: float) -> None:
    """``q.receive()`` runs on the server, and the reply of every attempt is lost: it raises."""
    proxy.kill_after_send(QueueScripts.receive.sha.encode(), times=1000)
    with pytest.raises(BackendError) as caught:
        await q.receive(visibility_timeout=visibility_timeout, timeout=5)
    assert caught.value.maybe_applied
    proxy.disarm()


async def _setup(own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any
                 ) -> tuple[FaultProxy, Redis, DelayedQueue[str], DelayedQueue[str]]:
    """A queue through a proxy (``q``), the same queue on a direct client (``other``), one item ready."""
    server = own_server()
    proxy = make_proxy(server)
    admin = make_client(server)
    q: DelayedQueue[str] = make_queue("lost", redis=make_client(proxy), codec="str", max_deliveries=3,
                                      call_timeout_s=CALL_TIMEOUT_S)
    other: DelayedQueue[str] = make_queue("lost", redis=make_client(server), codec="str", max_deliveries=3)
    await q.open()
    await other.open()
    await q.offer("warm", 0)  # loads RECEIVE on the server: every EVALSHA below runs
    warm = await q.receive(visibility_timeout=30.0, timeout=5)
    assert warm is not None
    assert await warm.ack(confirm=True)
    await q.offer("m", 0)
    await until(lambda: llen_is(admin, q, 1))
    return proxy, admin, q, other


async def test_an_undo_that_lands_before_the_deadline_gives_the_count_back(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any) -> None:
    proxy, admin, q, other = await _setup(own_server, make_proxy, make_client, make_queue)
    await _receive_without_reply(q, proxy, visibility_timeout=30.0)
    proxy.pause()  # the undo task has not run yet (it starts at this task's next await)
    try:
        assert await admin.zcard(q.keys.in_flight) == 1  # the RECEIVE ran: one delivery counted
    finally:
        proxy.resume()
    await until(lambda: llen_is(admin, q, 1), timeout_s=10)  # undone: back at the head of the list
    msg = await other.receive(visibility_timeout=30.0, timeout=5)
    assert msg is not None
    assert (msg.value, msg.delivery_count) == ("m", 1)


async def test_an_undo_that_lands_after_the_deadline_leaves_the_count_raised(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any) -> None:
    proxy, admin, q, other = await _setup(own_server, make_proxy, make_client, make_queue)
    await _receive_without_reply(q, proxy, visibility_timeout=1.0)
    # The undo task has not run yet (it starts at this task's next await): hold it in the proxy.
    proxy.pause()
    try:
        in_flight: list[tuple[bytes, float]] = await admin.zrange(q.keys.in_flight, 0, -1, withscores=True)
        [(element, deadline)] = in_flight
        await until(lambda: server_past(admin, int(deadline)), timeout_s=10)
        again = await other.receive(visibility_timeout=30.0, timeout=5)
    finally:
        proxy.resume()
    assert again is not None
    assert (again.value, again.delivery_count) == ("m", 2)  # delivery 1 was never seen
    # The undo lands now and finds nothing of its call in flight ('' recorded for the call id, whose
    # first 12 bytes are the message id's): the delivery nobody saw stays counted.
    calls: list[bytes] = await admin.zrange(q.keys.calls, 0, -1)
    [call_id] = [c for c in calls if c[:12] == element[4:16]]
    await until(lambda: _recorded_empty(admin, q, call_id), timeout_s=10)
    assert await again.ack(confirm=True) is True
    assert await admin.zcard(q.keys.in_flight) == 0
    assert await q.dead_letters() == []


async def _recorded_empty(admin: Redis, q: DelayedQueue[str], call_id: bytes) -> bool:
    return await admin.hget(q.keys.call_replies, call_id) == b""
