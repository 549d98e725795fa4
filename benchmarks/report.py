"""What a run's result becomes: one Markdown table per scenario, the bars, the ``--check`` checks and the
figure. ``python benchmarks/report.py [RESULTS.json]`` prints the tables of a results file (default
``benchmarks/results.json``)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECORD = HERE / "results.json"  # the committed record, written by a full default run


def fmt_num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def fmt_sig(value: float | None) -> str:
    """Three significant digits, thousands separated, never in exponent form."""
    if value is None:
        return "n/a"
    if value == 0 or math.isinf(value) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{max(0, 2 - math.floor(math.log10(abs(value))))}f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else fmt_sig(value) + "x"


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{fmt_sig(value)} ms"


def _lat(lat: dict[str, Any]) -> list[str]:
    return [fmt_sig(lat[k]) for k in ("p50", "p99", "max")]


def _ours_ref(r: dict[str, Any], metric: str) -> list[str]:
    return [fmt_num(r["ours"][metric]), fmt_num(r["reference"][metric]), fmt_ratio(r["ratio"])]


def _slow(part: dict[str, Any]) -> str:  # pending_10m: script calls over 5 ms (share) / over 30 ms / slowest
    share = "n/a" if part["share_over_5ms"] is None else f"{100 * part['share_over_5ms']:.3f}%"
    return f"{fmt_num(part['over_5ms'])} ({share}) / {part['over_30ms']} / {fmt_ms(part['max_ms'])}"


def _keys_table(k: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    servers = [(k["jemalloc"], k["jemalloc"]["server"])] if "jemalloc" in k else []
    servers.append((k, "the run's server"))
    calls = ("get", "reschedule", "cancel", "offer")

    def cell(j: dict[str, Any], part: str) -> str:
        return (f"{fmt_ratio(j[part]['ratio'])} ({fmt_num(j[part]['keyed']['items_per_s'])} vs "
                f"{fmt_num(j[part]['unkeyed']['items_per_s'])}/s)")

    return (f"Keyed / unkeyed: `offer()` from {k['callers']} callers, the transfer of {k['transfer_n']:,} (medians "
            f"of {k['rounds']} rounds); server time of 2,000 calls each, {k['pending_n']:,} keyed pending.",
            ["", *(f"{name} ({j['allocator']})" for j, name in servers)],
            [["keyed / unkeyed `offer()`", *(cell(j, "offer") for j, _ in servers)],
             ["`dedupe_for` on / off `offer()`", *(fmt_ratio(j["offer"].get("windowed_ratio")) for j, _ in servers)],
             ["events on / off `offer()`", *(fmt_ratio(j["offer"].get("events_ratio")) for j, _ in servers)],
             ["keyed / unkeyed transfer", *(cell(j, "transfer") for j, _ in servers)],
             ["mean ms " + " / ".join(calls), *(" / ".join(f"{j['calls'][c]['mean_ms'] or 0:.3f}" for c in calls)
                                                for j, _ in servers)],
             ["calls over 1 ms", *(str(sum(j["calls"][c]["over_1ms"] or 0 for c in calls)) for j, _ in servers)]])


def _startup_table(st: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    sec, rat = st["seconds"], st["ratio"]
    rows = [("`python -c pass`", "pass", "pass", ""),
            ('`python -c "import redis.asyncio"` (the reference)', "import_redis", None, ""),
            ('`python -c "import aiodelayq"`', "import_aiodelayq", "import_aiodelayq", ""),
            ('`python -c "from aiodelayq import DelayedQueue"`', "delayed_queue", "delayed_queue", ""),
            ("`aiodelayq --help`", "help", "help", ""),
            ("`aiodelayq worker`: start to first delivery", "worker", None, fmt_ratio(rat["worker"])),
            ("reference consumer: start to first take", "reference_worker", None, "")]
    return (f"New processes, bytecode cached: wall time to exit, or from the start to the first item (already "
            f"due); medians of {st['runs']} runs.",
            ["process", "median", "/ `import redis.asyncio`", "/ the reference consumer"],
            [[label, fmt_ms(None if sec[key] is None else sec[key] * 1000), fmt_ratio(rat[r]) if r else "", by_ref]
             for label, key, r, by_ref in rows])


def _otel_table(ot: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    v, rat, keys, span = ot["variants"], ot["ratio"], ("plain", "api", "sdk"), fmt_sig(ot.get("sdk_span_us"))

    def rate(key: str, op: str) -> str:
        value = fmt_num(v[key][op]["items_per_s"])
        return f"{value} ({fmt_ratio(rat[key][op])})" if key in rat else value

    rows = [row for op, label in (("offer", "`offer()`"), ("drain", "`async for`")) for row in (
        [f"{label}: items/s", *(rate(key, op) for key in keys)],
        [f"{label}: CPU per item", *(f"{fmt_sig(v[key][op]['cpu_us_per_item'])} µs" for key in keys)])]
    return (f"Tracing on the hot paths, one new process per variant, {ot['rounds']} rounds taking turns: `offer()` "
            f"from {ot['callers']} callers for {ot['seconds']:g} s, `async for` over {ot['items']:,} due items; "
            f"medians (/ plain); SDK: {fmt_num(v['sdk']['spans'])} spans exported; one receive span alone: "
            f"{span} µs; tracing's µs per `async for` item: {fmt_sig(ot.get('traced_drain_added_us'))}.",
            ["", "plain: no `opentelemetry`", "`opentelemetry` imported, no SDK", "SDK tracer provider, spans dropped"],
            rows)


def _fill_us(fill: dict[str, Any]) -> str:  # pending_10m: OFFER's server µs per item (its ZADDs')
    us = fill.get("server_us_per_item")
    return "n/a" if not us else " / ".join(f"{fmt_sig(us[t]['scripts'])} ({fmt_sig(us[t]['zadd'])})"
                                           for t in ("first", "last"))


def _read_us(drain: dict[str, Any]) -> str:  # pending_10m: ZRANGE's µs per due element, among the rest / alone
    among, alone = drain.get("server_read_us_per_item"), drain.get("alone_server_read_us_per_item")
    return "n/a" if among is None or alone is None else f"{fmt_sig(among)} / {fmt_sig(alone)}"


def _pending_table(p: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    variants = (("ours", "ours"), ("ours_tiered", f"ours, `tier_after_s={p['tier_after_s']:g}`"))
    return (f"{p['items']:,} pending items ({p['due']:,} due at one instant after the fill, the rest in 1 to 2 "
            f"days), `offer_many` of {p['batch']:,} by one caller on {p['mem_allocator']}: `used_memory` per item, "
            f"fill rate by tenth, then `take_many(1000)` of the due items from a queue object's open: the move out "
            f"of the zset and the drain, each against the same {p['due']:,} alone; script calls over 5 ms (share) / "
            "over 30 ms / slowest.",
            ["", "bytes per item", "fill: first / last tenth, items/s", "last / first",
             "fill: server µs per item, first / last tenth (of it `ZADD`)", "fill: slow calls",
             "move, items/s", "/ alone", "drain, items/s", "/ alone",
             "the server reading them: µs per item, among them / alone", "drain: slow calls"],
            [[label, f"{p[k]['memory']['bytes_per_item']:.1f}",
              f"{fmt_num(p[k]['fill']['items_per_s_by_tenth'][0])} / "
              f"{fmt_num(p[k]['fill']['items_per_s_by_tenth'][-1])}", fmt_ratio(p[k]["fill"]["last_over_first"]),
              _fill_us(p[k]["fill"]), _slow(p[k]["fill"]["slow"]), fmt_num(p[k]["move"]["items_per_s"]),
              fmt_ratio(p[k]["move"]["ratio"]),
              fmt_num(p[k]["drain"]["items_per_s"]), fmt_ratio(p[k]["drain"]["ratio"]), _read_us(p[k]["drain"]),
              _slow(p[k]["drain"]["slow"])]
             for k, label in variants])


IDLE_ROWS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("commands/s", "commands_per_s", fmt_num), ("script calls/s", "script_calls_per_s", fmt_num),
    ("pub/sub connections", "pubsub_connections", str), ("other connections", "other_connections", str),
    ("failed transfer calls", "transfer_errors", str), ("client RSS growth", "rss_growth_mb", lambda v: f"{v:.1f} MiB"),
    ("closing every queue at once (s)", "close_s", lambda v: f"{v:.2f}")]
DRAIN = {"raw_pop": "the server alone: `ZRANGE` + `ZREMRANGEBYRANK` of 1,000", "take_many_1000": "`take_many(1000)`",
         "take_many": "`take_many(100)`", "async_for": "`async for`",
         "receive_many_ack": "`receive_many(100)` + `ack()`", "messages_ack": "`messages()` + `ack()`",
         "worker16": "worker, concurrency 16", "worker16_grouped": "worker, concurrency 16, groups of 100",
         "take_many_1000_e2e": "`take_many(1000)`, from the open (transfer included)"}


def _drain_table(d: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    r = d["ratio"]
    how = (f"{d['drains']} drains of {d['items']:,} due items by each consumer, in turn, rated by items over total "
           "time" if "drains" in d else f"{d['items']:,} due items drained by each consumer, medians of its rounds")
    return (f"{how}; each drain timed from its first take once the transfer moved them (the last row: from its "
            "open); items/s.", ["consumer", "items/s", "/ the server alone", "/ `take_many(100)`", "/ `async for`"],
            [[label, fmt_num(d["ours"][mode]["items_per_s"]),
              fmt_ratio(r[f"{mode}_vs_raw_pop"]) if f"{mode}_vs_raw_pop" in r else "",
              fmt_ratio(r[mode]) if mode in r else "",
              fmt_ratio(r["worker16_vs_async_for"]) if mode == "worker16" else
              fmt_ratio(r.get("worker16_grouped_vs_worker16")) + " of the worker" if mode == "worker16_grouped" else ""]
             for mode, label in DRAIN.items() if mode in d["ours"]])


def _drain_breakdown_table(d: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    b = d["breakdown"]
    server, client = b["server_us_per_item"], b["client_us_per_item"]
    rows = [[f"server: {script}", fmt_sig(us)] for script, us in server["by_script"].items()]
    rows += [[f"server: {step}", fmt_sig(us)] for step, us in server["by_step"].items()]
    rows += [[f"client: {part}", fmt_sig(us)] for part, us in client.items() if part != "cpu"]
    rows += [[f"server: grouped, {int(g):,} groups", fmt_sig(us)] for g, us in d.get("grouped_server_us", {}).items()
             if g != "ratio"]
    return ("`take_many(1000)` of the same backlog: server µs per drained item, by script (`SLOWLOG`) and by step "
            "(`INFO commandstats`; \"Lua and the rest\": the scripts' own work), and the client's CPU µs per item, "
            "the reply parse and the decode measured alone.", ["where", "µs per item"], rows)

# Per scenario: its result -> (the note under its heading, the header, the rows).
TABLES: dict[str, Callable[[dict[str, Any]], tuple[str, list[str], list[list[Any]]]]] = {
    "offer": lambda o: (f"{o['callers']} tasks, each awaiting one offer at a time, {o['seconds']:g} s; items/s.",
                        ["ours", "reference", "ours / reference"], [_ours_ref(o, "items_per_s")]),
    "offer_many": lambda o: (
        f"{o['items']:,} items in batches of {o['batch']:,}, one batch at a time; items/s.",
        ["ours", "reference", "ours / reference", "ours: worst script"],
        [[*_ours_ref(o, "items_per_s"), fmt_ms(o["ours"]["worst_script_ms"])]]),
    "transfer": lambda t: (
        f"N due items in random due order: items/s until moved (the reference stops at {t['ref_bound_s']:g} s: "
        "bounded); the worst script call.",
        ["N", "ours", "reference", "ours / reference", "ours: worst script", "reference: worst script"],
        [[f"{int(n):,}", fmt_num(t["ours"][n]["items_per_s"]),
          fmt_num(t["reference"][n]["items_per_s"]) + (" (bounded)" if t["reference"][n]["bounded"] else ""),
          fmt_ratio(t["ratio"][n]), fmt_ms(t["ours"][n]["worst_script_ms"]),
          fmt_ms(t["reference"][n]["worst_script_ms"])] for n in t["ours"]]),
    "lateness": lambda la: (
        f"{la['rate']:,.0f} items/s falling due for {la['seconds']:g} s, one consumer process; delivered - due (ms).",
        ["consumer", "p50", "p99", "max", "lost", "duplicates"],
        [[label, *_lat(la[impl]["lateness_ms"]), la[impl]["lost"], la[impl]["duplicates"]]
         for impl, label in (("ours", "ours, `take_many(1000)`"), ("reference", "reference, `BLPOP`"))]),
    "lateness_async_for": lambda la: (
        f"{la['rate']:,.0f} items/s for {la['seconds']:g} s, one consumer process on `async for item in queue`; "
        "delivered - due (ms).", ["placement", "p50", "p99", "max", "lost", "duplicates"],
        [[label, *_lat(la[k]["lateness_ms"]), la[k]["lost"], la[k]["duplicates"]]
         for k, label in (("ours", "producer on its own CPU"), ("unpinned", "kernel-placed")) if k in la]),
    "reliable_lateness": lambda rl: (
        f"{rl['rate']:,.0f} items/s for {rl['seconds']:g} s, {rl['consumers']} consumer processes on `messages()` + "
        "`ack()`: first receipt - due (ms); a PING every 20 ms meanwhile (ms).",
        ["p50", "p99", "max", "lost", "duplicates", "still queued", "PING p50 / p99", "CPU busy"],
        [[*_lat(rl["lateness_ms"]), rl["lost"], rl["duplicates"], rl["undelivered_still_queued"],
          " / ".join(map(fmt_sig, rl["ping_ms"].values())), fmt_num(rl["load"]["cpu_busy_pct"]) + "%"]]),
    "e2e": lambda e: (f"Offer -> due -> consumed in one process, at most {e['backlog_cap']:,} in flight; msgs/s.",
                      ["ours", "reference", "ours / reference"], [_ours_ref(e, "msgs_per_s")]),
    "idle": lambda i: (f"{i['queues']:,} open queues, nothing pending, {i['seconds']:g} s.", ["", "ours", "reference"],
                       [[label, f(i["ours"][key]), f(i["reference"][key])] for label, key, f in IDLE_ROWS]),
    "memory": lambda m: (
        f"{m['items']:,} pending items: `MEMORY USAGE` of the zset and the list, per item.",
        ["ours", "reference", "ours / reference", "ours, `strict=True`"],
        [[f"{m['ours']['bytes_per_item']:.1f} B", f"{m['reference']['bytes_per_item']:.1f} B", fmt_ratio(m["ratio"]),
          f"{m['ours_strict']['bytes_per_item']:.1f} B"]]),
    "drain": _drain_table, "due_times": lambda dt: (
        f"`offer_many` of {dt['batch']:,} while {dt['loaders']} clients load the server, {dt['calls']} calls: due - "
        "delay - server time at the call (ms).", ["clock", "p50", "p90", "p99", "max", "calls > 1 ms early"],
        [[label, *(fmt_sig(dt[k]["lag_ms"][p]) for p in ("p50", "p90", "p99", "max")), dt[k]["early"]]
         for k, label in (("ours", "the call's issue time (ours)"), ("script_time", "the script's clock"))]),
    "keys": _keys_table, "startup": _startup_table, "otel": _otel_table, "pending_10m": _pending_table}


def markdown(name: str, note: str, header: list[str], rows: list[list[Any]]) -> list[str]:
    return [f"### {name}", "", note, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows), ""]


def tables(res: dict[str, Any]) -> list[str]:
    """One Markdown table per scenario in ``res``, each under a ``### name`` heading."""
    sc = res["scenarios"]
    out = [line for name, table in TABLES.items()
           if name in sc and (name != "pending_10m" or "ours_tiered" in sc[name])
           for line in markdown(name, *table(sc[name]))]
    if "breakdown" in sc.get("drain", {}):
        out += markdown("drain: where an item's time goes", *_drain_breakdown_table(sc["drain"]))
    return out


# -- bars and checks ----------------------------------------------------------------------------------


def evaluate(res: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The bars (each: what, threshold, measured, met) and the checks of ``--check``: ratios of ours to a
    reference measured in the same run, with limits loosened for the noise of a quick run on a small
    shared machine (``benchmarks/README.md``, "--check")."""
    sc = res["scenarios"]
    bars: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []

    def judge(items: list[dict[str, Any]], what: str, measured: float | None, threshold: float, higher: bool,
              unit: str = "x") -> None:
        met = None if measured is None else (measured >= threshold if higher else measured <= threshold)
        items.append({"what": what, "measured": measured, "threshold": threshold, "higher_is_better": higher,
                      "met": met, "unit": unit})

    def bar(what: str, measured: float | None, threshold: float, higher: bool, unit: str = "x",
            check: float | None = None) -> None:
        """``check``: the limit of ``--check`` for a ratio bar (the bar, or looser where quick runs are noisy)."""
        judge(bars, what, measured, threshold, higher, unit)
        if check is not None:
            judge(checks, what, measured, check, higher, unit)

    if "offer" in sc:
        bar("offer, 64 awaiting callers: ours / reference >= 1.5x", sc["offer"]["ratio"], 1.5, True, check=1.5)
    if o := sc.get("offer_many"):
        bar("offer_many (batches of 1000) >= 150k items/s", o["ours"]["items_per_s"], 150_000, True, "items/s")
        judge(checks, "offer_many: ours / reference >= 2x", o["ratio"], 2.0, True)
    if t := sc.get("transfer"):
        if "1000000" in t["ours"]:
            bar("transfer at 1M >= 100k items/s", t["ours"]["1000000"]["items_per_s"], 100_000, True, "items/s")
        if "100000" in t["ours"]:
            bar("transfer at 100k: ours / reference >= 40x", t["ratio"]["100000"], 40, True, check=40)
        worst = [v["worst_script_ms"] for v in t["ours"].values() if v["worst_script_ms"] is not None]
        bar("transfer: no script call over 5 ms at any N", max(worst, default=None), 5.0, False, "ms")
    if "lateness" in sc:
        lat = sc["lateness"]["ours"]["lateness_ms"]
        bar("lateness p99 <= 5 ms", lat["p99"], 5.0, False, "ms")
        bar("lateness max <= 50 ms", lat["max"], 50.0, False, "ms")
    if la := sc.get("lateness_async_for"):
        bar(f"lateness, async for at {la['rate']:,.0f}/s: p99 <= 5 ms", la["ours"]["lateness_ms"]["p99"], 5.0, False,
            "ms")
    if rl := sc.get("reliable_lateness"):
        for key, limit in (("p99", 5.0), ("max", 50.0)):
            bar(f"reliable lateness, {rl['consumers']} consumer processes: {key} <= {limit:g} ms",
                rl["lateness_ms"][key], limit, False, "ms")
        bar("reliable lateness: 0 lost", rl["lost"], 0, False, "items")
    if "e2e" in sc:
        bar("end-to-end >= 30k msgs/s", sc["e2e"]["ours"]["msgs_per_s"], 30_000, True, "msgs/s")
        judge(checks, "end-to-end: ours / reference >= 9x", sc["e2e"]["ratio"], 9.0, True)
    if "idle" in sc:
        i = sc["idle"]["ours"]
        bar("idle: one pub/sub connection", i["pubsub_connections"], 1, False, "connections")
        bar("idle: no script calls (the safety poll reads)", i["script_calls_per_s"], 0.5, False, "calls/s")
        bar(f"idle: commands/s only from the safety poll (<= 1.1 x {i['expected_commands_per_s']:.0f}/s)",
            i["commands_per_s"], 1.1 * i["expected_commands_per_s"], False, "commands/s")
        bar(f"idle: {sc['idle']['queues']} queues ({i['takers']} taking) closed at once in <= 3 s", i["close_s"], 3.0,
            False, "s")
        bar("idle: no library warnings while open and closing", i["log_warnings"], 0, False, "lines")
        bar("idle: flat client memory (RSS growth <= 1 MiB)", i["rss_growth_mb"], 1.0, False, "MiB")
    if "memory" in sc:
        bar("memory: ours <= reference + 10%", sc["memory"]["ratio"], 1.10, False, check=1.10)
    if "drain" in sc:
        d = sc["drain"]["ratio"]
        for what, key, goal, limit in (
                ("take_many(1000) from the open >= 25% of the server alone", "take_many_1000_e2e_vs_raw_pop", .25, .12),
                ("async for >= 85% of take_many(100)", "async_for", 0.85, 0.52),
                ("receive_many(100) + ack() >= 70% of take_many(100)", "receive_many_ack", 0.7, 0.47),
                ("messages() + ack() >= 10% of take_many(100)", "messages_ack", 0.1, 0.1),
                ("worker (no-op handler, concurrency 16) >= 70% of async for", "worker16_vs_async_for", 0.7, 0.55),
                ("the worker on groups of 100 >= 50% of the worker", "worker16_grouped_vs_worker16", 0.5, 0.42),
                ("the worker with events on >= 50% of off", "worker16_events_vs_worker16", 0.5, None)):
            bar(f"drain: {what}", d.get(key), goal, True, check=limit)
        if g := sc["drain"].get("grouped_server_us"):  # the server's time per grouped item, not the groups'
            few, many = (k for k in g if k != "ratio")
            bar(f"drain: server µs per grouped item, {int(many):,} groups <= 1.5x {few} groups",
                g.get("ratio", g[many] / g[few]), 1.5, False, check=2.0)
    if "due_times" in sc:  # the bar on the p99; the check on the p90 (in 60 quick calls the p99 is the worst)
        o, r = sc["due_times"]["ours"]["lag_ms"], sc["due_times"]["script_time"]["lag_ms"]
        bar("due times under load: p99 lag <= 0.5x the script clock's", o["p99"] / r["p99"] if r["p99"] else None,
            0.5, False)
        judge(checks, "due times under load: p90 lag <= 0.5x the script clock's", o["p90"] / r["p90"] if r["p90"]
              else None, 0.5, False)
    if k := sc.get("keys"):
        j = k.get("jemalloc") or k  # judged on a jemalloc build when there is one (the scenario says why)
        bar("keys: keyed offer() >= 70% of unkeyed (64 callers)", j["offer"]["ratio"], 0.7, True, check=0.45)
        bar("keys: keyed offer() with dedupe_for >= 70% of without", j["offer"].get("windowed_ratio"), 0.7, True,
            check=0.7)
        bar("keys: offer() with events on >= 60% of off", j["offer"].get("events_ratio"), 0.6, True, check=0.6)
        bar(f"keys: keyed transfer >= 70% of unkeyed ({k['transfer_n']:,})", j["transfer"]["ratio"], 0.7, True,
            check=0.4)
        over = [c["over_1ms"] for name, c in j["calls"].items() if name in ("get", "reschedule", "cancel", "offer")]
        bar(f"keys: keyed calls over 1 ms with {k['pending_n']:,} pending", None if None in over else sum(over), 0,
            False, "calls")
    if p := sc.get("pending_10m"):
        for k in ("ours", "ours_tiered"):
            if v := p.get(k):
                label = f"pending_10m, {'tiered' if k == 'ours_tiered' else 'default layout'}"
                bar(f"{label}: memory <= 176 B per item", v["memory"]["bytes_per_item"], 176, False, "B")
                bar(f"{label}: fill, last tenth >= 0.8x the first", v["fill"]["last_over_first"], 0.8, True)
                bar(f"{label}: drain among {p['items']:,} >= 0.85x alone", v["drain"]["ratio"], 0.85, True)
                calls = [v["fill"]["slow"], v["drain"]["slow"]]
                over, total = (sum(c[k] for c in calls) for k in ("over_5ms", "calls"))
                bar(f"{label}: script calls over 5 ms <= 0.1%", over / total if total else None, 0.001, False, "share")
                bar(f"{label}: slowest script call <= 30 ms", max((c["max_ms"] or 0.0 for c in calls), default=None),
                    30.0, False, "ms")
    if st := sc.get("startup"):
        sec, rat = st["seconds"], st["ratio"]
        bar("startup: aiodelayq --help <= 300 ms", None if sec["help"] is None else sec["help"] * 1000, 300, False,
            "ms")
        bar("startup: a worker's first delivery <= 1 s after it starts",
            None if sec["worker"] is None else sec["worker"] * 1000, 1000, False, "ms")
        bar("startup: import aiodelayq <= 0.5x import redis.asyncio", rat["import_aiodelayq"], 0.5, False, check=0.5)
        judge(checks, "startup: from aiodelayq import DelayedQueue <= 1.6x import redis.asyncio",
              rat["delayed_queue"], 1.6, False)
        judge(checks, "startup: aiodelayq --help <= 1x import redis.asyncio", rat["help"], 1.0, False)
        judge(checks, "startup: a worker's first delivery <= 2.8x the reference consumer's", rat["worker"], 2.8,
              False)
    if "otel" in sc:
        rat = sc["otel"]["ratio"]
        for op, label in (("offer", "offer()"), ("drain", "async for")):
            bar(f"otel: {label} with opentelemetry imported, no SDK >= 0.9x without it", rat["api"][op], 0.9, True,
                check=0.9)
        judge(checks, "otel: offer() traced (SDK, spans dropped) >= 0.2x without opentelemetry", rat["sdk"]["offer"],
              0.2, True)
        judge(checks, "otel: async for traced: its µs per item over untraced <= 2x the SDK's own receive span",
              sc["otel"].get("added_over_span"), 2.0, False)
    return bars, checks


def judged_table(res: dict[str, Any]) -> list[str]:
    """The bars and the checks of ``--check`` as one Markdown table; a check without a bar last."""
    bars = {b["what"]: b for b in res["bars"]}
    checks = {c["what"]: c for c in res["checks"]}

    def verdict(item: dict[str, Any]) -> str:
        return "n/a" if item["met"] is None else ("met" if item["met"] else "**missed**")

    rows = []
    for what, item in {**bars, **checks}.items():
        check = checks.get(what)
        rows.append(f"| {what} | {fmt_sig(item['measured'])} {item['unit']} | "
                    f"{verdict(bars[what]) if what in bars else '(no bar)'} | "
                    + (f"{'>=' if check['higher_is_better'] else '<='} {fmt_sig(check['threshold'])}: "
                       f"{verdict(check)}" if check else "") + " |")
    return ["### bars and checks", "", "| | measured | bar | check: limit |", "|---|---|---|---|", *rows, ""]


def plot(res: dict[str, Any], path: Path) -> bool:
    """The figure: lateness histograms, and the transfer's rate and worst call by backlog."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'aiodelayq[bench]'): no figure", flush=True)
        return False
    sc = res["scenarios"]
    colors = {"ours": "tab:blue", "reference": "tab:orange"}
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.5))
    ax = axes[0]
    curves = [(impl, sc["lateness"][impl], colors[impl]) for impl in colors if "lateness" in sc]
    if "reliable_lateness" in sc:
        curves.append(("ours, messages() + ack()", sc["reliable_lateness"], "tab:green"))
    for label, r, color in curves:
        lat = r["lateness_ms"]
        if lat["p50"] is not None:
            ax.stairs(r["histogram"]["counts"], r["histogram"]["edges_ms"], color=color, linewidth=1.8,
                      label=f"{label}: p50 {lat['p50']:.2f}, p99 {lat['p99']:.2f}, max {lat['max']:.1f} ms")
    ax.set(xscale="log", xlabel="lateness: delivered - due (ms, log)", ylabel="items", title="lateness")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    if t := sc.get("transfer"):
        for ax, key, label in ((axes[1], "items_per_s", "items/s moved"),
                               (axes[2], "worst_script_ms", "worst script call (ms)")):
            for impl, color in colors.items():
                ns = [int(n) for n in t[impl] if t[impl][n][key] is not None]
                ax.plot(ns, [t[impl][str(n)][key] for n in ns], "o-", color=color, label=impl)
            ax.set(xscale="log", yscale="log", xlabel="backlog N, random due order", ylabel=label,
                   title=f"transfer: {label}; the reference stops at {t['ref_bound_s']:g} s")
            ax.legend(fontsize=8)
    m = res["machine"]
    fig.suptitle(f"aiodelayq vs a Redisson-design reference, same run: {m['server']['kind']}, {m['nproc']} CPUs, "
                 f"Python {m['python']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    print("\n".join([*tables(res := json.loads(Path(sys.argv[1] if sys.argv[1:] else RECORD).read_text())),
                     *judged_table(res)]))
