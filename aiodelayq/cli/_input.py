"""Command-line text turned into values: a ``--sentinel`` address, a ``RATE``, an item's ``VALUE``.
A value the command cannot use is a :class:`BadInput` (exit code 2)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from .._admin.connect import BadInput

__all__ = ["parse_rate", "parse_sentinel", "parse_value"]

SENTINEL_PORT = 26379


def parse_sentinel(text: str) -> tuple[str, int]:
    """``(host, port)`` of a ``--sentinel`` value: ``host:port``, ``host`` (port 26379) or
    ``[ipv6]:port``.

    Raises:
        BadInput: an empty host or a port that is not a number from 1 to 65535.
    """
    host, port_text = text.strip(), ""
    if host.startswith("["):
        inner, _, rest = host[1:].partition("]")
        host, port_text = inner, rest.removeprefix(":")
    elif host.count(":") == 1:
        host, _, port_text = host.partition(":")
    try:
        port = int(port_text) if port_text else SENTINEL_PORT
    except ValueError:
        port = 0
    if not host or not 0 < port < 65536:
        raise BadInput(f"--sentinel must be HOST:PORT (e.g. sentinel-1:26379), not {text!r}")
    return host, port


_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate(text: str) -> float | None:
    """Items per second of a command-line ``RATE``: ``100/s``, ``6000/min``, ``10/h``, ``2.5`` (per
    second), or ``off``/``none`` (no limit).

    Raises:
        BadInput: anything else, or a rate that is not above 0.
    """
    spec = text.strip().lower()
    if spec in ("off", "none"):
        return None
    number, _, unit = spec.partition("/")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    per = _PER.get(unit or "s")
    if per is None or not math.isfinite(value) or value <= 0:
        raise BadInput(f"RATE must be like 100/s, 6000/min, 10/h, 2.5 or off, not {text!r}")
    return value / per


def parse_value(text: str, codec: str) -> Any:
    """The item a command-line ``VALUE`` stands for under ``codec``.

    ``json`` and ``msgpack``: the text parsed as JSON (so ``'{"order": 1}'`` is a dict and a string
    needs its quotes); ``str``: the text; ``bytes``: the argument's bytes as the OS passed them.

    Raises:
        BadInput: the text is not JSON for a JSON-based codec.
    """
    if codec == "str":
        return text
    if codec == "bytes":
        return os.fsencode(text)  # undoes the surrogateescape decoding of argv: the exact bytes
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"VALUE is not JSON ({exc}); the {codec} codec takes JSON text: quote a string as "
                       f"'\"text\"', or use --codec str") from None
