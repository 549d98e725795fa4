"""The arguments and options several commands take, declared once: the connection options (given to
a command as one :class:`Connection` by :func:`connection_options`), the codec, ``--json``, queue
names, and the parser of a ``SECONDS`` option."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ._running import fail

if TYPE_CHECKING:
    from .._admin.connect import Target

__all__ = ["DEFAULT_URL", "AsJson", "CodecName", "CodecOpt", "Connection", "QueueName", "QueueNames",
           "connection_options", "seconds"]

R = TypeVar("R")

DEFAULT_URL = "redis://localhost:6379/0"


class CodecName(str, Enum):
    """The built-in codecs a command can decode or encode with."""

    JSON = "json"
    STR = "str"
    BYTES = "bytes"
    MSGPACK = "msgpack"


def seconds(minimum: float) -> Callable[[str], float]:
    """The parser of a ``SECONDS`` option: a finite number of seconds, at least ``minimum`` (the
    library's rule for durations); anything else (``inf``, ``nan``, text) is a usage error (exit 2)."""

    def parse(text: str) -> float:
        import math

        from .._util.checks import seconds_text

        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"must be a number of seconds, not {text!r}") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"must be a finite number of seconds, not {text!r}")
        if value < minimum:
            raise typer.BadParameter(f"must be at least {seconds_text(minimum)}, not {text!r}")
        return value

    return parse


RedisUrl = Annotated[str, typer.Option("--redis-url", envvar="REDIS_URL", metavar="URL",
                                       help="The server: redis://, rediss:// (TLS) or unix://; for a Cluster, any "
                                       "node. With --sentinel, only its credentials, database and TLS count.")]
ClusterOpt = Annotated[bool, typer.Option("--cluster", help="The URL is a Cluster node (found out by itself with "
                                          "INFO cluster where INFO is allowed).")]
SentinelOpt = Annotated[list[str] | None, typer.Option("--sentinel", metavar="HOST:PORT",
                                                       help="A Sentinel to ask for the primary (repeatable); "
                                                       "needs --service.")]
ServiceOpt = Annotated[str | None, typer.Option("--service", metavar="NAME",
                                                help="The primary's name at the Sentinels (--sentinel).")]
CodecOpt = Annotated[CodecName, typer.Option("--codec", metavar="json|str|bytes|msgpack",
                                             help="How the queue's payloads are encoded.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
QueueName = Annotated[str, typer.Argument(metavar="NAME", help="Queue name (the destination list, Redisson's queue "
                                          "name).")]
QueueNames = Annotated[list[str], typer.Argument(metavar="NAMES", help="Queue names.")]

# The connection options, in the order help lists them: parameter name, declaration, default.
_CONNECTION_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("redis_url", RedisUrl, DEFAULT_URL), ("cluster", ClusterOpt, False), ("sentinel", SentinelOpt, None),
    ("service", ServiceOpt, None))


@dataclass(frozen=True)
class Connection:
    """A command's connection options as given (``--redis-url``, ``--cluster``, ``--sentinel``,
    ``--service``); :meth:`target` checks them."""

    redis_url: str
    cluster: bool
    sentinel: list[str] | None
    service: str | None

    def target(self) -> Target:
        """Where the command connects (a bad option: one line, exit 2)."""
        from .._admin.connect import BadInput, Target
        from ._input import parse_sentinel

        try:
            nodes = tuple(parse_sentinel(text) for text in self.sentinel or ())
        except BadInput as exc:
            fail(str(exc), 2)
        if self.service is not None and not nodes:
            fail("--service needs --sentinel HOST:PORT (the Sentinels to ask)", 2)
        return Target(self.redis_url, self.cluster, nodes, self.service)


def connection_options(command: Callable[..., R]) -> Callable[..., R]:
    """``command`` with the connection options in place of its keyword-only parameter ``connection``,
    which it gets as one :class:`Connection`. Typer reads a command's options from its signature:
    the one this gives the command declares the four options where ``connection`` stands."""
    declared = inspect.signature(command, eval_str=True)
    parameters: list[inspect.Parameter] = []
    for parameter in declared.parameters.values():
        if parameter.name != "connection":
            parameters.append(parameter)
            continue
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, "declare it after a '*'"
        parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                       for name, annotation, default in _CONNECTION_OPTIONS]

    @functools.wraps(command)
    def with_connection(**options: Any) -> R:
        connection = Connection(*(options.pop(name) for name, _, _ in _CONNECTION_OPTIONS))
        return command(**options, connection=connection)

    signature = declared.replace(parameters=parameters)
    with_connection.__signature__ = signature  # type: ignore[attr-defined]
    with_connection.__annotations__ = {p.name: p.annotation for p in parameters}
    with_connection.__annotations__["return"] = signature.return_annotation
    return with_connection
