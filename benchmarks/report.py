"""What a run's result becomes: the summary printed at the end (ratios, absolute numbers, bars), the bars'
evaluation, the figure (``results.png``) and the number formats the progress lines use too."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from _harness import log

# -- formats ------------------------------------------------------------------------------------------


def fmt_num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{_num(value)}x"


def _num(value: float) -> str:
    """Three significant digits, thousands separated, never in exponent form."""
    if value == 0 or math.isinf(value) or math.isnan(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def fmt_mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} MiB"


# -- bars, summary, plot ----------------------------------------------------------------------------


def evaluate_bars(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each bar: what, the threshold, the measured value, met or not, and by how much."""
    sc = res["scenarios"]
    bars: list[dict[str, Any]] = []

    def bar(what: str, measured: float | None, threshold: float, higher_is_better: bool, unit: str,
            note: str = "") -> None:
        if measured is None:
            bars.append({"bar": what, "measured": None, "threshold": threshold, "met": None, "margin": None,
                         "unit": unit, "note": note or "not measured"})
            return
        met = measured >= threshold if higher_is_better else measured <= threshold
        margin = measured / threshold if higher_is_better else (threshold / measured if measured else math.inf)
        bars.append({"bar": what, "measured": measured, "threshold": threshold, "met": met, "margin": margin,
                     "unit": unit, "note": note})

    if "offer" in sc:
        bar("offer, 64 awaiting callers: ours/reference >= 1.5x", sc["offer"]["ratio"], 1.5, True, "x")
    if "offer_many" in sc:
        bar("offer_many (batches of 1000) >= 150k items/s", sc["offer_many"]["ours"]["items_per_s"], 150_000, True,
            "items/s")
    if "transfer" in sc:
        t = sc["transfer"]
        if "1000000" in t["ours"]:
            bar("transfer at 1M >= 100k items/s", t["ours"]["1000000"]["items_per_s"], 100_000, True, "items/s")
        if "100000" in t["ours"]:
            note = "reference bounded: its rate over the bounded window" if t["reference"]["100000"]["bounded"] else ""
            bar("transfer at 100k: ours/reference >= 40x", t["ratio"]["100000"], 40, True, "x", note)
        worst = [t["ours"][k]["worst_script_ms"] for k in t["ours"] if t["ours"][k]["worst_script_ms"] is not None]
        bar("transfer: no script call over 5 ms at any N", max(worst) if worst else None, 5.0, False, "ms")
    if "lateness" in sc:
        lat = sc["lateness"]["ours"]["lateness_ms"]
        bar("lateness p99 <= 5 ms", lat["p99"], 5.0, False, "ms")
        bar("lateness max <= 50 ms", lat["max"], 50.0, False, "ms")
    if "lateness_async_for" in sc:
        la = sc["lateness_async_for"]
        lat = la["ours"]["lateness_ms"]
        unpinned = la.get("unpinned")
        where = "producer on its own CPU" if la["ours"].get("placement", {}).get("pinned") else "unpinned"
        also = (f"; unpinned p99 {fmt_ms(unpinned['lateness_ms']['p99'])}, lost {unpinned['lost']}, "
                f"duplicates {unpinned['duplicates']}") if unpinned else ""
        bar(f"lateness, async for at {la['rate']:,.0f}/s: p99 <= 5 ms", lat["p99"], 5.0, False, "ms",
            f"{where}; lost {la['ours']['lost']}, duplicates {la['ours']['duplicates']}{also}")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        lat, ping, load = rl["lateness_ms"], rl["ping"], rl["load"]
        note = (f"PING raw p50 {fmt_ms(ping['raw_p50_ms'])}, redis.asyncio p50 {fmt_ms(ping['client_p50_ms'])}; "
                f"load {load['loadavg_before'][0]:.2f} -> {load['loadavg_after'][0]:.2f}, "
                f"CPU busy {fmt_pct(load['cpu_busy_pct'])}")
        n = rl["consumers"]
        bar(f"reliable lateness, {n} consumer processes: p99 <= 5 ms", lat["p99"], 5.0, False, "ms", note)
        bar(f"reliable lateness, {n} consumer processes: max <= 50 ms", lat["max"], 50.0, False, "ms")
        bar("reliable lateness: 0 lost", rl["lost"], 0, False, "items", f"duplicates {rl['duplicates']}")
    if "e2e" in sc:
        bar("end-to-end >= 30k msgs/s", sc["e2e"]["ours"]["msgs_per_s"], 30_000, True, "msgs/s")
    if "idle" in sc:
        idle = sc["idle"]["ours"]
        bar("idle: one pub/sub connection", idle["pubsub_connections"], 1, False, "connections")
        expected = idle["expected_commands_per_s"]
        bar("idle: no script calls (the safety poll reads)", idle["script_calls_per_s"], 0.5, False, "calls/s")
        bar(f"idle: commands/s only from the safety poll (<= 1.1 x {expected:.0f}/s)",
            idle["commands_per_s"], 1.1 * expected, False, "commands/s")
        bar(f"idle: {sc['idle']['queues']} queues ({idle['takers']} taking) closed at once in <= 3 s",
            idle["close_s"], 3.0, False, "s")
        bar("idle: no library warnings while open and closing", idle["log_warnings"], 0, False, "lines")
        bar("idle: flat client memory (RSS growth <= 1 MiB)", max(0.0, idle["rss_growth_mb"] or 0.0)
            if idle["rss_growth_mb"] is not None else None, 1.0, False, "MiB")
    if "memory" in sc:
        bar("memory: ours <= reference + 10%", sc["memory"]["ratio"], 1.10, False, "x")
    if "drain" in sc:
        d = sc["drain"]["ratio"]
        bar("drain: async for >= 50% of take_many(100)", d["async_for"], 0.5, True, "x")
        bar("drain: messages() + ack() >= 10% of take_many(100)", d["messages_ack"], 0.1, True, "x")
        if d.get("worker16_vs_async_for") is not None:
            bar("drain: worker (no-op handler, concurrency 16) >= 70% of async for", d["worker16_vs_async_for"],
                0.7, True, "x")
    if "due_times" in sc:
        dt = sc["due_times"]
        o, r = dt["ours"]["lag_ms"]["p99"], dt["script_time"]["lag_ms"]["p99"]
        bar("due times of offer_many under load: p99 lag <= 0.5x the script clock's", o / r if r > 0 else None, 0.5,
            False, "x", f"{o:.2f} vs {r:.2f} ms; {dt['ours']['early']} calls more than 1 ms early")
    if "keys" in sc:
        k = sc["keys"]
        judged = k.get("jemalloc") or k  # on a jemalloc build when the run's server is a libc one
        where = f"on {judged.get('server', 'the run server')} ({judged['allocator']})"
        for part, title in (("offer", "keyed offer() >= 70% of unkeyed (64 callers)"),
                            ("transfer", f"transfer of a keyed backlog >= 70% of unkeyed ({k['transfer_n']:,})")):
            j, r = judged[part], k[part]
            detail = f"{where}: {j['keyed']['items_per_s']:,.0f} vs {j['unkeyed']['items_per_s']:,.0f} items/s"
            if "jemalloc" in k:
                detail += (f"; on the run's server ({k['allocator']}): {r['ratio']:.2f}x, "
                           f"{r['keyed']['items_per_s']:,.0f} vs {r['unkeyed']['items_per_s']:,.0f} items/s")
            bar(f"keys: {title}", j["ratio"], 0.7, True, "x", detail)
        floors = ("return 1", "allocating floor")
        keyed = {name: c for name, c in judged["calls"].items() if name not in floors}
        over = [c["over_1ms"] for c in keyed.values() if c["over_1ms"] is not None]
        detail = (f"{where}: "
                  + ", ".join(f"{name} mean {c['mean_ms'] or 0:.3f} ms, worst {c['max_ms'] or 0:.2f}"
                              for name, c in keyed.items())
                  + "; floors over 1 ms: " + ", ".join(f"{f} {judged['calls'][f]['over_1ms']}" for f in floors))
        if "jemalloc" in k:
            detail += (f"; on the run's server ({k['allocator']}): "
                       + ", ".join(f"{name} {c['over_1ms']}" for name, c in k["calls"].items()))
        bar(f"keys: get/reschedule/cancel/keyed offer calls over 1 ms with {k['pending_n']:,} pending",
            sum(over) if over else None, 0, False, "calls", detail)
    return bars


def summary_lines(res: dict[str, Any]) -> list[str]:
    sc = res["scenarios"]
    m = res["machine"]
    lines = [f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['platform']}, Python {m['python']}, redis-py "
             f"{m['redis_py']}, hiredis {m['hiredis']}",
             f"server:  {m['server']['kind']} {m['server']['server_name']} {m['server']['server_version']}; "
             f"git {m['git']}; {m['time_utc']}; run took {res['total_s']:.0f} s", "", "ratios (ours / reference)"]
    rows: list[tuple[str, float | None, bool, str, str]] = []  # name, ratio, higher is better, ours, reference

    def row(name: str, ratio: float | None, higher_better: bool, ours: str, ref: str) -> None:
        rows.append((name, ratio, higher_better, ours, ref))

    def paired(scenario: str, name: str, metric: str, higher_better: bool, digits: int = 0) -> None:
        """The row of a scenario with one ``metric`` for ``ours`` and ``reference`` and one ``ratio``."""
        x = sc[scenario]
        row(name, x["ratio"], higher_better, fmt_num(x["ours"][metric], digits),
            fmt_num(x["reference"][metric], digits))

    if "offer" in sc:
        paired("offer", "offer, 64 awaiting callers (items/s)", "items_per_s", True)
    if "offer_many" in sc:
        paired("offer_many", "offer_many, batches of 1000 (items/s)", "items_per_s", True)
    if "transfer" in sc:
        t = sc["transfer"]
        for n in t["ours"]:
            o, r = t["ours"][n], t["reference"][n]
            flag = " (bounded)" if r["bounded"] else ""
            row(f"transfer N={int(n):,} (items/s)", t["ratio"][n], True, fmt_num(o["items_per_s"]),
                fmt_num(r["items_per_s"]) + flag)
        for n in t["ours"]:
            o, r = t["ours"][n], t["reference"][n]
            ow, rw = o["worst_script_ms"], r["worst_script_ms"]
            row(f"worst transfer script N={int(n):,} (ms)", ow / rw if ow and rw else None, False, fmt_ms(ow),
                fmt_ms(rw))
    if "lateness" in sc:
        la = sc["lateness"]
        for k in ("p50", "p99", "max"):
            row(f"lateness {k} (ms)", la["ratio"][k], False, fmt_ms(la["ours"]["lateness_ms"][k]),
                fmt_ms(la["reference"]["lateness_ms"][k]))
    if "lateness_async_for" in sc:
        la = sc["lateness_async_for"]
        for k in ("p50", "p99", "max"):
            row(f"lateness {k} (ms), async for at {la['rate']:,.0f}/s", None, False,
                fmt_ms(la["ours"]["lateness_ms"][k]), "(no reference)")
        if "unpinned" in la:
            for k in ("p50", "p99", "max"):
                row(f"lateness {k} (ms), async for, kernel-placed producer", None, False,
                    fmt_ms(la["unpinned"]["lateness_ms"][k]), "(no reference)")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        for k in ("p50", "p99", "max"):
            row(f"reliable lateness {k} (ms), {rl['consumers']} processes", None, False, fmt_ms(rl["lateness_ms"][k]),
                "(no reference)")
        row("reliable lateness: lost / duplicates / redelivered", None, False,
            f"{rl['lost']} / {rl['duplicates']} / {rl['redelivered']}", "")
        row("reliable lateness: undelivered in the bound, still queued", None, False,
            str(rl["undelivered_still_queued"]), "")
    if "e2e" in sc:
        paired("e2e", "end-to-end (msgs/s)", "msgs_per_s", True)
    if "memory" in sc:
        items = sc["memory"]["items"]
        paired("memory", f"memory per pending item (bytes, {items:,} items)", "bytes_per_item", False, 1)
    if "idle" in sc:
        i = sc["idle"]
        o, r = i["ours"], i["reference"]
        row(f"idle, {i['queues']} open queues: commands/s", None, False, fmt_num(o["commands_per_s"]),
            fmt_num(r["commands_per_s"]))
        row("idle: script calls/s", None, False, fmt_num(o["script_calls_per_s"]), fmt_num(r["script_calls_per_s"]))
        row("idle: closing every queue at once (s)", None, False, f"{o['close_s']:.2f}", f"{r['close_s']:.2f}")
        row("idle: pub/sub connections", None, False, str(o["pubsub_connections"]), str(r["pubsub_connections"]))
        row("idle: other client connections", None, False, str(o["other_connections"]), str(r["other_connections"]))
        row("idle: failed transfer calls in the window", None, False, str(o["transfer_errors"]),
            str(r["transfer_errors"]))
        row("idle: client RSS growth over the window", None, False, fmt_mb(o["rss_growth_mb"]),
            fmt_mb(r["rss_growth_mb"]))
    if "drain" in sc:
        d = sc["drain"]
        for mode, label in (("async_for", "async for"), ("messages_ack", "messages() + ack()")):
            row(f"drain: {label} / take_many(100)", d["ratio"][mode], True,
                fmt_num(d["ours"][mode]["items_per_s"]), fmt_num(d["ours"]["take_many"]["items_per_s"]))
        if "worker16" in d["ours"]:
            row("drain: worker (concurrency 16) / async for", d["ratio"]["worker16_vs_async_for"], True,
                fmt_num(d["ours"]["worker16"]["items_per_s"]), fmt_num(d["ours"]["async_for"]["items_per_s"]))
    if "due_times" in sc:
        dt = sc["due_times"]
        for k in ("p50", "p99", "max"):
            o, r = dt["ours"]["lag_ms"][k], dt["script_time"]["lag_ms"][k]
            row(f"due-time lag {k} (ms), offer_many under load (vs script time)", o / r if r > 0 else None, False,
                fmt_ms(o), fmt_ms(r))
    width = max((len(r[0]) for r in rows), default=10)
    for name, ratio, higher_better, _, _ in rows:
        if ratio is None:
            continue
        better = ratio if higher_better else 1.0 / ratio
        lines.append(f"  {name:{width}}  {fmt_ratio(ratio):>10}  (ours {'better' if better >= 1 else 'WORSE'} by "
                     f"{fmt_ratio(max(better, 1 / better))})")
    lines += ["", "absolute numbers", f"  {'scenario':{width}}  {'ours':>14}  {'reference':>22}"]
    for name, _, _, ours, ref in rows:
        lines.append(f"  {name:{width}}  {ours:>14}  {ref:>22}")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        ping, load = rl["ping"], rl["load"]
        cpu_s = ", ".join(f"{c['cpu_s']:.1f}" for c in rl["per_consumer"])
        lines.append(f"  (reliable lateness: PING raw p50 {fmt_ms(ping['raw_p50_ms'])}, redis.asyncio p50 "
                     f"{fmt_ms(ping['client_p50_ms'])} before the window, {fmt_ms(ping['during_client_p50_ms'])} "
                     f"(p99 {fmt_ms(ping['during_client_p99_ms'])}) during it; loadavg 1/5/15 min "
                     f"{'/'.join(f'{x:.2f}' for x in load['loadavg_before'])} before, "
                     f"{'/'.join(f'{x:.2f}' for x in load['loadavg_after'])} after; CPU busy "
                     f"{fmt_pct(load['cpu_busy_pct'])} of {load['nproc']} CPUs; consumer CPU s {cpu_s})")
    if "big_item_stall" in sc:
        b = sc["big_item_stall"]
        lines.append(f"  big items, event-loop stall (median of {b['rounds']}; ticker baseline "
                     f"{fmt_ms(b['baseline_stall_ms'])}):")
        for c in b["cases"].values():
            lines.append(f"    {c['codec']:5} {c['mb']:3} MB: offer stall {fmt_ms(c['offer_stall_ms'])} "
                         f"({c['offer_stall_ms_per_mb']:.2f} ms/MB), offer wall {fmt_ms(c['offer_wall_ms'])}, encode "
                         f"alone {fmt_ms(c['encode_ms'])} ({c['encode_ms_per_mb']:.2f} ms/MB), server script "
                         f"{fmt_ms(c['server_script_ms'])}; take stall {fmt_ms(c['take_stall_ms'])}")
    if "memory" in sc and "ours_strict" in sc["memory"]:
        lines.append(f"  (ours with strict=True: {fmt_num(sc['memory']['ours_strict']['bytes_per_item'], 1)} bytes per "
                     "pending item)")
    lines += ["", "bars"]
    for b in res["bars"]:
        status = "n/a " if b["met"] is None else ("MET " if b["met"] else "MISS")
        measured = "n/a" if b["measured"] is None else f"{_num(b['measured'])} {b['unit']}"
        margin = "" if b["margin"] is None or math.isinf(b["margin"]) else f" (margin {fmt_ratio(b['margin'])})"
        note = f" [{b['note']}]" if b["note"] else ""
        lines.append(f"  {status} {b['bar']}: {measured}{margin}{note}")
    return lines


def plot(res: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install 'aiodelayq[bench]'): no figure")
        return False
    sc = res["scenarios"]
    colors = {"ours": "tab:blue", "reference": "tab:orange"}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    curves: list[tuple[str, dict[str, Any], dict[str, Any], str]] = []  # label, histogram, lateness, color
    titles: list[str] = []
    if "lateness" in sc:
        for impl in ("ours", "reference"):
            curves.append((impl, sc["lateness"][impl]["histogram"], sc["lateness"][impl]["lateness_ms"], colors[impl]))
        titles.append(f"{sc['lateness']['rate']:,.0f} items/s for {sc['lateness']['seconds']:g} s")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        curves.append((f"ours, receive+ack in {rl['consumers']} processes", rl["histogram"], rl["lateness_ms"],
                       "tab:green"))
        titles.append(f"reliable {rl['rate']:,.0f}/s for {rl['seconds']:g} s")
    for label, h, lat, color in curves:
        if lat["p50"] is None:
            continue
        ax.stairs(h["counts"], h["edges_ms"], color=color, fill=False, linewidth=1.8,
                  label=f"{label}: p50 {lat['p50']:.2f}, p99 {lat['p99']:.2f}, max {lat['max']:.1f} ms")
    if curves:
        ax.set_xscale("log")
        ax.set_xlabel("lateness: delivered - due (ms, log)")
        ax.set_ylabel("items")
        ax.set_title("lateness, " + "; ".join(titles), fontsize=10)
        ax.legend(fontsize=8)
    ax = axes[0][1]
    if "transfer" in sc:
        t = sc["transfer"]
        for impl in ("ours", "reference"):
            ns = [int(n) for n in t[impl]]
            rates = [t[impl][str(n)]["items_per_s"] for n in ns]
            ax.plot(ns, rates, "o-", color=colors[impl], label=impl)
            for n, r in zip(ns, rates, strict=True):
                if t[impl][str(n)]["bounded"] and r:
                    ax.annotate("bounded", (n, r), textcoords="offset points", xytext=(4, 6), fontsize=8,
                                color=colors[impl])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("backlog N (items due at once)")
        ax.set_ylabel("items/s moved to the destination")
        ax.set_title("transfer rate vs backlog")
        ax.legend(fontsize=8)
        ax = axes[1][0]
        plotted = False
        for impl in ("ours", "reference"):
            ns = [int(n) for n in t[impl] if t[impl][n]["worst_script_ms"] is not None]
            ax.plot(ns, [t[impl][str(n)]["worst_script_ms"] for n in ns], "o-", color=colors[impl], label=impl)
            plotted = plotted or bool(ns)
        ax.axhline(5.0, color="gray", linestyle="--", linewidth=1, label="5 ms bar")
        if plotted:
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "not measured (SLOWLOG off)", transform=ax.transAxes, ha="center")
        ax.set_xlabel("backlog N")
        ax.set_ylabel("worst single transfer script (ms, server time)")
        ax.set_title("worst transfer script call vs backlog (SLOWLOG)")
        ax.legend(fontsize=8)
    ax = axes[1][1]
    labels, values = [], []
    for line in _ratio_points(res):
        labels.append(line[0])
        values.append(line[1])
    if values:
        ax.barh(range(len(values)), values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
        ax.set_yticks(range(len(values)), labels, fontsize=8)
        ax.set_xscale("log")
        ax.axvline(1.0, color="gray", linewidth=1)
        ax.set_xlabel("ours better by (x, log; > 1 = ours better)")
        ax.set_title("how much better ours is, per scenario")
        ax.invert_yaxis()
    m = res["machine"]
    fig.suptitle(f"aiodelayq vs a Redisson-design reference, same run: {m['server']['kind']}, "
                 f"{m['nproc']} CPUs, Python {m['python']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _ratio_points(res: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, factor by which ours is better) for the figure."""
    sc = res["scenarios"]
    pts: list[tuple[str, float]] = []
    if "offer" in sc and sc["offer"]["ratio"]:
        pts.append(("offer, 64 callers", sc["offer"]["ratio"]))
    if "offer_many" in sc and sc["offer_many"]["ratio"]:
        pts.append(("offer_many x1000", sc["offer_many"]["ratio"]))
    if "transfer" in sc:
        for n, r in sc["transfer"]["ratio"].items():
            if r:
                bounded = " (ref bounded)" if sc["transfer"]["reference"][n]["bounded"] else ""
                pts.append((f"transfer N={int(n):,}{bounded}", r))
    if "lateness" in sc and sc["lateness"]["ratio"]["p99"]:
        pts.append(("lateness p99", 1.0 / sc["lateness"]["ratio"]["p99"]))
    if "e2e" in sc and sc["e2e"]["ratio"]:
        pts.append(("end-to-end", sc["e2e"]["ratio"]))
    if "memory" in sc and sc["memory"]["ratio"]:
        pts.append(("memory per item", 1.0 / sc["memory"]["ratio"]))
    return pts
