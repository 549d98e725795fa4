"""aiodelayq against its peers, BullMQ, arq and saq: the same three scenarios on each, on one throwaway server,
in one run, each with its framework's idiomatic calls and default settings (sizes: :data:`FULL`, ``--quick``:
:data:`QUICK`). Jobs carry ``{"i": i, "due": ms}`` with the same delays for every peer (``python_peer.py``).

- **A, lateness**: a consumer process runs the framework's worker while a producer process enqueues jobs
  with delays spread over a range, 64 calls in flight: the enqueue rate, lateness (the consumer's clock
  when the handler gets the job - the producer's clock before the enqueue call - the delay), lost (not
  received ``a_tail_s`` after the last due time) and duplicates.
- **B, drain**: jobs all due before one consumer process starts (filled with the bulk call where there is
  one): the drain rate, or the rate over ``b_bound_s`` ("bounded").
- **C, memory**: ``used_memory`` before and after enqueueing jobs due in 1 h, per job.

The server is flushed before every scenario. For each round, for each scenario, every peer in turn, the
order rotated by one each round; the tables quote medians of the rounds. Each driver runs as its own
processes with its peer's interpreter (``envs.py`` installs them). Output: the tables (``summary.py``) and
``results/peers.json`` (``--out-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for _p in (str(HERE), str(HERE.parent), str(REPO)):  # envs, summary; _harness; aiodelayq.testing (this checkout)
    if _p not in sys.path:
        sys.path.insert(0, _p)

import envs  # noqa: E402
import redis  # noqa: E402
from _harness import Child  # noqa: E402
from summary import table_lines  # noqa: E402

from aiodelayq.testing import ThrowawayServer, pick_server_kind, server_version  # noqa: E402

PEERS = ("aiodelayq", "bullmq", "arq", "saq")
HAS_BULK = {"aiodelayq": True, "bullmq": True, "arq": False, "saq": False}
LATE = ("p50", "p90", "p99", "max")


@dataclass(frozen=True)
class Sizes:
    rounds: int = 3
    in_flight: int = 64
    batch: int = 1000  # jobs per bulk call
    a_jobs: int = 20_000
    a_delay_min_ms: int = 1000
    a_delay_max_ms: int = 6000
    a_tail_s: float = 120.0  # after the last due time; jobs not received by then are lost
    b_jobs: int = 100_000
    b_delay_ms: int = 1000
    b_bound_s: float = 20.0  # drain window; a peer still draining then is reported "bounded"
    c_jobs: int = 20_000
    c_delay_ms: int = 3_600_000


FULL = Sizes()
QUICK = Sizes(rounds=1, a_jobs=2000, a_delay_max_ms=2000, a_tail_s=30.0, b_jobs=10_000, b_bound_s=10.0, c_jobs=5000)


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="aiodelayq vs BullMQ, arq and saq: three scenarios, one server, one run.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, one round")
    p.add_argument("--rounds", type=int, choices=range(1, 11), help="rounds (default 3, quick 1)")
    p.add_argument("--only", default=",".join(PEERS), help="comma-separated peers")
    p.add_argument("--scenarios", default="A,B,C", help="comma-separated scenarios (A lateness, B drain, C memory)")
    p.add_argument("--server-kind", help="throwaway server kind (default: the first found)")
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results", help="where peers.json goes")
    p.add_argument("--setup-only", action="store_true", help="install the peers' environments and stop")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    args.scenarios = [s.strip().upper() for s in args.scenarios.split(",") if s.strip()]
    if any(s not in PEERS for s in args.only) or any(s not in ("A", "B", "C") for s in args.scenarios):
        p.error(f"peers are {', '.join(PEERS)}; scenarios are A, B, C")
    return args


async def driver(peer: envs.Peer, url: str, work: Path, role: str, scenario: str, total: int,
                 *extra: str) -> tuple[Child, Path]:
    """One driver process of a peer against the run's server, and the file of its JSON result."""
    out = work / f"{time.monotonic_ns()}-{peer.name}-{scenario}-{role}.json"
    return await Child.start([*peer.command, "--redis-url", url, "--role", role, "--scenario", scenario,
                              "--total", str(total), "--out", str(out), *extra], stdin=role == "consumer",
                             env={**os.environ, **peer.env}), out


async def result(child: Child, out: Path, bound_s: float) -> dict[str, Any]:
    """The result of a driver once it exited (within ``bound_s``, else killed: a failure)."""
    try:
        await child.wait(bound_s)
    finally:
        await child.stop()
    answer: dict[str, Any] = json.loads(await asyncio.to_thread(out.read_text))
    return answer


async def produce(peer: envs.Peer, url: str, work: Path, scenario: str, total: int, s: Sizes,
                  delay_ms: tuple[int, int], mode: str = "single") -> dict[str, Any]:
    return await result(*await driver(peer, url, work, "producer", scenario, total, "--mode", mode, "--in-flight",
                                      str(s.in_flight), "--batch", str(s.batch), "--delay-min-ms",
                                      str(delay_ms[0]), "--delay-max-ms", str(delay_ms[1])), 900.0)


async def scenario_a(peer: envs.Peer, url: str, work: Path, s: Sizes, ctl: redis.Redis) -> dict[str, Any]:
    consumer, out = await driver(peer, url, work, "consumer", "A", s.a_jobs)
    try:
        if (await consumer.line(60.0)).strip() != b"ready":
            raise consumer.fail("not ready")
        prod = await produce(peer, url, work, "A", s.a_jobs, s, (s.a_delay_min_ms, s.a_delay_max_ms))
        deadline = prod["last_due_ms"] + s.a_tail_s * 1000.0
        await consumer.send(f"deadline {deadline:.1f}")
        cons = await result(consumer, out, max(0.0, deadline / 1000.0 - time.time()) + 60.0)
    finally:
        await consumer.stop()
    lost = prod["enqueued"] - cons["received"]
    # Jobs not received by the deadline count as infinitely late: a percentile that lands on them is
    # reported as "> a_tail_s after the last due time" (None in the JSON).
    late = sorted(cons["late_ms"]) + [float("inf")] * max(0, lost)
    n = len(late)  # nearest-rank percentiles
    stats = ({k: late[-1] if k == "max" else late[max(1, min(n, -(-n * int(k[1:]) // 100))) - 1] for k in LATE}
             if late else dict.fromkeys(LATE, float("nan")))
    return {"enqueue_rate": prod["rate"], "enqueued": prod["enqueued"], "enqueue_failed": prod["failed"],
            "enqueue_errors": prod["errors"], "received": cons["received"], "lost": lost,
            "duplicates": cons["duplicates"], "out_of_range": cons["out_of_range"], "stopped": cons["stopped"],
            "late_ms": {k: (None if v == float("inf") else v) for k, v in stats.items()},
            "consumer_s": (cons["t_last_ms"] - cons["t_start_ms"]) / 1000.0 if cons["t_last_ms"] else None}


async def scenario_b(peer: envs.Peer, url: str, work: Path, s: Sizes, ctl: redis.Redis) -> dict[str, Any]:
    mode = "bulk" if HAS_BULK[peer.name] else "single"
    prod = await produce(peer, url, work, "B", s.b_jobs, s, (s.b_delay_ms, s.b_delay_ms), mode)
    await asyncio.sleep(max(0.0, (prod["last_due_ms"] + 200.0) / 1000.0 - time.time()))  # every job due first
    cons = await result(*await driver(peer, url, work, "consumer", "B", s.b_jobs, "--bound-s", str(s.b_bound_s)),
                        s.b_bound_s + 120.0)
    bounded = cons["stopped"] != "all"
    end = cons["deadline_ms"] if bounded else cons["t_last_ms"]
    seconds = (end - cons["t_start_ms"]) / 1000.0 if end else None
    return {"fill_mode": mode, "fill_rate": prod["rate"], "enqueued": prod["enqueued"],
            "enqueue_failed": prod["failed"], "received": cons["received"], "duplicates": cons["duplicates"],
            "bounded": bounded, "seconds": seconds, "drain_rate": cons["received"] / seconds if seconds else None}


async def scenario_c(peer: envs.Peer, url: str, work: Path, s: Sizes, ctl: redis.Redis) -> dict[str, Any]:
    mode = "bulk" if HAS_BULK[peer.name] else "single"
    await asyncio.sleep(0.3)  # after the FLUSHALL: let the allocator settle
    before = int(ctl.info("memory")["used_memory"])
    prod = await produce(peer, url, work, "C", s.c_jobs, s, (s.c_delay_ms, s.c_delay_ms), mode)
    await asyncio.sleep(0.3)  # the producer's connections are gone (their buffers are in used_memory too)
    after = int(ctl.info("memory")["used_memory"])
    return {"mode": mode, "enqueued": prod["enqueued"], "enqueue_rate": prod["rate"], "keys": int(ctl.dbsize()),
            "bytes_per_job": (after - before) / prod["enqueued"] if prod["enqueued"] else None}


SCENARIOS = {"A": scenario_a, "B": scenario_b, "C": scenario_c}


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the median over the rounds that ran without error (lateness: a censored round, None,
    counts as infinitely late)."""
    ok = {sc: [r[sc] for r in rounds if sc in r and "error" not in r[sc]] for sc in SCENARIOS}

    def med(values: list[Any], censored: bool = False) -> float | None:
        vals = [float("inf") if v is None else v for v in values] if censored else [v for v in values if v is not None]
        m = statistics.median(vals) if vals else None
        return None if m == float("inf") else m

    out: dict[str, Any] = {"rounds_ok": {sc: len(v) for sc, v in ok.items()},
                           "errors": [f"round {i + 1} {sc}: {r[sc]['error']}" for i, r in enumerate(rounds)
                                      for sc in r if "error" in r[sc]]}
    if a := ok["A"]:
        out["enqueue_rate"] = med([r["enqueue_rate"] for r in a])
        for k in LATE:
            out[f"late_{k}_ms"] = med([r["late_ms"][k] for r in a], censored=True)
            out[f"late_{k}_censored"] = out[f"late_{k}_ms"] is None
        for k in ("lost", "duplicates", "enqueued"):
            out[f"{k}_total"] = sum(r[k] for r in a)
    if b := ok["B"]:
        out.update(fill_rate=med([r["fill_rate"] for r in b]), fill_mode=b[0]["fill_mode"],
                   drain_rate=med([r["drain_rate"] for r in b]), drain_bounded_rounds=sum(r["bounded"] for r in b))
    if ok["C"]:
        out["bytes_per_job"] = med([r["bytes_per_job"] for r in ok["C"]])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    sizes = Sizes(**{**asdict(sizes), "rounds": args.rounds or sizes.rounds})
    t_start = time.perf_counter()
    peers = {name: envs.ensure(name) for name in args.only}
    for name, p in peers.items():
        log(f"{name}: " + (f"SKIPPED: {p.skipped}" if p.skipped else
                           ", ".join(f"{k} {v}" for k, v in p.versions.items() if k != "from")))
    if args.setup_only:
        return 0
    runnable = [n for n in args.only if not peers[n].skipped]
    kind = pick_server_kind(args.server_kind)
    if kind is None:
        raise SystemExit("no server kind found (pip install 'aiodelayq[server]')")
    label = f"{kind.name} {server_version(kind.binary)}"
    info = {"nproc": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_start": os.getloadavg(), "server": label,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in runnable}
    with ThrowawayServer(kind) as srv, tempfile.TemporaryDirectory(prefix="aiodelayq-peers-") as work:
        ctl = redis.Redis.from_url(srv.url)
        log(f"server: {label} at {srv.url} (throwaway, flushed before every scenario); {info['nproc']} CPUs, "
            f"load {info['loadavg_start'][0]:.2f}; sizes {asdict(sizes)}")
        for rnd in range(sizes.rounds):
            order = runnable[rnd % len(runnable):] + runnable[:rnd % len(runnable)] if runnable else []
            log(f"== round {rnd + 1}/{sizes.rounds}: {', '.join(order)}")
            results: dict[str, dict[str, Any]] = {n: {} for n in order}
            for scenario in args.scenarios:
                for name in order:
                    ctl.flushall(asynchronous=False)
                    t0 = time.perf_counter()
                    try:
                        r = asyncio.run(SCENARIOS[scenario](peers[name], srv.url, Path(work), sizes, ctl))
                    except (RuntimeError, OSError, KeyError, ValueError) as exc:
                        r = {"error": str(exc)}
                    r["scenario_s"] = time.perf_counter() - t0
                    results[name][scenario] = r
                    log(f"    {name:9} {scenario}: " + ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                                                             for k, v in r.items() if not isinstance(v, list)))
            for name in order:
                rounds[name].append(results[name])
        ctl.flushall(asynchronous=False)
        ctl.close()
    info["loadavg_end"] = os.getloadavg()
    result = {"machine": info, "sizes": asdict(sizes), "quick": args.quick, "scenarios": args.scenarios,
              "peers": {n: {"versions": peers[n].versions, "skipped": peers[n].skipped, "has_bulk": HAS_BULK[n]}
                        for n in args.only},
              "rounds": rounds, "medians": {n: medians(rounds[n]) for n in runnable},
              "total_s": time.perf_counter() - t_start}
    log("\n" + "\n".join(table_lines(result)))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_json = args.out_dir / "peers.json"
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    log(f"\nwrote {out_json}")
    log(f"total {result['total_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
