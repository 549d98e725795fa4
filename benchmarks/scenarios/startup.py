"""Scenario ``startup``: how long new processes take: ``import aiodelayq``, ``aiodelayq --help``, and a
worker process until its first delivery."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import HERE, Bench, Child, log, median, payload, ratio
from reference import ReferenceQueue

from aiodelayq import DelayedQueue

# The worker's handler: prints the time it got its first item (``aiodelayq worker startup_handler:handle``).
HANDLER = """\
import time


async def handle(item):
    print(f"delivered {time.time():.6f}", flush=True)
"""

# The reference's consumer process: Redisson's design from redis-py (``reference.py``), started the way a
# worker of it would start: its transfer task and subscriber, then ``take()`` until the item comes.
REFERENCE_TAKER = "import asyncio, sys; sys.path.insert(0, sys.argv[1]); import reference; " \
                  "asyncio.run(reference.take_one(*sys.argv[2:]))"

BOUND_S = 30.0  # for each process: longer than this is a failure, not a measurement

# The short-lived commands, timed from start to exit: name -> the code the interpreter runs.
IMPORTS = {"pass": "pass", "import_redis": "import redis.asyncio", "import_aiodelayq": "import aiodelayq",
           "delayed_queue": "from aiodelayq import DelayedQueue"}


def _console_script() -> list[str]:
    """The ``aiodelayq`` console script next to this interpreter, else ``python -m aiodelayq``."""
    script = Path(sys.executable).with_name("aiodelayq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "aiodelayq"]


async def _run(argv: list[str], **kwargs: Any) -> float:
    """Seconds from starting ``argv`` until it exits (status 0, else ``RuntimeError``)."""
    t0 = time.perf_counter()
    child = await Child.start(argv, **kwargs)
    try:
        await child.wait(BOUND_S)
        return time.perf_counter() - t0
    finally:
        await child.stop()


async def _first_delivery(argv: list[str], **kwargs: Any) -> float:
    """Start ``argv``, a consumer whose stdout says ``delivered <epoch s>`` when it got its first item:
    seconds from its start to that time. The process is then stopped with SIGTERM (killed after 15 s)."""
    t0 = time.time()
    child = await Child.start(argv, **kwargs)
    try:
        line = await child.line(BOUND_S)
        if not line.startswith(b"delivered "):
            raise child.fail(f"{line!r} before a delivery")
        return float(line.split()[1]) - t0
    finally:
        await child.stop()


async def run(bench: Bench) -> dict[str, Any]:
    """New processes of this interpreter, each started ``startup_runs`` times (the commands in turn, after
    one unmeasured run of each), the bytecode cached as for an installed package (in a temporary
    ``PYTHONPYCACHEPREFIX`` that the first run fills; the source tree is not written):

    - wall time from start to exit of ``python -c`` ``pass``, ``import redis.asyncio`` (the reference: what
      any asyncio Redis client loads), ``import aiodelayq`` and ``from aiodelayq import DelayedQueue``, and
      of ``aiodelayq --help`` (the console script; needs the ``cli`` extra);
    - ours, ``aiodelayq worker startup_handler:handle`` (default options: reliable, concurrency 16) on a
      queue holding one item offered with delay 0 before the start: from starting the process to the
      handler's first item (its own clock), then SIGTERM; the reference, a process that imports redis-py
      and ``reference.py``, starts Redisson's transfer task and subscriber and ``take()``s the item.

    Medians; ratios of the imports and ``--help`` to ``import redis.asyncio``, of ours' first delivery to
    the reference's."""
    s = bench.sizes
    has_cli = all(importlib.util.find_spec(m) is not None for m in ("typer", "rich"))
    commands: dict[str, list[str]] = {name: [sys.executable, "-c", code] for name, code in IMPORTS.items()}
    if has_cli:
        commands["help"] = [*_console_script(), "--help"]
    times: dict[str, list[float]] = {name: [] for name in [*commands, "worker", "reference_worker"]}
    if not has_cli:
        del times["worker"]
        log("    the cli extra is not installed (pip install 'aiodelayq[cli]'): no --help, no worker")
    with tempfile.TemporaryDirectory(prefix="aiodelayq-startup-") as tmp:
        await asyncio.to_thread(Path(tmp, "startup_handler.py").write_text, HANDLER)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
        starts = {"worker": [*_console_script(), "worker", "startup_handler:handle", "--redis-url", bench.url,
                             "--queue"],
                  "reference_worker": [sys.executable, "-c", REFERENCE_TAKER, str(HERE), bench.url]}
        for rnd in range(s.startup_runs + 1):  # round 0 fills the bytecode cache: not measured
            got = {name: await _run(argv, cwd=tmp, env=env) for name, argv in commands.items()}
            for impl in (impl for impl in starts if impl in times):
                async with bench.fresh_queue("startup", impl) as (client, name):
                    q = DelayedQueue(client, name) if impl == "worker" else await ReferenceQueue(client, name).prepare()
                    await q.offer(payload(0), 0)
                    got[impl] = await _first_delivery([*starts[impl], name], cwd=tmp, env=env)
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
