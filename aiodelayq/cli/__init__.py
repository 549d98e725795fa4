"""The ``aiodelayq`` command line, for people on call: ``stats``, ``watch``, ``peek``, ``offer``,
``cancel``, ``pause``, ``resume``, ``rate-limit``, ``ls``, ``dead-letters`` and ``worker`` (see
``docs/cli.md``).

It needs the ``cli`` extra (typer and rich), imported only when :func:`main` runs, and then only what the
command needs (``--help`` needs neither rich nor redis-py).
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["MISSING_EXTRA", "main"]

MISSING_EXTRA = "aiodelayq: the command line needs the 'cli' extra: pip install 'aiodelayq[cli]'"

# The top-level modules of the extra (click comes with typer): a missing one means "not installed",
# any other ImportError is a bug to show as such.
_EXTRA_MODULES = frozenset({"typer", "rich", "click"})


def main(argv: list[str] | None = None) -> None:
    """Run the command line (the ``aiodelayq`` console script and ``python -m aiodelayq``).

    Without the ``cli`` extra, prints one line to stderr and exits 2.
    """
    # rich is looked for now so that its absence is this one line whatever the command.
    if any(importlib.util.find_spec(name) is None for name in ("typer", "rich")):
        print(MISSING_EXTRA, file=sys.stderr)
        raise SystemExit(2)
    try:
        from ._app import app
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        print(MISSING_EXTRA, file=sys.stderr)
        raise SystemExit(2) from None
    app(args=argv, prog_name="aiodelayq")
