"""What the Python peer drivers (``aiodelayq_peer.py``, ``arq_peer.py``, ``saq_peer.py``) share: the command
line, the job sequence, the producer loop and the consumer's recorder. ``bullmq_peer.mjs`` does the same in
JavaScript; keep the two in step.

Standard library only: each driver runs with its peer's own interpreter (``.nox/peers-<peer>/bin/python``),
where nothing of this repository is installed.

Protocol with ``run.py``:

- ``--role producer``: enqueue ``--total`` jobs, write a JSON summary to ``--out``, exit.
- ``--role consumer``: start the framework's worker, print ``ready`` on stdout once it consumes, record every
  job it is handed, and stop when every job arrived (then ``GRACE_S`` more, to see duplicates), when
  ``--bound-s`` passed since the worker was started, or at the epoch-ms deadline sent on stdin as
  ``deadline <ms>``, whichever comes first; then write the JSON summary to ``--out``.

Job ``i`` carries ``{"i": i, "due": due_ms}``, where ``due_ms`` is the producer's wall clock just before the
enqueue call plus the job's delay: the consumer's lateness is its wall clock on receipt minus ``due``
(producer and consumer share the machine, hence the clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

GOLDEN = 0.6180339887498949
GRACE_S = 1.0  # after the last job arrived, to catch duplicates delivered late


def delay_ms(i: int, lo: int, hi: int) -> int:
    """Delay of job ``i``: uniform over ``[lo, hi]`` ms by the golden-ratio sequence, so every peer (and the
    JavaScript driver, same IEEE arithmetic) gets the very same delays without sharing a random generator."""
    return lo + int(((i * GOLDEN) % 1.0) * (hi - lo + 1))


def now_ms() -> float:
    return time.time() * 1000.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--name", default="peers", help="queue name")
    p.add_argument("--role", choices=("producer", "consumer"), required=True)
    p.add_argument("--scenario", choices=("A", "B", "C"), required=True)
    p.add_argument("--total", type=int, required=True)
    p.add_argument("--delay-min-ms", type=int, default=1000)
    p.add_argument("--delay-max-ms", type=int, default=1000)
    p.add_argument("--mode", choices=("single", "bulk"), default="single",
                   help="producer: one call per job with --in-flight calls outstanding, or the bulk call")
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--batch", type=int, default=1000, help="jobs per bulk call")
    p.add_argument("--bound-s", type=float, default=None, help="consumer: stop this long after the worker started")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def write(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result))


# -- producer ----------------------------------------------------------------------------------------------

SendOne = Callable[[int, float, int], Awaitable[Any]]  # (i, due_ms, delay_ms)
SendBulk = Callable[[list[tuple[int, float, int]]], Awaitable[Any]]


async def produce(args: argparse.Namespace, send_one: SendOne, send_bulk: SendBulk | None) -> dict[str, Any]:
    """Enqueue jobs ``0 .. total-1``: ``--in-flight`` concurrent callers of ``send_one`` (each takes the next
    job when its call returned), or ``send_bulk`` of ``--batch`` jobs, one call at a time. The rate is jobs
    enqueued over the wall time from the first call to the last reply."""
    total, lo, hi = args.total, args.delay_min_ms, args.delay_max_ms
    failed: list[int] = []
    errors: list[str] = []
    last_due = 0.0
    t0 = time.perf_counter()
    if args.mode == "bulk":
        if send_bulk is None:
            raise SystemExit("this peer has no bulk call")
        for start in range(0, total, args.batch):
            base = now_ms()
            delays = [(i, delay_ms(i, lo, hi)) for i in range(start, min(total, start + args.batch))]
            batch = [(i, base + d, d) for i, d in delays]
            try:
                await send_bulk(batch)
            except Exception as exc:  # reported, not raised: a failed call is a result too
                failed += [i for i, _, _ in batch]
                errors.append(repr(exc))
            last_due = max(last_due, max(d for _, d, _ in batch))
    else:
        next_i = 0

        async def caller() -> None:
            nonlocal next_i, last_due
            while next_i < total:
                i = next_i
                next_i += 1
                d = delay_ms(i, lo, hi)
                due = now_ms() + d
                last_due = max(last_due, due)
                try:
                    await send_one(i, due, d)
                except Exception as exc:
                    failed.append(i)
                    errors.append(repr(exc))

        await asyncio.gather(*(caller() for _ in range(args.in_flight)))
    seconds = time.perf_counter() - t0
    ok = total - len(failed)
    return {"enqueued": ok, "failed": len(failed), "failed_ids": failed[:100], "errors": errors[:5],
            "seconds": seconds, "rate": ok / seconds if seconds > 0 else None, "last_due_ms": last_due,
            "mode": args.mode}


# -- consumer ----------------------------------------------------------------------------------------------


class Recorder:
    """What a consumer saw: per job its lateness, duplicates, and when it started and last got a new job."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.total = args.total
        self.bound_s = args.bound_s
        self.seen: set[int] = set()
        self.late_ms: list[float] = []
        self.duplicates = self.out_of_range = 0
        self.t_start_ms: float | None = None
        self.t_last_ms: float | None = None
        self.deadline_ms: float | None = None
        self.stopped = ""

    def started(self) -> None:
        """Call right before the worker is started: the drain rate (scenario B) is timed from here."""
        self.t_start_ms = now_ms()
        if self.bound_s is not None:
            self.deadline_ms = self.t_start_ms + self.bound_s * 1000.0

    def ready(self) -> None:
        """The worker consumes: tell ``run.py`` (and start listening for a deadline on stdin)."""
        print("ready", flush=True)
        threading.Thread(target=self._read_stdin, daemon=True).start()

    def record(self, i: int, due_ms: float) -> None:
        now = now_ms()
        if not 0 <= i < self.total:
            self.out_of_range += 1
        elif i in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(i)
            self.late_ms.append(now - due_ms)
            self.t_last_ms = now

    def _read_stdin(self) -> None:
        # A daemon thread: it may stay blocked on stdin at exit without holding the process up.
        for line in sys.stdin:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "deadline":
                self.deadline_ms = min(self.deadline_ms or math.inf, float(parts[1]))

    async def wait(self) -> None:
        """Return when every job arrived (plus ``GRACE_S``) or the deadline passed (checked every 10 ms)."""
        while len(self.seen) < self.total:
            if self.deadline_ms is not None and now_ms() >= self.deadline_ms:
                self.stopped = "deadline"
                return
            await asyncio.sleep(0.01)
        self.stopped = "all"
        await asyncio.sleep(GRACE_S)

    def result(self, **extra: Any) -> dict[str, Any]:
        return {"received": len(self.seen), "duplicates": self.duplicates, "out_of_range": self.out_of_range,
                "late_ms": self.late_ms, "t_start_ms": self.t_start_ms, "t_last_ms": self.t_last_ms,
                "deadline_ms": self.deadline_ms, "stopped": self.stopped, **extra}
