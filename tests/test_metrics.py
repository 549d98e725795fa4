"""Metrics: the core's sink hook (``_observe``), the transfer's lateness, the Prometheus integration
served over real HTTP (uvicorn and aiohttp), and the lifecycle INFO logs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiodelayq import DelayedQueue, QueueCounts, Reject
from aiodelayq._consuming.handoff import payloads
from aiodelayq._runtime.client_runtime import runtime_for
from aiodelayq._scripts import QueueScripts
from aiodelayq._util import observe as _observe
from aiodelayq.prometheus import QueueMetrics
from tests.helpers import free_socket, llen_is, server_ms, until


@pytest.fixture
def metrics() -> Iterator[QueueMetrics]:
    """A ``QueueMetrics`` on a registry of its own, installed as the sink; uninstalled after."""
    m = QueueMetrics(registry=CollectorRegistry())
    try:
        yield m
    finally:
        m.uninstall()
        _observe.uninstall()  # whatever a failed test left


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape: (name, labels) -> value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def _scrape(url: str) -> tuple[str, str]:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
    assert response.status_code == 200
    return response.text, response.headers["content-type"]


async def _counts_are(q: DelayedQueue[Any], **expected: int) -> bool:
    counts = await q.counts()
    return all(getattr(counts, k) == v for k, v in expected.items())


async def test_metrics_over_http_after_real_traffic(client: Redis, make_queue: Any, metrics: QueueMetrics,
                                                    serve_asgi: Any, serve_aiohttp: Any) -> None:
    q = make_queue(max_deliveries=2)
    metrics.track(q)
    name = q.name
    # A malformed pending element due with the first items: the same transfer dead-letters it and moves
    # them, and the lateness list must skip it.
    now = await server_ms(client)
    await client.zadd(q.keys.timeout_set, {b"not an element": int(now) - 5})
    await q.offer_many([(f"plain-{i}", 0) for i in range(4)])  # offered 4
    async with q:  # the first transfer: 4 moved (with lateness), 1 malformed
        assert [await q.take() for _ in range(4)] == [f"plain-{i}" for i in range(4)]  # delivered 4

        await q.offer_many([("a", 0), ("b", 0), ("c", 0)])  # offered 7
        await until(lambda: _counts_are(q, pending=0, ready=3))
        a, b, c = [await q.receive(30) for _ in range(3)]  # delivered 7
        assert a is not None
        assert b is not None
        assert c is not None
        assert await a.ack(confirm=True)  # acked 1
        assert await b.nack(0)  # nacked 1
        b2 = await q.receive(30)  # the redelivery: delivered 8, redelivered 1
        assert b2 is not None
        assert b2.delivery_count == 2
        assert await b2.nack(0)  # its last delivery (max_deliveries=2): nacked 2, dead letter max_deliveries
        assert await c.nack(dead_letter=True)  # nacked 3, dead letter nacked

        await q.offer("held", 0)  # offered 8
        held = await q.receive(60)  # delivered 9; stays in flight
        assert held is not None
        assert held.value == "held"
        await q.offer("ready", 0)  # offered 9
        await until(lambda: _counts_are(q, ready=1))
        await q.offer_many([("later-1", 3600), ("later-2", 7200)])  # offered 11
        await q.set_concurrency_limit(10)

        web_app = web.Application()
        web_app.router.add_get("/metrics", metrics.aiohttp_handler)
        urls = [await serve_asgi(metrics.asgi_app()) + "/metrics", await serve_aiohttp(web_app) + "/metrics"]
        for url in urls:
            text, content_type = await _scrape(url)
            assert content_type.startswith("text/plain")
            got = _samples(text)
            real = await q.counts()
            assert real == QueueCounts(pending=2, ready=1, in_flight=1, dead_letters=3, next_due_ms=real.next_due_ms,
                                       concurrency_limit=10)
            for gauge in ("pending", "ready", "in_flight", "dead_letters"):
                assert _value(got, f"aiodelayq_{gauge}", queue=name) == getattr(real, gauge), gauge
            assert _value(got, "aiodelayq_next_due_timestamp_seconds", queue=name) == real.next_due_ms / 1000
            assert _value(got, "aiodelayq_lag_seconds", queue=name) == 0  # nothing due is left behind
            assert _value(got, "aiodelayq_concurrency_limit", queue=name) == 10
            assert _value(got, "aiodelayq_groups", queue=name) == 0
            assert _value(got, "aiodelayq_rate_limit_per_second", queue=name) is None  # absent without one
            expected = {"offered": 11, "moved": 9, "delivered": 9, "redelivered": 1, "acked": 1, "nacked": 3,
                        "transfer_errors": 0}
            assert {k: _value(got, f"aiodelayq_{k}_total", queue=name) for k in expected} == expected
            for reason in ("malformed", "max_deliveries", "nacked"):
                assert _value(got, "aiodelayq_dead_lettered_total", queue=name, reason=reason) == 1, reason
            assert _value(got, "aiodelayq_dead_lettered_total", queue=name, reason="undecodable") is None
            assert _value(got, "aiodelayq_lateness_seconds_count", queue=name) == 9  # one per moved item
            lateness_sum = _value(got, "aiodelayq_lateness_seconds_sum", queue=name)
            assert lateness_sum is not None
            assert 0 <= lateness_sum < 9 * 2.0  # each item a few ms late here
            assert _value(got, "aiodelayq_lateness_seconds_bucket", queue=name, le="60.0") == 9
            assert _value(got, "aiodelayq_scrape_errors_total", queue=name) is None  # never failed
        await held.ack(confirm=True)
    print(f"\n/metrics after traffic:\n{text}")


async def test_the_transfer_scripts_return_lateness_only_when_their_limit_asks_for_it(
        client: Redis, make_queue: Any) -> None:
    assert _observe.hook.sink is None
    assert _observe.transfer_limit(500) == 500
    q = make_queue()
    k = q.keys
    scripts = QueueScripts(client, k, call_timeout_s=5)
    await q.offer_many([(i, 0) for i in range(3)])
    reply = await scripts.transfer(500)
    assert len(reply) == 8  # no lateness entry
    assert reply[0] == 3
    await q.offer_many([(i, 0) for i in range(2)])
    now = await server_ms(client)
    await client.zadd(k.timeout_set, {b"garbage": int(now) - 1000})
    reply = await scripts.transfer(-500)
    assert len(reply) == 9
    assert (reply[0], reply[1]) == (2, 1)
    assert len(reply[8]) == 2  # the garbage is not listed
    assert all(0 <= late < 2000 for late in reply[8])
    # POP: the same, inside its transfer reply.
    for limit, length in ((500, 8), (-500, 9)):
        await q.offer(f"pop{limit}", 0)
        reply = await scripts.pop(os.urandom(16), 10, 20_000, limit)
        assert len(reply[0]) == length
        assert reply[0][0] == 1
        assert reply[1] == 0  # not held by the queue's controls
        assert payloads(*reply[3:])[-1] == f'"pop{limit}"'.encode()


async def test_without_a_sink_the_library_asks_no_lateness(client: Redis, make_queue: Any,
                                                         make_client: Any) -> None:
    """MONITOR on the server, which also lists what scripts run: without a sink every TRANSFER carries
    a positive limit and no transfer reads scores (no WITHSCORES on the timeout zset); with one, they do."""
    if isinstance(client, RedisCluster):
        pytest.skip("MONITOR watches one server (a cluster client has no monitor())")
    assert _observe.hook.sink is None
    q = make_queue()
    k = q.keys
    scans: list[str] = []  # the transfers' ZRANGEBYSCORE of the timeout zset (TRANSFER's and POP's)
    limits: list[int] = []  # TRANSFER's ARGV[1]: EVALSHA sha N <N keys> limit (no binary argument before it)
    nkeys = len(QueueScripts.transfer.key_names)

    async def watch(monitor: Any) -> None:
        while True:
            command = (await monitor.next_command())["command"]
            words = command.split(" ")
            if command.startswith("zrangebyscore") and words[1] == k.timeout_set:
                scans.append(command)
            elif words[0] == "EVALSHA" and len(words) == 4 + nkeys and words[4] == k.timeout_set:
                limits.append(int(words[3 + nkeys]))

    async def traffic(n: int) -> None:
        await q.offer_many([(i, 0.02) for i in range(n)])
        await until(lambda: llen_is(client, q, n))  # moved by a TRANSFER: nobody waits to pop them
        assert sorted([await q.take() for _ in range(n)]) == list(range(n))

    async with make_client().monitor() as monitor:
        watching = asyncio.ensure_future(watch(monitor))
        try:
            async with q:
                await traffic(5)
                await until(lambda: len(scans) >= 2 and len(limits) >= 2)  # open()'s transfer, and traffic's
                assert not any("WITHSCORES" in scan for scan in scans), scans
                assert all(limit > 0 for limit in limits), limits
                sink_off = len(scans), len(limits)
                with QueueMetrics(registry=CollectorRegistry()):  # installed for the block
                    await traffic(5)
                    await until(lambda: len(limits) > sink_off[1])
                assert any("WITHSCORES" in scan for scan in scans[sink_off[0]:])
                assert any(limit < 0 for limit in limits[sink_off[1]:])
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def test_a_failing_gauge_read_never_fails_the_scrape(own_server: Any, make_proxy: Any, make_client: Any,
                                                           make_queue: Any, metrics: QueueMetrics, serve_asgi: Any,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    proxy = make_proxy(own_server())
    q = make_queue("metrics-down", redis=make_client(proxy), call_timeout_s=0.3)
    metrics.refresh_timeout_s = 1.0
    metrics.track(q)
    await q.offer("x", 3600)
    url = await serve_asgi(metrics.asgi_app()) + "/"
    got = _samples((await _scrape(url))[0])
    assert _value(got, "aiodelayq_pending", queue=q.name) == 1
    with caplog.at_level(logging.INFO, logger="aiodelayq"):
        proxy.pause()
        try:
            for scrape in range(1, 3):
                got = _samples((await _scrape(url))[0])  # 200, with what the process counted
                assert _value(got, "aiodelayq_offered_total", queue=q.name) == 1
                assert _value(got, "aiodelayq_pending", queue=q.name) is None  # no stale gauge
                assert _value(got, "aiodelayq_scrape_errors_total", queue=q.name) == scrape
        finally:
            proxy.resume()
        got = _samples((await _scrape(url))[0])
        assert _value(got, "aiodelayq_pending", queue=q.name) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "metrics could not read" in r.message]
    assert len(warnings) == 1  # once per streak, not per scrape
    assert any(r.levelno == logging.INFO and "read the counts of" in r.message for r in caplog.records)


async def test_concurrent_scrapes_share_one_read(make_queue: Any, metrics: QueueMetrics) -> None:
    class Counting:
        """A real queue, counting its counts() calls."""

        def __init__(self, queue: DelayedQueue[Any]) -> None:
            self.queue, self.calls = queue, 0

        @property
        def name(self) -> str:
            return self.queue.name

        async def counts(self) -> QueueCounts:
            self.calls += 1
            return await self.queue.counts()

    counting = Counting(make_queue())
    metrics.track(counting)
    app = metrics.asgi_app()
    bodies = await asyncio.gather(*(_call_asgi(app) for _ in range(5)))
    assert counting.calls == 1
    assert all(b"aiodelayq_pending{" in body for body in bodies)
    await metrics.refresh()
    assert counting.calls == 2


async def _call_asgi(app: Any) -> bytes:
    """One GET through the ASGI interface (the HTTP round trip is tested above)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    assert sent[0]["status"] == 200
    return b"".join(m.get("body", b"") for m in sent[1:])


async def test_undecodable_payloads_are_counted_by_reason(client: Redis, make_queue: Any,
                                                         metrics: QueueMetrics) -> None:
    async with make_queue(codec="json") as q:
        await client.rpush(q.keys.destination, b"\xffnot json", b'"good"')
        assert await q.take() == "good"  # the pump dead-letters the bad one (FINISH 'x')
        await client.rpush(q.keys.destination, b"\xffnot json either", b'"fine"')
        # Both in one RECEIVE: the consumer dead-letters the bad one (SETTLE 'undecodable'). (A RECEIVE
        # that got only undecodable payloads waits for the next wake-up, up to 5 s, before it looks again.)
        [message] = await q.receive_many(2, 30)
        assert message.value == "fine"
        await message.ack(confirm=True)
        await until(lambda: _counts_are(q, dead_letters=2, in_flight=0))
    got = _samples(generate_latest(metrics.registry).decode())
    assert _value(got, "aiodelayq_dead_lettered_total", queue=q.name, reason="undecodable") == 2
    assert _value(got, "aiodelayq_delivered_total", queue=q.name) == 2
    assert _value(got, "aiodelayq_acked_total", queue=q.name) == 1


def test_lateness_buckets_are_upper_bounds_in_seconds() -> None:
    m = QueueMetrics(registry=CollectorRegistry(), install=False, lateness_buckets_s=(0.001, 0.01))
    m.moved("q", 4, [0.25, 1.0, 1.5, 20_000.0])  # ms: a bound itself falls in its bucket ("le")
    m.moved("q", 2, ())  # moved without lateness (e.g. the sink was installed mid-call): no observation
    buckets, total = m.lateness()["q"]
    assert buckets == [(0.001, 2), (0.01, 3), (float("inf"), 4)]
    assert total == pytest.approx(20.00275)
    got = _samples(generate_latest(m.registry).decode())
    assert _value(got, "aiodelayq_lateness_seconds_bucket", queue="q", le="0.001") == 2
    assert _value(got, "aiodelayq_lateness_seconds_bucket", queue="q", le="+Inf") == 4
    assert _value(got, "aiodelayq_lateness_seconds_count", queue="q") == 4
    assert _value(got, "aiodelayq_moved_total", queue="q") == 6


async def test_a_sink_that_raises_never_breaks_delivery(make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            def fail(*args: Any) -> None:
                raise RuntimeError(f"broken sink: {name}")
            return fail

    _observe.install(Broken())  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, logger="aiodelayq"):
            async with make_queue() as q:
                await q.offer_many([(i, 0) for i in range(3)])
                assert sorted([await q.take() for _ in range(3)]) == [0, 1, 2]
    finally:
        _observe.uninstall()
    assert len([r for r in caplog.records if "metrics sink" in r.message]) == 1


async def test_only_one_sink_at_a_time(metrics: QueueMetrics) -> None:
    other = QueueMetrics(registry=CollectorRegistry(), install=False)
    with pytest.raises(RuntimeError, match="another aiodelayq metrics sink"):
        other.install()
    metrics.uninstall()
    with other:
        assert other.installed
        assert not metrics.installed
    assert _observe.installed() is None


async def test_lifecycle_logs_at_info(own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any,
                                      caplog: pytest.LogCaptureFixture) -> None:
    proxy = make_proxy(own_server())
    redis = make_client(proxy)
    with caplog.at_level(logging.INFO, logger="aiodelayq"):
        q = make_queue("lifecycle", redis=redis, safety_poll_s=0.1, call_timeout_s=0.3)
        async with q:
            assert any("queue 'lifecycle' opened" in r.message for r in caplog.records)
            subscriber = runtime_for(redis).subscriber
            proxy.kill_all()  # the pub/sub connection (and the pool's) dropped once: a reconnect mends it quietly
            await until(lambda: subscriber.reconnects >= 1, timeout_s=10)
            assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
            caplog.clear()
            proxy.pause()  # the safety poll's reads time out meanwhile (warned from the second), then work
            await until(lambda: any("safety poll failed" in r.message and r.levelno == logging.WARNING
                                    for r in caplog.records), timeout_s=15)
            proxy.resume()
            await until(lambda: any("safety poll works again" in r.message for r in caplog.records), timeout_s=15)
        assert any("queue 'lifecycle' closed" in r.message for r in caplog.records)
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    assert all(r.name == "aiodelayq" for r in info)
    # Lifecycle lines only, none per item: nothing at INFO while items flow.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiodelayq"):
        async with make_queue() as quiet:
            await quiet.offer_many([(i, 0) for i in range(50)])
            assert len([await quiet.take() for _ in range(50)]) == 50
    lines = [r.message for r in caplog.records if r.name == "aiodelayq"]
    assert len(lines) == 2, lines
    assert "opened" in lines[0]
    assert "closed in" in lines[1]


def test_the_core_never_imports_prometheus_client_and_the_extra_says_how_to_install() -> None:
    core = ("import sys, aiodelayq, aiodelayq._queue, aiodelayq._util.observe, aiodelayq.testing; "
            "assert 'prometheus_client' not in sys.modules, 'core imported prometheus_client'")
    subprocess.run([sys.executable, "-c", core], check=True, timeout=60)
    missing = ("import sys; sys.modules['prometheus_client'] = None\n"
               "try:\n    import aiodelayq.prometheus\n"
               "except ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", missing], check=True, capture_output=True, text=True, timeout=60)
    assert "pip install 'aiodelayq[prometheus]'" in out.stdout


# -- a real Prometheus, and the Grafana dashboard of the docs -----------------------------------------

GRAFANA_DASHBOARD = Path("docs/grafana/aiodelayq.json")


def _exported_names(namespace: str = "aiodelayq") -> set[str]:
    """Every sample name a QueueMetrics can export: counters' ``_total``, the histogram's series, gauges."""
    registry = CollectorRegistry()
    m = QueueMetrics(registry=registry, install=False)
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    m.uninstall()
    return {n for n in names if n.startswith(namespace + "_")}


def _dashboard_queries() -> tuple[list[str], list[str]]:
    """The PromQL of the dashboard's panels, and its variables' Grafana queries (``label_values``)."""
    document = json.loads(GRAFANA_DASHBOARD.read_text(encoding="utf-8"))
    panels = [t["expr"] for panel in document["panels"] for t in panel["targets"]]
    variables = [v["query"]["query"] for v in document["templating"]["list"] if v["type"] == "query"]
    return panels, variables


def test_the_grafana_dashboard_references_only_exported_metrics() -> None:
    exported = _exported_names()
    panels, variables = _dashboard_queries()
    used = {name for query in panels + variables for name in re.findall(r"\baiodelayq_\w+", query)}
    assert used, "no aiodelayq metric in the dashboard"
    assert used <= exported, used - exported
    # Every gauge and counter the library exports is on the dashboard.
    assert {n.removesuffix("_bucket") for n in exported if not n.endswith(("_sum", "_count"))} <= {
        n.removesuffix("_bucket") for n in used}


async def _prometheus_query(http: httpx.AsyncClient, base: str, query: str) -> list[dict[str, Any]]:
    response = await http.get(f"{base}/api/v1/query", params={"query": query})
    body = response.json()
    assert body["status"] == "success", (query, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus (.ci/run installs it)")
@pytest.mark.once
async def test_a_real_prometheus_scrapes_a_workers_metrics(make_queue: Any, metrics: QueueMetrics, serve_asgi: Any,
                                                         tmp_path: Path) -> None:
    q = make_queue(max_deliveries=3)
    metrics.track(q)
    target = await serve_asgi(metrics.asgi_app())
    await q.offer_many([("ok", 0), ("ok", 0), ("bad", 0), ("later", 3600)])

    async def handler(item: str) -> None:
        if item == "bad":
            raise Reject

    with free_socket() as probe:
        port = probe.getsockname()[1]
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: worker\n"
                      f"    static_configs:\n      - targets: ['{target.removeprefix('http://')}']\n", encoding="utf-8")
    prometheus = await asyncio.create_subprocess_exec(
        "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        async with q, httpx.AsyncClient(timeout=10) as http:
            worker = q.worker(handler)
            running = asyncio.ensure_future(worker.run())
            await until(lambda: _counts_are(q, ready=0, in_flight=0, dead_letters=1), timeout_s=30)

            expected = {f'aiodelayq_delivered_total{{queue="{q.name}"}}': "3",
                        f'aiodelayq_dead_lettered_total{{queue="{q.name}"}}': "1",
                        f'aiodelayq_pending{{queue="{q.name}"}}': "1",
                        f'aiodelayq_lag_seconds{{queue="{q.name}"}}': "0"}
            found: dict[str, list[dict[str, Any]]] = {}

            async def scraped() -> bool:
                # Each query gives the latest scrape: wait for one made after every event was counted.
                try:
                    for query in expected:
                        response = await http.get(f"{base}/api/v1/query", params={"query": query})
                        if response.status_code != 200:
                            return False  # starting (503 until its storage is ready)
                        found[query] = response.json()["data"]["result"]
                except httpx.TransportError:
                    return False  # not listening yet
                return all(len(found[k]) == 1 and found[k][0]["value"][1] == v for k, v in expected.items())

            await until(scraped, timeout_s=60, interval_s=0.5)
            worker.stop()
            await asyncio.wait_for(running, 30)
            (dead,) = found[f'aiodelayq_dead_lettered_total{{queue="{q.name}"}}']
            assert dead["metric"]["reason"] == "nacked"
            assert dead["metric"]["job"] == "worker"
            # Every query of the Grafana dashboard is valid PromQL, as Grafana would send it.
            panels, variables = _dashboard_queries()
            for query in panels:
                await _prometheus_query(http, base, query.replace("$queue", ".*").replace("$__rate_interval", "1m"))
            assert variables == ["label_values(aiodelayq_pending, queue)"]
            response = await http.get(f"{base}/api/v1/label/queue/values", params={"match[]": "aiodelayq_pending"})
            assert q.name in response.json()["data"]
    finally:
        prometheus.terminate()
        await asyncio.wait_for(prometheus.wait(), 30)
