"""Redis URLs in messages: shown without their password (the CLI, the demo, the worker process)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact"]


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (error messages must not leak it)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return url
