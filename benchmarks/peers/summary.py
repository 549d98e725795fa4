"""The peers benchmark's tables (Markdown, ratios first) and figure, from the result ``run.py`` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LABEL = {"aiodelayq": "aiodelayq", "bullmq": "BullMQ", "arq": "arq", "saq": "saq"}
COLOR = {"aiodelayq": "#1f77b4", "bullmq": "#d62728", "arq": "#2ca02c", "saq": "#ff7f0e"}


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}{unit}"
    if abs(v) >= 10:
        return f"{v:.0f}{unit}"
    return f"{v:.1f}{unit}"


def _ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or den == 0:
        return "n/a"
    r = num / den
    return f"{r:.2f} x" if r < 10 else f"{r:,.0f} x"


def _late(m: dict[str, Any], key: str, tail_s: float) -> str:
    if m.get(f"late_{key}_censored"):
        return f"> {tail_s:.0f} s after the last due"
    return _num(m.get(f"late_{key}_ms"))


def table_lines(result: dict[str, Any]) -> list[str]:
    """Two Markdown tables: how many times better aiodelayq is per metric, then the medians themselves."""
    meds: dict[str, dict[str, Any]] = result["medians"]
    peers: dict[str, dict[str, Any]] = result["peers"]
    sizes = result["sizes"]
    tail = sizes["a_tail_s"]
    n_rounds = sizes["rounds"]
    ours = meds.get("aiodelayq")
    lines = [f"Medians of {n_rounds} round(s), interleaved; A: {sizes['a_jobs']:,} jobs, delays "
             f"{sizes['a_delay_min_ms'] / 1000:g}-{sizes['a_delay_max_ms'] / 1000:g} s; B: {sizes['b_jobs']:,} due "
             f"jobs, drain window {sizes['b_bound_s']:g} s; C: {sizes['c_jobs']:,} pending jobs.", ""]
    lines += ["**aiodelayq's advantage** (how many times better aiodelayq is; > 1: aiodelayq better): rates are "
              "aiodelayq ÷ peer, lateness and memory peer ÷ aiodelayq.", "",
              "| peer | enqueue, 64 in flight | enqueue, bulk call | lateness p50 | lateness p99 | lateness max | "
              "drain | memory per pending job |",
              "|---|---|---|---|---|---|---|---|"]
    for name, info in peers.items():
        if name == "aiodelayq":
            continue
        if info["skipped"]:
            lines.append(f"| {LABEL[name]} | skipped: {info['skipped']} |||||||")
            continue
        m = meds.get(name, {})
        if not ours:
            lines.append(f"| {LABEL[name]} | n/a (aiodelayq not in this run) |||||||")
            continue

        def late_ratio(key: str, m: dict[str, Any] = m) -> str:
            if m.get(f"late_{key}_censored"):
                return f"> {tail * 1000 / (ours.get(f'late_{key}_ms') or 1):,.0f} x"
            return _ratio(m.get(f"late_{key}_ms"), ours.get(f"late_{key}_ms"))

        bulk = _ratio(ours.get("fill_rate"), m.get("fill_rate")) if info["has_bulk"] else "no bulk call"
        lines.append(f"| {LABEL[name]} | {_ratio(ours.get('enqueue_rate'), m.get('enqueue_rate'))} | {bulk} | "
                     f"{late_ratio('p50')} | {late_ratio('p99')} | {late_ratio('max')} | "
                     f"{_ratio(ours.get('drain_rate'), m.get('drain_rate'))} | "
                     f"{_ratio(m.get('bytes_per_job'), ours.get('bytes_per_job'))} |")
    lines += ["", "**Medians** (lost and duplicates: totals over the rounds):", "",
              "| peer | enqueue/s, 64 in flight | enqueue/s, bulk call | lateness p50 / p99 / max (ms) | "
              "lost / duplicates | drain (jobs/s) | bytes per pending job |",
              "|---|---|---|---|---|---|---|"]
    bounded_note = False
    for name, info in peers.items():
        if info["skipped"]:
            lines.append(f"| {LABEL[name]} | skipped: {info['skipped']} ||||||")
            continue
        m = meds.get(name, {})
        bulk = _num(m.get("fill_rate")) if info["has_bulk"] else f"none ({_num(m.get('fill_rate'))} with 64 in flight)"
        drain = _num(m.get("drain_rate"))
        if m.get("drain_bounded_rounds"):
            drain += f" (bounded in {m['drain_bounded_rounds']}/{m['rounds_ok']['B']})"
            bounded_note = True
        lost = (f"{m['lost_total']:,} / {m['duplicates_total']:,} of {m['enqueued_total']:,}"
                if "lost_total" in m else "n/a")
        lines.append(f"| {LABEL[name]} | {_num(m.get('enqueue_rate'))} | {bulk} | "
                     f"{_late(m, 'p50', tail)} / {_late(m, 'p99', tail)} / {_late(m, 'max', tail)} | {lost} | "
                     f"{drain} | {_num(m.get('bytes_per_job'))} |")
    if bounded_note:
        lines += ["", f"Bounded: the peer had not drained the backlog {sizes['b_bound_s']:g} s after its worker "
                  "started; its rate is the jobs it received in that window over the window."]
    errors = [f"{LABEL[n]}: {e}" for n, m in meds.items() for e in m.get("errors", [])]
    if errors:
        lines += ["", "Errors:"] + [f"- {e}" for e in errors]
    versions = "; ".join(", ".join(f"{k} {v}" for k, v in info["versions"].items() if k != "from")
                         for n, info in peers.items() if not info["skipped"])
    lines += ["", f"Versions: {versions}. Server: {result['machine']['server']}."]
    return lines


def plot(result: dict[str, Any], path: Path) -> bool:
    """Bars of the medians, one panel per metric; ``False`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure (pip install matplotlib)")
        return False
    names = [n for n in result["peers"] if n in result["medians"]]
    if not names:
        return False
    tail_ms = result["sizes"]["a_tail_s"] * 1000.0
    panels = [("enqueue, 64 in flight (jobs/s)", "enqueue_rate", False),
              ("enqueue, bulk call (jobs/s; arq, saq: none)", "fill_rate", False),
              ("lateness p50 (ms, log)", "late_p50_ms", True), ("lateness p99 (ms, log)", "late_p99_ms", True),
              ("drain of a due backlog (jobs/s, log)", "drain_rate", True),
              ("memory per pending job (bytes)", "bytes_per_job", False)]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (title, key, log_scale) in zip(axes.flat, panels, strict=True):
        for x, name in enumerate(names):
            m = result["medians"][name]
            value = m.get(key)
            if key == "fill_rate" and not result["peers"][name]["has_bulk"]:
                value = None
            if key.startswith("late_") and m.get(key.replace("_ms", "_censored")):
                value = tail_ms  # beyond the tail bound
            if value is None:
                ax.annotate("none", (x, 0), ha="center", va="bottom", fontsize=8)
                continue
            ax.bar(x, value, color=COLOR[name], alpha=0.8)
            ax.annotate(_num(value), (x, value), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), [LABEL[n] for n in names])
        ax.set_title(title, fontsize=10)
        if log_scale:
            ax.set_yscale("log")
    fig.suptitle(f"aiodelayq vs BullMQ, arq, saq: defaults, one consumer process, {result['machine']['server']}; "
                 f"medians of {result['sizes']['rounds']} interleaved round(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":  # python benchmarks/peers/summary.py RESULTS.json: the tables of a peers results file
    import json
    import sys

    print("\n".join(table_lines(json.loads(Path(sys.argv[1]).read_text()))))
