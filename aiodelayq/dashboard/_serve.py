"""The dashboard on its own: :func:`serve` runs it with uvicorn (what ``aiodelayq dashboard`` calls)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
from collections.abc import Iterator, Sequence
from typing import Any

from .._admin.connect import Target, connect
from ._app import Dashboard
from ._auth import check_token, new_token

__all__ = ["CannotListen", "serve"]

log = logging.getLogger("aiodelayq")


class CannotListen(Exception):
    """The dashboard cannot listen on ``host:port`` (in use, not an address of this machine, a
    privileged port); the message is one line that says so."""


async def serve(url: str | Target, host: str = "127.0.0.1", port: int = 8000, read_only: bool = False, *,
                queues: Sequence[str] | None = None, token: str | None = None) -> None:
    """Serve a :class:`Dashboard` of the server at ``url`` on ``http://host:port/`` with uvicorn, until
    SIGTERM (then it returns) or until cancelled (Ctrl-C under ``asyncio.run``: the server shuts down,
    then :class:`asyncio.CancelledError` propagates). Needs the ``dashboard`` extra (Jinja2, uvicorn).

    Every failure it can expect is one of the exceptions below, with a one-line message (``aiodelayq
    dashboard`` prints it). On loopback without ``token`` anyone who can reach the port may use it; on
    any other address without ``token`` it makes one and logs it at WARNING, once, at start.

    Args:
        url: a Redis URL (``redis://``, ``rediss://``, ``unix://``): a server, or a node of a Cluster
            (detected); or a :class:`~aiodelayq._admin.connect.Target` (what the command line passes), for Sentinel.
        host: the address to listen on.
        port: the port to listen on (0: any free port).
        read_only: no write buttons; every action answers 403.
        queues: the queues to show (``None``: those ``SCAN`` finds).
        token: the token every request needs (16 to 1,024 visible ASCII characters); ``None``: none
            on loopback, a new one on any other address.

    Raises:
        ConfigurationError: ``token`` is not a ``str`` of 16 to 1,024 visible ASCII characters
            (raised before connecting; the message never shows it).
        aiodelayq._admin.connect.BadInput: ``url`` is not a Redis URL.
        aiodelayq._admin.connect.CannotConnect: the server does not answer a ``PING`` (refused, unknown host,
            timeout, bad password).
        CannotListen: ``host:port`` cannot be listened on (in use, an address not of this machine).
        ImportError: uvicorn is not installed (the message says ``pip install 'aiodelayq[dashboard]'``).
    """
    try:
        import uvicorn
    except ImportError as exc:
        raise ImportError("aiodelayq.dashboard.serve needs uvicorn: pip install 'aiodelayq[dashboard]'") from exc

    if token is not None:
        check_token(token)
    target = url if isinstance(url, Target) else Target(url)
    async with connect(target) as client:
        sock = _listen(host, port)
        try:
            bound = sock.getsockname()
            made = token is None and not _is_loopback(bound[0])
            if made:
                token = new_token()
            dashboard = Dashboard(client, read_only=read_only, queues=queues, token=token)
            server = _server(uvicorn.Config(dashboard.asgi_app(), lifespan="on", log_level="warning",
                                            access_log=False, server_header=False, proxy_headers=False))
            log.info("dashboard of %s on http://%s/%s%s", target, _address(bound),
                     " (read-only)" if read_only else "", " (token required)" if token is not None else "")
            if made:
                log.warning("the dashboard listens beyond loopback (%s) and was given no token; "
                            "its token is %s", bound[0], token)
            running = asyncio.ensure_future(server.serve(sockets=[sock]))
            try:
                await asyncio.shield(running)
            except asyncio.CancelledError:
                server.should_exit = True  # requests in flight finish, then the socket closes
                with contextlib.suppress(Exception):
                    await running
                raise
        finally:
            sock.close()


def _is_loopback(address: str) -> bool:
    """Whether a bound address is a loopback one (``127.0.0.0/8``, ``::1``, ``::ffff:127.x.y.z``)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _listen(host: str, port: int) -> socket.socket:
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    if not 0 <= port <= 65535:
        raise CannotListen(f"cannot listen on {where}: a port is 0 to 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                            flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise CannotListen(f"cannot listen on {where}: unknown host ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart at once
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        reason = {errno.EADDRINUSE: "the address is in use (another server listens there)",
                  errno.EADDRNOTAVAIL: "not an address of this machine",
                  errno.EACCES: "permission denied (a port below 1024 needs privileges)"}.get(
                      exc.errno or 0, exc.strerror or str(exc))
        raise CannotListen(f"cannot listen on {where}: {reason}") from None
    sock.setblocking(False)
    return sock


def _address(bound: Any) -> str:
    host, port = bound[0], bound[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _server(config: Any) -> Any:
    """A uvicorn server that leaves SIGINT to the caller (Ctrl-C cancels :func:`serve`) and ends
    :func:`serve` on SIGTERM without re-raising it, as uvicorn's own handling would."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            try:
                loop.add_signal_handler(signal.SIGTERM, self.handle_exit, signal.SIGTERM, None)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals
                yield
                return
            try:
                yield
            finally:
                loop.remove_signal_handler(signal.SIGTERM)

    return Server(config)
