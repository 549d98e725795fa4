"""A Redis container for tests and benchmarks, published and reached on 127.0.0.1 only (testcontainers)."""

from __future__ import annotations

from typing import Any

__all__ = ["loopback_redis_container"]


def loopback_redis_container(image: str) -> Any:
    """A testcontainers ``RedisContainer`` of ``image`` (not started) published on 127.0.0.1 only and
    reached there; use it as a context manager.

    testcontainers' defaults publish on every host address and, where ``/.dockerenv`` exists, connect to the
    Docker bridge's gateway; the overrides below also cover its readiness PING inside ``start()``.

    Raises:
        ImportError: testcontainers is not installed (``pip install 'testcontainers[redis]'``).
    """
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:  # testcontainers before the community/ layout
        from testcontainers.redis import RedisContainer

    class LoopbackRedisContainer(RedisContainer):
        def get_container_host_ip(self) -> str:
            return "127.0.0.1"

        def get_exposed_port(self, port: int) -> int:
            return int(self.get_docker_client().port(self.get_container_id(), port))

    container = LoopbackRedisContainer(image)
    # docker-py's ``ports`` form (host address, host port); None: a free port the engine picks.
    container.ports[str(container.port)] = ("127.0.0.1", None)  # type: ignore[assignment]  # docker-py takes it
    return container
