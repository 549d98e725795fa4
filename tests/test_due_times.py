"""Due times of offers count from when the call was issued, not from when its script ran."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq._wire.clock import STALE_S, ServerClock
from tests.faults import pause_server
from tests.helpers import server_clock_at

DELAY_S = 60.0
DELAY_MS = 60_000


# -- the estimate (pure state) --------------------------------------------------------------------


def test_the_estimate_is_the_smallest_recent_upper_bound() -> None:
    clock = ServerClock()
    assert clock.server_ms(0.0) is None  # no reply yet: the script's clock is used
    # The server read 1 000 002 (whole ms: 1 000 002.0 to 1 000 002.999) between 10.000 and 10.004:
    # at 10.000 it was at most 1 000 002.999.
    clock.observe(sent=10.000, received=10.004, server_ms=1_000_002.0)
    assert clock.server_ms(10.0) == 1_000_002  # truncated as the server reads it; never behind
    clock.observe(sent=11.000, received=11.001, server_ms=1_000_999.0)  # a tighter bound, 3 ms lower
    assert clock.server_ms(12.0) == 1_001_999
    clock.observe(sent=12.000, received=12.010, server_ms=1_002_005.0)  # looser: ignored
    assert clock.server_ms(12.0) == 1_001_999


def test_a_server_clock_that_moved_ahead_restarts_the_estimate() -> None:
    clock = ServerClock()
    clock.observe(sent=1.0, received=1.001, server_ms=5_000.0)
    # 200 ms ahead of the estimate even at the reply's lower bound: a clock step or another node.
    clock.observe(sent=2.0, received=2.001, server_ms=6_200.0)
    assert clock.server_ms(2.0) == 6_200
    # Behind: the smaller upper bound wins at once.
    clock.observe(sent=3.0, received=3.001, server_ms=7_100.0)
    assert clock.server_ms(3.0) == 7_100


def test_a_stale_estimate_is_not_used() -> None:
    clock = ServerClock()
    clock.observe(sent=1.0, received=1.001, server_ms=5_000.0)
    assert clock.server_ms(1.0 + STALE_S) is not None
    assert clock.server_ms(1.002 + STALE_S) is None


# -- against a server whose commands are held --------------------------------------------------------


def _server_at(anchor: tuple[float, float], loop_time: float) -> float:
    return anchor[1] + (loop_time - anchor[0]) * 1000


async def _anchored(own_server: Any, make_client: Any, make_queue: Any, name: str, *,
                    warm: bool = True) -> tuple[Any, DelayedQueue[int], Redis, tuple[float, float]]:
    """A private server, a queue on a client of its own (its estimate anchored by one offer unless
    ``warm`` is false), an admin client, and an anchor of the server clock."""
    server = own_server()
    client, admin = make_client(server), make_client(server)
    q: DelayedQueue[int] = make_queue(name, redis=client)
    if warm:
        # The replies anchor the producer's estimate of the server clock; it keeps the tightest,
        # and the first one also paid for connecting and loading the script.
        for _ in range(3):
            await q.offer(-1, DELAY_S)
    # (loop time, server ms) read together: one slow reply would shift every expected due time.
    return server, q, admin, await server_clock_at(admin, asyncio.get_running_loop().time)


async def _offer_while_held(url: str, q: DelayedQueue[Any], hold_ms: int, n: int) -> tuple[list[int], float]:
    """Offer ``n`` items with ``offer_many`` while the server holds every command for ``hold_ms``;
    returns their due times and the loop time of the call."""
    await asyncio.to_thread(pause_server, url, hold_ms)
    issued = asyncio.get_running_loop().time()
    dues = await q.offer_many([(i, DELAY_S) for i in range(n)])
    return dues, issued


async def test_a_bulk_offer_held_up_by_the_server_counts_from_its_issue_time(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, admin, anchor = await _anchored(own_server, make_client, make_queue, "issued")
    dues, issued = await _offer_while_held(server.url, q, 400, 2500)  # three OFFER calls, all held
    expected = _server_at(anchor, issued) + DELAY_MS
    # Without the issue time every due would be >= 400 ms late; with it, within the measuring error
    # (the estimate's and the anchor's round trips, and a busy machine's lag).
    assert all(abs(due - expected) < 100 for due in dues), (min(dues) - expected, max(dues) - expected)
    scores = {int(s) for _, s in await admin.zrange(q.keys.timeout_set, 0, -1, withscores=True)}
    assert set(dues) <= scores  # what offer_many returned is what the zset holds


async def test_coalesced_offers_each_count_from_their_own_issue_time(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, _, anchor = await _anchored(own_server, make_client, make_queue, "coalesced")
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(pause_server, server.url, 400)
    # Ten offers 25 ms apart while the server holds every call: the first two go out in calls of
    # their own (two in flight), the eight later ones wait and go out together in a third.
    offers, issued = [], []
    for i in range(10):
        issued.append(loop.time())
        offers.append(asyncio.ensure_future(q.offer(i, DELAY_S)))
        await asyncio.sleep(0.025)
    dues = await asyncio.gather(*offers)
    for due, at in zip(dues, issued, strict=True):
        assert abs(due - (_server_at(anchor, at) + DELAY_MS)) < 100, (due, _server_at(anchor, at) + DELAY_MS)
    assert dues == sorted(dues)


async def test_a_first_offer_without_an_estimate_counts_from_the_script(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, _, anchor = await _anchored(own_server, make_client, make_queue, "first", warm=False)
    dues, issued = await _offer_while_held(server.url, q, 400, 10)  # no reply has anchored this client yet
    assert min(dues) >= _server_at(anchor, issued) + DELAY_MS + 250  # held 400 ms; with an estimate, ~0


async def test_an_issue_time_older_than_a_second_is_not_trusted(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, _, anchor = await _anchored(own_server, make_client, make_queue, "stale")
    dues, issued = await _offer_while_held(server.url, q, 1300, 10)
    # Held 1.3 s: the script's own clock counts (the bound is 1 s), so the items are late, not early.
    assert min(dues) >= _server_at(anchor, issued) + DELAY_MS + 1000
