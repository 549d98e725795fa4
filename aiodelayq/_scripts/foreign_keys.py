"""Keys of a queue that hold another type than the queue keeps there: another program writes them.

``WRONGTYPE`` does not say which key; :func:`foreign_keys` reads every key's type in one call and
names the culprits, for the log and ``aiodelayq doctor``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._wire.key_names import KEY_TYPES
from ..exceptions import BackendError
from . import QueueScripts

__all__ = ["ForeignKey", "foreign_keys", "is_wrong_type", "refusal_advice"]


@dataclass(frozen=True)
class ForeignKey:
    """A key of the queue that holds another type.

    Attributes:
        key: the key's name.
        found: the type it holds (``TYPE``: ``string``, ``hash``...).
        expected: the type the queue keeps there.
    """

    key: str
    found: str
    expected: str

    @property
    def saw(self) -> str:
        """What the key holds: ``"'orders' holds a string where the queue keeps a list"``."""
        return f"{self.key!r} holds a {self.found} where the queue keeps a {self.expected}"

    @property
    def todo(self) -> str:
        """What to do about it."""
        return f"another program writes {self.key!r}: rename one of them"

    def __str__(self) -> str:
        return f"{self.saw}; {self.todo}"


def is_wrong_type(exc: BaseException) -> bool:
    """Whether ``exc`` is a call refused because a key holds another type (``WRONGTYPE``)."""
    return "WRONGTYPE" in str(exc.__cause__ or exc)


async def foreign_keys(scripts: QueueScripts) -> list[ForeignKey]:
    """The queue's keys that hold another type than the queue keeps there, in one read-only call.

    Raises:
        BackendError: the call failed.
    """
    keys = scripts.key_types.keys
    types = await scripts.key_types.resend(what=f"read the key types of {scripts.keys.destination!r}")
    expected = [KEY_TYPES[name] for name in scripts.key_types.script.key_names]
    return [ForeignKey(key, _text(found), want) for key, found, want in zip(keys, types, expected, strict=True)
            if _text(found) not in ("none", want)]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def refusal_advice(scripts: QueueScripts, exc: BaseException) -> str:
    """What to do about a call on the queue refused with ``exc``: for ``WRONGTYPE``, the keys another
    program wrote (one read); ``""`` for other errors, or when that read fails too."""
    if not is_wrong_type(exc):
        return ""
    try:
        return "; ".join(map(str, await foreign_keys(scripts)))
    except BackendError:
        return ""
