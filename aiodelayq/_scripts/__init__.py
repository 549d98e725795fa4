"""Every Lua script of the library, and their binding to one queue.

Each script is a file ``lua/<name>.lua`` whose header names its KEYS (``-- KEYS:`` and the
:class:`~aiodelayq._wire.key_names.QueueKeys` attributes, in order), then what each KEYS and ARGV
entry holds and what it returns. Functions several scripts share are in ``lua/lib/``, each file
starting with ``-- defines:`` and the names it defines; a script gets the library files whose names
it uses (directly or through another library file), in :data:`LIBRARY` order, and nothing else:
Redis runs a script's definitions on every call. Each file is read once per process, when its
script is first used; a :class:`QueueScript` (text + SHA1) is shared by every client, as redis-py's
``asyncio/lock.py`` registers its scripts once per class.

A queue's components call them through :class:`QueueScripts`, which binds each script to the
queue's client and keys: ``await scripts.pop(call_id, n, lease_ms, 0)``, never a positional key list.

Time inside a script is always the **server** clock (``TIME``): producers and consumers with skewed
clocks still agree on when an item is due. Elements are parsed inside Lua with the server's own
``struct`` sizes (``L`` is 8 bytes on 64-bit Linux servers, 4 on Windows builds); the same layouts,
seen from Python, are in ``aiodelayq/_wire/elements.py``.

Resends (``docs/design.md``, "Connections and resends"): the library never lets redis-py resend a
call; where it resends one itself after a lost reply, the script makes the resend harmless: OFFER,
RECEIVE and REMOVE_PAGE carry a call id remembered for 60 s, POP records its items under its call
id in the hand-off, FINISH and TRANSFER are idempotent, SETTLE is told it is a resend and the
message's deadline, so it can tell "my first attempt applied it" from "it went to someone else".
"""

from __future__ import annotations

import re
from dataclasses import fields
from functools import cache, cached_property
from importlib.resources import files
from typing import Any

from .._redis.connections import AnyRedis, Script, run_script
from .._redis.durability import Durability, run_durable
from .._redis.retry import resend_script
from .._wire.key_names import QueueKeys

__all__ = [
    "CANCEL", "CLAIM_SHARDS", "CLEAR", "CONTAINS_PAGE", "COUNTS", "EXTEND", "FINISH", "GET", "KEY_TYPES", "LIBRARY",
    "NATIVE_LONG",
    "OFFER", "PAGE_SIZE", "PEEK", "POP", "PURGE", "READ_PAGE", "RECEIVE", "REFILL", "RELEASE_CALL", "REMOVE_PAGE",
    "REQUEUE", "RESCHEDULE", "SCHEDULE", "SCRIPTS", "SETTLE", "SET_CONTROLS", "SIZE", "TRANSFER", "BoundScript",
    "QueueScript", "QueueScripts", "assemble",
]

# The shared library files, in the order a script's text includes them: a file may use the names
# of those before it.
LIBRARY = ("parse", "dead", "item", "clock", "issue", "chunked", "reversed", "lists", "calls", "index", "unindex",
           "sweep", "tiers", "transfer", "walk", "tier_walk", "messages", "controls", "recur")

# Elements one page script (CONTAINS_PAGE, READ_PAGE, REMOVE_PAGE) reads at most; a page also stops
# after PAGE_BYTES (lua/lib/walk.lua) of elements, so large payloads cannot make it long either.
PAGE_SIZE = 1000

_WORD = re.compile(r"\w+")


def _lua(*path: str) -> str:
    """The text of ``lua/<path...>``."""
    where = files(__name__) / "lua"
    for part in path:
        where = where / part
    return where.read_text(encoding="utf-8")


@cache
def _library() -> tuple[tuple[str, frozenset[str], frozenset[str], str], ...]:
    """Each library file: its name, the names it defines, the words of its code and its text."""
    out = []
    for name in LIBRARY:
        text = _lua("lib", f"{name}.lua")
        first, _, body = text.partition("\n")
        if not first.startswith("-- defines:"):
            raise RuntimeError(f"lua/lib/{name}.lua must start with '-- defines: <names>'")
        out.append((name, frozenset(first.split(":", 1)[1].split()), _words(body), body))
    return tuple(out)


def _code(lua: str) -> str:
    """``lua`` without its ``--`` comments (outside string literals): what it uses."""
    out = []
    for line in lua.splitlines():
        if "--" not in line:
            out.append(line)
            continue
        quote = None
        for i, char in enumerate(line):
            if quote:
                quote = None if char == quote and line[i - 1] != "\\" else quote
            elif char in "'\"":
                quote = char
            elif line.startswith("--", i):
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def _words(lua: str) -> frozenset[str]:
    """The words (runs of ``\\w``) of ``lua``'s code: the names it may use."""
    return frozenset(_WORD.findall(_code(lua)))


def assemble(body: str) -> str:
    """``body`` preceded by the library files its code uses (names outside comments), directly or
    through other library files, in :data:`LIBRARY` order."""
    library = _library()
    needed: set[str] = set()
    words = set(_words(body))
    changed = True
    while changed:  # a library file may use another one (index -> parse, lists)
        changed = False
        for name, defines, uses, _ in library:
            if name not in needed and not defines.isdisjoint(words):
                needed.add(name)
                words |= uses
                changed = True
    return "\n" + "".join(lua for name, _, _, lua in library if name in needed) + body


class QueueScript(Script):
    """A script of ``lua/<name>.lua``: its assembled text, SHA1 and the queue keys it takes, in order.

    Each is made on first use, once per process: the file is read with the first of them (a queue's
    :class:`QueueScripts` asks for the key names), the text is assembled and hashed with the first
    call. Importing the package reads no file, and a process assembles only the scripts it runs.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name, lambda: assemble(self._body))

    @cached_property
    def _body(self) -> str:
        return _lua(f"{self.name}.lua")

    @cached_property
    def key_names(self) -> tuple[str, ...]:
        """The :class:`~aiodelayq._wire.key_names.QueueKeys` attributes of its KEYS, in order."""
        match = re.search(r"^-- KEYS: *(.*)$", self._body, re.M)
        if match is None:
            raise RuntimeError(f"lua/{self.name}.lua has no '-- KEYS:' header line")
        key_names = tuple(k for k in match.group(1).split() if k != "(none)")
        unknown = [k for k in key_names if k not in {f.name for f in fields(QueueKeys)}]
        if unknown:
            raise RuntimeError(f"lua/{self.name}.lua names keys a queue does not have: {unknown}")
        return key_names


OFFER = QueueScript("offer")
NATIVE_LONG = QueueScript("native_long")
TRANSFER = QueueScript("transfer")
POP = QueueScript("pop")
FINISH = QueueScript("finish")
RECEIVE = QueueScript("receive")
RELEASE_CALL = QueueScript("release_call")
SETTLE = QueueScript("settle")
EXTEND = QueueScript("extend")
COUNTS = QueueScript("counts")
PEEK = QueueScript("peek")
CONTAINS_PAGE = QueueScript("contains_page")
READ_PAGE = QueueScript("read_page")
REMOVE_PAGE = QueueScript("remove_page")
CANCEL = QueueScript("cancel")
RESCHEDULE = QueueScript("reschedule")
GET = QueueScript("get")
REQUEUE = QueueScript("requeue")
PURGE = QueueScript("purge")
SET_CONTROLS = QueueScript("set_controls")
SCHEDULE = QueueScript("schedule")
REFILL = QueueScript("refill")
CLAIM_SHARDS = QueueScript("claim_shards")
SIZE = QueueScript("size")
CLEAR = QueueScript("clear")
KEY_TYPES = QueueScript("key_types")

SCRIPTS: tuple[QueueScript, ...] = (OFFER, NATIVE_LONG, TRANSFER, POP, FINISH, RECEIVE, RELEASE_CALL, SETTLE, EXTEND,
                                    COUNTS, PEEK, CONTAINS_PAGE, READ_PAGE, REMOVE_PAGE, CANCEL, RESCHEDULE, GET,
                                    REQUEUE, PURGE, SET_CONTROLS, SCHEDULE, REFILL, CLAIM_SHARDS, SIZE, CLEAR,
                                    KEY_TYPES)
"""Every script, for tests and tools (the Lua lint assembles each)."""


class BoundScript:
    """One script bound to a queue's client, keys (in the script's order), call bound and durability.

    ``await bound(*argv)`` runs it once; ``bound.durable(*argv)`` also waits for the queue's replicas
    (when it asks for any); ``bound.resend(*argv)`` resends it after a transient failure, for a
    script whose resend is harmless (read-only, idempotent, or carrying a call id). Each is bounded by
    ``timeout_s`` (default: the queue's ``call_timeout_s``) and raises as
    :func:`~aiodelayq._redis.connections.run_script`; ``what`` names the call in errors.
    """

    __slots__ = ("_client", "_durability", "_timeout_s", "_what", "keys", "script")

    def __init__(self, scripts: QueueScripts, script: QueueScript) -> None:
        self.script = script
        self.keys = tuple(getattr(scripts.keys, name) for name in script.key_names)
        self._client = scripts.client
        self._timeout_s = scripts.call_timeout_s
        self._durability = scripts.durability
        self._what = f"{script.name} on {scripts.keys.destination!r}"

    def __repr__(self) -> str:
        return f"<BoundScript {self._what}>"

    async def __call__(self, *argv: Any, timeout_s: float | None = None, what: str | None = None) -> Any:
        return await run_script(self._client, self.script, self.keys, argv,
                                timeout_s=self._timeout_s if timeout_s is None else timeout_s, what=what or self._what)

    async def durable(self, *argv: Any, timeout_s: float | None = None, what: str | None = None) -> Any:
        """Run once, confirmed by the queue's durability (:func:`~aiodelayq._redis.durability.run_durable`)."""
        return await run_durable(self._client, self.script, self.keys, argv, durability=self._durability,
                                 timeout_s=self._timeout_s if timeout_s is None else timeout_s,
                                 what=what or self._what)

    async def resend(self, *argv: Any, timeout_s: float | None = None, what: str | None = None,
                     durable: bool = False) -> Any:
        """Run, resent with the same ``argv`` after a transient failure within ``timeout_s`` (with
        ``durable``: confirmed by the queue's durability)."""
        return await resend_script(self._client, self.script, self.keys, argv,
                                   timeout_s=self._timeout_s if timeout_s is None else timeout_s,
                                   what=what or self._what, durability=self._durability if durable else None)


class QueueScripts:
    """The library's scripts bound to one queue: its client, keys, call bound (``call_timeout_s``,
    seconds) and durability, the four things every component that talks to Redis needs."""

    def __init__(self, client: AnyRedis, keys: QueueKeys, *, call_timeout_s: float,
                 durability: Durability | None = None) -> None:
        self.client = client
        self.keys = keys
        self.call_timeout_s = call_timeout_s
        self.durability = durability or Durability()
        self.offer = BoundScript(self, OFFER)
        self.native_long = BoundScript(self, NATIVE_LONG)
        self.transfer = BoundScript(self, TRANSFER)
        self.pop = BoundScript(self, POP)
        self.finish = BoundScript(self, FINISH)
        self.receive = BoundScript(self, RECEIVE)
        self.release_call = BoundScript(self, RELEASE_CALL)
        self.settle = BoundScript(self, SETTLE)
        self.extend = BoundScript(self, EXTEND)
        self.counts = BoundScript(self, COUNTS)
        self.peek = BoundScript(self, PEEK)
        self.contains_page = BoundScript(self, CONTAINS_PAGE)
        self.read_page = BoundScript(self, READ_PAGE)
        self.remove_page = BoundScript(self, REMOVE_PAGE)
        self.cancel = BoundScript(self, CANCEL)
        self.reschedule = BoundScript(self, RESCHEDULE)
        self.get = BoundScript(self, GET)
        self.requeue = BoundScript(self, REQUEUE)
        self.purge = BoundScript(self, PURGE)
        self.set_controls = BoundScript(self, SET_CONTROLS)
        self.schedule = BoundScript(self, SCHEDULE)
        self.refill = BoundScript(self, REFILL)
        self.claim_shards = BoundScript(self, CLAIM_SHARDS)
        self.size = BoundScript(self, SIZE)
        self.clear = BoundScript(self, CLEAR)
        self.key_types = BoundScript(self, KEY_TYPES)

    def __repr__(self) -> str:
        return f"<QueueScripts {self.keys.destination!r} call_timeout_s={self.call_timeout_s:g}>"
