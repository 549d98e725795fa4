"""The scenarios (``paired`` holds the four that run ours and the reference in this process, ``lateness`` the
three steady-rate ones; ``_otel_process.py`` is the program ``otel`` starts for each of its variants); each
scenario function's docstring says what it measures. :data:`REGISTRY` is the order they run in; those in
:data:`EXTRA` run only when asked for."""

from __future__ import annotations

from _harness import Scenario

from . import drain, due_times, idle, keys, lateness, otel, paired, pending_10m, startup, transfer

REGISTRY: dict[str, Scenario] = {
    "offer": paired.offer, "offer_many": paired.offer_many, "transfer": transfer.run, "lateness": lateness.run,
    "lateness_async_for": lateness.run_async_for, "reliable_lateness": lateness.run_reliable, "e2e": paired.e2e,
    "idle": idle.run, "memory": paired.memory, "drain": drain.run, "due_times": due_times.run, "keys": keys.run,
    "startup": startup.run, "otel": otel.run, "pending_10m": pending_10m.run}
EXTRA = ("pending_10m",)  # run only when named in --only
DEFAULT = tuple(name for name in REGISTRY if name not in EXTRA)
