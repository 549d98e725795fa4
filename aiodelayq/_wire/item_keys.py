"""An item's key (``offer(..., key=...)``, ``schedule(key, ...)``): its check, and its tag, the
index field the element's id carries; the key of an item deduplicated by its content; and the
check of an item's group (``offer(..., group=...)``)."""

from __future__ import annotations

import hashlib

from ..exceptions import InvalidGroupError, InvalidKeyError

__all__ = ["CONTENT_KEY_PREFIX", "MAX_GROUP_BYTES", "MAX_KEY_BYTES", "check_group", "check_key", "content_key",
           "key_tag"]

MAX_KEY_BYTES = 1024
MAX_GROUP_BYTES = 256


def check_key(key: object) -> bytes:
    """The UTF-8 bytes of a valid key.

    Raises:
        InvalidKeyError: not a non-empty ``str`` of at most ``MAX_KEY_BYTES`` UTF-8 bytes.
    """
    return _utf8(key, "key", MAX_KEY_BYTES, InvalidKeyError)


def check_group(group: object) -> bytes:
    """The UTF-8 bytes of a valid group.

    Raises:
        InvalidGroupError: not a non-empty ``str`` of at most ``MAX_GROUP_BYTES`` UTF-8 bytes.
    """
    return _utf8(group, "group", MAX_GROUP_BYTES, InvalidGroupError)


def _utf8(text: object, what: str, most: int, error: type[InvalidKeyError]) -> bytes:
    if not isinstance(text, str):
        raise error(f"{what} must be a str, not {type(text).__name__}")
    try:
        raw = text.encode()
    except UnicodeEncodeError as exc:  # lone surrogates
        raise error(f"{what} is not valid UTF-8: {exc}") from exc
    if not raw or len(raw) > most:
        raise error(f"{what} must be 1..{most} UTF-8 bytes, got {len(raw)}")
    return raw


def key_tag(raw_key: bytes) -> bytes:
    """The 8-byte tag of a key (its index field, carried in its element's id): SHA-1's first 8 bytes
    with the top bit set (clear in unkeyed elements, so a transfer knows which own an index field)."""
    digest = hashlib.sha1(raw_key).digest()
    return bytes((digest[0] | 0x80,)) + digest[1:8]


CONTENT_KEY_PREFIX = "content:"


def content_key(payload: bytes, headers_block: bytes) -> str:
    """The key of an item offered with ``dedupe_by_content=True``: ``content:`` and the first 128 bits
    of SHA-256 over its encoded payload (length-prefixed) and its headers block (headers sorted by
    name), in hex. Two different items share a key with odds 2**-128."""
    digest = hashlib.sha256(len(payload).to_bytes(8, "big") + payload + headers_block).hexdigest()
    return CONTENT_KEY_PREFIX + digest[:32]
