"""The help pages of the ``aiodelayq`` commands, written here from each parameter's declaration.

Typer's own help rendering differs between its releases (some show ``--help <bool>``), so
:class:`Command` and :class:`Group` write plain help with click's formatter from the parameter parts every
release has. It needs no rich, so ``--help`` stays fast.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from typer.core import TyperCommand, TyperGroup

__all__ = ["Command", "Group", "param_rows", "usage_pieces"]


def _takes_value(param: Any) -> bool:
    return not (getattr(param, "is_flag", False) or getattr(param, "count", False))


def _argument_label(param: Any) -> str:
    label = str(param.metavar or (param.name or "").upper())
    return label + "..." if param.nargs != 1 else label


def usage_pieces(command: Any, ctx: Any) -> list[str]:
    """The usage line after the command's name: ``[OPTIONS]``, then each argument (``NAME``,
    ``NAMES...``, ``[NAME]`` when optional)."""
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            label = _argument_label(param)
            pieces.append(label if param.required else f"[{label}]")
    return pieces


def _default_text(param: Any) -> str | None:
    default = param.default
    if (default is None or default is False or not _takes_value(param) or getattr(param, "show_default", True) is False
            or callable(default)):
        return None
    if isinstance(default, Enum):
        return str(default.value)
    if isinstance(default, (list, tuple)):
        return ", ".join(str(item) for item in default) or None
    return str(default)


def _option_label(param: Any) -> str:
    names = ", ".join(sorted(param.opts, key=lambda opt: (len(opt) > 2, opt)))
    if param.secondary_opts:
        names += " / " + ", ".join(param.secondary_opts)
    if _takes_value(param):
        names += " " + str(param.metavar or (param.name or "value").upper())
    return names


def param_rows(command: Any, ctx: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The (label, help) rows of the command's arguments and of its options (``--help`` last)."""
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        text = " ".join((getattr(param, "help", None) or "").split())
        if param.param_type_name == "argument":
            arguments.append((_argument_label(param), text))
            continue
        extra = []
        envvar = param.envvar if getattr(param, "show_envvar", True) else None
        if envvar:
            extra.append("env var: " + (envvar if isinstance(envvar, str) else ", ".join(envvar)))
        default = _default_text(param)
        if default is not None:
            extra.append(f"default: {default}")
        if param.required:
            extra.append("required")
        if extra:
            text = f"{text} [{'; '.join(extra)}]".strip()
        options.append((_option_label(param), text))
    return arguments, options


def _format_params(command: Any, ctx: Any, formatter: Any) -> None:
    arguments, options = param_rows(command, ctx)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


class Command(TyperCommand):
    """A command whose usage line and help page are written from its parameters' declarations."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """``[OPTIONS]`` and the arguments, as :func:`usage_pieces` writes them."""
        return usage_pieces(self, ctx)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Usage, description, arguments, options: plain text, the same under every typer."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        _format_params(self, ctx, formatter)
        self.format_epilog(ctx, formatter)


class Group(TyperGroup):
    """A group of commands, with its help page written as :class:`Command` writes one."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """``[OPTIONS]``, then ``COMMAND [ARGS]...``."""
        return [*usage_pieces(self, ctx), self.subcommand_metavar]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Usage, description, options, then the commands with their one-line descriptions."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        _format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)
        self.format_epilog(ctx, formatter)
