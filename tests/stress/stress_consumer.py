"""A consumer of the stress test (``stress.py``) that runs in a child interpreter and is shut down
by force: ``python stress_consumer.py MODE URL QUEUE POISON_EVERY``.

MODE ``plain`` consumes with ``take_many``, MODE ``reliable`` with ``receive_many`` + ack (nack for
poison ids). The queue is opened with ``open()`` and never closed: a SIGINT from the stress test cancels
the main task (``asyncio.Runner``), ``asyncio.run`` cancels every other task and returns, as under a
second Ctrl-C. A SIGKILL is the hard variant.

Lines on stdout (unbuffered, so the stress test reads everything written before a kill):
``ready`` once open; plain: ``got T ID ID ...`` per batch; reliable: ``q T`` right before each
``receive_many``, ``x T MAYBE_APPLIED`` when it raised, ``r ID COUNT T MESSAGE_ID DEADLINE_MS DUE_MS``
per message received (``DUE_MS`` 0 for a first delivery), ``s ID`` right before its settle, ``a ID
1|0`` (``b ID 1`` written behind) after it, ``e ID MAYBE_APPLIED`` when it raised; on a forced
shutdown ``cancelled T``, ``delivered N`` (the queue's ``stats.delivered``) and ``returned T``
(``time.monotonic()``, the clock of the stress test's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time

from redis.asyncio import Redis

from aiodelayq import BackendError, DelayedQueue

CALL_TIMEOUT_S = 1.0
VISIBILITY_S = 2.0


async def plain(q: DelayedQueue[int]) -> None:
    while True:
        try:
            items = await q.take_many(200)
        except BackendError:
            await asyncio.sleep(0.05)
            continue
        # Printed before the next await: the FINISH of these items cannot be sent before this line is
        # written, so a SIGKILL either finds the line written or the items still in the hand-off.
        sys.stdout.write(f"got {time.monotonic():.6f} " + " ".join(map(str, items)) + "\n")


async def reliable(q: DelayedQueue[int], poison_every: int) -> None:
    write = sys.stdout.write
    while True:
        write(f"q {time.monotonic():.6f}\n")
        try:
            messages = await q.receive_many(100, visibility_timeout=VISIBILITY_S, timeout=1.0)
        except BackendError as exc:
            write(f"x {time.monotonic():.6f} {int(exc.maybe_applied)}\n")
            await asyncio.sleep(0.05)
            continue
        for m in messages:
            write(f"r {m.value} {m.delivery_count} {time.monotonic():.6f} {m.id} {m.deadline_ms} {m.due_ms or 0}\n")
        for m in messages:
            write(f"s {m.value}\n")
            # An ack with more than call_timeout_s left is written behind (not waited for): "b".
            behind = m.value % poison_every != 0 and m.remaining_s > CALL_TIMEOUT_S
            try:
                ok = await (m.nack() if m.value % poison_every == 0 else m.ack())
            except BackendError as exc:
                write(f"e {m.value} {int(exc.maybe_applied)}\n")
            else:
                write(f"{'b' if behind and ok else 'a'} {m.value} {int(ok)}\n")


async def main(mode: str, url: str, name: str, poison_every: int) -> None:
    client = Redis.from_url(url)
    q: DelayedQueue[int] = DelayedQueue(client, name, max_deliveries=3 if mode == "reliable" else None,
                                        safety_poll_s=1.0, call_timeout_s=CALL_TIMEOUT_S)
    try:
        await q.open()
        print("ready", flush=True)
        await (plain(q) if mode == "plain" else reliable(q, poison_every))
    except asyncio.CancelledError:
        print(f"cancelled {time.monotonic():.6f}", flush=True)
        print(f"delivered {q.stats.delivered}", flush=True)
        raise  # nothing is closed: asyncio.run cancels the library's tasks and returns


if __name__ == "__main__":
    mode, url, name, poison = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")  # stderr, counted by the stress test
    with contextlib.suppress(KeyboardInterrupt):  # asyncio.run re-raises the SIGINT after its cleanup
        asyncio.run(main(mode, url, name, poison))
    print(f"returned {time.monotonic():.6f}", flush=True)
