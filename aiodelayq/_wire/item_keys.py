"""An item's key (``offer(..., key=...)``, ``schedule(key, ...)``): its check, and its tag, the
index field the element's id carries; and the check of an item's group (``offer(..., group=...)``)."""

from __future__ import annotations

import hashlib

from ..exceptions import InvalidGroupError, InvalidKeyError

__all__ = ["MAX_GROUP_BYTES", "MAX_KEY_BYTES", "check_group", "check_key", "key_tag"]

MAX_KEY_BYTES = 1024
MAX_GROUP_BYTES = 256


def check_key(key: object) -> bytes:
    """The UTF-8 bytes of a valid key.

    Raises:
        InvalidKeyError: not a non-empty ``str`` of at most ``MAX_KEY_BYTES`` UTF-8 bytes.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"key must be a str, not {type(key).__name__}")
    try:
        raw = key.encode()
    except UnicodeEncodeError as exc:  # lone surrogates
        raise InvalidKeyError(f"key is not valid UTF-8: {exc}") from exc
    if not raw or len(raw) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"key must be 1..{MAX_KEY_BYTES} UTF-8 bytes, got {len(raw)}")
    return raw


def check_group(group: object) -> bytes:
    """The UTF-8 bytes of a valid group.

    Raises:
        InvalidGroupError: not a non-empty ``str`` of at most ``MAX_GROUP_BYTES`` UTF-8 bytes.
    """
    if not isinstance(group, str):
        raise InvalidGroupError(f"group must be a str, not {type(group).__name__}")
    try:
        raw = group.encode()
    except UnicodeEncodeError as exc:  # lone surrogates
        raise InvalidGroupError(f"group is not valid UTF-8: {exc}") from exc
    if not raw or len(raw) > MAX_GROUP_BYTES:
        raise InvalidGroupError(f"group must be 1..{MAX_GROUP_BYTES} UTF-8 bytes, got {len(raw)}")
    return raw


def key_tag(raw_key: bytes) -> bytes:
    """The 8-byte tag of a key (its index field, carried in its element's id): SHA-1's first 8 bytes
    with the top bit set (clear in unkeyed elements, so a transfer knows which own an index field)."""
    digest = hashlib.sha1(raw_key).digest()
    return bytes((digest[0] | 0x80,)) + digest[1:8]
