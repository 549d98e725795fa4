"""Durable writes: a write that must not be lost waits until replicas (and optionally the AOF) have it.

With ``min_replicas`` > 0 (or ``wait_aof``), the writes that must survive are followed, on the same
connection, by ``WAIT`` (or ``WAITAOF``); the call raises :class:`~aiodelayq.NotReplicatedError`
unless enough replicas confirm. This does not make Redis strongly consistent: a failover that
promotes a replica without the write still loses it.

``WAIT`` counts from a connection's own last write, so a resend (recognised by its call id) writes
its call id again (``first_run`` in the scripts' prelude): the ``WAIT`` on the new connection then
also covers the first run's writes.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from .._util import checks
from ..exceptions import AccessDeniedError, BackendError, ConfigurationError, NotReplicatedError
from .connections import AnyRedis, Script, call, run_script

__all__ = ["Durability", "run_durable"]


@dataclass(frozen=True)
class Durability:
    """How a queue's durable writes are confirmed.

    Attributes:
        min_replicas: replicas that must have a write before its call returns (0: none).
        timeout_s: how long to wait for them, seconds (on top of the call's own bound).
        aof: also wait for the primary's AOF fsync (and the replicas', with ``WAITAOF``; Redis and
            Valkey >= 7.2, ``appendonly yes``).
    """

    min_replicas: int = 0
    timeout_s: float = 1.0
    aof: bool = False

    @classmethod
    def build(cls, min_replicas: int, timeout_s: float, aof: bool) -> Durability:
        """Check the options.

        Raises:
            ConfigurationError: a bad option, named.
        """
        replicas = checks.count("min_replicas", min_replicas, minimum=0)
        timeout = checks.seconds("replication_timeout_s", timeout_s, above_minimum=True)
        if not isinstance(aof, bool):
            raise ConfigurationError(f"wait_aof must be a bool, not {aof!r}")
        return cls(replicas, timeout, aof)

    @property
    def enabled(self) -> bool:
        """Whether writes wait for a confirmation at all."""
        return self.min_replicas > 0 or self.aof

    def command(self) -> tuple[Any, ...]:
        """The confirmation command sent after a durable write."""
        timeout_ms = max(1, round(self.timeout_s * 1000))
        if self.aof:
            return ("WAITAOF", 1, self.min_replicas, timeout_ms)
        return ("WAIT", self.min_replicas, timeout_ms)

    def check(self, reply: Any, what: str) -> None:
        """Raise unless ``reply`` (of :meth:`command`) confirms the write.

        Raises:
            NotReplicatedError: fewer confirmations than asked, or the command failed.
        """
        if isinstance(reply, ResponseError):
            hint = " (WAITAOF needs Redis or Valkey >= 7.2 and appendonly yes)" if self.aof else ""
            raise NotReplicatedError(f"{what}: applied on the primary, but its confirmation failed: {reply}{hint}",
                                     replicas=None, wanted=self.min_replicas)
        if self.aof:
            local, replicas = int(reply[0]), int(reply[1])
            if local >= 1 and replicas >= self.min_replicas:
                return
            raise NotReplicatedError(
                f"{what}: applied on the primary, but within {self.timeout_s:g} s its AOF fsync "
                f"{'was' if local else 'was not'} confirmed and {replicas} of {self.min_replicas} replicas "
                "confirmed theirs; a failover now may lose it", replicas=replicas, wanted=self.min_replicas)
        replicas = int(reply)
        if replicas < self.min_replicas:
            raise NotReplicatedError(
                f"{what}: applied on the primary, but only {replicas} of {self.min_replicas} replicas confirmed it "
                f"within {self.timeout_s:g} s; a failover now may lose it", replicas=replicas,
                wanted=self.min_replicas)


# Clients whose server accepted each confirmation command (a probe before the first durable write).
_accepted: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


async def _probe(client: AnyRedis, durability: Durability, route: Any, timeout_s: float) -> None:
    """Check once per client that the server runs the confirmation command: a refused one would turn
    every write into an applied but unconfirmed one. These probes return at once."""
    name = "WAITAOF" if durability.aof else "WAIT"
    accepted = _accepted.setdefault(client, set())
    if name in accepted:
        return
    probe = ("WAITAOF", 1, 0, 1) if durability.aof else ("WAIT", 0, 0)
    try:
        await call(client, *probe, what=f"{name} (checking durable writes)", timeout_s=timeout_s, route=route)
    except AccessDeniedError:
        raise
    except BackendError as exc:
        if not isinstance(exc.__cause__, ResponseError):
            raise  # not the server's answer: nothing learnt
        hint = ("wait_aof needs Redis or Valkey >= 7.2 with appendonly yes" if durability.aof
                else "min_replicas needs WAIT")
        raise ConfigurationError(f"durable writes cannot be confirmed on this server ({hint}): {exc}") from exc
    accepted.add(name)


async def run_durable(client: AnyRedis, script: Script, keys: Sequence[Any], args: Sequence[Any], *,
                      durability: Durability, timeout_s: float, what: str) -> Any:
    """:func:`run_script`, then (when ``durability`` is enabled) its confirmation on the same
    connection; the bound grows by the confirmation's timeout.

    Raises:
        NotReplicatedError: the write ran but was not confirmed.
        ConfigurationError, AccessDeniedError: the server refuses the confirmation command (checked
            once per client before its first durable write; nothing was written).
        Otherwise as :func:`run_script`.
    """
    if not durability.enabled:
        return await run_script(client, script, keys, args, timeout_s=timeout_s, what=what)
    await _probe(client, durability, keys[0] if keys else None, timeout_s)
    reply, confirmation = await run_script(client, script, keys, args, timeout_s=timeout_s + durability.timeout_s,
                                           what=what, then=durability.command())
    durability.check(confirmation, what)
    return reply
