"""The ``aiodelayq`` command line, run for real: ``python -m aiodelayq`` (and once the installed console
script) in a subprocess against the suite's server, on queues the tests fill with the library."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer.main
from redis.asyncio import Redis

import aiodelayq
from aiodelayq import DelayedQueue, QueueKeys
from aiodelayq._admin.scan import queue_name_of
from aiodelayq._redis.acl import minimal_acl_rules
from aiodelayq.cli import MISSING_EXTRA
from aiodelayq.cli._app import app
from aiodelayq.testing import ThrowawayCluster, ThrowawaySentinels, ThrowawayServer
from tests.conftest import ServerInfo
from tests.helpers import free_socket, server_ms, until

# Bound of one command run: each takes ~0.5 s (interpreter, typer, rich, one connection).
RUN_TIMEOUT_S = 30.0


@dataclass
class Run:
    code: int
    out: str
    err: str


Cli = Callable[..., Awaitable[Run]]


def _env(redis_url: str | None = None) -> dict[str, str]:
    """The child's environment: UTF-8, wide and colourless output, REDIS_URL only when given, no
    dashboard token."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "FORCE_COLOR", "TTY_COMPATIBLE", "AIODELAYQ_DASHBOARD_TOKEN")}
    env.update(PYTHONIOENCODING="utf-8", COLUMNS="200", NO_COLOR="1")
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


async def _spawn(argv: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env)


async def run_command(argv: list[str], *, env: dict[str, str] | None = None, stdin: bytes = b"") -> Run:
    """Run ``argv`` to its end (bounded) and return its exit code and decoded output."""
    proc = await _spawn(argv, env or _env())
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), RUN_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


@pytest.fixture
def cli(redis_server: ServerInfo) -> Cli:
    """``await cli(*args, url=..., stdin=...)``: ``python -m aiodelayq *args --redis-url <the suite's server>``."""
    if redis_server.cluster:
        pytest.skip("the CLI connects to a single server, not a cluster")

    async def run(*args: str, url: str | None = redis_server.url, stdin: bytes = b"") -> Run:
        tail = [] if url is None else ["--redis-url", url]
        return await run_command([sys.executable, "-m", "aiodelayq", *args, *tail], stdin=stdin)

    return run


def table_rows(out: str) -> list[list[str]]:
    """The body rows of the rich table(s) in ``out``, as stripped cell texts (header rows included)."""
    rows = []
    for line in out.splitlines():
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip().strip("│").split("│")])
    return rows


def rows_by_first_cell(out: str) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in table_rows(out)}


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def free_port() -> int:
    """A loopback port nobody listens on (bound then released: nothing else in the test takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def _ready_is(q: Any, n: int) -> bool:
    return bool(await q.ready_size() == n)


# -- stats, watch ----------------------------------------------------------------------------------


async def test_stats_shows_every_count_of_a_live_queue(client: Redis, make_queue: Any, cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    later = int(await q.offer({"n": 1}, 60))
    await q.offer({"n": 2}, 120)
    await q.offer_many([({"ready": n}, 0) for n in range(3)])
    await client.rpush(q.keys.dead_letter, b"garbage")
    empty = f"{qname}:empty"
    async with q:
        await until(lambda: _ready_is(q, 3))
        message = await q.receive(30)
        assert message is not None  # in flight while the commands run
        table, as_json = await asyncio.gather(cli("stats", qname, empty), cli("stats", qname, "--json"))
        now = await server_ms(client)
    assert (table.code, table.err) == (0, "")
    rows = rows_by_first_cell(table.out)
    assert rows["queue"] == ["pending", "ready", "in flight", "dead letters", "next due", "lag", "controls"]
    assert rows[qname][:4] == ["2", "2", "1", "1"]
    shown = re.fullmatch(r"in (\d+\.\d) s", rows[qname][4])
    assert shown is not None, rows[qname]
    assert 0 < float(shown[1]) <= 60
    assert rows[empty] == ["0", "0", "0", "0", "-", "0", "-"]
    assert as_json.code == 0
    doc = json.loads(as_json.out)
    assert abs(doc["server_time_ms"] - now) < 10_000  # the server's clock, not a constant
    (entry,) = doc["queues"]
    assert entry == {"name": qname, "pending": 2, "ready": 2, "in_flight": 1, "dead_letters": 1,
                     "next_due_ms": later, "next_due_in_ms": later - doc["server_time_ms"], "lag_ms": 0,
                     "paused": False, "rate_limit_per_s": None, "rate_burst": None, "concurrency_limit": None,
                     "groups": 0, "group_concurrency": 1, "recurring": 0, "deduplicating": 0}


async def test_the_cli_pauses_resumes_and_limits_and_stats_show_it(make_queue: Any, cli: Cli, qname: str) -> None:
    q: aiodelayq.DelayedQueue[int] = make_queue()
    paused = await cli("pause", qname)
    assert paused.code == 0, paused.err
    assert await q.is_paused()
    limited = await cli("rate-limit", qname, "600/min", "--burst", "3")
    assert limited.code == 0, limited.err
    assert "10/s" in limited.out
    capped = await cli("concurrency", qname, "20")
    assert capped.code == 0, capped.err
    assert "concurrency limit of" in capped.out
    stats = await cli("stats", qname, "--json")
    (entry,) = json.loads(stats.out)["queues"]
    assert (entry["paused"], entry["rate_limit_per_s"], entry["rate_burst"], entry["concurrency_limit"]) == (
        True, 10.0, 3, 20)
    table = await cli("stats", qname)
    assert "paused, 10/s (burst 3), at most 20 held" in table.out
    assert (await cli("resume", qname)).code == 0
    assert (await cli("rate-limit", qname, "off")).code == 0
    assert (await cli("concurrency", qname, "off")).code == 0
    assert await q.counts() == aiodelayq.QueueCounts(0, 0, 0, 0, None)
    bad = await cli("rate-limit", qname, "fast")
    assert bad.code == 2
    assert "RATE must be like" in bad.err
    for wrong in ("0", "1.5", "many"):
        refused = await cli("concurrency", qname, wrong)
        assert refused.code == 2
        assert "N must be an int >= 1 or 'off'" in refused.err


async def test_watch_stops_after_count_refreshes(make_queue: Any, cli: Cli, qname: str) -> None:
    await make_queue().offer("x", 60)
    run = await cli("watch", qname, "--interval", "0.1", "--count", "2")
    assert run.code == 0
    assert rows_by_first_cell(run.out)[qname][:4] == ["1", "0", "0", "0"]  # piped: the last frame
    assert run.err.startswith("aiodelayq: watching 1 queue(s)")
    assert len(run.err.splitlines()) == 1


async def test_watch_ends_on_ctrl_c_with_exit_0(redis_server: ServerInfo, cli: Cli, qname: str) -> None:
    async with _spawned([sys.executable, "-m", "aiodelayq", "watch", qname, "--interval", "0.2",
                         "--redis-url", redis_server.url]) as proc:
        assert proc.stderr is not None
        first = await asyncio.wait_for(proc.stderr.readline(), RUN_TIMEOUT_S)
        assert first.startswith(b"aiodelayq: watching")  # connected, inside its event loop
        await _ctrl_c_ends_it_cleanly(proc)


@contextlib.asynccontextmanager
async def _spawned(argv: list[str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """The command ``argv`` running, killed on the way out if it has not ended."""
    proc = await _spawn(argv, _env())
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _ctrl_c_ends_it_cleanly(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    assert proc.returncode == 0
    assert err == b""  # no traceback, no "Aborted!"


async def test_events_shows_the_last_events_then_follows_until_ctrl_c(redis_server: ServerInfo, make_queue: Any,
                                                                      cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    quiet = await cli("events", qname)
    assert (quiet.code, quiet.out) == (0, "")
    assert "no events stored" in quiet.err
    await q.set_events(100)
    await q.offer({"n": 1}, 60, key="order-1", group="tenant-a")
    assert await q.cancel("order-1")
    shown = await cli("events", qname, "-n", "5")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert [line.split()[1] for line in lines] == ["offered", "cancelled"]
    assert lines[0].split()[2:] == ['key="order-1"', 'group="tenant-a"']
    as_json = await cli("events", qname, "--json", "-n", "1")
    [doc] = [json.loads(line) for line in as_json.out.splitlines()]
    assert (doc["kind"], doc["key"], doc["group"], doc["reason"]) == ("cancelled", "order-1", "tenant-a", None)
    async with _spawned([sys.executable, "-m", "aiodelayq", "events", qname, "--follow", "--json", "-n", "1",
                         "--redis-url", redis_server.url]) as proc:
        assert proc.stdout is not None
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), RUN_TIMEOUT_S))
        assert first["kind"] == "cancelled"  # the last stored, then it follows
        await q.offer({"n": 2}, 60, key="order-2")
        new = json.loads(await asyncio.wait_for(proc.stdout.readline(), RUN_TIMEOUT_S))
        assert (new["kind"], new["key"]) == ("offered", "order-2")
        await _ctrl_c_ends_it_cleanly(proc)


async def _time_calls(client: Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_time", {}).get("calls", 0))


async def test_watch_ends_on_sigterm_like_ctrl_c_with_its_last_table(client: Redis, make_queue: Any,
                                                                     redis_server: ServerInfo, cli: Cli,
                                                                     qname: str) -> None:
    # `timeout 5 aiodelayq watch q | cat`: timeout sends SIGTERM; stdout is a pipe.
    await make_queue().offer("x", 60)
    before = await _time_calls(client)
    proc = await _spawn([sys.executable, "-m", "aiodelayq", "watch", qname, "--interval", "0.2",
                         "--redis-url", redis_server.url], _env())
    try:
        assert proc.stderr is not None
        first = await asyncio.wait_for(proc.stderr.readline(), RUN_TIMEOUT_S)
        assert first.startswith(b"aiodelayq: watching")
        # A refresh calls TIME twice at most (counts.lua reads the clock for the lag, then the
        # table's own TIME): a third means the second refresh began, after the first table was drawn
        # (kept back: a pipe).
        await until(lambda: _time_calls_reached(client, before + 3), RUN_TIMEOUT_S)
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert err == b""  # no traceback, no "Aborted!"
    assert rows_by_first_cell(out.decode())[qname][:4] == ["1", "0", "0", "0"]  # the last table
    assert out.endswith(b"\n")


async def _time_calls_reached(client: Redis, calls: int) -> bool:
    return await _time_calls(client) >= calls


# -- peek ------------------------------------------------------------------------------------------


async def test_peek_lists_soonest_first_with_keys_and_raw_bytes(client: Redis, make_queue: Any, cli: Cli,
                                                                qname: str) -> None:
    q = make_queue(codec="json")
    raw_q = make_queue(codec="bytes")
    third = int(await q.offer({"n": 3}, 300))
    first = int(await q.offer({"n": 1}, 100, key="order-1"))
    odd = int(await raw_q.offer(b"\xffnot json", 200))
    await client.zadd(q.keys.timeout_set, {b"junk": third + 1})
    table, as_json, two = await asyncio.gather(cli("peek", qname), cli("peek", qname, "--json"),
                                               cli("peek", qname, "-n", "2"))
    assert table.code == 0
    rows = table_rows(table.out)
    assert rows[0] == ["due", "at (UTC)", "key", "value", "!"]
    assert [row[1:] for row in rows[1:]] == [
        [iso(first), "order-1", '{"n": 1}', ""],
        [iso(odd), "", r"b'\xffnot json'", "undecodable"],
        [iso(third), "", '{"n": 3}', ""],
        [iso(third + 1), "", "b'junk'", "malformed"],
    ]
    assert all(row[0].startswith("in ") for row in rows[1:])
    items = json.loads(as_json.out)["items"]
    assert [(i["due_ms"], i["key"], i["value"], i["decodable"], i["malformed"], base64.b64decode(i["raw_b64"]))
            for i in items] == [
        (first, "order-1", {"n": 1}, True, False, b'{"n":1}'),
        (odd, None, None, False, False, b"\xffnot json"),
        (third, None, {"n": 3}, True, False, b'{"n":3}'),
        (third + 1, None, None, False, True, b"junk"),
    ]
    assert len(table_rows(two.out)) == 3  # header + 2


async def test_peek_and_ls_mark_recurring_items_headers_and_expiry(make_queue: Any, cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    recurring = await q.schedule("nightly", {"job": 1}, every=3600)
    expiring = await q.offer({"job": 2}, 7200, headers={"a": "1", "b": "2"}, expires=3600)
    table, as_json, listed = await asyncio.gather(cli("peek", qname), cli("peek", qname, "--json"),
                                                  cli("ls", "--match", qname, "--json"))
    assert table.code == 0, table.err
    marks = [row[-1] for row in table_rows(table.out)[1:]]
    assert marks[0] == "recurring"
    assert marks[1].startswith("expires in ")
    assert marks[1].endswith(", 2 header(s)")
    items = json.loads(as_json.out)["items"]
    assert [(i["due_ms"], i["recurring"], i["headers"], i["expires_at_ms"]) for i in items] == [
        (recurring, True, {}, None), (expiring, False, {"a": "1", "b": "2"}, expiring + 3_600_000)]
    [queue] = json.loads(listed.out)["queues"]
    assert queue["recurring"] == 1


async def test_ls_stats_and_peek_show_groups(make_queue: Any, cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    later = await q.offer({"job": 1}, 3600, group="tenant-1")
    await q.offer_many([({"job": 2}, 0), ({"job": 3}, 0)], groups=["tenant-2", "tenant-3"])
    await q.set_group_concurrency(2)
    async with q:
        await until(lambda: _groups_waiting(q, 2), timeout_s=10)
    peeked, stats, table, listed = await asyncio.gather(
        cli("peek", qname, "--json"), cli("stats", qname, "--json"), cli("stats", qname),
        cli("ls", "--match", qname, "--json"))
    [item] = json.loads(peeked.out)["items"]
    assert (item["due_ms"], item["group"]) == (later, "tenant-1")
    (entry,) = json.loads(stats.out)["queues"]
    assert (entry["pending"], entry["ready"], entry["groups"], entry["group_concurrency"]) == (1, 2, 2, 2)
    assert "2 groups (2 at a time)" in table.out
    assert [queue["name"] for queue in json.loads(listed.out)["queues"]] == [qname]  # only grouped keys


async def _groups_waiting(q: aiodelayq.DelayedQueue[Any], n: int) -> bool:
    return (await q.counts()).groups == n


# -- offer, cancel ---------------------------------------------------------------------------------


async def test_offer_and_cancel_round_trip(make_queue: Any, cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    added = await cli("offer", qname, '{"order": 1}', "--delay", "60", "--key", "order-1")
    assert added.code == 0, added.err
    pending = await q.get("order-1")
    assert pending is not None
    assert pending.value == {"order": 1}
    assert f"key 'order-1' of {qname} added: due in " in added.out
    assert f"({pending.due_ms})" in added.out

    again = await cli("offer", qname, '{"order": 2}', "--key", "order-1")
    assert again.code == 0
    assert "already pending, nothing changed" in again.out
    assert (await q.get("order-1")) == pending

    replaced = await cli("offer", qname, '{"order": 2}', "--delay", "120", "--key", "order-1", "--replace")
    assert replaced.code == 0
    assert "replaced" in replaced.out
    assert (await q.get("order-1")).value == {"order": 2}

    plain = await cli("offer", qname, "[1, 2]", "--delay", "30")
    assert (plain.code, plain.out.startswith(f"offered to {qname}: due in ")) == (0, True)
    assert await q.size() == 2

    cancelled = await cli("cancel", qname, "order-1")
    assert (cancelled.code, cancelled.out.strip()) == (0, f"cancelled key 'order-1' of {qname} (it was pending)")
    not_pending = await cli("cancel", qname, "order-1")
    assert (not_pending.code, not_pending.out.strip()) == (1, f"key 'order-1' of {qname} was not pending: nothing "
                                                              "cancelled")
    assert await q.read_all() == [[1, 2]]


@pytest.mark.parametrize(("args", "option"), [
    (["offer", "{q}", "1", "--delay", "inf"], "--delay"), (["offer", "{q}", "1", "--delay", "nan"], "--delay"),
    (["offer", "{q}", "1", "--delay", "-inf"], "--delay"),
    (["dead-letters", "requeue", "{q}", "--delay", "inf"], "--delay"),
    (["watch", "{q}", "--interval", "inf"], "--interval"), (["doctor", "{q}", "--max-lag", "nan"], "--max-lag"),
    (["worker", "m:f", "--queue", "{q}", "--visibility-timeout", "inf"], "--visibility-timeout"),
    (["worker", "m:f", "--queue", "{q}", "--drain-timeout", "nan"], "--drain-timeout"),
])
async def test_seconds_that_are_not_finite_are_a_usage_error(make_queue: Any, cli: Cli, qname: str, args: list[str],
                                                            option: str) -> None:
    q = make_queue()
    value = args[args.index(option) + 1]
    run = await cli(*(arg.replace("{q}", qname) for arg in args))
    assert run.code == 2, run.err
    assert f"Invalid value for '{option}': must be " in run.err
    assert f"not '{value}'" in run.err
    assert await q.size() == 0  # nothing written


async def test_offer_takes_json_text_str_or_bytes(make_queue: Any, cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    not_json = await cli("offer", qname, "hello")
    assert not_json.code == 2
    (line,) = not_json.err.splitlines()
    assert line.startswith("aiodelayq: VALUE is not JSON")
    assert await q.size() == 0  # nothing written
    text_q = make_queue(f"{qname}:str", codec="str")
    bytes_q = make_queue(f"{qname}:bytes", codec="bytes")
    runs = await asyncio.gather(cli("offer", text_q.name, "hello world", "--codec", "str"),
                                cli("offer", bytes_q.name, "héllo", "--codec", "bytes"),
                                cli("offer", qname, '"hello"'))
    assert [r.code for r in runs] == [0, 0, 0]
    assert await text_q.read_all() == ["hello world"]
    assert await bytes_q.read_all() == ["héllo".encode()]
    assert await q.read_all() == ["hello"]


# -- dead letters ----------------------------------------------------------------------------------


async def test_dead_letters_list_requeue_purge(client: Redis, make_queue: Any, cli: Cli, qname: str) -> None:
    q = make_queue(codec="json")
    await q.offer({"order": 7}, 0)
    async with q:
        message = await q.receive(30, timeout=5)
        assert message is not None
        assert await message.nack(dead_letter=True)
    await client.rpush(q.keys.dead_letter, b"garbage")

    table, as_json = await asyncio.gather(cli("dead-letters", "list", qname),
                                          cli("dead-letters", "list", qname, "--json"))
    assert table.code == 0
    rows = rows_by_first_cell(table.out)
    assert re.fullmatch(r"\d+\.\d s ago \(\d{4}-\d\d-\d\dT[\d:.]+Z\)", rows["0"][0]), rows
    assert rows["0"][1:] == ["nacked", "1", '{"order": 7}', ""]
    assert rows["1"] == ["-", "malformed", "-", "b'garbage'", "undecodable"]
    assert "2 of 2 shown" in table.out
    doc = json.loads(as_json.out)
    assert doc["total"] == 2
    assert [(d["reason"], d["delivery_count"], d["value"], d["decodable"], base64.b64decode(d["raw_b64"]))
            for d in doc["dead_letters"]] == [("nacked", 1, {"order": 7}, True, b'{"order":7}'),
                                              ("malformed", None, None, False, b"garbage")]

    requeued = await cli("dead-letters", "requeue", qname, "--limit", "1", "--delay", "60")
    assert (requeued.code, requeued.out.strip()) == (0, f"requeued 1 dead letter(s) of {qname}, due in 60 s")
    assert await q.read_all() == [{"order": 7}]
    assert (await q.counts()).dead_letters == 1

    refused = await cli("dead-letters", "purge", qname, stdin=b"n\n")
    assert refused.code == 1
    assert "Delete the 1 dead letter(s)" in refused.err
    assert (await q.counts()).dead_letters == 1
    purged = await cli("dead-letters", "purge", qname, "--yes")
    assert (purged.code, purged.out.strip()) == (0, f"purged 1 dead letter(s) of {qname}")
    assert (await q.counts()).dead_letters == 0


# -- ls ----------------------------------------------------------------------------------------------


async def test_ls_finds_queues_by_their_keys(client: Redis, make_queue: Any, cli: Cli, qname: str) -> None:
    await make_queue().offer("x", 60)
    dead_only = make_queue(f"{qname}:dead-only")
    await client.rpush(dead_only.keys.dead_letter, b"x")  # nothing pending: found by its dead letters
    braced = make_queue(f"{{{qname}}}tail")  # braces of its own: key redisson_delay_queue_timeout:{...}tail
    await braced.offer("y", 60)
    match = f"*{qname}*"
    table, as_json, limited = await asyncio.gather(cli("ls", "--match", match), cli("ls", "--match", match, "--json"),
                                                   cli("ls", "--match", match, "--limit", "2", "--json"))
    assert table.code == 0
    rows = rows_by_first_cell(table.out)
    assert rows[qname][:4] == ["1", "0", "0", "0"]
    assert rows[dead_only.name] == ["0", "0", "0", "1", "-", "0", "-"]
    assert rows[braced.name][:4] == ["1", "0", "0", "0"]
    assert len(rows) == 4  # header + 3
    assert "3 queue(s)" in table.out
    assert "STOPPED EARLY" not in table.out
    doc = json.loads(as_json.out)
    assert (doc["complete"], doc["note"]) == (True, None)
    assert {entry["name"]: entry["dead_letters"] for entry in doc["queues"]} == {
        qname: 0, dead_only.name: 1, braced.name: 0}
    cut = json.loads(limited.out)
    assert (cut["complete"], cut["note"], len(cut["queues"])) == (False, "more than --limit 2 queues", 2)
    shown = await cli("ls", "--match", match, "--limit", "2")
    assert "STOPPED EARLY: more than --limit 2 queues" in shown.out


async def test_a_sharded_queue_is_one_queue_to_every_command(client: Redis, drop_keys: Any, cli: Cli,
                                                              qname: str) -> None:
    # The shard count recorded under the name: ls lists the queue once (its shards' keys found by
    # SCAN), and stats, peek and cancel cover every shard.
    q: DelayedQueue[Any] = DelayedQueue(client, f"{qname}-sharded", shards=3, codec="str")
    drop_keys(*QueueKeys.for_name(q.name).all, *(key for keys in q.shard_keys for key in keys.all))
    await q.offer_many([(f"v{i}", 600) for i in range(6)])
    await q.offer("keyed", 600, key="k1")
    listed, stats, peek = await asyncio.gather(cli("ls", "--match", f"{qname}*", "--json"),
                                               cli("stats", q.name, "--json"), cli("peek", q.name, "--json"))
    assert [entry["name"] for entry in json.loads(listed.out)["queues"]] == [q.name]
    (entry,) = json.loads(stats.out)["queues"]
    assert entry["pending"] == 7
    assert len(json.loads(peek.out)["items"]) == 7
    cancelled = await cli("cancel", q.name, "k1")
    assert cancelled.code == 0, cancelled.err
    assert await q.size() == 6
    await q.set_events(100)
    await q.offer_many([(f"e{i}", 600) for i in range(6)])  # over the shards in rotation
    events = await cli("events", q.name, "--json")
    assert [json.loads(line)["kind"] for line in events.out.splitlines()] == ["offered"] * 6


async def test_a_queue_recorded_with_shards_placed_by_their_names_is_one_queue_too(
        client: Redis, drop_keys: Any, cli: Cli, qname: str) -> None:
    # A record of the count alone places shard i at {name:i}: ls, stats and doctor follow it.
    name = f"{qname}-hashed"
    hashed = [f"{{{name}:{i}}}" for i in range(3)]
    drop_keys(*(key for n in (name, *hashed) for key in aiodelayq.QueueKeys.for_name(n).all))
    await client.hset(aiodelayq.QueueKeys.for_name(name).controls, "shards", "3")
    for i, shard in enumerate(hashed):
        await aiodelayq.DelayedQueue(client, shard).offer(i, 600)
    listed, stats, doctor = await asyncio.gather(cli("ls", "--match", f"{qname}*", "--json"),
                                                 cli("stats", name, "--json"), cli("doctor", name, "--json"))
    assert [(entry["name"], entry["pending"]) for entry in json.loads(listed.out)["queues"]] == [(name, 3)]
    assert json.loads(stats.out)["queues"][0]["pending"] == 3
    assert [f["where"] for f in json.loads(doctor.out)["findings"] if f["check"] == "lag"] == hashed


@pytest.mark.parametrize(("key", "name"), [
    ("redisson_delay_queue_timeout:{orders}", "orders"),
    ("redisson_delay_queue_timeout:{a}b", "{a}b"),
    ("aiodelayq_dead_letter:{x:y}", "x:y"),
    ("aiodelayq_in_flight:{}", "{}"),
    ("redisson_delay_queue_timeout:plain", None),  # prefix_name never makes this: nobody's queue
    ("redisson_delay_queue_timeout:{a}{b}", "{a}{b}"),
    ("other:{orders}", None),
])
def test_queue_names_from_keys(key: str, name: str | None) -> None:
    prefix = key.partition(":")[0]
    assert queue_name_of(key, prefix if prefix != "other" else "redisson_delay_queue_timeout") == name


# -- errors, the extra, the console script -----------------------------------------------------------


async def test_an_unreachable_server_is_one_line_and_exit_1(cli: Cli) -> None:
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    commands = [("stats", "q"), ("peek", "q"), ("ls",), ("dead-letters", "list", "q"), ("offer", "q", "1"),
                ("cancel", "q", "k"), ("watch", "q", "--count", "1")]
    runs = await asyncio.gather(*(cli(*command, url=url) for command in commands))
    for command, run in zip(commands, runs, strict=True):
        assert (run.code, run.out) == (1, ""), command
        (line,) = run.err.splitlines()
        assert line.startswith(f"aiodelayq: cannot connect to redis://user:***@127.0.0.1:{url.rsplit(':', 1)[1]}: ")
        assert "secret" not in run.err


async def test_without_the_cli_extra_one_line_and_exit_2() -> None:
    for blocked, start in (("typer", "import aiodelayq.cli; aiodelayq.cli.main()"),
                           ("rich", "import runpy; runpy.run_module('aiodelayq', run_name='__main__')")):
        run = await run_command([sys.executable, "-c", f"import sys; sys.modules[{blocked!r}] = None; {start}",
                                 "stats", "q"])
        assert (run.code, run.out, run.err) == (2, "", MISSING_EXTRA + "\n"), blocked
    probe = "import sys, aiodelayq, aiodelayq.cli; print(sorted({'typer', 'rich', 'click'} & set(sys.modules)))"
    imported = await run_command([sys.executable, "-c", probe])
    assert imported.out.strip() == "[]"  # the core and the entry point's module import neither


async def test_the_console_script_and_redis_url_from_the_environment(redis_server: ServerInfo, make_queue: Any,
                                                                     cli: Cli, qname: str) -> None:
    script = shutil.which("aiodelayq", path=os.path.dirname(sys.executable))
    assert script is not None, "aiodelayq is not installed next to this interpreter: pip install -e '.[cli]'"
    version = await run_command([script, "--version"])
    assert (version.code, version.out) == (0, f"aiodelayq {aiodelayq.__version__}\n")
    await make_queue().offer("x", 60)
    run = await run_command([script, "stats", qname, "--json"], env=_env(redis_server.url))
    assert run.code == 0, run.err
    assert json.loads(run.out)["queues"][0]["pending"] == 1


# -- doctor, dashboard -------------------------------------------------------------------------------


async def test_doctor_prints_a_line_per_check_and_fails_on_an_evicting_policy(own_server: Any, make_client: Any,
                                                                            qname: str) -> None:
    server = own_server(**{"maxmemory-policy": "allkeys-lru"})
    await DelayedQueue(make_client(server), qname).offer("x", 60)
    run = await run_command([sys.executable, "-m", "aiodelayq", "doctor", "--redis-url", server.url])
    assert run.code == 1, run.err
    lines = {line.split()[1]: line for line in run.out.splitlines()}
    assert lines["eviction"].startswith("FAIL eviction")
    assert "allkeys-lru" in lines["eviction"]
    assert " -> CONFIG SET maxmemory-policy noeviction" in lines["eviction"]
    assert lines["persistence"].startswith("WARN")
    assert lines["lag"].startswith("OK")
    assert qname in lines["lag"]  # found by SCAN
    await make_client(server).config_set("maxmemory-policy", "noeviction")
    run = await run_command([sys.executable, "-m", "aiodelayq", "doctor", qname, "--redis-url", server.url, "--json"])
    assert run.code == 0, run.out  # warnings do not fail
    report = json.loads(run.out)
    assert report["ok"] is True
    assert {f["check"]: f["status"] for f in report["findings"]}["persistence"] == "warn"


async def test_doctor_on_an_unreachable_server_is_one_line() -> None:
    run = await run_command([sys.executable, "-m", "aiodelayq", "doctor", "--redis-url", "redis://127.0.0.1:1/0"])
    assert run.code == 1
    assert run.err.startswith("aiodelayq: cannot connect to redis://127.0.0.1:1/0")
    assert len(run.err.splitlines()) == 1


async def test_the_dashboard_command_serves_until_sigterm(redis_server: Any, make_queue: Any, qname: str) -> None:
    if redis_server.cluster:
        pytest.skip("one server here; the dashboard on a Cluster is in tests/test_dashboard.py")
    await make_queue().offer("x", 60)
    proc = await _spawn([sys.executable, "-m", "aiodelayq", "dashboard", "--port", "0", "--queue", qname,
                         "--redis-url", redis_server.url], _env())
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), RUN_TIMEOUT_S)).decode()
        url = re.search(r"http://\S+", line)
        assert url is not None, line
        async with httpx.AsyncClient(timeout=10) as http:
            page = await http.get(url.group(0))
        assert page.status_code == 200
        assert qname in page.text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), RUN_TIMEOUT_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _dashboard_lines(argv: list[str], env: dict[str, str], n: int) -> tuple[asyncio.subprocess.Process,
                                                                                   list[str]]:
    """``aiodelayq dashboard ARGV`` started, and the first ``n`` lines of its stderr."""
    proc = await _spawn([sys.executable, "-m", "aiodelayq", "dashboard", *argv], env)
    assert proc.stderr is not None
    lines = [(await asyncio.wait_for(proc.stderr.readline(), RUN_TIMEOUT_S)).decode() for _ in range(n)]
    return proc, lines


async def _stop_dashboard(proc: asyncio.subprocess.Process) -> str:
    """SIGTERM, exit 0; the rest of its stderr."""
    assert proc.stderr is not None
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), RUN_TIMEOUT_S) == 0
    return (await proc.stderr.read()).decode()


async def test_the_dashboard_beyond_loopback_prints_the_token_it_made(redis_server: Any, make_queue: Any,
                                                                      qname: str) -> None:
    if redis_server.cluster:
        pytest.skip("one server here; the dashboard on a Cluster is in tests/test_dashboard.py")
    await make_queue().offer("x", 60)
    # Every address of this machine: the requests below go to loopback, and need the token there too.
    proc, (where, made) = await _dashboard_lines(["--host", "0.0.0.0", "--port", "0", "--queue", qname,
                                                  "--redis-url", redis_server.url], _env(), 2)
    try:
        port = re.search(r"http://0\.0\.0\.0:(\d+)/ \(token required\)", where)
        assert port is not None, where
        token = re.fullmatch(r"aiodelayq: the dashboard listens beyond loopback \(0\.0\.0\.0\) and was given no "
                             r"token; its token is ([A-Za-z0-9_-]{43})\n", made)
        assert token is not None, made
        url = f"http://127.0.0.1:{port.group(1)}/"
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(url)).status_code == 401
            page = await http.get(url, headers={"Authorization": f"Bearer {token.group(1)}"})
        assert page.status_code == 200
        assert qname in page.text
        await _stop_dashboard(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_dashboard_takes_its_token_from_the_environment_on_loopback_too(redis_server: Any) -> None:
    token = "a-token-from-the-environment"
    proc, [where] = await _dashboard_lines(["--port", "0", "--redis-url", redis_server.url],
                                           {**_env(), "AIODELAYQ_DASHBOARD_TOKEN": token}, 1)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", where)
        assert url is not None, where
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(url.group(0))).status_code == 401
            assert (await http.get(url.group(0), headers={"Authorization": f"Bearer {token}"})).status_code == 200
        rest = await _stop_dashboard(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert token not in where + rest  # a token given is never printed


async def test_a_dashboard_token_it_cannot_take_is_a_usage_error(redis_server: Any) -> None:
    for given in (["--token", "short"], ["--token", "sixteen chars ok"]):
        run = await run_command([sys.executable, "-m", "aiodelayq", "dashboard", "--port", "0", *given,
                                 "--redis-url", redis_server.url])
        assert run.code == 2, run.err
        assert run.err.startswith("aiodelayq: --token (or AIODELAYQ_DASHBOARD_TOKEN) must be "), run.err
        assert len(run.err.splitlines()) == 1
        assert given[1] not in run.err


async def test_the_dashboard_on_a_port_in_use_is_one_line(redis_server: Any) -> None:
    with free_socket() as taken:
        taken.listen()
        run = await run_command([sys.executable, "-m", "aiodelayq", "dashboard", "--port",
                                 str(taken.getsockname()[1]), "--redis-url", redis_server.url])
    assert run.code == 1
    assert len(run.err.strip().splitlines()) == 1, run.err
    assert run.err.startswith("aiodelayq: "), run.err


# -- help pages --------------------------------------------------------------------------------------

# Each command's usage line after "Usage: aiodelayq": what a person types.
USAGES = {
    (): "[OPTIONS] COMMAND [ARGS]...",
    ("stats",): "stats [OPTIONS] NAMES...",
    ("watch",): "watch [OPTIONS] NAMES...",
    ("peek",): "peek [OPTIONS] NAME",
    ("offer",): "offer [OPTIONS] NAME VALUE",
    ("cancel",): "cancel [OPTIONS] NAME KEY",
    ("pause",): "pause [OPTIONS] NAME",
    ("resume",): "resume [OPTIONS] NAME",
    ("rate-limit",): "rate-limit [OPTIONS] NAME RATE",
    ("concurrency",): "concurrency [OPTIONS] NAME N",
    ("events",): "events [OPTIONS] NAME",
    ("ls",): "ls [OPTIONS]",
    ("worker",): "worker [OPTIONS] MODULE:FUNC",
    ("doctor",): "doctor [OPTIONS] [NAMES...]",
    ("dashboard",): "dashboard [OPTIONS]",
    ("dead-letters",): "dead-letters [OPTIONS] COMMAND [ARGS]...",
    ("dead-letters", "list"): "dead-letters list [OPTIONS] NAME",
    ("dead-letters", "requeue"): "dead-letters requeue [OPTIONS] NAME",
    ("dead-letters", "purge"): "dead-letters purge [OPTIONS] NAME",
}


def _declared(path: tuple[str, ...]) -> Any:
    """The click command (or group) the app declares at ``path``."""
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def test_the_help_tests_cover_every_command() -> None:
    def paths(command: Any, at: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = [at]
        for name, sub in getattr(command, "commands", {}).items():
            found += paths(sub, (*at, name))
        return found

    assert sorted(paths(_declared(()), ())) == sorted(USAGES)


def _option_line(param: Any) -> str:
    """How an option's line starts: its names, then the name of its value unless it is a flag."""
    names = ", ".join(sorted(param.opts, key=lambda opt: (len(opt) > 2, opt)))
    flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
    return names if flag else f"{names} {param.metavar}"


@pytest.mark.once
async def test_help_shows_flags_as_flags_arguments_by_name_and_every_option() -> None:
    script = shutil.which("aiodelayq", path=os.path.dirname(sys.executable))
    assert script is not None, "aiodelayq is not installed next to this interpreter: pip install -e '.[cli]'"
    runs = await asyncio.gather(*(run_command([script, *path, "--help"]) for path in USAGES))
    for (path, usage), run in zip(USAGES.items(), runs, strict=True):
        assert (run.code, run.err) == (0, ""), path
        lines = run.out.splitlines()
        assert lines[0] == f"Usage: aiodelayq {usage}", path
        assert not re.search(r"<\w[^>]*>|\{\w+\}", run.out), (path, run.out)  # no <bool>, <str>, {names}
        command = _declared(path)
        params = command.get_params(command.make_context("aiodelayq", [], resilient_parsing=True))
        assert any(param.opts == ["--help"] for param in params)
        for param in params:
            if param.param_type_name == "argument":
                label = (param.metavar or param.name.upper()) + ("..." if param.nargs != 1 else "")
                assert any(line.split()[:1] == [label] for line in lines), (path, label)
                continue
            # Its line: the option, its value's name unless a flag, then two spaces and its help.
            start = _option_line(param)
            shown = [line for line in lines if re.match(rf"\s+{re.escape(start)}(\s\s|$)", line)]
            assert len(shown) == 1, (path, start, run.out)
    top = runs[0].out
    for name in ("stats", "watch", "peek", "offer", "cancel", "pause", "resume", "rate-limit", "ls", "worker",
                 "dead-letters", "doctor", "dashboard"):
        assert re.search(rf"^\s+{re.escape(name)}\s\s+\S", top, re.MULTILINE), name


# The probe of what `--help` and `--version` import (beyond what `import aiodelayq` loads).
_IMPORTS_PROBE = """
import sys
import aiodelayq
before = set(sys.modules)
from aiodelayq.cli import main
for argv in (["--help"], ["--version"], ["stats", "--help"], ["dead-letters", "list", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
new = set(sys.modules) - before
print(sorted(m for m in new if m.split(".")[0] in ("rich", "redis")
             or m.startswith("aiodelayq._admin") or m in ("aiodelayq.cli._render", "aiodelayq._queue")))
"""


async def test_help_and_version_import_neither_rich_nor_redis_nor_the_commands_code() -> None:
    run = await run_command([sys.executable, "-c", _IMPORTS_PROBE])
    assert run.code == 0, run.err
    assert run.out.splitlines()[-1] == "[]"


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.once
async def test_bad_options_are_one_line_and_exit_2(redis_server: ServerInfo, cli: Cli, qname: str) -> None:
    cases = {
        ("stats", qname, "--redis-url", "http://127.0.0.1:6379/0"): "bad --redis-url",
        ("stats", qname, "--sentinel", "127.0.0.1:26379"): "--sentinel needs --service",
        ("stats", qname, "--service", "mymaster"): "--service needs --sentinel",
        ("stats", qname, "--sentinel", "127.0.0.1:port", "--service", "m"): "--sentinel must be HOST:PORT",
        ("stats", qname, "--sentinel", "127.0.0.1:1", "--service", "m", "--cluster"): "exclude each other",
        ("peek", ""): "queue name must not be empty",
        ("pause", ""): "queue name must not be empty",
    }
    runs = await asyncio.gather(*(cli(*args, url=None if "--redis-url" in args else redis_server.url)
                                  for args in cases))
    for (args, expected), run in zip(cases.items(), runs, strict=True):
        assert (run.code, run.out) == (2, ""), (args, run.err)
        (line,) = run.err.splitlines()
        assert line.startswith("aiodelayq: "), (args, line)
        assert expected in line, (args, line)


async def test_refused_commands_are_one_line_and_exit_1(own_server: Callable[..., ThrowawayServer],
                                                        make_client: Callable[..., Redis], cli: Cli,
                                                        qname: str) -> None:
    server = own_server()
    # No INFO (the Cluster check then takes it for one server), no EVALSHA (the queue's calls), no SCAN (ls).
    await make_client(server).execute_command("ACL", "SETUSER", "cli-ro", "on", ">pw", "~*", "&*", "+@all", "-info",
                                              "-evalsha", "-scan")
    url = f"redis://cli-ro:pw@127.0.0.1:{server.port}/0"
    stats, listed, wrong = await asyncio.gather(cli("stats", qname, url=url), cli("ls", url=url),
                                                cli("stats", qname, url=url.replace(":pw@", ":nope@")))
    for run, expected in ((stats, "permission denied"), (listed, "redis error: "), (wrong, "cannot connect to")):
        assert (run.code, run.out) == (1, ""), run.err
        (line,) = run.err.splitlines()
        assert line.startswith("aiodelayq: "), line
        assert expected in line, line
        assert ":pw@" not in line
        assert ":nope@" not in line


async def test_a_queue_without_keys_gets_a_note(make_queue: Any, cli: Cli, qname: str) -> None:
    # A misspelt name reads the same as an idle, empty queue: said on stderr, the output unchanged.
    unknown = f"{qname}:misspelt"
    peeked = await cli("peek", unknown, "--json")
    paused = await cli("pause", unknown)  # after the peek: the pause writes the queue's first key
    for run in (peeked, paused):
        assert run.code == 0, run.err
        (line,) = run.err.splitlines()
        assert line.startswith(f"aiodelayq: note: no key of queue {unknown!r} exists on ")
    assert json.loads(peeked.out)["items"] == []
    assert await make_queue(unknown).is_paused()
    await make_queue().offer("x", 60)
    known = await cli("peek", qname)
    assert (known.code, known.err) == (0, "")


async def test_the_minimal_acl_runs_the_commands_without_the_note(own_server: Callable[..., ThrowawayServer],
                                                                 make_client: Callable[..., Redis], cli: Cli,
                                                                 qname: str) -> None:
    # The minimal ACL of a queue has neither EXISTS nor INFO: the commands run, without the note.
    server = own_server()
    await make_client(server).execute_command("ACL", "SETUSER", "app", "on", ">pw", *minimal_acl_rules(qname))
    url = f"redis://app:pw@127.0.0.1:{server.port}/0"
    for args in (("peek", qname), ("pause", qname), ("resume", qname), ("offer", qname, "1", "--delay", "60"),
                 ("stats", qname, "--json")):
        run = await cli(*args, url=url)
        assert (run.code, run.err) == (0, ""), (args, run.err)
    assert json.loads(run.out)["queues"][0]["pending"] == 1


# -- Cluster and Sentinel ----------------------------------------------------------------------------


async def _topology_cli(*args: str) -> Run:
    """``python -m aiodelayq *args`` with no REDIS_URL: the topology tests give their own options."""
    return await run_command([sys.executable, "-m", "aiodelayq", *args])


_RECORDING_HANDLER = """
import json, os

async def record(item):
    with open(os.environ["RECORD_FILE"], "a", encoding="utf-8") as out:
        out.write(json.dumps(item) + "\\n")
"""


async def _worker_delivers(q: aiodelayq.DelayedQueue[Any], tmp_path: Path, *where: str) -> None:
    """``aiodelayq worker`` on ``q`` (connected by ``where``) gets an item offered now, then ends on
    SIGTERM with exit 0."""
    (tmp_path / "recording.py").write_text(_RECORDING_HANDLER, encoding="utf-8")
    record = tmp_path / "record.jsonl"
    env = {**_env(), "RECORD_FILE": str(record),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = await _spawn([sys.executable, "-m", "aiodelayq", "worker", "recording:record", "--queue", q.name, *where],
                        env)
    try:
        await q.offer({"order": "worked"}, 0)
        await until(lambda: record.exists() and "worked" in record.read_text(encoding="utf-8"), timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), RUN_TIMEOUT_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _away_from(cluster: ThrowawayCluster, name: str) -> str:
    """The URL of a primary that does not serve the queue ``name``'s slot: the CLI must find it."""
    owner = cluster.primary_of(name)
    node = next(n for n in cluster.primaries() if n.port != owner.port)
    return f"redis://127.0.0.1:{node.port}/0"


async def _queue_commands(qname: str, *where: str) -> dict[str, Run]:
    """stats, peek, offer, cancel, pause and resume of ``qname`` (in this order), each a real CLI run."""
    runs = {"offer": await _topology_cli("offer", qname, '{"order": 1}', "--delay", "60", "--key", "k1", *where),
            "offer-2": await _topology_cli("offer", qname, '{"order": 2}', "--delay", "120", "--key", "k2", *where)}
    runs["stats"] = await _topology_cli("stats", qname, "--json", *where)
    runs["peek"] = await _topology_cli("peek", qname, "--json", *where)
    runs["cancel"] = await _topology_cli("cancel", qname, "k1", *where)
    runs["pause"] = await _topology_cli("pause", qname, *where)
    runs["paused-stats"] = await _topology_cli("stats", qname, "--json", *where)
    runs["resume"] = await _topology_cli("resume", qname, *where)
    return runs


def _check_queue_commands(runs: dict[str, Run], qname: str) -> None:
    for what, run in runs.items():
        assert (run.code, run.err) == (0, ""), (what, run.err)
    assert runs["offer"].out.startswith(f"key 'k1' of {qname} added: due in ")
    (counts,) = json.loads(runs["stats"].out)["queues"]
    assert (counts["name"], counts["pending"]) == (qname, 2)
    assert [(item["key"], item["value"]) for item in json.loads(runs["peek"].out)["items"]] == [
        ("k1", {"order": 1}), ("k2", {"order": 2})]
    assert runs["cancel"].out.strip() == f"cancelled key 'k1' of {qname} (it was pending)"
    (paused,) = json.loads(runs["paused-stats"].out)["queues"]
    assert (paused["pending"], paused["paused"]) == (1, True)
    assert runs["resume"].out.strip() == f"resumed {qname}"


def _one_queue_per_primary(cluster: ThrowawayCluster, prefix: str) -> list[str]:
    """Queue names starting with ``prefix``, one on each primary."""
    owners: dict[int, str] = {}
    for n in range(1000):
        owners.setdefault(cluster.primary_of(f"{prefix}:{n}").port, f"{prefix}:{n}")
        if len(owners) == len(cluster.primaries()):
            return sorted(owners.values())
    raise AssertionError("1000 names should cover every primary")


@pytest.mark.topology
async def test_the_cli_on_a_cluster_given_any_node(cluster: ThrowawayCluster, cluster_clients: Any,
                                                   qname: str, tmp_path: Path) -> None:
    rc = cluster_clients(cluster)
    q: aiodelayq.DelayedQueue[Any] = aiodelayq.DelayedQueue(rc, qname)
    try:
        await q.set_events(100)
        url = _away_from(cluster, qname)  # a plain client there would get MOVED for every call
        runs = await _queue_commands(qname, "--redis-url", url)
        _check_queue_commands(runs, qname)
        assert (await q.get("k2")).value == {"order": 2}  # type: ignore[union-attr]
        assert await q.get("k1") is None
        assert not await q.is_paused()

        replica = cluster.replica_of(cluster.primaries()[0])
        others = _one_queue_per_primary(cluster, qname)  # ls scans every primary
        for other in others:
            await aiodelayq.DelayedQueue(rc, other).offer("x", 60)
        listed, forced, watched, dead = await asyncio.gather(
            _topology_cli("ls", "--match", f"{qname}*", "--json", "--redis-url", f"redis://127.0.0.1:{replica.port}/0"),
            _topology_cli("stats", qname, "--json", "--cluster", "--redis-url", url),
            _topology_cli("watch", qname, "--count", "1", "--redis-url", url),
            _topology_cli("dead-letters", "list", qname, "--json", "--redis-url", url))
        for run in (listed, forced, watched, dead):
            assert run.code == 0, run.err
        assert sorted(entry["name"] for entry in json.loads(listed.out)["queues"]) == sorted([qname, *others])
        assert json.loads(listed.out)["complete"] is True
        assert json.loads(forced.out)["queues"][0]["pending"] == 1
        assert rows_by_first_cell(watched.out)[qname][:4] == ["1", "0", "0", "0"]
        assert json.loads(dead.out)["total"] == 0
        events = await _topology_cli("events", qname, "--json", "-n", "100", "--redis-url", url)
        assert events.code == 0, events.err
        kinds = [json.loads(line)["kind"] for line in events.out.splitlines()]
        assert kinds[:2] == ["offered", "offered"]
        assert "cancelled" in kinds
        await _worker_delivers(q, tmp_path, "--redis-url", url)
        doctor = await _topology_cli("doctor", qname, "--json", "--redis-url", url)
        findings = json.loads(doctor.out)["findings"]
        assert {f["where"] for f in findings if f["check"] == "eviction"} == {
            f"127.0.0.1:{node.port}" for node in cluster.primaries()}  # every primary's server checks
        assert {f["check"]: f["status"] for f in findings if f["where"] == qname} == {
            "acl": "ok", "keys": "ok", "lag": "ok", "format": "ok"}
    finally:
        for name in [qname, *_one_queue_per_primary(cluster, qname)]:
            await aiodelayq.DelayedQueue(rc, name).clear()
            await rc.delete(*aiodelayq.QueueKeys.for_name(name).all)


@pytest.mark.topology
async def test_the_cli_on_a_cluster_node_without_info_needs_cluster(cluster: ThrowawayCluster,
                                                                   cluster_clients: Any, qname: str) -> None:
    # A user that may not run INFO: the Cluster is not recognised, the queue's calls meet MOVED, and the
    # line says what to add.
    user = f"cli-{qname.rsplit(':', 1)[1]}"
    for node in cluster.nodes:
        admin = Redis(host="127.0.0.1", port=node.port)
        await admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-info")
        await admin.aclose()
    try:
        url = _away_from(cluster, qname).replace("redis://", f"redis://{user}:pw@")
        refused = await _topology_cli("offer", qname, "1", "--redis-url", url)
        assert (refused.code, refused.out) == (1, "")
        (line,) = refused.err.splitlines()
        assert line.endswith("(here: add --cluster)")
        assert ":pw@" not in line
        forced = await _topology_cli("offer", qname, "1", "--cluster", "--redis-url", url)
        assert forced.code == 0, forced.err
        assert await aiodelayq.DelayedQueue(cluster_clients(cluster), qname).size() == 1
    finally:
        await aiodelayq.DelayedQueue(cluster_clients(cluster), qname).clear()
        for node in cluster.nodes:
            admin = Redis(host="127.0.0.1", port=node.port)
            await admin.execute_command("ACL", "DELUSER", user)
            await admin.aclose()


@pytest.mark.topology
async def test_the_cli_with_sentinel(own_sentinels: Callable[..., ThrowawaySentinels], qname: str,
                                     tmp_path: Path) -> None:
    setup = own_sentinels()
    where = [arg for host, port in setup.sentinel_nodes[:2] for arg in ("--sentinel", f"{host}:{port}")]
    where += ["--service", setup.service]
    runs = await _queue_commands(qname, *where)
    _check_queue_commands(runs, qname)
    primary = Redis(host="127.0.0.1", port=setup.master_port())
    try:
        q: aiodelayq.DelayedQueue[Any] = aiodelayq.DelayedQueue(primary, qname)
        assert (await q.get("k2")).value == {"order": 2}  # type: ignore[union-attr]
        assert not await q.is_paused()
        await _worker_delivers(q, tmp_path, *where)
        doctor = await _topology_cli("doctor", qname, "--json", *where)
        wheres = {f["where"] for f in json.loads(doctor.out)["findings"] if f["check"] == "server"}
        assert wheres == {f"127.0.0.1:{setup.master_port()}"}  # the primary the Sentinels name
    finally:
        await primary.aclose()

    host, port = setup.sentinel_nodes[0]
    unknown, silent = await asyncio.gather(
        _topology_cli("stats", qname, "--sentinel", f"{host}:{port}", "--service", "no-such-service"),
        _topology_cli("stats", qname, "--sentinel", f"127.0.0.1:{free_port()}", "--service", setup.service))
    for run, expected in ((unknown, "No master found for 'no-such-service'"), (silent, "no answer from 127.0.0.1:")):
        assert (run.code, run.out) == (1, "")
        (line,) = run.err.splitlines()
        assert line.startswith("aiodelayq: cannot connect to Sentinel service "), line
        assert expected in line, line


@pytest.mark.topology
async def test_on_a_cluster_the_cli_refuses_a_name_whose_keys_span_slots(cluster: ThrowawayCluster,
                                                                         cluster_clients: Any, qname: str) -> None:
    # 'a{' opens no hash tag, so each of its keys hashes whole: no queue of that name can work on a
    # cluster. A command on it exits 2 with the rule; ls, which may find such a key, leaves it out.
    rc = cluster_clients(cluster)
    split = f"{qname}:a{{"
    stray = aiodelayq.QueueKeys.for_name(split).timeout_set
    await rc.zadd(stray, {"x": 1})  # one key alone: a cluster takes it
    await aiodelayq.DelayedQueue(rc, qname).offer("x", 60)
    url = f"redis://127.0.0.1:{cluster.primaries()[0].port}/0"
    try:
        for args in (("stats", split), ("offer", split, "1"), ("pause", split), ("doctor", split)):
            run = await _topology_cli(*args, "--cluster", "--redis-url", url)
            assert (run.code, run.out) == (2, ""), (args, run)
            assert "hash to one slot" in run.err, args
            assert "its first '{' opens a hash tag" in run.err, args
        listed = await _topology_cli("ls", "--match", f"{qname}*", "--json", "--cluster", "--redis-url", url)
        assert listed.code == 0, listed.err
        assert [entry["name"] for entry in json.loads(listed.out)["queues"]] == [qname]
    finally:
        await rc.delete(stray)
        await aiodelayq.DelayedQueue(rc, qname).clear()
