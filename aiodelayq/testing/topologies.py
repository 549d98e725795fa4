"""Throwaway topologies on loopback, made of :class:`ThrowawayServer` processes of one server kind:
synchronous context managers (set up with redis-py's sync client) with the faults a test needs."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import redis

from .servers import ServerKind, ThrowawayServer, _free_port, stop_process

__all__ = ["ThrowawayCluster", "ThrowawaySentinels", "replicate"]

_SLOTS = 16384


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _port_with_bus() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too (Redis 6.2 has no
    ``cluster-port``, so the bus is always port + 10000)."""
    for _ in range(200):
        port = random.randint(20_000, 50_000)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _wait(what: str, check: Callable[[], bool], timeout_s: float, why: Callable[[], str] = lambda: "") -> None:
    """Until ``check()``; raises ``RuntimeError`` after ``timeout_s``, with ``why()`` (the last miss)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not reached within {timeout_s} s{': ' + why() if why() else ''}")
        time.sleep(0.05)


def replicate(primary: ThrowawayServer, replicas: list[ThrowawayServer], timeout_s: float = 15.0) -> None:
    """``REPLICAOF`` ``primary`` on each of ``replicas``; returns once the primary counts them all and
    each one's link to it is up."""
    for replica in replicas:
        _cmd(replica.port, "REPLICAOF", "127.0.0.1", primary.port)
    _wait("replicas in sync", lambda: _info(primary.port, "replication").get("connected_slaves") == len(replicas)
          and all(_info(r.port, "replication").get("master_link_status") == "up" for r in replicas), timeout_s)


def _tail(path: Path, size: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5.0)


def _cmd(port: int, *args: Any) -> Any:
    """One command to the server on ``port`` (a short-lived connection: setup and faults only)."""
    with _client(port) as c:
        return c.execute_command(*args)


def _info(port: int, section: str) -> dict[str, Any]:
    with _client(port) as c:
        return cast(dict[str, Any], c.info(section))


class ThrowawayCluster:
    """A Redis Cluster of ``primaries`` primaries with ``replicas`` replicas each, slots split evenly.

    ``startup_nodes`` (``[(host, port), ...]``) feed ``redis.asyncio.RedisCluster``;
    ``cluster-node-timeout`` is ``node_timeout_ms`` (a killed primary's replica takes over after
    about twice that). Use as a context manager.
    """

    def __init__(self, kind: ServerKind, *, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 1000,
                 extra_args: dict[str, str] | None = None) -> None:
        self.kind = kind
        self.node_timeout_ms = node_timeout_ms
        self._shape = (primaries, replicas)
        self._extra = dict(extra_args or {})
        self.nodes: list[ThrowawayServer] = []

    def __repr__(self) -> str:
        return f"<ThrowawayCluster {self.kind.name} ports={[n.port for n in self.nodes]}>"

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node."""
        return [("127.0.0.1", n.port) for n in self.nodes]

    def start(self, timeout_s: float = 30.0) -> ThrowawayCluster:
        """Start every node, join them, assign the slots and the replicas; return when the cluster
        state is ``ok`` on every node and every replica is in sync."""
        primaries, replicas = self._shape
        args = {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf",
                "cluster-node-timeout": str(self.node_timeout_ms), **self._extra}
        try:
            for _ in range(primaries * (1 + replicas)):
                node = ThrowawayServer(self.kind, args)
                node.port = _port_with_bus()
                self.nodes.append(node.start())
            first = self.nodes[0].port
            for node in self.nodes[1:]:
                _cmd(node.port, "CLUSTER", "MEET", "127.0.0.1", first)
            for i in range(primaries):
                lo, hi = i * _SLOTS // primaries, (i + 1) * _SLOTS // primaries
                _cmd(self.nodes[i].port, "CLUSTER", "ADDSLOTS", *range(lo, hi))
            _wait("every node knows every other", lambda: all(
                len(self._node_lines(n.port)) == len(self.nodes) for n in self.nodes), timeout_s)
            for j, node in enumerate(self.nodes[primaries:]):
                primary_id = self.node_id(self.nodes[j % primaries].port)

                def attach(port: int = node.port, primary_id: str = primary_id) -> bool:
                    return bool(_cmd(port, "CLUSTER", "REPLICATE", primary_id))
                _wait("replica attached", attach, timeout_s)
            self.wait_ok(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _node_lines(self, port: int) -> list[list[str]]:
        text = _cmd(port, "CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else text
        return [line.split() for line in text.splitlines() if line.strip()]

    def node_id(self, port: int) -> str:
        """The cluster node id of the node on ``port``."""
        return str(_cmd(port, "CLUSTER", "MYID").decode())

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok``, they agree on which primary serves
        which slots, and every replica's link to its primary is up."""
        def ok() -> bool:
            owners = None
            for node in self.running:
                if b"cluster_state:ok" not in _cmd(node.port, "CLUSTER", "INFO"):
                    return False
                info = _info(node.port, "replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
                mine = sorted((int(s[0]), int(s[1]), int(s[2][1])) for s in _cmd(node.port, "CLUSTER", "SLOTS"))
                if owners is not None and mine != owners:
                    return False
                owners = mine
            return True
        _wait("cluster ok", ok, timeout_s)

    @property
    def running(self) -> list[ThrowawayServer]:
        """Nodes whose process is alive."""
        return [n for n in self.nodes if n._proc is not None and n._proc.poll() is None]

    def primaries(self) -> list[ThrowawayServer]:
        """Running nodes that are primaries now (after failovers too)."""
        return [n for n in self.running if _info(n.port, "replication").get("role") == "master"]

    def primary_of(self, key: str | bytes) -> ThrowawayServer:
        """The running primary serving ``key``'s slot now."""
        return self.primary_of_slot(self.slot_of(key))

    def slot_of(self, key: str | bytes) -> int:
        """The hash slot of ``key``."""
        return int(_cmd(self.running[0].port, "CLUSTER", "KEYSLOT", key))

    def replica_of(self, primary: ThrowawayServer) -> ThrowawayServer:
        """A running replica of ``primary``."""
        replicas = self.replicas_of(primary)
        if not replicas:
            raise RuntimeError(f"{primary.port} has no running replica")
        return replicas[0]

    def replicas_of(self, primary: ThrowawayServer) -> list[ThrowawayServer]:
        """The running replicas of ``primary``."""
        pid = self.node_id(primary.port)
        ports = {int(line[1].split("@")[0].rsplit(":", 1)[1]) for line in self._node_lines(primary.port)
                 if line[3] == pid and "fail" not in line[2]}
        return [n for n in self.running if n.port in ports]

    def kill(self, node: ThrowawayServer) -> None:
        """SIGKILL ``node`` (its replica is promoted after about 2x ``node_timeout_ms``)."""
        node.kill()

    def failover_to(self, replica: ThrowawayServer, timeout_s: float = 30.0) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` (no write is lost); returns once it is a primary and the
        cluster is ok."""
        _cmd(replica.port, "CLUSTER", "FAILOVER")
        _wait("failover", lambda: _info(replica.port, "replication").get("role") == "master", timeout_s)
        self.wait_ok(timeout_s)

    def migrate_slot(self, slot: int, target: ThrowawayServer, *, keys_per_step: int = 1,
                     pause_s: float = 0.0, timeout_s: float = 60.0, finish: bool = True) -> int:
        """Move ``slot`` to the primary ``target`` the way ``redis-cli --cluster reshard`` does
        (IMPORTING/MIGRATING, ``MIGRATE`` key by key, then ``SETSLOT NODE`` everywhere), pausing
        ``pause_s`` between steps so clients meet ASK and TRYAGAIN; returns the keys moved. With
        ``finish=False`` the slot stays migrating (every key moved, clients get ASK) until
        :meth:`finish_migration`."""
        source = self.primary_of_slot(slot)
        src_id, dst_id = self.node_id(source.port), self.node_id(target.port)
        _cmd(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        _cmd(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            keys = _cmd(source.port, "CLUSTER", "GETKEYSINSLOT", slot, keys_per_step)
            if not keys:
                break
            _cmd(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            if pause_s:
                time.sleep(pause_s)
        if finish:
            self.finish_migration(slot, target)
        return moved

    def finish_migration(self, slot: int, target: ThrowawayServer) -> None:
        """``CLUSTER SETSLOT slot NODE target`` on every primary: the migration is over."""
        target_id = self.node_id(target.port)
        for node in self.primaries():
            _cmd(node.port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def primary_of_slot(self, slot: int) -> ThrowawayServer:
        """The running primary serving ``slot`` now, as the first running node sees it."""
        for s_lo, s_hi, master, *_ in _cmd(self.running[0].port, "CLUSTER", "SLOTS"):
            if s_lo <= slot <= s_hi:
                port = int(master[1])
                return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no primary serves slot {slot}")

    def close(self) -> None:
        """Stop every node and delete their data (idempotent)."""
        for node in self.nodes:
            node.close()
        self.nodes = []

    def __enter__(self) -> ThrowawayCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class ThrowawaySentinels:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority) watching it
    as ``service``; ``sentinel_nodes`` (``[(host, port), ...]``) feed ``redis.asyncio.sentinel.Sentinel``.
    ``extra_args`` go to the data servers. Use as a context manager."""

    def __init__(self, kind: ServerKind, *, replicas: int = 1, sentinels: int = 3, service: str = "mymaster",
                 down_after_ms: int = 1000, failover_timeout_ms: int = 10_000,
                 extra_args: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._extra = dict(extra_args or {})
        self.service = service
        self._shape = (replicas, sentinels)
        self._timing = (down_after_ms, failover_timeout_ms)
        self.servers: list[ThrowawayServer] = []
        self.sentinel_ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def __repr__(self) -> str:
        return f"<ThrowawaySentinels {self.kind.name} servers={[s.port for s in self.servers]} " \
               f"sentinels={self.sentinel_ports}>"

    @property
    def sentinel_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every Sentinel."""
        return [("127.0.0.1", p) for p in self.sentinel_ports]

    def start(self, timeout_s: float = 30.0) -> ThrowawaySentinels:
        """Start the primary, its replicas (in sync) and the Sentinels (each seeing the replicas and
        the other Sentinels)."""
        replicas, sentinels = self._shape
        try:
            primary = ThrowawayServer(self.kind, self._extra).start()
            self.servers.append(primary)
            for _ in range(replicas):
                self.servers.append(ThrowawayServer(self.kind, self._extra).start())
            replicate(primary, self.servers[1:], timeout_s)
            self._dir = tempfile.TemporaryDirectory(prefix="aiodelayq-sentinels-")
            for i in range(sentinels):
                self._start_sentinel(i, primary.port, timeout_s)
            self.wait_settled(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _start_sentinel(self, i: int, primary_port: int, timeout_s: float) -> None:
        """Start Sentinel ``i`` on a free port and wait for its PONG; on another port if it exits
        (a port taken between the check and its bind)."""
        assert self._dir is not None
        down_after_ms, failover_timeout_ms = self._timing
        quorum = self._shape[1] // 2 + 1
        log_path = Path(self._dir.name) / f"sentinel-{i}.log"
        for attempt in range(5):
            port = _free_port()
            conf = Path(self._dir.name) / f"sentinel-{i}-{attempt}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {self._dir.name}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {primary_port} {quorum}\n"
                f"sentinel down-after-milliseconds {self.service} {down_after_ms}\n"
                f"sentinel failover-timeout {self.service} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {self.service} 1\n")
            log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
            proc = subprocess.Popen([self.kind.binary, str(conf), "--sentinel"], stdout=log,
                                    stderr=subprocess.STDOUT, cwd=self._dir.name)
            log.close()
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError, OSError):
                    if _cmd(port, "PING"):
                        self._procs.append(proc)
                        self.sentinel_ports.append(port)
                        return
                time.sleep(0.02)
            stop_process(proc)
        raise RuntimeError(f"Sentinel {i} did not start: {_tail(log_path)}")

    def master_port(self) -> int:
        """The primary's port as the first Sentinel that answers sees it."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError, OSError):
                host_port = _cmd(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                return int(host_port[1])
        raise RuntimeError("no Sentinel answers")

    def wait_settled(self, timeout_s: float = 30.0) -> None:
        """Until every Sentinel agrees on the primary, knows the others and sees every replica of it
        with its link up."""
        replicas, sentinels = self._shape
        last = [""]  # what the last check found unsettled

        def settled() -> bool:
            seen = set()
            for port in self.sentinel_ports:
                last[0] = f"Sentinel on {port} does not answer"
                with _client(port) as s:
                    master = cast(dict[str, Any], s.sentinel_master(self.service))
                    others = s.sentinel_slaves(self.service)
                last[0] = f"Sentinel on {port} sees {master} and replicas {others}"
                if master.get("num-other-sentinels") != sentinels - 1 or master.get("num-slaves", 0) < replicas:
                    return False
                if "s_down" in str(master.get("flags", "")) or "o_down" in str(master.get("flags", "")):
                    return False
                seen.add(int(master["port"]))
                alive = {x.port for x in self.running}
                for rep in others:
                    unwell = rep.get("is_odown") or rep.get("is_sdown") or rep.get("master-link-status") != "ok"
                    if unwell and int(rep["port"]) in alive:
                        return False
            last[0] = f"the Sentinels name different primaries: {sorted(seen)}"
            return len(seen) == 1

        def why() -> str:
            logs = sorted(Path(self._dir.name).glob("sentinel-*.log")) if self._dir is not None else []
            return last[0] + "".join(f"\n--- {path.name}:\n{_tail(path)}" for path in logs)
        _wait("sentinels settled", settled, timeout_s, why)

    @property
    def running(self) -> list[ThrowawayServer]:
        """Data servers whose process is alive."""
        return [n for n in self.servers if n._proc is not None and n._proc.poll() is None]

    def server_on(self, port: int) -> ThrowawayServer:
        """The data server listening on ``port``."""
        return next(s for s in self.servers if s.port == port)

    def failover(self, timeout_s: float = 30.0) -> int:
        """``SENTINEL FAILOVER`` (a replica is promoted without the primary's agreement) and wait until
        the Sentinels name a new primary; returns its port."""
        old = self.master_port()
        _cmd(self.sentinel_ports[0], "SENTINEL", "FAILOVER", self.service)
        _wait("new primary", lambda: self.master_port() != old and _info(self.master_port(),
            "replication").get("role") == "master", timeout_s)
        return self.master_port()

    def close(self) -> None:
        """Stop the Sentinels and the servers, delete their data (idempotent)."""
        for proc in self._procs:
            stop_process(proc)
        self._procs = []
        self.sentinel_ports = []
        for server in self.servers:
            server.close()
        self.servers = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> ThrowawaySentinels:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

