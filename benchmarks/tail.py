"""Where the lateness tail comes from: late items against the producer's sends.

Run a lateness scenario with the two developer dumps, then this::

    AIODELAYQ_DUMP_LATENESS=/tmp/lat.json AIODELAYQ_DUMP_SENDS=/tmp/sends.json \\
        python benchmarks/run.py --only lateness_async_for --out-dir /tmp/out
    python benchmarks/tail.py /tmp/lat.json /tmp/sends.json --late-ms 3

It prints how many items were later than ``--late-ms`` and what share of them (and of a sample of
the others) were due or delivered while the producer's ``offer_many`` call was in flight (the
server runs a 1,000-item offer script for ~1.7 ms, and the producer burns a core encoding it).
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lateness", type=Path, help="AIODELAYQ_DUMP_LATENESS file")
    parser.add_argument("sends", type=Path, help="AIODELAYQ_DUMP_SENDS file")
    parser.add_argument("--late-ms", type=float, default=3.0)
    args = parser.parse_args()
    data = json.loads(args.lateness.read_text())
    shift = data["shift"]
    due = {int(k): v for k, v in data["due"].items()}
    rows = sorted((due[i], t - due[i], t) for i, t in zip(data["ids"], data["times"], strict=True) if i in due)
    # Sends are on the producer's local clock; lateness rows on the server clock.
    sends = sorted((a + shift, b + shift) for a, b, _ in json.loads(args.sends.read_text()))
    starts = [a for a, _ in sends]

    def during_send(due_ms: float, received_ms: float) -> bool:
        k = bisect.bisect_right(starts, received_ms) - 1
        while k >= 0 and sends[k][1] > due_ms - 60_000:
            if sends[k][0] < received_ms and sends[k][1] > due_ms:
                return True
            if sends[k][1] < due_ms:
                break
            k -= 1
        return False

    late = [r for r in rows if r[1] > args.late_ms]
    others = [r for r in rows if r[1] <= args.late_ms]
    sample = random.Random(1).sample(others, min(5000, len(others)))
    overlap_late = sum(during_send(r[0], r[2]) for r in late)
    overlap_others = sum(during_send(r[0], r[2]) for r in sample)
    print(f"items: {len(rows):,}; later than {args.late_ms} ms: {len(late):,} ({len(late) / max(1, len(rows)):.2%})")
    print(f"  of those, due or delivered while an offer call was in flight: {overlap_late / max(1, len(late)):.0%}")
    print(f"  of the others (sample of {len(sample):,}): {overlap_others / max(1, len(sample)):.0%}")
    print(f"producer calls: {len(sends)}")


if __name__ == "__main__":
    main()
