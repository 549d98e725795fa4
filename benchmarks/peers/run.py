"""aiodelayq against its peers, BullMQ, arq and saq: the same three scenarios on each, on one throwaway server,
in one run, interleaved, each with its framework's idiomatic calls and default settings (the method:
``benchmarks/README.md``, "Peers"; sizes: :data:`FULL`, ``--quick``: :data:`QUICK`).

- **A, lateness**: a consumer process runs the framework's worker while a producer process enqueues jobs
  with delays spread over a range, 64 calls in flight: the enqueue rate, lateness, lost and duplicates.
- **B, drain**: jobs all due before one consumer process starts (filled with the bulk call where there is
  one): the drain rate, or "bounded" when the consumer has not drained them within ``b_bound_s``.
- **C, memory**: ``used_memory`` before and after enqueueing jobs due in 1 h, per job.

The server is flushed before every scenario. For each round, for each scenario, every peer in turn, the
order rotated by one each round; the tables quote medians of the rounds. Each driver runs as its own
processes with its peer's interpreter (``envs.py`` installs them; ``common.py``: the protocol). Output:
the tables, ``results/peers.json`` and ``results/peers.png`` (``--out-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for _p in (str(HERE), str(REPO)):  # envs/summary next to this file; aiodelayq.testing from this checkout
    if _p not in sys.path:
        sys.path.insert(0, _p)

import envs  # noqa: E402
import redis  # noqa: E402
from summary import plot, table_lines  # noqa: E402

from aiodelayq.testing import ThrowawayServer, pick_server_kind, server_version  # noqa: E402

PEERS = ("aiodelayq", "bullmq", "arq", "saq")
HAS_BULK = {"aiodelayq": True, "bullmq": True, "arq": False, "saq": False}


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
QUICK = Sizes(rounds=1, a_jobs=2000, a_delay_max_ms=2000, a_tail_s=30.0, b_jobs=10_000, b_bound_s=10.0,
              c_jobs=5000)


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
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results", help="where peers.json and .png go")
    p.add_argument("--setup-only", action="store_true", help="install the peers' environments and stop")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    args.scenarios = [s.strip().upper() for s in args.scenarios.split(",") if s.strip()]
    if any(s not in PEERS for s in args.only) or any(s not in ("A", "B", "C") for s in args.scenarios):
        p.error(f"peers are {', '.join(PEERS)}; scenarios are A, B, C")
    return args


class Runner:
    """Starts a peer's driver processes against the run's server and reads their JSON results."""

    def __init__(self, url: str, work: Path) -> None:
        self.url, self.work, self._n = url, work, 0

    def _start(self, peer: envs.Peer, role: str, scenario: str, total: int, *extra: str) -> tuple[Any, Path, Path]:
        self._n += 1
        out = self.work / f"{self._n:04d}-{peer.name}-{scenario}-{role}.json"
        err = out.with_suffix(".err")
        with err.open("w") as stderr:  # a consumer prints "ready" on stdout and reads its deadline on stdin
            proc = subprocess.Popen([*peer.command, "--redis-url", self.url, "--role", role, "--scenario", scenario,
                                     "--total", str(total), "--out", str(out), *extra],
                                    stdin=subprocess.PIPE if role == "consumer" else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE if role == "consumer" else stderr, stderr=stderr,
                                    env={**os.environ, **peer.env})
        return proc, out, err

    def produce(self, peer: envs.Peer, scenario: str, total: int, *extra: str) -> dict[str, Any]:
        proc, out, err = self._start(peer, "producer", scenario, total, *extra)
        return _result(peer.name, proc, out, err, 900.0)

    def consume(self, peer: envs.Peer, scenario: str, total: int, *extra: str) -> tuple[Any, Path, Path]:
        return self._start(peer, "consumer", scenario, total, *extra)


def _result(name: str, proc: Any, out: Path, err: Path, timeout_s: float) -> dict[str, Any]:
    """Wait (bounded) for a driver to exit and read its JSON result; killed when it overstays."""
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise RuntimeError(f"{name} still running after {timeout_s:.0f} s; killed: {_tail(err)}") from None
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{name} exited {proc.returncode}: {_tail(err)}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _kill(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _tail(path: Path) -> str:
    return envs.tail(path.read_text(errors="replace")) if path.exists() else ""


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (``inf`` entries stand for jobs never received)."""
    return sorted_values[max(1, min(len(sorted_values), -(-len(sorted_values) * p // 100))) - 1]


def scenario_a(run: Runner, peer: envs.Peer, s: Sizes) -> dict[str, Any]:
    proc, out, err = run.consume(peer, "A", s.a_jobs)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        if not ready or proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"{peer.name} consumer not ready after 60 s: {_tail(err)}")
        prod = run.produce(peer, "A", s.a_jobs, "--mode", "single", "--in-flight", str(s.in_flight),
                           "--delay-min-ms", str(s.a_delay_min_ms), "--delay-max-ms", str(s.a_delay_max_ms))
        deadline = prod["last_due_ms"] + s.a_tail_s * 1000.0
        proc.stdin.write(f"deadline {deadline:.1f}\n".encode())
        proc.stdin.flush()
        cons = _result(peer.name, proc, out, err, max(0.0, deadline / 1000.0 - time.time()) + 60.0)
    finally:
        _kill(proc)
    lost = prod["enqueued"] - cons["received"]
    # Jobs not received by the deadline count as infinitely late: a percentile that lands on them is
    # reported as "> a_tail_s after the last due time" (None in the JSON).
    late = sorted(cons["late_ms"]) + [float("inf")] * max(0, lost)
    stats = ({**{f"p{p}": percentile(late, p) for p in (50, 90, 99)}, "max": late[-1]} if late
             else dict.fromkeys(("p50", "p90", "p99", "max"), float("nan")))
    return {"enqueue_rate": prod["rate"], "enqueued": prod["enqueued"], "enqueue_failed": prod["failed"],
            "enqueue_errors": prod["errors"], "received": cons["received"], "lost": lost,
            "duplicates": cons["duplicates"], "out_of_range": cons["out_of_range"], "stopped": cons["stopped"],
            "late_ms": {k: (None if v == float("inf") else v) for k, v in stats.items()},
            "consumer_s": (cons["t_last_ms"] - cons["t_start_ms"]) / 1000.0 if cons["t_last_ms"] else None}


def scenario_b(run: Runner, peer: envs.Peer, s: Sizes) -> dict[str, Any]:
    mode = "bulk" if HAS_BULK[peer.name] else "single"
    prod = run.produce(peer, "B", s.b_jobs, "--mode", mode, "--in-flight", str(s.in_flight), "--batch",
                       str(s.batch), "--delay-min-ms", str(s.b_delay_ms), "--delay-max-ms", str(s.b_delay_ms))
    time.sleep(max(0.0, (prod["last_due_ms"] + 200.0) / 1000.0 - time.time()))  # every job due first
    proc, out, err = run.consume(peer, "B", s.b_jobs, "--bound-s", str(s.b_bound_s))
    try:
        cons = _result(peer.name, proc, out, err, s.b_bound_s + 120.0)
    finally:
        _kill(proc)
    bounded = cons["stopped"] != "all"
    end = cons["deadline_ms"] if bounded else cons["t_last_ms"]
    seconds = (end - cons["t_start_ms"]) / 1000.0 if end else None
    return {"fill_mode": mode, "fill_rate": prod["rate"], "enqueued": prod["enqueued"],
            "enqueue_failed": prod["failed"], "received": cons["received"], "duplicates": cons["duplicates"],
            "bounded": bounded, "seconds": seconds, "drain_rate": cons["received"] / seconds if seconds else None}


def scenario_c(run: Runner, peer: envs.Peer, s: Sizes, ctl: redis.Redis) -> dict[str, Any]:
    mode = "bulk" if HAS_BULK[peer.name] else "single"
    time.sleep(0.3)  # after the FLUSHALL: let the allocator settle
    before = int(ctl.info("memory")["used_memory"])
    prod = run.produce(peer, "C", s.c_jobs, "--mode", mode, "--in-flight", str(s.in_flight), "--batch",
                       str(s.batch), "--delay-min-ms", str(s.c_delay_ms), "--delay-max-ms", str(s.c_delay_ms))
    time.sleep(0.3)  # the producer's connections are gone (their buffers are in used_memory too)
    after = int(ctl.info("memory")["used_memory"])
    return {"mode": mode, "enqueued": prod["enqueued"], "enqueue_rate": prod["rate"], "keys": int(ctl.dbsize()),
            "bytes_per_job": (after - before) / prod["enqueued"] if prod["enqueued"] else None}


def one_line(peer: str, scenario: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"    {peer:9} {scenario}: ERROR {r['error']}"
    if scenario == "A":
        lat = " / ".join(">tail" if v is None else f"{v:.1f}" for v in r["late_ms"].values())
        return (f"    {peer:9} A: enqueue {r['enqueue_rate']:,.0f}/s, late p50/p90/p99/max {lat} ms, lost {r['lost']}, "
                f"duplicates {r['duplicates']}")
    if scenario == "B":
        return (f"    {peer:9} B: fill {r['fill_rate']:,.0f}/s ({r['fill_mode']}), drain {r['drain_rate'] or 0:,.0f}/s"
                f"{' BOUNDED' if r['bounded'] else ''}")
    return f"    {peer:9} C: {r['bytes_per_job']:.1f} B/job ({r['enqueued']:,} jobs, {r['keys']:,} keys)"


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the median over the rounds that ran without error (lateness: a censored round, None,
    counts as infinitely late)."""
    ok = {sc: [r[sc] for r in rounds if sc in r and "error" not in r[sc]] for sc in ("A", "B", "C")}

    def med(values: list[Any], censored: bool = False) -> float | None:
        vals = [float("inf") if v is None else v for v in values] if censored else [v for v in values if v is not None]
        m = statistics.median(vals) if vals else None
        return None if m == float("inf") else m

    out: dict[str, Any] = {"rounds_ok": {sc: len(v) for sc, v in ok.items()},
                           "errors": [f"round {i + 1} {sc}: {r[sc]['error']}" for i, r in enumerate(rounds)
                                      for sc in r if "error" in r[sc]]}
    if a := ok["A"]:
        out["enqueue_rate"] = med([r["enqueue_rate"] for r in a])
        for k in ("p50", "p90", "p99", "max"):
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
        log(f"{name}: " + (f"SKIPPED: {p.skipped}" if p.skipped else ", ".join(f"{k} {v}" for k, v in
                                                                              p.versions.items() if k != "from")))
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
        runner = Runner(srv.url, Path(work))
        for rnd in range(sizes.rounds):
            order = runnable[rnd % len(runnable):] + runnable[:rnd % len(runnable)] if runnable else []
            log(f"== round {rnd + 1}/{sizes.rounds}: {', '.join(order)}")
            results: dict[str, dict[str, Any]] = {n: {} for n in order}
            for scenario in args.scenarios:
                for name in order:
                    ctl.flushall(asynchronous=False)
                    t0 = time.perf_counter()
                    try:
                        r = (scenario_a(runner, peers[name], sizes) if scenario == "A"
                             else scenario_b(runner, peers[name], sizes) if scenario == "B"
                             else scenario_c(runner, peers[name], sizes, ctl))
                    except (RuntimeError, subprocess.SubprocessError, OSError, KeyError, ValueError) as exc:
                        r = {"error": str(exc)}
                    r["scenario_s"] = time.perf_counter() - t0
                    results[name][scenario] = r
                    log(one_line(name, scenario, r) + f"  [{r['scenario_s']:.0f} s]")
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
    log("")
    for line in table_lines(result):
        log(line)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_json = args.out_dir / "peers.json"
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    log(f"\nwrote {out_json}")
    if plot(result, out_json.with_suffix(".png")):
        log(f"wrote {out_json.with_suffix('.png')}")
    log(f"total {result['total_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
