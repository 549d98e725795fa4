"""The model-based test: random sequences of the public calls on two queue objects of one queue,
faults between them, and a model of the queue checked after every step (``tests/model/``)."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import get_state_machine_test

from tests.model.machine import QueueMachine
from tests.model.tally import STATS

# (examples, steps per example) of each run; AIODELAYQ_MODEL_MINUTES runs batches of the "ci" size
# until that many minutes have passed.
SIZES = {"quick": (10, 35), "ci": (40, 40)}


def _run(own_server: Any, make_proxy: Any, examples: int, steps: int, seed: int) -> None:
    server = own_server()
    proxies = [make_proxy(server), make_proxy(server)]
    test = get_state_machine_test(
        lambda: QueueMachine(server.url, proxies),  # type: ignore[arg-type]  # a factory is fine
        settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True))
    print(f"\nmodel: {examples} examples of up to {steps} steps, seed {seed} (AIODELAYQ_MODEL_SEED={seed} repeats it)")
    started = time.monotonic()
    STATS.clear()
    try:
        hypothesis_seed(seed)(test)()
    finally:
        print(f"model: {time.monotonic() - started:.1f} s; " + ", ".join(f"{k} {v}" for k, v in sorted(STATS.items())))


def _seed() -> int:
    return int(os.environ.get("AIODELAYQ_MODEL_SEED") or random.randrange(2**32))


# A passing run takes its size's time; a failing one also shrinks the failure (up to 5 minutes more).
@pytest.mark.timeout(600)
def test_model_quick(own_server: Any, make_proxy: Any) -> None:
    _run(own_server, make_proxy, *SIZES["quick"], _seed())
