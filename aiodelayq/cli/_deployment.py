"""``doctor``, ``dashboard`` and ``worker``: the commands of a deployment rather than of one queue's
contents (the checks are :mod:`._doctor`'s)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer

from ._arguments import AsJson, CodecName, CodecOpt, Connection, connection_options, seconds
from ._running import fail, run

if TYPE_CHECKING:
    from .._admin.connect import Target

__all__ = ["dashboard", "doctor", "worker"]


class WireFormatName(str, Enum):
    """What the queues' producers write (``DelayedQueue(wire_format=...)``)."""

    REDISSON = "redisson"
    LEGACY = "redisson-legacy"


@connection_options
def doctor(names: Annotated[list[str] | None, typer.Argument(metavar="NAMES", help="Queues to check (default: "
                                                             "the queues SCAN finds, up to 100).")] = None,
           max_lag: Annotated[float, typer.Option("--max-lag", parser=seconds(0.0), metavar="SECONDS",
                                                  help="A queue whose due items wait longer fails.")] = 60.0,
           max_skew: Annotated[float, typer.Option("--max-skew", parser=seconds(0.0), metavar="SECONDS",
                                                   help="Warn when this machine's clock is further off the "
                                                   "server's.")] = 1.0,
           wire_format: Annotated[WireFormatName, typer.Option("--wire-format", metavar="redisson|redisson-legacy",
                                                               help="What the queues' producers write.")]
           = WireFormatName.REDISSON,
           acl_user: Annotated[str | None, typer.Option("--acl-user", metavar="NAME",
                                                        help="Check this user's ACL (default: the URL's user; "
                                                        "needs ACL DRYRUN).")] = None,
           *, connection: Connection, as_json: AsJson = False) -> None:
    """Check a deployment: eviction policy, persistence, replication, server version and commands,
    clock, and per queue the ACL, lag and element format. One line per check; exit 1 when one
    fails (warnings do not fail)."""
    failed = run(_doctor(connection.target(), names, max_lag, max_skew, wire_format.value, acl_user, as_json))
    raise typer.Exit(1 if failed else 0)


async def _doctor(target: Target, names: list[str] | None, max_lag_s: float, max_skew_s: float, wire_format: str,
                  acl_user: str | None, as_json: bool) -> bool:
    from .._admin.connect import connect
    from .._admin.scan import scan_queues
    from ._doctor import diagnose
    from ._render import doctor_lines, print_json

    async with connect(target) as client:
        if not names:
            names = (await scan_queues(client, "*", 100, 100)).names
        findings = await diagnose(client, names, max_lag_s=max_lag_s, max_skew_s=max_skew_s,
                                  wire_format=wire_format, acl_user=acl_user)
    failed = any(f.status == "fail" for f in findings)
    if as_json:
        print_json({"ok": not failed, "findings": [vars(f) for f in findings]})
    else:
        for line in doctor_lines(findings):
            typer.echo(line)
    return failed


@connection_options
def dashboard(host: Annotated[str, typer.Option("--host", metavar="ADDRESS",
                                                help="The address to listen on (beyond loopback, a token is "
                                                "required).")] = "127.0.0.1",
              port: Annotated[int, typer.Option("--port", min=0, max=65535, metavar="PORT",
                                                help="The port to listen on (0: any free one).")] = 8000,
              read_only: Annotated[bool, typer.Option("--read-only", help="No write buttons: nothing can be "
                                                      "changed.")] = False,
              names: Annotated[list[str] | None, typer.Option("--queue", metavar="NAME",
                                                              help="Show this queue (repeatable; default: the "
                                                              "queues SCAN finds).")] = None,
              token: Annotated[str | None, typer.Option("--token", envvar="AIODELAYQ_DASHBOARD_TOKEN",
                                                        metavar="TOKEN",
                                                        help="Every request needs this token (16+ characters; "
                                                        "a bearer token or the login form's). Beyond loopback "
                                                        "one is required: without it, one is made and printed. "
                                                        "Prefer the env var: arguments show in ps.")] = None,
              *, connection: Connection) -> None:
    """Serve the web dashboard of the queues until Ctrl-C or SIGTERM (docs: Dashboard)."""
    import logging

    try:
        from ..dashboard import CannotListen, serve
        from ..dashboard._auth import check_token
    except ImportError as exc:  # the extra is missing: its message says what to install
        fail(str(exc), 2)
    from ..exceptions import ConfigurationError

    if token is not None:
        try:
            check_token(token, "--token (or AIODELAYQ_DASHBOARD_TOKEN)")
        except ConfigurationError as exc:
            fail(str(exc), 2)

    # The dashboard's one INFO line says where it listens (the port it got, with --port 0).
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("aiodelayq").setLevel(logging.INFO)
    try:
        run(serve(connection.target(), host, port, read_only, queues=names, token=token))
    except CannotListen as exc:
        fail(str(exc), 1)
    except KeyboardInterrupt:  # Ctrl-C is how it ends: exit 0
        raise typer.Exit(0) from None


@connection_options
def worker(target: Annotated[str, typer.Argument(metavar="MODULE:FUNC", help="The async handler of one item, "
                                                 "e.g. myapp.jobs:handle.")],
           queue: Annotated[str, typer.Option("--queue", metavar="NAME", help="The queue to consume.")],
           concurrency: Annotated[int, typer.Option("--concurrency", min=1, metavar="N",
                                                    help="Items handled at once.")] = 16,
           visibility_timeout: Annotated[float, typer.Option("--visibility-timeout", parser=seconds(0.1),
                                                             metavar="SECONDS",
                                                             help="Seconds a received item stays invisible to "
                                                             "others (extended while the handler runs).")] = 30.0,
           max_deliveries: Annotated[int, typer.Option("--max-deliveries", min=0, metavar="N",
                                                       help="Dead-letter a failing item after N deliveries "
                                                       "(0: no limit).")] = 5,
           drain_timeout: Annotated[float, typer.Option("--drain-timeout", parser=seconds(0.0), metavar="SECONDS",
                                                        help="Seconds running handlers get to finish on "
                                                        "SIGTERM/Ctrl-C.")] = 30.0,
           plain: Annotated[bool, typer.Option("--plain", help="At most once: take items (no acks); a failed "
                                               "item is logged and gone.")] = False,
           *, connection: Connection, codec: CodecOpt = CodecName.JSON) -> None:
    """Consume a queue with a handler until SIGTERM/Ctrl-C, then drain (at-least-once, unless --plain):
    on one server, a Cluster (any node's URL) or a Sentinel-managed primary."""
    where = connection.target()
    # Imported here: the worker is only this command's business. run_worker loads MODULE:FUNC itself,
    # prints its own one-line errors and returns the exit code.
    from .._admin.connect import BadInput, CannotConnect, connect
    from ..worker import run_worker

    try:
        code = run_worker(target, queue=queue, redis_url=connection.redis_url, max_deliveries=max_deliveries,
                          codec=codec.value, concurrency=concurrency, visibility_timeout_s=visibility_timeout,
                          reliable=not plain, drain_timeout_s=drain_timeout, connect=lambda: connect(where))
    except BadInput as exc:
        fail(str(exc), 2)
    except CannotConnect as exc:
        fail(str(exc), 1)
    raise typer.Exit(code)
