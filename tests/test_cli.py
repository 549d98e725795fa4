"""The ``aiodelayq`` command line, run for real: ``python -m aiodelayq`` (and once the installed console
script) in a subprocess against the suite's server, on queues the tests fill with the library."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from redis.asyncio import Redis

import aiodelayq
from aiodelayq.cli import MISSING_EXTRA
from aiodelayq.cli._ops import queue_name_of
from tests.conftest import ServerInfo
from tests.helpers import server_ms, until

# Bound of one command run: each takes ~0.5 s (interpreter, typer, rich, one connection).
RUN_TIMEOUT_S = 30.0


@dataclass
class Run:
    code: int
    out: str
    err: str


Cli = Callable[..., Awaitable[Run]]


def _env(redis_url: str | None = None) -> dict[str, str]:
    """The child's environment: UTF-8, wide and colourless output, REDIS_URL only when given."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FORCE_COLOR", "TTY_COMPATIBLE")}
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
    assert rows["queue"] == ["pending", "ready", "in flight", "dead letters", "next due", "controls"]
    assert rows[qname][:4] == ["2", "2", "1", "1"]
    shown = re.fullmatch(r"in (\d+\.\d) s", rows[qname][4])
    assert shown is not None, rows[qname]
    assert 0 < float(shown[1]) <= 60
    assert rows[empty] == ["0", "0", "0", "0", "-", "-"]
    assert as_json.code == 0
    doc = json.loads(as_json.out)
    assert abs(doc["server_time_ms"] - now) < 10_000  # the server's clock, not a constant
    (entry,) = doc["queues"]
    assert entry == {"name": qname, "pending": 2, "ready": 2, "in_flight": 1, "dead_letters": 1,
                     "next_due_ms": later, "next_due_in_ms": later - doc["server_time_ms"], "paused": False,
                     "rate_limit_per_s": None, "rate_burst": None, "recurring": 0}


async def test_the_cli_pauses_resumes_and_limits_and_stats_show_it(make_queue: Any, cli: Cli, qname: str) -> None:
    q: aiodelayq.DelayedQueue[int] = make_queue()
    paused = await cli("pause", qname)
    assert paused.code == 0, paused.err
    assert await q.is_paused()
    limited = await cli("rate-limit", qname, "600/min", "--burst", "3")
    assert limited.code == 0, limited.err
    assert "10/s" in limited.out
    stats = await cli("stats", qname, "--json")
    (entry,) = json.loads(stats.out)["queues"]
    assert (entry["paused"], entry["rate_limit_per_s"], entry["rate_burst"]) == (True, 10.0, 3)
    table = await cli("stats", qname)
    assert "paused, 10/s (burst 3)" in table.out
    assert (await cli("resume", qname)).code == 0
    assert (await cli("rate-limit", qname, "off")).code == 0
    assert await q.counts() == aiodelayq.QueueCounts(0, 0, 0, 0, None)
    bad = await cli("rate-limit", qname, "fast")
    assert bad.code == 2
    assert "RATE must be like" in bad.err


async def test_watch_stops_after_count_refreshes(make_queue: Any, cli: Cli, qname: str) -> None:
    await make_queue().offer("x", 60)
    run = await cli("watch", qname, "--interval", "0.1", "--count", "2")
    assert run.code == 0
    assert rows_by_first_cell(run.out)[qname][:4] == ["1", "0", "0", "0"]  # piped: the last frame
    assert run.err.startswith("aiodelayq: watching 1 queue(s)")
    assert len(run.err.splitlines()) == 1


async def test_watch_ends_on_ctrl_c_with_exit_0(redis_server: ServerInfo, cli: Cli, qname: str) -> None:
    proc = await _spawn([sys.executable, "-m", "aiodelayq", "watch", qname, "--interval", "0.2",
                         "--redis-url", redis_server.url], _env())
    try:
        assert proc.stderr is not None
        first = await asyncio.wait_for(proc.stderr.readline(), RUN_TIMEOUT_S)
        assert first.startswith(b"aiodelayq: watching")  # connected, inside its event loop
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert err == b""  # no traceback, no "Aborted!"


# A program whose coroutine is busy in Python code (a lock, arithmetic) and sends itself SIGINT from
# there. Python 3.10's asyncio.run leaves SIGINT to the default handler, which raises
# KeyboardInterrupt inside the coroutine right after os.kill: "cancelled" is never printed. The CLI's
# runner (asyncio.run's behaviour from 3.11 on) cancels the coroutine at its next await instead, lets
# it unwind, then raises KeyboardInterrupt.
_SELF_INTERRUPTED = """
import asyncio, os, signal
from aiodelayq._core.tasks import run_interruptible

async def work():
    lock = asyncio.Lock()
    try:
        for n in range(1_000_000):
            async with lock:
                if n == 100:
                    os.kill(os.getpid(), signal.SIGINT)
                sum(range(100))
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise

try:
    run_interruptible(work())
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


async def test_ctrl_c_cancels_the_command_then_interrupts_on_every_python() -> None:
    run = await run_command([sys.executable, "-c", _SELF_INTERRUPTED])
    assert (run.code, run.out, run.err) == (0, "cancelled\ninterrupted\n", "")


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
    assert rows[dead_only.name] == ["0", "0", "0", "1", "-", "-"]
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
