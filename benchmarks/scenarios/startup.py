"""Scenario ``startup``: how long new processes take: ``import aiodelayq``, ``aiodelayq --help``, and a
worker process until its first delivery."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _harness import HERE, Bench, log, median, payload, ratio
from reference import ReferenceQueue

from aiodelayq import DelayedQueue

# The worker's handler: prints the time it got its first item (``aiodelayq worker startup_handler:handle``).
HANDLER = """\
import time


async def handle(item):
    print(f"delivered {time.time():.6f}", flush=True)
"""

# The reference's consumer process: Redisson's design from redis-py (``reference.py``), started the way a
# worker of it would start: its transfer scheduler and subscriber, then ``take()`` until the item comes.
REFERENCE_TAKER = """\
import asyncio
import sys
import time

sys.path.insert(0, sys.argv[1])

from redis.asyncio import Redis
from reference import ReferenceQueue, ReferenceSubscriber


async def main(url, name):
    client = Redis.from_url(url)
    ref = await ReferenceQueue(client, name).prepare()
    sub = ReferenceSubscriber(client)
    ref.start(sub)
    try:
        await sub.start()
        while await ref.take(1.0) is None:
            pass
        print(f"delivered {time.time():.6f}", flush=True)
    finally:
        await ref.stop()
        await sub.aclose()
        await client.aclose()


asyncio.run(main(sys.argv[2], sys.argv[3]))
"""

BOUND_S = 30.0  # for each process: longer than this is a failure, not a measurement

# The short-lived commands, timed from start to exit: name -> the arguments after the interpreter.
IMPORTS = {
    "pass": ["-c", "pass"],
    "import_redis": ["-c", "import redis.asyncio"],
    "import_aiodelayq": ["-c", "import aiodelayq"],
    "delayed_queue": ["-c", "from aiodelayq import DelayedQueue"],
}


def _console_script() -> list[str]:
    """The ``aiodelayq`` console script next to this interpreter, else ``python -m aiodelayq``."""
    script = Path(sys.executable).with_name("aiodelayq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "aiodelayq"]


async def _run(argv: list[str], *, cwd: str, env: dict[str, str]) -> float:
    """Seconds from starting ``argv`` until it exits (status 0, else ``RuntimeError``)."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), BOUND_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{argv}: still running after {BOUND_S:g} s") from None
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{argv}: exit {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return elapsed


async def _first_delivery(argv: list[str], *, cwd: str, env: dict[str, str]) -> float:
    """Start ``argv``, a consumer whose stdout says ``delivered <epoch s>`` when it got its first item:
    seconds from its start to that time. The process is then stopped with SIGTERM (killed after 15 s)."""
    with tempfile.TemporaryFile() as errors:  # its stderr: a worker logs, and a pipe nobody reads fills up
        t0 = time.time()
        proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=errors)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), BOUND_S)
            if not line.startswith(b"delivered "):
                await asyncio.wait_for(proc.wait(), 15.0)
                errors.seek(0)
                raise RuntimeError(f"{argv}: exit {proc.returncode} before a delivery: "
                                   f"{errors.read().decode(errors='replace')[-2000:]}")
            return float(line.split()[1]) - t0
        except asyncio.TimeoutError:
            raise RuntimeError(f"{argv}: no delivery within {BOUND_S:g} s") from None
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 15.0)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()


def _write_programs(directory: str) -> None:
    """The worker's handler module and the reference's consumer program, in ``directory``."""
    Path(directory, "startup_handler.py").write_text(HANDLER)
    Path(directory, "reference_taker.py").write_text(REFERENCE_TAKER)


async def run(bench: Bench) -> dict[str, Any]:
    """New processes of this interpreter, each started ``startup_runs`` times (the commands in turn, after
    one unmeasured run of each), with the bytecode cached as it is for an installed package (in a
    temporary ``PYTHONPYCACHEPREFIX``, which that first run fills; the source tree is not written):

    - wall time from start to exit of ``python -c pass``, ``python -c "import redis.asyncio"`` (the
      reference: what any asyncio Redis client loads), ``python -c "import aiodelayq"``, ``python -c
      "from aiodelayq import DelayedQueue"`` and ``aiodelayq --help`` (the console script; needs the
      ``cli`` extra);
    - for ours, ``aiodelayq worker startup_handler:handle --queue NAME --redis-url URL`` (default
      options: reliable, concurrency 16) on a queue holding one item offered with delay 0 before the
      start: seconds from starting the process to the handler's first item (its own clock), then
      SIGTERM; for the reference, a process that imports redis-py and ``reference.py``, starts
      Redisson's transfer scheduler and subscriber and ``take()``s the item the same way.

    Medians; ratios of the imports and ``--help`` to ``import redis.asyncio``, of ours' first delivery to
    the reference's."""
    s = bench.sizes
    has_cli = all(importlib.util.find_spec(m) is not None for m in ("typer", "rich"))
    commands: dict[str, list[str]] = {name: [sys.executable, *args] for name, args in IMPORTS.items()}
    if has_cli:
        commands["help"] = [*_console_script(), "--help"]
    times: dict[str, list[float]] = {name: [] for name in [*commands, "worker", "reference_worker"]}
    if not has_cli:
        del times["worker"]
        log("    the cli extra is not installed (pip install 'aiodelayq[cli]'): no --help, no worker")
    with tempfile.TemporaryDirectory(prefix="aiodelayq-startup-") as tmp:
        _write_programs(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
        starts: dict[str, Callable[[str], Awaitable[float]]] = {
            "worker": lambda name: _first_delivery(
                [*_console_script(), "worker", "startup_handler:handle", "--queue", name, "--redis-url",
                 bench.url], cwd=tmp, env=env),
            "reference_worker": lambda name: _first_delivery(
                [sys.executable, "reference_taker.py", str(HERE), bench.url, name], cwd=tmp, env=env),
        }
        for rnd in range(s.startup_runs + 1):  # round 0 fills the bytecode cache: not measured
            got = {name: await _run(argv, cwd=tmp, env=env) for name, argv in commands.items()}
            for impl in (impl for impl in starts if impl in times):
                async with bench.fresh_queue("startup", impl) as (client, name):
                    if impl == "worker":
                        await DelayedQueue(client, name).offer(payload(0), 0)
                    else:
                        await (await ReferenceQueue(client, name).prepare()).offer(payload(0), 0)
                    got[impl] = await starts[impl](name)
            if rnd:
                for name, value in got.items():
                    times[name].append(value)
                log(f"    round {rnd}: " + ", ".join(f"{name} {value * 1000:.0f} ms" for name, value in got.items()))
    med = {name: median(values) for name, values in times.items()}
    return {"runs": s.startup_runs, "bytecode": "cached", "cli": has_cli,
            "seconds": {name: med.get(name) for name in [*IMPORTS, "help", "worker", "reference_worker"]},
            "rounds": times,
            "ratio": {**{name: ratio(med.get(name), med["import_redis"])
                         for name in ("pass", "import_aiodelayq", "delayed_queue", "help")},
                      "worker": ratio(med.get("worker"), med["reference_worker"])}}
