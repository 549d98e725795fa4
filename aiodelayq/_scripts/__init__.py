"""Every Lua script of the library, and their binding to one queue.

Each script is ``lua/<name>.lua``, declared once as the attribute ``<name>`` of :class:`QueueScripts`,
which binds it to a queue's client and keys (``await scripts.pop(call_id, n, lease_ms, 0)``). Its
header names its KEYS (:class:`~aiodelayq._wire.key_names.QueueKeys` attributes, in order) and the
``lua/lib/`` files it uses; see :func:`assemble`. Nothing else goes in the text: Redis runs a
script's definitions on every call.

Time inside a script is the **server** clock (``TIME``), so skewed clients agree on due times.
Element layouts, seen from Python, are in ``aiodelayq/_wire/elements.py``.

Resends (``docs/design.md``, "Connections and resends"): OFFER, RECEIVE and REMOVE_PAGE carry a call
id remembered for 60 s, POP records its items under its call id, FINISH and TRANSFER are idempotent,
SETTLE is told it is a resend and the deadline, so it can tell its own first attempt from another's.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache, cached_property
from importlib.resources import files
from typing import Any, overload

from .._redis.connections import AnyRedis, Script, run_script
from .._redis.durability import Durability, run_durable
from .._redis.retry import resend_script
from .._wire.key_names import QueueKeys

__all__ = ["PAGE_SIZE", "SCRIPTS", "BoundScript", "QueueScript", "QueueScripts", "assemble"]

# Elements one page script (CONTAINS_PAGE, READ_PAGE, REMOVE_PAGE) reads at most; a page also stops
# after PAGE_BYTES (lua/lib/walk.lua) of elements, so large payloads cannot make it long either.
PAGE_SIZE = 1000


@cache
def _lua(path: str) -> str:
    """The text of ``lua/<path>`` (``pop.lua``, ``lib/item.lua``), read once per process."""
    return (files(__name__) / "lua").joinpath(*path.split("/")).read_text(encoding="utf-8")


def _header(text: str, label: str) -> list[str] | None:
    """The words of the line ``-- <label>: words`` among ``text``'s leading comments; None without one."""
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if line.startswith(f"-- {label}:"):
            return line.split(":", 1)[1].split()
    return None


def _key_names(path: str) -> tuple[str, ...]:
    """The :class:`~aiodelayq._wire.key_names.QueueKeys` attributes of ``lua/<path>``'s KEYS, in order."""
    names = _header(_lua(path), "KEYS")
    if names is None:
        raise RuntimeError(f"lua/{path} has no '-- KEYS:' header line")
    key_names = tuple(k for k in names if k != "(none)")
    unknown = [k for k in key_names if k not in {f.name for f in fields(QueueKeys)}]
    if unknown:
        raise RuntimeError(f"lua/{path} names keys a queue does not have: {unknown}")
    return key_names


def assemble(path: str) -> str:
    """The text Redis runs for ``lua/<path>``: ``local K = {destination = KEYS[1], ...}`` from its
    ``-- KEYS:`` line, the library files its ``-- uses:`` lines reach (each once, after those it
    uses), then its own.

    Raises:
        RuntimeError: a header that names no KEYS or keys a queue does not have; library files that
            use each other in a cycle.
    """
    keys = ", ".join(f"{name} = KEYS[{i}]" for i, name in enumerate(_key_names(path), 1))
    included: dict[str, str] = {}

    def include(chain: tuple[str, ...]) -> None:
        for lib in _header(_lua(chain[-1]), "uses") or ():
            if lib in chain:
                raise RuntimeError(f"lua/{lib} uses itself: {' -> '.join((*chain, lib))}")
            if lib not in included:
                include((*chain, lib))
                included[lib] = _lua(lib)

    include((path,))
    return (f"local K = {{{keys}}}\n" if keys else "") + "".join(included.values()) + _lua(path)


class QueueScript(Script):
    """The script of ``lua/<name>.lua``: its assembled text, SHA1 and the queue keys it takes, in order.

    Read on the class it is this script; on a queue's :class:`QueueScripts`, a :class:`BoundScript`
    made on first access. Shared by every client; importing the package reads no file, and a process
    assembles only the scripts it runs.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name, lambda: assemble(f"{name}.lua"))

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if name != self.name:
            raise TypeError(f"QueueScripts.{name} must be QueueScript({name!r}), the script of lua/{name}.lua")

    @overload
    def __get__(self, scripts: None, owner: type[Any] | None = None) -> QueueScript: ...

    @overload
    def __get__(self, scripts: QueueScripts, owner: type[Any] | None = None) -> BoundScript: ...

    def __get__(self, scripts: QueueScripts | None, owner: type[Any] | None = None) -> QueueScript | BoundScript:
        if scripts is None:
            return self
        bound = scripts.__dict__[self.name] = BoundScript(scripts, self)  # read from there from now on
        return bound

    @cached_property
    def key_names(self) -> tuple[str, ...]:
        """The :class:`~aiodelayq._wire.key_names.QueueKeys` attributes of its KEYS, in order."""
        return _key_names(f"{self.name}.lua")


class BoundScript:
    """One script bound to a queue's client, keys (in the script's order), call bound and durability.

    ``await bound(*argv)`` runs it once; ``.durable`` also waits for the replicas; ``.resend`` resends
    after a transient failure (only for harmless resends). Bounded by ``timeout_s`` (default
    ``call_timeout_s``); raise as :func:`~aiodelayq._redis.connections.run_script`.
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
    """The library's scripts bound to one queue's client, keys, ``call_timeout_s`` (seconds) and
    durability; each attribute is bound when first read."""

    offer = QueueScript("offer")
    native_long = QueueScript("native_long")
    transfer = QueueScript("transfer")
    pop = QueueScript("pop")
    finish = QueueScript("finish")
    receive = QueueScript("receive")
    release_call = QueueScript("release_call")
    settle = QueueScript("settle")
    extend = QueueScript("extend")
    counts = QueueScript("counts")
    peek = QueueScript("peek")
    contains_page = QueueScript("contains_page")
    read_page = QueueScript("read_page")
    remove_page = QueueScript("remove_page")
    cancel = QueueScript("cancel")
    reschedule = QueueScript("reschedule")
    get = QueueScript("get")
    requeue = QueueScript("requeue")
    purge = QueueScript("purge")
    set_controls = QueueScript("set_controls")
    schedule = QueueScript("schedule")
    refill = QueueScript("refill")
    claim_shards = QueueScript("claim_shards")
    size = QueueScript("size")
    clear = QueueScript("clear")
    key_types = QueueScript("key_types")

    def __init__(self, client: AnyRedis, keys: QueueKeys, *, call_timeout_s: float,
                 durability: Durability | None = None) -> None:
        self.client = client
        self.keys = keys
        self.call_timeout_s = call_timeout_s
        self.durability = durability or Durability()

    def __repr__(self) -> str:
        return f"<QueueScripts {self.keys.destination!r} call_timeout_s={self.call_timeout_s:g}>"


SCRIPTS: tuple[QueueScript, ...] = tuple(v for v in vars(QueueScripts).values() if isinstance(v, QueueScript))
"""Every script, for tests and tools."""
