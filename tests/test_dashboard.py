"""The web dashboard (``aiodelayq.dashboard``) for real: served by uvicorn and aiohttp on free loopback
ports, driven by httpx and by a headless Chromium (Selenium), against the session's server: the pages
show what Redis holds, the buttons act on it, POSTs need the CSRF token and a same-site origin,
read-only mode refuses them, and it works mounted under a prefix behind an app's own auth.

``python -m tests.test_dashboard screenshot docs/img/dashboard.png`` takes the docs' screenshot (a
throwaway server, a queue with pending items and dead letters, headless Chromium).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest
import uvicorn
from aiohttp import web
from redis.asyncio import Redis

from aiodelayq import DelayedQueue, QueueKeys
from aiodelayq.dashboard import CannotListen, Dashboard, serve
from aiodelayq.dashboard._auth import SESSION_COOKIE, SESSION_TTL_S, TokenGate
from aiodelayq.dashboard._http import CSRF_COOKIE, CSRF_FIELD
from aiodelayq.dashboard._http import Request as HttpRequest
from tests.helpers import free_socket, until

# Run with the first server kind only: pages and HTTP over the queue's calls, which the modules of
# those calls run on every server kind.
pytestmark = pytest.mark.once

BROWSER_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")


# -- serving ---------------------------------------------------------------------------------------------


@pytest.fixture(params=["asgi", "aiohttp"])
async def served(request: pytest.FixtureRequest, serve_asgi: Any, serve_aiohttp: Any
                 ) -> Callable[[Dashboard], Awaitable[str]]:
    """``await served(dashboard)``: the dashboard alone, by uvicorn (ASGI) or by aiohttp; its base URL
    with a trailing slash."""

    async def start(dashboard: Dashboard) -> str:
        if request.param == "asgi":
            return await serve_asgi(dashboard.asgi_app()) + "/"
        return await serve_aiohttp(dashboard.aiohttp_app()) + "/"

    return start


# -- reading pages -----------------------------------------------------------------------------------------


class Page(HTMLParser):
    """What the tests read of a dashboard page: the index's rows, the queue page's counts, charts,
    forms and links, and the text."""

    def __init__(self, html: str, url: str) -> None:
        super().__init__()
        self.html = html
        self.url = url
        self.rows: dict[str, dict[str, str]] = {}
        self.counts: dict[str, str] = {}
        self.charts: dict[str, list[int]] = {}
        self.forms: list[dict[str, Any]] = []
        self.links: list[str] = []
        self.stylesheets: list[str] = []
        self.text_parts: list[str] = []
        self._row: str | None = None
        self._chart: str | None = None
        self._in_counts = False
        self.feed(html)
        self.text = " ".join(" ".join(self.text_parts).split())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-queue" in a:
            self._row = a["data-queue"]
            self.rows[self._row] = {}
        elif "data-field" in a and "data-value" in a:
            if self._row is not None:
                self.rows[self._row][a["data-field"]] = a["data-value"]
            elif self._in_counts:
                self.counts[a["data-field"]] = a["data-value"]
        if tag == "section" and a.get("class") == "counts":
            self._in_counts = True
        if tag == "svg" and "data-chart" in a:
            self._chart = a["data-chart"]
            self.charts[self._chart] = []
        elif tag == "rect" and self._chart is not None:
            self.charts[self._chart].append(int(a["data-count"]))
        elif tag == "form":
            self.forms.append({"action": urljoin(self.url, a.get("action", "")), "method": a.get("method", "get"),
                               "fields": {}, "buttons": []})
        elif tag == "input" and self.forms and a.get("type") != "checkbox":
            self.forms[-1]["fields"][a.get("name", "")] = a.get("value", "")
        elif tag == "button" and self.forms:
            self.forms[-1]["buttons"].append(a.get("name", ""))
        elif tag == "a" and "href" in a:
            self.links.append(urljoin(self.url, a["href"]))
        elif tag == "link" and a.get("rel") == "stylesheet":
            self.stylesheets.append(urljoin(self.url, a["href"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "section":
            self._in_counts = False
        elif tag == "svg":
            self._chart = None

    def handle_data(self, data: str) -> None:
        self.text_parts.append(data)

    def form(self, button: str) -> dict[str, Any]:
        """The form with the button named ``button``."""
        [found] = [f for f in self.forms if button in f["buttons"]]
        return found


async def get_page(http: httpx.AsyncClient, url: str, status: int = 200) -> Page:
    response = await http.get(url)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    return Page(response.text, str(response.url))


async def submit(http: httpx.AsyncClient, page: Page, button: str, **extra: str) -> httpx.Response:
    """Submit the form of ``button`` as a browser would (its fields, the cookie), without following."""
    form = page.form(button)
    return await http.post(form["action"], data={**form["fields"], **extra})


def queue_url(base: str, name: str, **params: str) -> str:
    return str(httpx.URL(urljoin(base, "queue"), params={"name": name, **params}))


async def dead_letters(q: DelayedQueue[Any], n: int) -> None:
    """``n`` due items received and nacked to the dead-letter list (reason ``nacked``)."""
    await q.offer_many([({"bad": i}, 0) for i in range(n)])
    async with q:
        got: list[Any] = []
        while len(got) < n:
            got += await q.receive_many(n - len(got), 30, timeout=10)
        for msg in got:
            await msg.nack(dead_letter=True)
    assert (await q.counts()).dead_letters == n


# -- the pages -----------------------------------------------------------------------------------------------


async def test_the_index_lists_a_queue_and_its_counts(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 2)
    await q.offer_many([({"order": i}, 3600) for i in range(3)])
    await q.set_rate_limit(5)
    await q.pause()
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        index = await get_page(http, base)
        row = index.rows[q.name]
        assert {k: row[k] for k in ("pending", "ready", "in_flight", "dead_letters", "paused", "rate_limit")} == {
            "pending": "3", "ready": "0", "in_flight": "0", "dead_letters": "2", "paused": "yes", "rate_limit": "5.0"}
        assert int(row["lag"]) == 0
        # The stylesheet is the app's own, and the queue's link leads to its page.
        [css] = index.stylesheets
        response = await http.get(css)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/css")
        assert queue_url(base, q.name) in index.links
        page = await get_page(http, queue_url(base, q.name))
    assert page.counts["pending"] == "3"
    assert page.counts["dead_letters"] == "2"
    assert "5/s (burst 5)" in page.text
    assert "nacked" in page.text
    assert '{"bad":0}' in page.text


async def test_a_sharded_queue_is_one_row_and_one_page_over_all_its_shards(client: Redis, drop_keys: Any,
                                                                             qname: str, served: Any) -> None:
    q: DelayedQueue[Any] = DelayedQueue(client, f"{qname}-sharded", shards=3)
    drop_keys(*QueueKeys.for_name(q.name).all, *(key for keys in q.shard_keys for key in keys.all))
    await q.offer_many([(i, 7 * 60) for i in range(6)] + [(i, 50 * 60) for i in range(3)])  # 3 to each shard
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        index = await get_page(http, base)
        page = await get_page(http, queue_url(base, q.name))
    assert index.rows[q.name]["pending"] == "9"
    assert not [name for name in index.rows if name.startswith(f"{q.name}:")]  # the shards are not queues of their own
    assert page.counts["pending"] == "9"
    assert page.charts["hour"][1] == 6  # due in 7 min: (5, 10], on every shard
    assert page.charts["hour"][9] == 3  # due in 50 min: (45, 50]


async def test_a_queue_recorded_with_shards_placed_by_their_names_is_one_page_too(client: Redis, drop_keys: Any,
                                                                                    qname: str, served: Any) -> None:
    # A record of the count alone places shard i at {name:i}: the page's counts and charts read there.
    name = f"{qname}-hashed"
    hashed = [f"{{{name}:{i}}}" for i in range(3)]
    drop_keys(*(key for n in (name, *hashed) for key in QueueKeys.for_name(n).all))
    await client.hset(QueueKeys.for_name(name).controls, "shards", "3")
    for shard in hashed:
        await DelayedQueue(client, shard).offer("x", 7 * 60)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        index = await get_page(http, base)
        page = await get_page(http, queue_url(base, name))
    assert index.rows[name]["pending"] == "3"
    assert page.counts["pending"] == "3"
    assert page.charts["hour"][1] == 3


async def test_a_post_needs_the_csrf_token_and_a_same_site_origin(client: Redis, make_queue: Any,
                                                                   served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 3600)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        page = await get_page(http, queue_url(base, q.name))
        assert CSRF_COOKIE in http.cookies
        form = page.form("pause")
        assert form["fields"][CSRF_FIELD] == http.cookies[CSRF_COOKIE]
        without_token = {k: v for k, v in form["fields"].items() if k != CSRF_FIELD}
        refused = [
            await http.post(form["action"], data=without_token),
            await http.post(form["action"], data={**form["fields"], CSRF_FIELD: "x" * 43}),
            await http.post(form["action"], data=form["fields"], headers={"Origin": "http://evil.example"}),
            await http.post(form["action"], data=form["fields"], headers={"Origin": "null"}),
            await http.post(form["action"], data=form["fields"], headers={"Sec-Fetch-Site": "cross-site"}),
        ]
        # The token of the form without the cookie (another browser's page) is refused too.
        async with httpx.AsyncClient(timeout=10) as stranger:
            refused.append(await stranger.post(form["action"], data=form["fields"]))
        assert [r.status_code for r in refused] == [403] * 6
        assert not (await q.counts()).paused

        origin = base.rstrip("/")
        paused = await submit(http, page, "pause")
        assert paused.status_code == 303, paused.text
        assert (await q.counts()).paused
        after = await get_page(http, urljoin(str(paused.url), paused.headers["location"]))
        assert "Paused" in after.text
        resumed = await http.post(after.form("resume")["action"], data=after.form("resume")["fields"],
                                  headers={"Origin": origin})
        assert resumed.status_code == 303
        assert not (await q.counts()).paused


async def test_dead_letters_are_requeued_and_purged(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 5)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10, follow_redirects=True) as http:
        page = await get_page(http, queue_url(base, q.name))
        assert page.text.count("nacked") == 5
        requeued = await submit(http, page, "requeue", limit="2", delay="600")
        assert requeued.status_code == 200
        assert [r.status_code for r in requeued.history] == [303]
        counts = await q.counts()
        assert (counts.dead_letters, counts.pending) == (3, 2)
        page = Page(requeued.text, str(requeued.url))
        assert "Requeued 2 dead letter(s)." in page.text
        assert page.counts["pending"] == "2"
        # Bad numbers are a 400, and nothing moves.
        bad = [await submit(http, page, "requeue", limit="two"), await submit(http, page, "requeue", delay="-1"),
               await submit(http, page, "requeue", delay="nan")]
        assert [r.status_code for r in bad] == [400] * 3
        # Purging needs its box ticked.
        unconfirmed = await submit(http, page, "purge")
        assert unconfirmed.status_code == 400
        assert (await q.counts()).dead_letters == 3
        purged = await submit(http, page, "purge", confirm="yes")
        assert purged.status_code == 200
        assert "Purged 3 dead letter(s)." in Page(purged.text, str(purged.url)).text
    assert (await q.counts()).dead_letters == 0


async def test_read_only_shows_no_buttons_and_refuses_every_post(client: Redis, make_queue: Any,
                                                                   served: Any) -> None:
    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 1)
    base = await served(Dashboard(client, read_only=True))
    async with httpx.AsyncClient(timeout=10) as http:
        page = await get_page(http, queue_url(base, q.name))
        assert "read-only" in page.text
        assert [f["method"] for f in page.forms] == ["get"]  # the search only
        assert CSRF_COOKIE not in http.cookies
        http.cookies.set(CSRF_COOKIE, "a" * 43)  # a token, as a page would give: still refused
        for action in ("pause", "resume", "requeue", "purge"):
            response = await http.post(urljoin(base, action), data={"queue": q.name, "confirm": "yes",
                                                                    CSRF_FIELD: "a" * 43})
            assert response.status_code == 403, action
    counts = await q.counts()
    assert not counts.paused
    assert counts.dead_letters == 1


async def test_the_charts_count_pending_items_by_due_time(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    # Due in 1 min (x2), 7 min (x3), 3 h 30 (x1) and 30 h (x1): the first 5-minute bar, the second,
    # the first hour (5), the fourth hour, and later.
    await q.offer_many([("a", 60), ("b", 60), ("c", 420), ("d", 420), ("e", 420), ("f", 12_600), ("g", 108_000)])
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        page = await get_page(http, queue_url(base, q.name))
    assert page.charts["hour"] == [2, 3] + [0] * 10
    assert page.charts["day"] == [5, 0, 0, 1] + [0] * 20
    assert re.search(r"due later than 24 hours: 1\b", page.text)


async def test_a_pending_item_is_found_by_its_key(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer({"order": 42}, 1800, key="order-42", group="acme")
    await q.offer({"order": 43}, 1800)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        found = await get_page(http, queue_url(base, q.name, key="order-42"))
        missing = await get_page(http, queue_url(base, q.name, key="order-7"))
        too_long = await http.get(queue_url(base, q.name, key="k" * 1025))
    [result] = re.findall(r'<tr data-found="yes">(.*?)</tr>', found.html, re.S)
    assert "order-42" in result
    assert "{&#34;order&#34;:42}" in result  # escaped
    assert 'data-group="acme"' in result
    assert found.counts["groups"] == "0"  # pending: no group has a due item waiting
    assert 'data-found="no"' in missing.html
    assert "No pending item has the key order-7" in missing.text
    assert too_long.status_code == 400


async def test_bad_requests_and_unknown_queues_get_their_pages(client: Redis, make_queue: Any,
                                                               served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 60)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        for url, status in [(queue_url(base, q.name + "-nope"), 404), (urljoin(base, "queue"), 400),
                            (urljoin(base, "nowhere"), 404), (queue_url(base, q.name, peek="lots"), 400),
                            (queue_url(base, q.name, peek="0"), 400), (urljoin(base, "?refresh=7"), 400)]:
            page = await get_page(http, url, status)
            assert "Back to the queues" in page.text, url
        page = await get_page(http, queue_url(base, q.name))
        form = page.form("pause")
        as_json = await http.post(form["action"], json=form["fields"])
        no_queue = await http.post(form["action"], data={**form["fields"], "queue": ""})
        unknown = await http.post(form["action"], data={**form["fields"], "queue": q.name + "-nope"})
        wrong_method = await http.put(urljoin(base, "pause"))
        too_large = await http.post(form["action"], data={**form["fields"], "pad": "x" * 70_000})
        refreshing = await get_page(http, urljoin(base, "?refresh=30"))
    assert [as_json.status_code, no_queue.status_code, unknown.status_code, wrong_method.status_code,
            too_large.status_code] == [400, 400, 404, 405, 413]
    assert wrong_method.headers["allow"] == "POST"
    assert not (await q.counts()).paused
    assert q.name in refreshing.rows


async def test_a_list_of_queues_shows_those_only(client: Redis, make_queue: Any, served: Any, qname: str) -> None:
    shown: DelayedQueue[Any] = make_queue(qname + "-shown")
    hidden: DelayedQueue[Any] = make_queue(qname + "-hidden")
    await hidden.offer("x", 60)
    base = await served(Dashboard(client, queues=[shown.name]))
    async with httpx.AsyncClient(timeout=10) as http:
        index = await get_page(http, base)
        empty = await get_page(http, queue_url(base, shown.name))  # given: shown even with no key
        await get_page(http, queue_url(base, hidden.name), 404)
    assert list(index.rows) == [shown.name]
    assert empty.counts["pending"] == "0"


@pytest.mark.waits
async def test_redis_not_answering_is_a_503_page(served: Any) -> None:
    with free_socket() as closed:
        port = closed.getsockname()[1]
    redis = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1)
    try:
        base = await served(Dashboard(redis, queues=["orders"]))
        async with httpx.AsyncClient(timeout=30) as http:
            page = await get_page(http, base, 503)
    finally:
        await redis.aclose()
    assert "Redis did not answer" in page.text


async def test_a_queue_name_of_any_characters_round_trips(client: Redis, make_queue: Any, served: Any,
                                                           qname: str) -> None:
    q: DelayedQueue[Any] = make_queue(qname + " {tag} a&b=c#d/é?x=1%20")
    await q.offer("x", 600)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        index = await get_page(http, base)
        assert q.name in index.rows
        [link] = [url for url in index.links if parse_qs(urlsplit(url).query).get("name") == [q.name]]
        assert link.startswith(urljoin(base, "queue?name="))
        page = await get_page(http, link)
        assert page.counts["pending"] == "1"
        paused = await submit(http, page, "pause")
        assert paused.status_code == 303
        after = await get_page(http, urljoin(str(paused.url), paused.headers["location"]))
    assert after.counts["pending"] == "1"
    assert (await q.counts()).paused


async def test_the_queue_page_shows_its_last_events_newest_first(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        await q.offer_many([(i, 600) for i in range(3)])
        off = await get_page(http, queue_url(base, q.name))
        await q.set_events(1000)
        await q.offer_many([(i, 600) for i in range(60)], keys=[f"order-{i}" for i in range(60)], groups=["acme"] * 60)
        assert await q.cancel("order-59")
        on = await get_page(http, queue_url(base, q.name))
    assert "No events" in off.text
    rows = re.findall(r'<tr data-kind="(\w+)">(.*?)</tr>', on.html, re.S)
    assert len(rows) == 50
    assert rows[0][0] == "cancelled"
    assert "order-59" in rows[0][1]
    assert "acme" in rows[0][1]
    assert [kind for kind, _ in rows[1:]] == ["offered"] * 49
    assert ["order-59" in rows[1][1], "order-58" in rows[2][1]] == [True, True]


async def test_the_minimal_acl_and_scan_are_all_it_needs(own_server: Any, make_client: Any, served: Any) -> None:
    from aiodelayq._redis.acl import minimal_acl_rules

    server = own_server()
    admin = make_client(server)
    await admin.execute_command("ACL", "SETUSER", "dashboard", "on", ">pw", *minimal_acl_rules("orders"), "+scan")
    user = make_client(server, username="dashboard", password="pw")
    orders: DelayedQueue[Any] = DelayedQueue(user, "orders", max_deliveries=3)
    await dead_letters(orders, 2)
    await orders.offer_many([(i, 600) for i in range(3)])
    await DelayedQueue(admin, "payroll").offer(1, 600)  # another team's queue: found, not readable
    base = await served(Dashboard(user))
    async with httpx.AsyncClient(timeout=10, follow_redirects=True) as http:
        index = await get_page(http, base)
        assert index.rows["orders"]["pending"] == "3"
        assert "permission" in index.rows["payroll"]["error"]
        page = await get_page(http, queue_url(base, "orders"))
        assert page.charts["hour"][1] == 3  # due in 10 min: (5, 10]
        page = await get_page(http, str((await submit(http, page, "pause")).url))
        page = await get_page(http, str((await submit(http, page, "requeue", limit="1")).url))
        await submit(http, page, "purge", confirm="yes")
        refused = await get_page(http, queue_url(base, "payroll"), 503)
    counts = await orders.counts()
    assert (counts.paused, counts.pending, counts.dead_letters) == (True, 4, 0)
    assert "Redis refused the call" in refused.text
    await orders.aclose()


def test_a_client_that_decodes_or_a_bad_queue_list_is_refused() -> None:
    from aiodelayq import ConfigurationError

    with pytest.raises(ConfigurationError, match="decode_responses"):
        Dashboard(Redis(decode_responses=True))
    with pytest.raises(ConfigurationError, match="list of names"):
        Dashboard(Redis(), queues="orders")
    with pytest.raises(ConfigurationError, match="empty"):
        Dashboard(Redis(), queues=["orders", ""])


# -- mounted in an app, behind its auth --------------------------------------------------------------------

AUTH = {"Authorization": "Bearer s3cret"}


async def _walk_mounted(http: httpx.AsyncClient, base: str, q: DelayedQueue[Any]) -> None:
    """Through the app's auth: the index under the mount, a relative link to the queue page, the
    stylesheet, the pause form and its redirect: every URL resolved from the page it is on."""
    assert (await http.get(base, headers={})).status_code == 401
    http.headers.update(AUTH)
    bare = await http.get(base.rstrip("/"))
    assert bare.status_code in (307, 308)
    assert urljoin(str(bare.url), bare.headers["location"]) == base
    index = await get_page(http, base)
    [link] = [url for url in index.links if "name=" in url]
    assert link == queue_url(base, q.name)
    page = await get_page(http, link)
    assert page.counts["pending"] == "1"
    [css] = page.stylesheets
    assert css == urljoin(base, "static/dashboard.css")
    assert (await http.get(css)).status_code == 200
    cookie = next(c for c in http.cookies.jar if c.name == CSRF_COOKIE)
    assert cookie.path == urlsplit(base).path
    paused = await submit(http, page, "pause")
    assert paused.status_code == 303
    after = urljoin(str(paused.url), paused.headers["location"])
    assert after.startswith(queue_url(base, q.name))
    assert (await get_page(http, after)).counts["pending"] == "1"
    assert (await q.counts()).paused


async def test_mounted_under_a_prefix_in_fastapi_behind_its_auth(client: Redis, make_queue: Any,
                                                                 serve_asgi: Any) -> None:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 3600)
    app = FastAPI()

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Any:
        if request.url.path.startswith("/admin/") and request.headers.get("authorization") != AUTH["Authorization"]:
            return JSONResponse({"detail": "not authenticated"}, status_code=401)
        return await call_next(request)

    app.mount("/admin/queues", Dashboard(client).asgi_app())
    base = await serve_asgi(app)
    async with httpx.AsyncClient(timeout=10) as http:
        await _walk_mounted(http, base + "/admin/queues/", q)


async def test_mounted_as_an_aiohttp_subapp_behind_its_auth(client: Redis, make_queue: Any,
                                                           serve_aiohttp: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 3600)

    @web.middleware
    async def require_token(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/admin/") and request.headers.get("Authorization") != AUTH["Authorization"]:
            raise web.HTTPUnauthorized()
        return await handler(request)

    admin = web.Application()
    admin.add_subapp("/queues", Dashboard(client).aiohttp_app())
    app = web.Application(middlewares=[require_token])
    app.add_subapp("/admin", admin)
    base = await serve_aiohttp(app)
    async with httpx.AsyncClient(timeout=10) as http:
        await _walk_mounted(http, base + "/admin/queues/", q)


@pytest.mark.topology
async def test_on_a_cluster_the_index_finds_queues_on_every_primary(cluster: Any, cluster_clients: Any,
                                                                    serve_asgi: Any, qname: str) -> None:
    rc = cluster_clients(cluster)
    queues: list[DelayedQueue[Any]] = [DelayedQueue(rc, f"{qname}-{i}") for i in range(6)]  # over several slots
    try:
        for i, q in enumerate(queues):
            await q.offer_many([(n, 60 + 3600 * n) for n in range(i + 1)])
        base = await serve_asgi(Dashboard(rc).asgi_app()) + "/"
        async with httpx.AsyncClient(timeout=10) as http:
            index = await get_page(http, base)
            assert {name: row["pending"] for name, row in index.rows.items() if name.startswith(qname)} == {
                q.name: str(i + 1) for i, q in enumerate(queues)}
            page = await get_page(http, queue_url(base, queues[5].name))
            assert page.charts["day"][:6] == [1] * 6
            assert (await submit(http, page, "pause")).status_code == 303
        assert (await queues[5].counts()).paused
    finally:
        for q in queues:
            await q.clear()
            await rc.delete(*q.keys.all)
            await q.aclose()


# -- a token: a bearer token, or a login and its session --------------------------------------------------

TOKEN = "the-dashboard-token-of-the-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
FORGED_CSRF = "a" * 43  # a well-formed double-submit token: anyone can make one, and a cookie to match


def session_cookies(response: httpx.Response) -> list[str]:
    """The ``Set-Cookie`` values of a response that set (or delete) the session cookie."""
    return [value for value in response.headers.get_list("set-cookie") if value.startswith(SESSION_COOKIE + "=")]


async def log_in(http: httpx.AsyncClient, url: str, token: str = TOKEN) -> httpx.Response:
    """Log in as a browser does: ``url`` answers 401 with the login form, posted with ``token``."""
    page = await get_page(http, url, 401)
    form = page.form("login")
    return await http.post(form["action"], data={**form["fields"], "token": token})


async def test_with_a_token_every_request_without_it_gets_401_and_the_login_form(client: Redis, make_queue: Any,
                                                                                 served: Any) -> None:
    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 1)
    base = await served(Dashboard(client, token=TOKEN))
    action = {"queue": q.name, "confirm": "yes"}
    async with httpx.AsyncClient(timeout=10) as http:
        asked = [("GET", base), ("GET", queue_url(base, q.name)), ("HEAD", base), ("GET", urljoin(base, "nowhere")),
                 ("GET", urljoin(base, "login")), ("POST", urljoin(base, "purge")), ("POST", urljoin(base, "pause")),
                 ("POST", urljoin(base, "logout"))]
        for method, url in asked:
            response = await http.request(method, url, data=action if method == "POST" else None)
            assert response.status_code == 401, (method, url)
            assert response.headers["www-authenticate"] == 'Bearer realm="aiodelayq dashboard"'
        page = await get_page(http, queue_url(base, q.name), 401)
        assert page.form("login")["fields"]["next"] == queue_url(base, q.name)[len(base):]  # back here after
        assert q.name not in page.text  # nothing of Redis
        assert (page.rows, page.counts) == ({}, {})
        # The stylesheet is the package's own file: the login page uses it.
        [css] = page.stylesheets
        assert (await http.get(css)).status_code == 200
        # A wrong token, in any scheme, is no token.
        wrong = [{"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Bearer {TOKEN[:-1]}"},
                 {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}, {"Authorization": "Bearer"}]
        for headers in wrong:
            assert (await http.get(base, headers=headers)).status_code == 401, headers
            assert (await http.post(urljoin(base, "purge"), data=action, headers=headers)).status_code == 401
        assert (await q.counts()).dead_letters == 1
        # The token as a bearer token: the pages, and the actions without a CSRF token (no browser
        # sends an Authorization header by itself).
        index = await http.get(base, headers=BEARER)
        assert index.status_code == 200
        assert Page(index.text, base).rows[q.name]["dead_letters"] == "1"
        assert (await http.get(base, headers={"authorization": f"bearer  {TOKEN}"})).status_code == 200
        purged = await http.post(urljoin(base, "purge"), data=action, headers=BEARER)
        assert purged.status_code == 303, purged.text
    assert (await q.counts()).dead_letters == 0


async def test_a_browser_logs_in_with_the_form_and_holds_a_session_that_is_not_the_token(client: Redis,
                                                                                         make_queue: Any,
                                                                                         served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 3600)
    base = await served(Dashboard(client, token=TOKEN))
    async with httpx.AsyncClient(timeout=10) as http:
        wrong = await log_in(http, queue_url(base, q.name), "not-the-token-of-this-dashboard")
        assert wrong.status_code == 401
        assert "That is not the token." in Page(wrong.text, str(wrong.url)).text
        assert session_cookies(wrong) == []
        logged_in = await log_in(http, queue_url(base, q.name))
        assert logged_in.status_code == 303, logged_in.text
        assert urljoin(base, logged_in.headers["location"]) == queue_url(base, q.name)  # the page asked for
        [cookie] = session_cookies(logged_in)
        assert [part.strip() for part in cookie.split(";")[1:]] == ["Path=/", "HttpOnly", "SameSite=Strict",
                                                                    "Max-Age=43200"]
        session = http.cookies[SESSION_COOKIE]
        assert TOKEN not in session
        again = await http.get(urljoin(base, "login"))  # logged in: the login page leads to the index
        assert (again.status_code, again.headers["location"]) == (303, "./")
        # Logged in: the pages, and an action through its form.
        page = await get_page(http, queue_url(base, q.name))
        assert page.counts["pending"] == "1"
        paused = await submit(http, page, "pause")
        assert paused.status_code == 303, paused.text
        assert (await q.counts()).paused
        # Each login is a new session.
        async with httpx.AsyncClient(timeout=10) as other:
            assert (await log_in(other, base)).status_code == 303
            assert other.cookies[SESSION_COOKIE] != session
        # Logging out deletes the cookie and ends the session: the pages are the login form again,
        # even to a copy of the cookie.
        after = await get_page(http, urljoin(base, paused.headers["location"]))
        out = await submit(http, after, "logout")
        assert out.status_code == 303
        assert [c.split(";")[0] for c in session_cookies(out)] == [f"{SESSION_COOKIE}="]
        assert SESSION_COOKIE not in http.cookies
        await get_page(http, base, 401)
        assert (await http.get(base, headers={"Cookie": f"{SESSION_COOKIE}={session}"})).status_code == 401


async def test_a_forged_post_changes_nothing(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 2)
    base = await served(Dashboard(client, token=TOKEN))
    purge = urljoin(base, "purge")
    forged = {"queue": q.name, "confirm": "yes", CSRF_FIELD: FORGED_CSRF}
    statuses = []
    # What purged every dead letter of a dashboard off loopback: a self-made double-submit cookie and
    # its form field, as curl sends them from any host.
    async with httpx.AsyncClient(timeout=10) as forger:
        statuses.append((await forger.post(purge, data=forged, headers={"Cookie": f"{CSRF_COOKIE}={FORGED_CSRF}"}))
                        .status_code)
        # A session cookie of the right shape, not signed with this token; one of a dashboard with
        # another token; one of this token, expired.
        made_up = f"{int(time.time())}.{'b' * 22}.{'c' * 43}"
        other = await served(Dashboard(client, token=TOKEN + "-other"))
        assert (await log_in(forger, other, TOKEN + "-other")).status_code == 303
        another = forger.cookies[SESSION_COOKIE]
        forger.cookies.clear()
        stale = TokenGate(TOKEN, clock=lambda: time.time() - SESSION_TTL_S - 120).new_session(
            HttpRequest("POST", "/login", "", {})).split(";")[0].partition("=")[2]
        for session in (made_up, another, stale):
            cookie = f"{SESSION_COOKIE}={session}; {CSRF_COOKIE}={FORGED_CSRF}"
            statuses.append((await forger.post(purge, data=forged, headers={"Cookie": cookie})).status_code)
    # Logged in, a browser is still safe from other pages: a form with a made-up CSRF token and its
    # cookie (a page of another port of this host can set one), or the right form from another origin.
    async with httpx.AsyncClient(timeout=10) as victim:
        assert (await log_in(victim, base)).status_code == 303
        page = await get_page(victim, queue_url(base, q.name))
        victim.cookies.set(CSRF_COOKIE, FORGED_CSRF)
        statuses.append((await victim.post(purge, data=forged)).status_code)
        statuses.append((await victim.post(purge, data={**forged, CSRF_FIELD: ""})).status_code)
        form = page.form("purge")
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "same-site"}):
            statuses.append((await victim.post(form["action"], data={**form["fields"], "confirm": "yes"},
                                               headers=headers)).status_code)
        assert (await q.counts()).dead_letters == 2
        # Its own form, from its own page: done.
        done = await victim.post(form["action"], data={**form["fields"], "confirm": "yes"})
        assert done.status_code == 303
    assert statuses == [401, 401, 401, 401, 403, 403, 403, 403]
    assert (await q.counts()).dead_letters == 0


async def test_the_login_form_refuses_a_post_from_another_site(client: Redis, served: Any) -> None:
    base = await served(Dashboard(client, token=TOKEN))
    async with httpx.AsyncClient(timeout=10) as http:
        form = (await get_page(http, base, 401)).form("login")
        data = {**form["fields"], "token": TOKEN}
        refused = [await http.post(form["action"], data={k: v for k, v in data.items() if k != CSRF_FIELD}),
                   await http.post(form["action"], data={**data, CSRF_FIELD: FORGED_CSRF}),
                   await http.post(form["action"], data=data, headers={"Origin": "http://evil.example"}),
                   await http.post(form["action"], data=data, headers={"Sec-Fetch-Site": "cross-site"})]
        async with httpx.AsyncClient(timeout=10) as stranger:  # the form's token without its cookie
            refused.append(await stranger.post(form["action"], data=data))
        assert [r.status_code for r in refused] == [403] * 5
        assert not [r for r in refused if session_cookies(r)]
        # A login leads to a page of this dashboard, never elsewhere.
        for next_page, location in [("queue?name=a%20b", "queue?name=a%20b"), ("?refresh=5", "./?refresh=5"),
                                    ("//evil.example/", "./"), ("http://evil.example/", "./"), ("../x", "./"),
                                    ("queue\r\nSet-Cookie: x=y", "./"), ("static/dashboard.css", "./")]:
            response = await http.post(form["action"], data={**data, "next": next_page})
            assert (response.status_code, response.headers["location"]) == (303, location), next_page


async def test_without_a_token_there_is_no_login(client: Redis, make_queue: Any, served: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 3600)
    base = await served(Dashboard(client))
    async with httpx.AsyncClient(timeout=10) as http:
        index = await get_page(http, base)
        assert q.name in index.rows
        assert not [f for f in index.forms if f["method"] == "post"]  # no logout
        for path in ("login", "logout"):
            assert (await http.get(urljoin(base, path))).status_code == 404
            assert (await http.post(urljoin(base, path), data={"token": TOKEN})).status_code == 404
        assert SESSION_COOKIE not in http.cookies


async def test_read_only_with_a_token_logs_in_and_serves_no_write(client: Redis, make_queue: Any,
                                                                   served: Any) -> None:
    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 1)
    base = await served(Dashboard(client, read_only=True, token=TOKEN))
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await log_in(http, queue_url(base, q.name))).status_code == 303
        page = await get_page(http, queue_url(base, q.name))
        assert "read-only" in page.text
        # The logout button and the search: no other form.
        assert [(f["method"], f["buttons"]) for f in page.forms] == [("post", ["logout"]), ("get", [""])]
        csrf = page.form("logout")["fields"][CSRF_FIELD]
        for action in ("pause", "resume", "requeue", "purge"):
            data = {"queue": q.name, "confirm": "yes", CSRF_FIELD: csrf}
            assert (await http.post(urljoin(base, action), data=data)).status_code == 403, action
            assert (await http.post(urljoin(base, action), data=data, headers=BEARER)).status_code == 403, action
    counts = await q.counts()
    assert (counts.paused, counts.dead_letters) == (False, 1)


async def test_mounted_under_a_prefix_the_session_is_the_mount_s(client: Redis, make_queue: Any,
                                                                  serve_aiohttp: Any) -> None:
    q: DelayedQueue[Any] = make_queue()
    await q.offer("x", 3600)
    admin = web.Application()
    admin.add_subapp("/queues", Dashboard(client, token=TOKEN).aiohttp_app())
    app = web.Application()
    app.add_subapp("/admin", admin)
    base = await serve_aiohttp(app) + "/admin/queues/"
    async with httpx.AsyncClient(timeout=10) as http:
        bare = await http.get(base.rstrip("/"))
        assert (bare.status_code, urljoin(str(bare.url), bare.headers["location"])) == (308, base)
        logged_in = await log_in(http, queue_url(base, q.name))
        assert urljoin(base, logged_in.headers["location"]) == queue_url(base, q.name)
        [cookie] = [c for c in http.cookies.jar if c.name == SESSION_COOKIE]
        assert cookie.path == "/admin/queues/"
        page = await get_page(http, queue_url(base, q.name))
        assert (await submit(http, page, "pause")).status_code == 303
    assert (await q.counts()).paused


def test_a_token_is_checked_where_the_dashboard_is_made() -> None:
    from aiodelayq import ConfigurationError

    secret = "s3cret-but-short"[:15]
    for bad, match in [(secret, "at least 16 characters"), ("x" * 1025, "at most 1024"),
                       ("sixteen chars ok", "visible ASCII"), ("é" * 16, "visible ASCII"), (b"x" * 20, "a str")]:
        with pytest.raises(ConfigurationError, match=match) as caught:
            Dashboard(Redis(), token=bad)  # type: ignore[arg-type]
        assert "token" in str(caught.value)
        assert secret not in str(caught.value)
    dashboard = Dashboard(Redis(), token=TOKEN)
    assert dashboard.needs_token
    assert not Dashboard(Redis()).needs_token
    assert TOKEN not in repr(dashboard)


# -- serve(): the standalone server the command line runs ---------------------------------------------------


async def test_serve_runs_the_dashboard_until_cancelled(own_server: Any, make_client: Any) -> None:
    server = own_server()
    await DelayedQueue(make_client(server), "orders", codec="str").offer("x", 60)
    with free_socket() as probe:
        port = probe.getsockname()[1]
    task = asyncio.ensure_future(serve(server.url, port=port, read_only=True))
    base = f"http://127.0.0.1:{port}/"
    async with httpx.AsyncClient(timeout=10) as http:

        async def up() -> bool:
            assert not task.done(), task.exception()
            try:
                return (await http.get(base)).status_code == 200
            except httpx.TransportError:
                return False

        await until(up, timeout_s=30, interval_s=0.05)
        index = await get_page(http, base)
        assert index.rows["orders"]["pending"] == "1"
        assert (await http.post(base + "pause", data={"queue": "orders"})).status_code == 403
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)


async def _serving(task: asyncio.Future[None], caplog: pytest.LogCaptureFixture) -> str:
    """The base URL (on 127.0.0.1) of :func:`serve` running as ``task``, from its INFO line."""

    def said() -> list[str]:
        assert not task.done(), task.exception()
        return re.findall(r"on http://[^/]+:(\d+)/", " ".join(r.getMessage() for r in caplog.records))

    await until(said, timeout_s=30, interval_s=0.05)
    return f"http://127.0.0.1:{said()[0]}/"


async def _stop(task: asyncio.Future[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)


async def test_serve_beyond_loopback_makes_a_token_and_prints_it(own_server: Any, make_client: Any,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiodelayq")
    server = own_server()
    orders: DelayedQueue[Any] = DelayedQueue(make_client(server), "orders", max_deliveries=3)
    await dead_letters(orders, 2)
    await orders.offer("x", 60)
    # Every address of this machine; the test's requests go to loopback, and need the token there too.
    task = asyncio.ensure_future(serve(server.url, host="0.0.0.0", port=0))
    try:
        base = await _serving(task, caplog)
        # Another host's curl with a self-made cookie and the matching form field: refused.
        async with httpx.AsyncClient(timeout=10) as forger:
            forged = await forger.post(base + "purge", data={"queue": "orders", "confirm": "yes",
                                                             CSRF_FIELD: FORGED_CSRF},
                                       headers={"Cookie": f"{CSRF_COOKIE}={FORGED_CSRF}"})
        assert forged.status_code == 401
        assert (await orders.counts()).dead_letters == 2
        [made] = [r for r in caplog.records if "its token is" in r.getMessage()]
        assert made.levelno == logging.WARNING
        assert "0.0.0.0" in made.getMessage()
        token = made.getMessage().rsplit(" ", 1)[1]
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(base)).status_code == 401
            assert (await http.post(base + "pause", data={"queue": "orders"})).status_code == 401
            index = await http.get(base, headers={"Authorization": f"Bearer {token}"})
            assert index.status_code == 200
            assert Page(index.text, base).rows["orders"]["dead_letters"] == "2"
            assert (await log_in(http, base, token)).status_code == 303
            assert "orders" in (await get_page(http, base)).rows
    finally:
        await _stop(task)
        await orders.aclose()


async def test_serve_on_loopback_needs_a_token_given_to_it(own_server: Any, make_client: Any,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    server = own_server()
    await DelayedQueue(make_client(server), "orders", codec="str").offer("x", 60)
    task = asyncio.ensure_future(serve(server.url, port=0, token=TOKEN))
    try:
        base = await _serving(task, caplog)
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(base)).status_code == 401
            assert (await http.get(base, headers=BEARER)).status_code == 200
    finally:
        await _stop(task)
    assert TOKEN not in caplog.text  # a token given is never printed
    assert "(token required)" in caplog.text


async def test_serve_returns_on_sigterm(own_server: Any, spawn_consumer: Any) -> None:
    server = own_server()
    with free_socket() as probe:
        port = probe.getsockname()[1]
    child = spawn_consumer("import asyncio, sys\nfrom aiodelayq.dashboard import serve\n"
                           "asyncio.run(serve(sys.argv[1], port=int(sys.argv[2])))\nprint('returned')",
                           args=[server.url, str(port)])
    async with httpx.AsyncClient(timeout=10) as http:

        async def up() -> bool:
            assert child.poll() is None, child.stderr
            try:
                return (await http.get(f"http://127.0.0.1:{port}/")).status_code == 200
            except httpx.TransportError:
                return False

        await until(up, timeout_s=30, interval_s=0.05)
    child.send_signal(signal.SIGTERM)
    await child.await_line("returned", timeout_s=30)
    assert await child.await_exit(30) == 0, child.stderr
    assert "Traceback" not in child.stderr


async def test_serve_says_in_one_line_why_it_cannot_start(own_server: Any) -> None:
    from aiodelayq import ConfigurationError
    from aiodelayq._admin.connect import CannotConnect

    server = own_server()
    with free_socket() as taken:
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CannotListen, match=rf"^cannot listen on 127.0.0.1:{port}: the address is in use"):
            await asyncio.wait_for(serve(server.url, port=port), 15)
    with pytest.raises(CannotListen, match="not an address of this machine"):
        await asyncio.wait_for(serve(server.url, host="192.0.2.1", port=0), 15)
    with free_socket() as closed:
        nobody = closed.getsockname()[1]
    # A token it cannot take: said before connecting (nothing listens at this URL).
    with pytest.raises(ConfigurationError, match="token must be at least 16 characters"):
        await asyncio.wait_for(serve(f"redis://127.0.0.1:{nobody}/0", port=0, token="short"), 15)
    with pytest.raises(CannotConnect) as caught:
        await asyncio.wait_for(serve(f"redis://:pw@127.0.0.1:{nobody}/0", port=0), 30)
    assert "\n" not in str(caught.value)
    assert "pw" not in str(caught.value)


def test_import_aiodelayq_loads_no_web_dependency() -> None:
    code = ("import sys, aiodelayq, aiodelayq._queue\n"
            "assert not {'jinja2', 'uvicorn', 'aiohttp', 'starlette'} & set(sys.modules), 'core'\n"
            "import aiodelayq.dashboard\n"
            "assert 'jinja2' in sys.modules\n"
            "assert not {'uvicorn', 'aiohttp', 'starlette', 'fastapi'} & set(sys.modules), sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    missing = ("import sys; sys.modules['jinja2'] = None\n"
               "try:\n    import aiodelayq.dashboard\nexcept ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", missing], check=True, capture_output=True, text=True, timeout=60)
    assert "pip install 'aiodelayq[dashboard]'" in out.stdout


# -- a real browser ---------------------------------------------------------------------------------------


def _browser_or_skip() -> tuple[str, str]:
    """The paths of Chromium and chromedriver; skips (saying what is missing) without them or Selenium."""
    pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    return chromium, driver


@contextlib.contextmanager
def _browser(chromium: str, driver_path: str, width: int = 1280, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium driven by Selenium, with a throwaway profile; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="aiodelayq-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in (*BROWSER_ARGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(arg)
        os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
        browser = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        try:
            browser.set_page_load_timeout(30)
            yield browser
        finally:
            browser.quit()


async def test_in_a_browser_the_page_lists_the_queue_and_pause_pauses_it(client: Redis, make_queue: Any,
                                                                       serve_asgi: Any) -> None:
    chromium, driver_path = _browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import presence_of_element_located
    from selenium.webdriver.support.wait import WebDriverWait

    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 1)
    await q.offer_many([({"order": i}, 60 * (i + 1)) for i in range(4)])
    base = await serve_asgi(Dashboard(client).asgi_app()) + "/"

    def browse() -> tuple[dict[str, str], str, str]:
        # Selenium blocks: it runs in a thread while this event loop serves the pages.
        with _browser(chromium, driver_path) as browser:
            browser.get(base)
            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{q.name}"]')
            counts = {cell.get_attribute("data-field") or "": cell.text
                      for cell in row.find_elements(By.CSS_SELECTOR, "td[data-field]")}
            # A click starts a navigation and returns: wait for what the next page has.
            wait = WebDriverWait(browser, 30)
            row.find_element(By.LINK_TEXT, q.name).click()
            wait.until(presence_of_element_located((By.CSS_SELECTOR, 'button[name="pause"]'))).click()
            message = wait.until(presence_of_element_located((By.CSS_SELECTOR, "p.message"))).text
            return counts, message, browser.current_url

    counts, message, url = await asyncio.wait_for(asyncio.to_thread(browse), 120)
    assert (counts["pending"], counts["ready"], counts["in_flight"], counts["dead_letters"], counts["paused"]) == (
        "4", "0", "0", "1", "no")
    assert message.startswith("Paused")
    assert parse_qs(urlsplit(url).query)["name"] == [q.name]
    assert (await q.counts()).paused


async def test_in_a_browser_a_login_lets_a_write_through_and_a_forged_post_changes_nothing(
        client: Redis, make_queue: Any, serve_asgi: Any, serve_aiohttp: Any) -> None:
    chromium, driver_path = _browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import presence_of_element_located
    from selenium.webdriver.support.wait import WebDriverWait

    q: DelayedQueue[Any] = make_queue(max_deliveries=3)
    await dead_letters(q, 2)
    await q.offer("x", 600)
    base = await serve_asgi(Dashboard(client, token=TOKEN).asgi_app()) + "/"
    read_only = await serve_asgi(Dashboard(client, read_only=True, token=TOKEN + "-ro").asgi_app()) + "/"

    # Another site's page, on another port of this host: it sets the CSRF cookie a dashboard without
    # a token trusts (cookies are not kept apart by port), and its button posts a purge with it.
    async def forger(request: web.Request) -> web.Response:
        fields = {"queue": q.name, "confirm": "yes", CSRF_FIELD: FORGED_CSRF}
        inputs = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in fields.items())
        page = f'<!doctype html><form method="post" action="{base}purge">{inputs}<button id="go">Go</button></form>'
        response = web.Response(text=page, content_type="text/html")
        response.set_cookie(CSRF_COOKIE, FORGED_CSRF, path="/")
        return response

    forging = web.Application()
    forging.router.add_get("/", forger)
    forging_url = await serve_aiohttp(forging) + "/"

    def log_in_with(browser: Any, wait: Any, token: str) -> None:
        wait.until(presence_of_element_located((By.NAME, "token"))).send_keys(token)
        browser.find_element(By.CSS_SELECTOR, 'button[name="login"]').click()

    def browse() -> tuple[str, dict[str, Any], str, str, str, list[str]]:
        with _browser(chromium, driver_path) as browser:
            wait = WebDriverWait(browser, 30)
            browser.get(queue_url(base, q.name))  # the login form (401), then back to this page
            log_in_with(browser, wait, TOKEN)
            wait.until(presence_of_element_located((By.CSS_SELECTOR, 'button[name="pause"]'))).click()
            message = wait.until(presence_of_element_located((By.CSS_SELECTOR, "p.message"))).text
            session = browser.get_cookie(SESSION_COOKIE)
            seen_by_scripts = str(browser.execute_script("return document.cookie"))
            browser.get(forging_url)
            browser.find_element(By.ID, "go").click()
            status = wait.until(presence_of_element_located((By.CSS_SELECTOR, "p.error[data-status]")))
            refusal = f"{status.get_attribute('data-status')} {status.text}"
            browser.get(queue_url(read_only, q.name))
            log_in_with(browser, wait, TOKEN + "-ro")
            wait.until(presence_of_element_located((By.CSS_SELECTOR, 'section.counts')))
            buttons = [b.get_attribute("name") or "" for b in browser.find_elements(By.CSS_SELECTOR, "button")]
            return message, session, seen_by_scripts, refusal, browser.current_url, buttons

    message, session, seen_by_scripts, refusal, url, buttons = await asyncio.wait_for(asyncio.to_thread(browse), 180)
    assert message.startswith("Paused")
    assert (session["httpOnly"], session["sameSite"]) == (True, "Strict")
    assert TOKEN not in session["value"]
    assert SESSION_COOKIE not in seen_by_scripts
    assert refusal.startswith("403 Refused")
    counts = await q.counts()
    assert (counts.paused, counts.dead_letters) == (True, 2)
    # Read-only: the queue page has the search and the logout button, no write button.
    assert url == queue_url(read_only, q.name)
    assert sorted(buttons) == ["", "logout"]


# -- the docs' screenshot ------------------------------------------------------------------------------


async def _screenshot(path: Path, page: str = "queue") -> None:
    """A queue page with pending items over the next day, keys, headers and dead letters (or, with
    ``page="index"``, the index of three queues, one paused, one rate-limited)."""
    import random

    from aiodelayq.testing import ThrowawayServer, find_server_kinds

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("needs chromium and chromedriver: apt-get install chromium chromium-driver")
    rng = random.Random(7)
    with ThrowawayServer(find_server_kinds()[0]) as server:
        redis = Redis.from_url(server.url)
        orders: DelayedQueue[Any] = DelayedQueue(redis, "orders:cancel-unpaid", max_deliveries=3)
        emails: DelayedQueue[Any] = DelayedQueue(redis, "emails:send", max_deliveries=5)
        reminders: DelayedQueue[Any] = DelayedQueue(redis, "reminders", codec="str")
        items = [({"order_id": 1000 + i, "total": round(rng.uniform(5, 300), 2)},
                  rng.choice([rng.uniform(20, 3600), rng.uniform(60, 86_400)])) for i in range(400)]
        await orders.offer_many(items, keys=[f"order-{1000 + i}" for i in range(len(items))])
        await orders.offer_many([({"order_id": 5000 + i, "total": 19.9}, rng.uniform(300, 900)) for i in range(60)],
                                headers=[{"tenant": "acme"}] * 60)
        await orders.offer_many([({"order_id": 7000 + i, "total": 42.0}, 30 + i) for i in range(8)],
                                keys=[f"order-{7000 + i}" for i in range(8)])
        await _dead_letters_of_every_kind(orders)
        await emails.offer_many([({"to": f"user{i}@example.com"}, rng.uniform(10, 7200)) for i in range(120)])
        await emails.set_rate_limit(20, burst=40)
        await reminders.offer_many([(f"remind {i}", rng.uniform(3600, 200_000)) for i in range(30)])
        await reminders.pause()
        dashboard = Dashboard(redis)
        sock = free_socket()
        uv = uvicorn.Server(uvicorn.Config(dashboard.asgi_app(), log_level="warning"))
        task = asyncio.ensure_future(uv.serve(sockets=[sock]))
        await until(lambda: uv.started, timeout_s=10)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        url = base if page == "index" else queue_url(base, orders.name, peek="6")

        def shoot() -> None:
            with _browser(chromium, driver_path, 1280, 900) as browser:
                browser.get(url)
                height = browser.execute_script("return document.documentElement.scrollHeight")
                browser.set_window_size(1280, int(height) + 140)
                browser.get(url)
                browser.save_screenshot(str(path))

        await asyncio.to_thread(shoot)
        uv.should_exit = True
        await task
        for q in (orders, emails, reminders):
            await q.aclose()
        await redis.aclose()


async def _dead_letters_of_every_kind(q: DelayedQueue[Any]) -> None:
    """Dead letters as a worker leaves them: nacked for good, out of deliveries (``max_deliveries=3``),
    expired before anyone received them."""
    await q.offer({"order_id": 981, "total": 12.5}, 0, headers={"tenant": "acme"})
    await q.offer({"order_id": 982, "total": 99.0}, 0)
    await q.offer({"order_id": 983, "total": 7.25}, 0, expires=0.001)
    await asyncio.sleep(0.05)
    async with q:
        for _ in range(3):  # 981 and 982 delivered three times, 983 found expired on the way
            for msg in await q.receive_many(10, 30, timeout=5):
                if msg.value["order_id"] == 981 and msg.delivery_count == 2:
                    await msg.nack(dead_letter=True)
                else:
                    await msg.nack()
            await asyncio.sleep(0.05)
    assert (await q.counts()).dead_letters == 3, await q.dead_letters()


if __name__ == "__main__":
    if sys.argv[1:2] != ["screenshot"] or len(sys.argv) not in (3, 4):
        raise SystemExit("usage: python -m tests.test_dashboard screenshot PATH.png [queue|index]")
    asyncio.run(_screenshot(Path(sys.argv[2]), *sys.argv[3:]))
