"""The model-based test: random sequences of the public calls on two queue objects of one queue, on a private
server with each client behind a fault proxy, and the queue reconciled with a model of what it must hold after
every step (``tests/model/``, whose docstring says what is covered and how to add a call).

Three sizes: ``test_model_quick`` (the quick command's), ``test_model_ci`` (marked slow: ``ci`` runs it on the
first server kind) and ``test_model_for_minutes`` (``AIODELAYQ_MODEL_MINUTES=N``, which ``python3 noxfile.py
-s stress`` sets: batches of 10 examples, one seed after the other, until N minutes have passed). Each run
prints its seed: ``AIODELAYQ_MODEL_SEED=<seed>`` draws the same sequences again (the server's timing can still
make a run differ; Hypothesis then reports the failure as flaky, with the failing sequence). An odd seed caps
the prefetch at one message, so that every receive fills it and the reliable consumer reads ahead, carrying
the acks written behind. ``AIODELAYQ_MODEL_TRACE=1`` prints every call, its outcome and time.
``AIODELAYQ_MODEL_STRICT`` is in ``tests/model/known.py``. The Hypothesis database is off (nothing is written
under ``.hypothesis/``)."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import get_state_machine_test

import aiodelayq._consuming.prefetch
from tests.model.machine import QueueMachine
from tests.model.tally import STATS

# (examples, steps per example at most) of each size; a timed run checks the time between batches.
SIZES = {"quick": (8, 35), "ci": (20, 50), "batch": (10, 50)}
PREFETCH_CAP = aiodelayq._consuming.prefetch.MAX_PREFETCH
MINUTES = float(os.environ.get("AIODELAYQ_MODEL_MINUTES") or 0)
# A passing run takes its size's time (quick: under a minute; ci: a few); a failing one then shrinks
# the failure, which Hypothesis bounds at 5 minutes.
SHRINK_S = 300


def _run(own_server: Any, make_proxy: Any, monkeypatch: Any, examples: int, steps: int, seed: int) -> None:
    """``examples`` examples drawn from ``seed``, on a private server (a new queue name each)."""
    server = own_server()
    proxies = [make_proxy(server), make_proxy(server)]
    _examples(server.url, proxies, monkeypatch, examples, steps, seed)


def _examples(url: str, proxies: list[Any], monkeypatch: Any, examples: int, steps: int, seed: int) -> None:
    cap = 1 if seed % 2 else PREFETCH_CAP
    monkeypatch.setattr(aiodelayq._consuming.prefetch, "MAX_PREFETCH", cap)
    test = get_state_machine_test(
        lambda: QueueMachine(url, proxies),  # type: ignore[arg-type]  # a factory is fine
        settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True))
    print(f"\nmodel: {examples} examples of up to {steps} steps, prefetch at most {cap}, seed {seed} "
          f"(AIODELAYQ_MODEL_SEED={seed} repeats it)", flush=True)
    started = time.monotonic()
    STATS.clear()
    try:
        hypothesis_seed(seed)(test)()
    finally:
        print(f"model: {time.monotonic() - started:.1f} s; " + ", ".join(f"{k} {v}" for k, v in sorted(STATS.items())),
              flush=True)


def _seed() -> int:
    return int(os.environ.get("AIODELAYQ_MODEL_SEED") or random.randrange(2**32))


@pytest.mark.timeout(60 + SHRINK_S)
def test_model_quick(own_server: Any, make_proxy: Any, monkeypatch: Any) -> None:
    _run(own_server, make_proxy, monkeypatch, *SIZES["quick"], _seed())


@pytest.mark.slow
@pytest.mark.timeout(300 + SHRINK_S)
def test_model_ci(own_server: Any, make_proxy: Any, monkeypatch: Any) -> None:
    _run(own_server, make_proxy, monkeypatch, *SIZES["ci"], _seed())


@pytest.mark.slow
@pytest.mark.timeout(MINUTES * 60 + 300 + SHRINK_S)
@pytest.mark.skipif(not MINUTES, reason="AIODELAYQ_MODEL_MINUTES not set (python3 noxfile.py -s stress sets it)")
def test_model_for_minutes(own_server: Any, make_proxy: Any, monkeypatch: Any) -> None:
    server = own_server()
    proxies = [make_proxy(server), make_proxy(server)]
    deadline = time.monotonic() + MINUTES * 60
    seed = _seed()
    while time.monotonic() < deadline:
        _examples(server.url, proxies, monkeypatch, *SIZES["batch"], seed)
        seed += 1
