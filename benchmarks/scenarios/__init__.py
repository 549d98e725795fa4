"""The scenarios, one module each (``lateness`` holds two; ``_otel_process.py`` is the program ``otel``
starts for each of its variants); each ``run`` function's docstring says what it measures. :data:`REGISTRY`
is the order they run in; those in :data:`EXTRA` run only when asked for."""

from __future__ import annotations

from _harness import Scenario

from . import (
    big_item_stall,
    drain,
    due_times,
    e2e,
    idle,
    keys,
    lateness,
    memory,
    offer,
    offer_many,
    otel,
    pending_10m,
    reliable_lateness,
    startup,
    transfer,
)

REGISTRY: dict[str, Scenario] = {
    "offer": offer.run,
    "offer_many": offer_many.run,
    "transfer": transfer.run,
    "lateness": lateness.run,
    "lateness_async_for": lateness.run_async_for,
    "reliable_lateness": reliable_lateness.run,
    "e2e": e2e.run,
    "idle": idle.run,
    "memory": memory.run,
    "drain": drain.run,
    "due_times": due_times.run,
    "keys": keys.run,
    "startup": startup.run,
    "otel": otel.run,
    "big_item_stall": big_item_stall.run,
    "pending_10m": pending_10m.run,
}
EXTRA = ("big_item_stall", "pending_10m")  # run only when asked for (--only / --big-item-stall)
DEFAULT = tuple(name for name in REGISTRY if name not in EXTRA)
