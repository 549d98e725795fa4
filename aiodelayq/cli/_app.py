"""The ``aiodelayq`` command line (typer): the app, its ``--version``, and which module each command
lives in. Tables and results go to stdout, prompts and progress to stderr.

Every module the app imports imports typer and nothing heavy (redis-py, rich and the queue code are
imported by the commands that run), so ``aiodelayq --help`` starts fast."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from ._controls import concurrency, pause, rate_limit, resume
from ._dead_letters import list_dead_letters, purge_dead_letters, requeue_dead_letters
from ._deployment import dashboard, doctor, worker
from ._events import events
from ._help import Command, Group
from ._items import cancel, offer, peek
from ._stats import list_queues, stats, watch

__all__ = ["app"]

# The app's help is _root's docstring. Unexpected exceptions (bugs) keep Python's plain traceback.
# No rich markup: help pages are ._help's plain text, usage errors click's plain lines.
app = typer.Typer(name="aiodelayq", cls=Group, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
dead_letters_app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                               help="Read, requeue or purge a queue's dead-letter list.")
app.add_typer(dead_letters_app, name="dead-letters")

def _print_version(value: bool) -> None:
    """``--version``: eager, so it works without a command."""
    if value:
        from .. import __version__

        typer.echo(f"aiodelayq {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                help="Print the version and exit.")] = False) -> None:
    """Look at and operate aiodelayq / Redisson RDelayedQueue queues on Redis: one server, a Cluster
    (any node's URL) or a Sentinel-managed primary."""


def _add(group: typer.Typer, commands: dict[str, Callable[..., None]]) -> None:
    """Each of ``commands`` under its name, with the help pages of :class:`._help.Command`."""
    for name, command in commands.items():
        group.command(name, cls=Command)(command)


_add(app, {"stats": stats, "watch": watch, "peek": peek, "offer": offer, "cancel": cancel, "pause": pause,
           "resume": resume, "rate-limit": rate_limit, "concurrency": concurrency, "ls": list_queues,
           "doctor": doctor, "dashboard": dashboard, "worker": worker, "events": events})
_add(dead_letters_app, {"list": list_dead_letters, "requeue": requeue_dead_letters, "purge": purge_dead_letters})
