"""Every Lua script of the library, by concern: ``prelude`` (shared Lua functions), ``producer``
(OFFER, NATIVE_LONG), ``transfer`` (TRANSFER), ``take`` (POP, FINISH), ``reliable`` (RECEIVE,
RELEASE_CALL, SETTLE) and ``pending`` (the paged walks).

Each script is a module constant whose header names its KEYS, ARGV and reply, wrapped in a
:class:`~aiodelayq._redis.connections.Script` (text + SHA1, made once per process and shared by every
client) and run with :func:`~aiodelayq._redis.connections.run_script`, as redis-py's ``asyncio/lock.py``
registers its scripts once per class.

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
