"""Codecs: how an item becomes the payload bytes stored in Redis, and back."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..exceptions import ConfigurationError, DecodeError, EncodeError
from .elements import ITEM_MARK, unwrap

__all__ = ["BytesCodec", "Codec", "JsonCodec", "MsgpackCodec", "StrCodec", "resolve_codec"]


@runtime_checkable
class Codec(Protocol):
    """Anything with ``encode(obj) -> bytes`` and ``decode(bytes) -> obj``.

    Exceptions raised by a custom codec are wrapped in :class:`~aiodelayq.EncodeError` /
    :class:`~aiodelayq.DecodeError`.
    """

    def encode(self, obj: Any) -> bytes:
        """Return the payload bytes for ``obj``."""
        ...

    def decode(self, data: bytes) -> Any:
        """Return the item stored as ``data``."""
        ...


class JsonCodec:
    """Compact UTF-8 JSON (``json.dumps`` with no spaces); readable by Redisson's string/JSON codecs."""

    # json.dumps with options builds a new encoder per call; one shared encoder is ~3x faster.
    _encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def encode(self, obj: Any) -> bytes:
        """Encode ``obj`` as compact JSON; raises ``TypeError``/``ValueError`` for non-JSON data."""
        return self._encoder.encode(obj).encode()

    # json.loads strips whitespace around the value with two regex matches and three calls per item;
    # raw_decode alone reads a value that fills the text (every payload encode makes).
    _raw_decode = json.JSONDecoder().raw_decode

    def decode(self, data: bytes) -> Any:
        """Decode UTF-8 JSON text (RFC 8259; ``json.loads`` of bytes would guess the encoding per item).
        Raises what ``json.loads`` raises for text that is not one JSON value."""
        text = data.decode()
        try:
            value, end = self._raw_decode(text)
        except ValueError:  # whitespace first, or not JSON: json.loads decides
            return json.loads(text)
        return value if end == len(text) else json.loads(text)


class StrCodec:
    """``str`` items stored as UTF-8 text (Redisson's ``StringCodec``)."""

    def encode(self, obj: Any) -> bytes:
        """Encode a ``str`` as UTF-8; raises ``TypeError`` for anything else."""
        if not isinstance(obj, str):
            raise TypeError(f"the 'str' codec needs str items, not {type(obj).__name__}")
        return obj.encode()

    def decode(self, data: bytes) -> str:
        """Decode UTF-8 text."""
        return data.decode()


class BytesCodec:
    """Bytes stored as they are (Redisson's ``ByteArrayCodec``)."""

    def encode(self, obj: Any) -> bytes:
        """Return ``bytes(obj)`` for bytes-like items; raises ``TypeError`` for anything else."""
        if not isinstance(obj, (bytes, bytearray, memoryview)):
            raise TypeError(f"the 'bytes' codec needs bytes-like items, not {type(obj).__name__}")
        return bytes(obj)

    def decode(self, data: bytes) -> bytes:
        """Return the bytes unchanged."""
        return data


class MsgpackCodec:
    """MessagePack via the optional ``msgpack`` package (``pip install aiodelayq[msgpack]``)."""

    def __init__(self) -> None:
        try:
            msgpack = importlib.import_module("msgpack")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigurationError(
                "the 'msgpack' codec needs the msgpack package: pip install 'aiodelayq[msgpack]'"
            ) from exc
        self._msgpack: Any = msgpack

    def encode(self, obj: Any) -> bytes:
        """Pack ``obj``; raises ``TypeError`` for types msgpack cannot pack."""
        data: bytes = self._msgpack.packb(obj, use_bin_type=True)
        return data

    def decode(self, data: bytes) -> Any:
        """Unpack MessagePack bytes."""
        return self._msgpack.unpackb(data, raw=False)


_NAMED: dict[str, type[Any]] = {
    "json": JsonCodec,
    "str": StrCodec,
    "bytes": BytesCodec,
    "msgpack": MsgpackCodec,
}


def resolve_codec(codec: str | Codec) -> Codec:
    """Return a codec object for a name (``json``, ``str``, ``bytes``, ``msgpack``) or a codec object.

    Raises:
        ValueError: an unknown codec name.
        TypeError: an object without ``encode``/``decode``.
    """
    if isinstance(codec, str):
        try:
            factory = _NAMED[codec]
        except KeyError:
            raise ValueError(f"unknown codec {codec!r}; use one of {sorted(_NAMED)} or a codec object") from None
        resolved: Codec = factory()
        return resolved
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise TypeError("a codec needs encode(obj) -> bytes and decode(bytes) -> obj methods")
    return codec


def encode_item(codec: Codec, item: Any) -> bytes:
    """Encode with ``codec``, turning any failure (or a non-bytes result) into :class:`EncodeError`."""
    try:
        data = codec.encode(item)
    except Exception as exc:  # codec code is the user's: any failure is an encode failure
        raise EncodeError(f"cannot encode {type(item).__name__} item: {exc}") from exc
    if not isinstance(data, (bytes, bytearray)):
        raise EncodeError(f"codec.encode returned {type(data).__name__}, expected bytes")
    return bytes(data)


def decode_item(codec: Codec, data: bytes) -> Any:
    """Decode with ``codec``, turning any failure into :class:`DecodeError` carrying the raw bytes."""
    try:
        return codec.decode(data)
    except Exception as exc:  # codec code is the user's: any failure is a decode failure
        raise DecodeError(f"cannot decode payload of {len(data)} bytes: {exc}", data) from exc


def scanning(codec: Codec, decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``decode`` (a decoder of stored payloads), in one call per item for the JSON codec: a payload
    that is one JSON text is read by the json module's scanner directly (the codec's own path is
    three calls more per item); anything else goes to ``decode``: an envelope (its first byte,
    0xC1, is never UTF-8) or text that ``json.loads`` must judge. Other codecs: ``decode`` itself."""
    scan_all = batch_decoder(codec)
    if scan_all is None:
        return decode

    def decode_json(data: bytes) -> Any:
        try:
            return scan_all((data,))[0]
        except ValueError:  # decode() decides, and raises its errors
            return decode(data)

    return decode_json


def batch_decoder(codec: Codec) -> Callable[[Sequence[bytes]], list[Any]] | None:
    """For the JSON codec: the values of a batch of bare payloads in one call, each read by the json
    module's scanner. Raises ``ValueError`` as soon as one is not a bare payload of one JSON text (an
    envelope, or text that ``json.loads`` must judge), having had no side effect, so the caller
    decodes that batch again one item at a time. ``None`` for other codecs, whose payloads cannot
    tell an envelope from a payload without a look at each."""
    if type(codec) is not JsonCodec:
        return None
    scan = _SCAN

    def scan_all(raws: Sequence[bytes]) -> list[Any]:
        values: list[Any] = []
        append = values.append  # (a loop, not a call per item: it runs per drained item)
        try:
            for data in raws:
                text = data.decode()
                value, end = scan(text, 0)
                if end != len(text):
                    raise ValueError("not one JSON text")
                append(value)
        except (StopIteration, RecursionError) as exc:  # (the scanner's StopIteration: an empty text)
            raise ValueError("not a bare payload of one JSON text") from exc
        return values

    return scan_all


# The json module's scanner (its C one where built): (value, end) of the JSON value at an index.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_stored(codec: Codec, data: bytes) -> Any:
    """The item stored as ``data`` (a bare payload, or an item envelope); raises as :func:`decode_item`."""
    return decode_item(codec, data if data[:1] != ITEM_MARK else unwrap(data).payload)


class Headed(NamedTuple):
    """A decoded item and the headers it was offered with (an item without headers needs none of
    this: it stands as itself)."""

    value: Any
    headers: dict[str, str]
