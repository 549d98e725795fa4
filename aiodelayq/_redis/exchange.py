"""One exchange on one connection: commands written together, every reply read.

Every reply is read, error replies too, so a connection goes back to its pool in sync; anything else
(a lost connection, a timeout, a cancellation) disconnects it, so a late reply never answers the next
command.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # hiredis comes with redis[hiredis], the core dependency; plain redis-py packs in Python
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis installed without the extra
    _hiredis_pack = None

__all__ = ["WRITTEN", "exchange", "pack", "reconnect_if_closed", "result", "until_written", "writing"]

log = logging.getLogger("aiodelayq")

WRITTEN: contextvars.ContextVar[asyncio.Future[None] | None] = contextvars.ContextVar("aiodelayq_written",
                                                                                      default=None)
"""Set in a task that must know when its call is on the wire: :func:`exchange` completes the future
once it has written the call's commands (a pooled connection's checks take a few loop turns first)."""

R = TypeVar("R")

# The most loop turns a caller gives a call sent ahead to be written (a pooled connection's checks take
# two or three) before it goes on with work that does not yield.
_WRITE_TURNS = 8


async def writing(written: asyncio.Future[None], work: Awaitable[R]) -> R:
    """Await ``work`` with :data:`WRITTEN` set to ``written``: run as a task of its own, whose context
    only it sets."""
    WRITTEN.set(written)
    return await work


async def until_written(written: asyncio.Future[None], task: asyncio.Future[Any]) -> None:
    """Return once ``written`` is done (the call that ``task`` runs through :func:`writing` is on the
    wire), ``task`` ended, or after a few loop turns."""
    for _ in range(_WRITE_TURNS):
        if written.done() or task.done():
            return
        await asyncio.sleep(0)

# Arguments above this size go through redis-py's packer, which passes them on as they are instead
# of copying them into one buffer (hiredis copies: ~100 ms for a 50 MB item).
_HIREDIS_MAX_ARG = 65536


def pack(conn: Any, commands: Sequence[Sequence[Any]]) -> Any:
    """The wire bytes of ``commands``: hiredis's packer when every argument is small and the client
    encodes UTF-8 (as hiredis always does); redis-py's Python packer is several times slower."""
    if _hiredis_pack is None or conn.encoder.encoding.lower().replace("-", "") != "utf8" or not _small(commands):
        return conn.pack_commands([tuple(c) for c in commands])
    return b"".join([_hiredis_pack(tuple(c)) for c in commands])


def _small(commands: Sequence[Sequence[Any]]) -> bool:
    """Whether no text or bytes argument of ``commands`` is over _HIREDIS_MAX_ARG (a plain loop: it
    runs over every argument of every call)."""
    for command in commands:
        for arg in command:
            if (type(arg) is bytes or type(arg) is str) and len(arg) > _HIREDIS_MAX_ARG:
                return False
    return True


async def reconnect_if_closed(conn: Any) -> None:
    """Disconnect ``conn``, just taken from a pool, if the server closed it or it holds unread bytes;
    run before anything is sent on it."""
    if not conn.is_connected:
        return
    probe = getattr(conn, "can_read", None) or conn.can_read_destructive  # redis-py 8.0: the latter only
    try:
        stale = bool(await probe())
    except (RedisConnectionError, OSError):
        stale = True
    if stale:
        log.debug("a pooled connection was closed by the server (idle timeout, CLIENT KILL, a "
                  "proxy); reconnecting before the next command")
        await conn.disconnect()


async def exchange(conn: Any, commands: Sequence[Sequence[Any]], sent: list[bool],
                   then: Sequence[Any] | None = None) -> list[Any]:
    """Write ``commands`` on ``conn`` in one go and return their replies in order (error replies
    returned). ``then`` follows only if the last command succeeded (a ``WAIT`` after a refusal would
    block for nothing). ``sent[0]`` is set after connecting: a call that fails to connect was never sent."""
    try:
        if not conn.is_connected:
            await conn.connect()
        sent[0] = True
        await conn.send_packed_command(pack(conn, commands))
        if (written := WRITTEN.get()) is not None and not written.done():
            written.set_result(None)
        replies = [await _read(conn) for _ in commands]
        if then is not None and not isinstance(replies[-1], ResponseError):
            await conn.send_packed_command(pack(conn, [then]))
            replies.append(await _read(conn))
        return replies
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _read(conn: Any) -> Any:
    try:
        # math.inf: no read timeout inside redis-py; the caller's bound governs.
        return await conn.read_response(timeout=math.inf)
    except ResponseError as exc:
        return exc


def result(replies: list[Any], then: Sequence[Any] | None) -> Any:
    """The call's result from :func:`exchange`'s replies: the first's error raised; else its reply, or
    with ``then`` the pair (the second as it came, an error too)."""
    if isinstance(replies[0], ResponseError):
        raise replies[0]
    return replies[0] if then is None else (replies[0], replies[1])
