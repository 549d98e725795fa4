"""The peers benchmark's tables (Markdown, ratios first), from the result ``run.py`` writes;
``python benchmarks/peers/summary.py RESULTS.json`` prints the tables of a results file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # report.py: one way to format
from report import fmt_num, fmt_ratio, fmt_sig

LABEL = {"aiodelayq": "aiodelayq", "bullmq": "BullMQ", "arq": "arq", "saq": "saq"}


def table_lines(result: dict[str, Any]) -> list[str]:
    """Two Markdown tables: how many times better aiodelayq is per metric, then the medians themselves."""
    meds: dict[str, dict[str, Any]] = result["medians"]
    peers: dict[str, dict[str, Any]] = result["peers"]
    sizes, ours = result["sizes"], meds.get("aiodelayq") or {}
    tail = sizes["a_tail_s"]

    def times(a: float | None, b: float | None) -> str:
        return fmt_ratio(a / b if a is not None and b else None)

    def late(m: dict[str, Any], key: str, ratio: bool = False) -> str:
        value, base = m.get(f"late_{key}_ms"), ours.get(f"late_{key}_ms")
        if m.get(f"late_{key}_censored"):  # some jobs not received by the tail bound: beyond it
            return f"> {fmt_ratio(tail * 1000 / (base or 1))}" if ratio else f"> {tail:.0f} s after the last due"
        return times(value, base) if ratio else fmt_sig(value)

    lines = [f"Medians of {sizes['rounds']} round(s), interleaved; A: {sizes['a_jobs']:,} jobs, delays "
             f"{sizes['a_delay_min_ms'] / 1000:g}-{sizes['a_delay_max_ms'] / 1000:g} s; B: {sizes['b_jobs']:,} due "
             f"jobs, drain window {sizes['b_bound_s']:g} s; C: {sizes['c_jobs']:,} pending jobs.", "",
             "**aiodelayq's advantage** (how many times better aiodelayq is; > 1: aiodelayq better): rates are "
             "aiodelayq ÷ peer, lateness and memory peer ÷ aiodelayq.", "",
             "| peer | enqueue, 64 in flight | enqueue, bulk call | lateness p50 | lateness p99 | lateness max | "
             "drain | memory per pending job |", "|---|---|---|---|---|---|---|---|"]
    for name, info in peers.items():
        m = meds.get(name, {})
        if name != "aiodelayq":
            lines.append(f"| {LABEL[name]} | skipped: {info['skipped']} |||||||" if info["skipped"] else
                         f"| {LABEL[name]} | {times(ours.get('enqueue_rate'), m.get('enqueue_rate'))} | "
                         f"{times(ours.get('fill_rate'), m.get('fill_rate')) if info['has_bulk'] else 'no bulk call'}"
                         f" | {' | '.join(late(m, k, True) for k in ('p50', 'p99', 'max'))} | "
                         f"{times(ours.get('drain_rate'), m.get('drain_rate'))} | "
                         f"{times(m.get('bytes_per_job'), ours.get('bytes_per_job'))} |")
    lines += ["", "**Medians** (lost and duplicates: totals over the rounds; bounded: the jobs received in the "
              f"{sizes['b_bound_s']:g} s drain window over the window):", "",
              "| peer | enqueue/s, 64 in flight | enqueue/s, bulk call | lateness p50 / p99 / max (ms) | "
              "lost / duplicates | drain (jobs/s) | bytes per pending job |", "|---|---|---|---|---|---|---|"]
    for name, info in peers.items():
        m = meds.get(name, {})
        if info["skipped"]:
            lines.append(f"| {LABEL[name]} | skipped: {info['skipped']} ||||||")
            continue
        bounded = f" (bounded in {m['drain_bounded_rounds']}/{m['rounds_ok']['B']})" if m.get("drain_bounded_rounds") \
            else ""
        lost = f"{m['lost_total']:,} / {m['duplicates_total']:,} of {m['enqueued_total']:,}" if "lost_total" in m \
            else "n/a"
        lines.append(f"| {LABEL[name]} | {fmt_num(m.get('enqueue_rate'))} | " + (
            fmt_num(m.get("fill_rate")) if info["has_bulk"] else f"none ({fmt_num(m.get('fill_rate'))} with 64 in "
            "flight)") + f" | {' / '.join(late(m, k) for k in ('p50', 'p99', 'max'))} | {lost} | "
            f"{fmt_num(m.get('drain_rate'))}{bounded} | {fmt_num(m.get('bytes_per_job'))} |")
    errors = [f"- {LABEL[n]}: {e}" for n, m in meds.items() for e in m.get("errors", [])]
    versions = "; ".join(", ".join(f"{k} {v}" for k, v in info["versions"].items() if k != "from")
                         for info in peers.values() if not info["skipped"])
    return [*lines, *(["", "Errors:", *errors] if errors else []),
            "", f"Versions: {versions}. Server: {result['machine']['server']}."]


if __name__ == "__main__":
    print("\n".join(table_lines(json.loads(Path(sys.argv[1]).read_text()))))
