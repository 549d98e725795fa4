"""Deduplication windows of offers (``dedupe_for=``, ``dedupe_by_content=``): the check of the
options, and the key of an item deduplicated by its content.

A window keeps an offered item's key taken for ``dedupe_for`` after the offer wrote it, whatever
became of the item (``lua/lib/windows.lua``). Content deduplication makes the key from the encoded
payload and headers (``_wire/item_keys.content_key``), before a trace context joins the headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from .._wire.codec import Codec, encode_item
from .._wire.delays import positive_ms
from .._wire.elements import pack_headers
from .._wire.item_keys import content_key
from ..exceptions import InvalidHeadersError, InvalidKeyError

__all__ = ["dedupe_key", "dedupe_keys", "window_ms"]


def window_ms(dedupe_for: float | timedelta | None, keyed: bool) -> int | None:
    """``dedupe_for`` in whole ms (``None``: no window) for an offer with a key (``keyed``).

    Raises:
        InvalidDelayError: ``dedupe_for`` not above 0, NaN, infinite, too large or not a number.
        InvalidKeyError: ``dedupe_for`` without a key (and without ``dedupe_by_content``).
    """
    if dedupe_for is None:
        return None
    ms = positive_ms(dedupe_for, "dedupe_for")
    if not keyed:
        raise InvalidKeyError("dedupe_for needs a key (key=/keys=) or dedupe_by_content=True: a window keeps a key "
                              "taken; nothing written")
    return ms


def dedupe_key(codec: Codec, item: Any, key: str | None, headers: Mapping[str, str] | None,
               dedupe_for: float | timedelta | None, by_content: bool) -> tuple[str | None, int | None]:
    """One offer's key (its content's with ``by_content``) and window (ms or ``None``).

    Raises:
        InvalidKeyError: ``key`` with ``by_content``, or ``dedupe_for`` without either.
        InvalidDelayError, EncodeError, InvalidHeadersError: a bad ``dedupe_for``, item or headers.
    """
    if by_content:
        if key is not None:
            raise InvalidKeyError("key and dedupe_by_content=True exclude each other: the content makes the key; "
                                  "nothing written")
        key = _content_key(codec, item, headers, "headers")
    return key, window_ms(dedupe_for, key is not None)


def dedupe_keys(codec: Codec, pairs: Sequence[tuple[Any, Any]], keys: Sequence[str | None] | None,
                headers: Sequence[Mapping[str, str] | None] | None, dedupe_for: float | timedelta | None,
                by_content: bool) -> tuple[Sequence[str | None] | None, int | None]:
    """An ``offer_many``'s keys (each item's content's with ``by_content``) and window (ms or
    ``None``, one for all: items whose key is ``None`` have none).

    Raises:
        InvalidKeyError: ``keys`` with ``by_content``, or ``dedupe_for`` without either.
        InvalidHeadersError: with ``by_content``, headers that are not one mapping (or ``None``) per item.
        InvalidDelayError, EncodeError: a bad ``dedupe_for`` or item.
    """
    if by_content:
        if keys is not None:
            raise InvalidKeyError("keys and dedupe_by_content=True exclude each other: the content makes the keys; "
                                  "nothing written")
        if headers is None:
            headers = [None] * len(pairs)
        elif isinstance(headers, (str, bytes, Mapping)) or len(headers) != len(pairs):
            raise InvalidHeadersError(f"headers must be a sequence of one mapping (or None) per item, {len(pairs)} "
                                      "items")
        keys = [_content_key(codec, item, h, f"headers[{i}]")
                for i, ((item, _), h) in enumerate(zip(pairs, headers, strict=True))]
    return keys, window_ms(dedupe_for, keys is not None)


def _content_key(codec: Codec, item: Any, headers: object, option: str) -> str:
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidHeadersError(f"{option} must be a mapping of str to str, not {type(headers).__name__}")
    ordered = None if headers is None else dict(sorted(headers.items(), key=lambda kv: str(kv[0])))
    return content_key(encode_item(codec, item), pack_headers(ordered, option))
