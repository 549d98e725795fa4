"""The shards recorded under a sharded queue's name, checked once per sharded queue object.

Changing a count or placement would move keys to other shards, so the first object to use a name records
both (``_wire/placement.py``) in the name's controls hash (``aiodelayq_controls:{name}``, field ``shards``)
with CLAIM_SHARDS, atomically; it also refuses a name holding an ordinary queue. A name recorded with another
placement keeps it. An ordinary queue object (``shards=1``) makes no check: its OFFER and TRANSFER refuse a
sharded name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._scripts import QueueScripts
from .._util.tasks import keep
from .._wire.placement import Placement, ShardRecord
from ..exceptions import ShardCountError

__all__ = ["ShardCount"]


class ShardCount:
    """The check of one queue object: :meth:`ensure` passes once the name's shard count in Redis is this
    object's, having called ``place`` with the recorded placement first. ``scripts`` are those of the
    queue's own name (which holds no item). ``timeout_s`` bounds the check, resends included (the smaller of
    ``call_timeout_s`` and ``open_timeout_s``: it may be an opening's first call)."""

    def __init__(self, scripts: QueueScripts, shards: int, *, timeout_s: float,
                 place: Callable[[Placement], None]) -> None:
        self._scripts = scripts
        self.shards = shards
        self._timeout_s = timeout_s
        self._place = place
        self.passed = False
        self._refused: ShardCountError | None = None
        self._task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        state = "passed" if self.passed else "refused" if self._refused is not None else "unchecked"
        return f"<ShardCount {self._scripts.keys.destination!r} shards={self.shards} {state}>"

    async def ensure(self) -> None:
        """Check once; concurrent first callers share one check (a cancelled caller only stops
        waiting for it).

        Raises:
            ShardCountError: the name has another shard count, or a record this release cannot
                read (every call raises it again).
            BackendError: the check could not be made (the next call tries again).
        """
        if self.passed:
            return
        if self._refused is not None:
            raise self._refused
        loop = asyncio.get_running_loop()
        task = self._task
        failed = task is not None and task.done() and (task.cancelled() or task.exception() is not None)
        if task is None or failed or self._loop is not loop:
            self._loop = loop
            task = self._task = keep(asyncio.ensure_future(self._check()), quiet=True)
        await asyncio.shield(task)
        self.passed = True

    async def _check(self) -> None:
        k = self._scripts.keys
        what = f"the shard count of {k.destination!r}"
        # Records it, or reads it: resending is harmless.
        raw = await self._scripts.claim_shards.resend(ShardRecord(self.shards).value, what=what,
                                                      timeout_s=self._timeout_s)
        record = ShardRecord.parse(raw)
        subject = f"queue {k.destination!r}"
        if record is None:
            self._refused = ShardCountError(
                f"{subject} records its shards as {_text(raw)!r}, which this release cannot read (a newer "
                "release recorded it): upgrade aiodelayq", recorded=0, wanted=self.shards)
        elif record.count != self.shards:
            self._refused = ShardCountError.refusing(subject, recorded=record.count, wanted=self.shards)
        if self._refused is not None:
            raise self._refused
        assert record is not None
        self._place(record.placement)  # before any caller goes on to a shard


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
