"""The docs site (docs/, mkdocs.yml): every Python block on a page is either a fragment or run here,
the programs print what their pages say they print, and the site builds with ``mkdocs build --strict``.

The convention, stated on docs/index.md: a ```python block whose first line is a ``# fragment`` comment
is part of a program and is not run as it stands (a few are run below anyway, with the names their
page gives them). Every other ```python block is a complete program, listed in ``EXECUTED`` with how
it is run: against a private throwaway server (``REDIS_URL``), its output compared with the page's next
```text block; as a script that needs no server; or as a copy of a file in docs/examples/ that
tests/test_web.py runs. Blocks in other languages (shell, Java, text) need no marking.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import importlib.util
import inspect
import io
import os
import re
import subprocess
import sys
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import aiodelayq.exceptions
from aiodelayq import DelayedQueue
from aiodelayq._wire.elements import DeadReason
from aiodelayq.testing import find_server_kinds
from tests.faults import REPO_ROOT

# Run with the first server kind only: the docs' examples and links; the calls they make run on every
# server kind in their own modules.
pytestmark = pytest.mark.once

DOCS = REPO_ROOT / "docs"
FRAGMENT = "# fragment"
PYTHON = {"python", "py", "python3"}
UNCLEAN = ("Traceback", "Task was destroyed", "Unclosed", "never awaited")

# How each kind of program is run.
SERVER = "program: run against a private server, prints the page's next ```text block"
NO_SERVER = "program: needs no server (builds objects only), runs cleanly"
QUICKSTART = "the quick start's orders.py and the script that runs it on a throwaway server"
ORDERS_HEAD = '"""Cancel unpaid orders 30 minutes after they are placed (here: 2 seconds)."""'

# Every Python block on a page that is not a fragment, by (page, first line): how it is run. A block
# given here must exist, once; a new complete program on a page must be added here.
EXECUTED: dict[tuple[str, str], str] = {
    ("quickstart.md", ORDERS_HEAD): QUICKSTART,
    ("quickstart.md", "import asyncio"): QUICKSTART,
    ("quickstart.md", "import logging"): NO_SERVER,
    ("web.md", "from aiodelayq import Queues"): NO_SERVER,
    ("web.md", "import os"): "docs/examples/fastapi_minimal.py",
    ("deployments.md", "from redis.asyncio import Redis"): NO_SERVER,
    ("keys.md", '"""One cancellation per order: scheduled once, cancelled when paid, pushed back, replaced."""'):
        SERVER,
    ("reliable.md", '"""Send e-mails at least once: ack what was sent, retry what failed, dead-letter what keeps '
                    'failing."""'): SERVER,
    ("controls.md", '"""Pause a queue\'s consumers while the mail service is down, then send at most 2 mails a '
                     'second."""'): SERVER,
    ("java.md", '"""What a Redisson client sees of the three element kinds aiodelayq can write."""'): SERVER,
    ("errors.md", '"""What aiodelayq raises for bad input, a queue used before it was opened, and a server it '
                  'cannot reach."""'): SERVER,
}


# Pages whose program's output interleaves independent subjects by timers (the page says so): their
# lines are compared per subject (the text before the first ": "), not as one sequence.
INTERLEAVED = {"reliable.md"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str

    @property
    def fragment(self) -> bool:
        return self.code.startswith(FRAGMENT)

    @property
    def head(self) -> str:
        """The first line of code (after the fragment marker, if any)."""
        lines = self.code.splitlines()[1 if self.fragment else 0:]
        return lines[0] if lines else ""

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line}"


_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def page_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page (indented ones too, without their indent)."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i].rstrip("\n"))
        if m is None:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        info = m["info"].strip().lstrip("{.").rstrip("}").split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and not lines[j].strip().strip(fence[0])):
            body.append(re.sub(rf"^[ \t]{{0,{indent}}}", "", lines[j]))
            j += 1
        assert j < len(lines), f"docs/{page.name}:{i + 1}: a code block that is never closed"
        found.append(Block(page.name, i + 1, info[0].lower() if info else "", "".join(body)))
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in sorted(DOCS.glob("*.md")) for b in page_blocks(page)]


def block(page: str, head: str) -> Block:
    [found] = [b for b in all_blocks() if b.page == page and b.head == head]
    return found


def output_after(program: Block) -> str:
    """The page's first ```text block after ``program`` (its output, as the page shows it)."""
    later = [b for b in page_blocks(DOCS / program.page) if b.line > program.line]
    for b in later:
        if b.lang in PYTHON:
            break
        if b.lang == "text":
            return b.code
    raise AssertionError(f"{program}: no ```text block with its output follows it")


def run_program(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = cwd / "program.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "always::ResourceWarning", **env})
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert not [w for w in UNCLEAN if w in result.stderr], result.stderr
    return result


async def exec_fragment(code: str, names: dict[str, Any]) -> list[str]:
    """Run a fragment (top-level ``await`` allowed) with the names its page gives it; its printed lines."""
    compiled = compile(code, "<docs fragment>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = eval(compiled, names)
        if inspect.iscoroutine(result):
            await result
    return out.getvalue().splitlines()


# -- every block is accounted for --------------------------------------------------------------------


def test_every_python_block_is_a_fragment_or_executed() -> None:
    python = [b for b in all_blocks() if b.lang in PYTHON]
    assert python, "no ```python block found in docs/*.md"
    unmarked = [b for b in python if not b.fragment and (b.page, b.head) not in EXECUTED]
    assert not unmarked, (
        "complete programs not run by tests/test_docs.py: add them to EXECUTED, or start each block with a "
        f"'{FRAGMENT}' line: " + ", ".join(f"{b} ({b.head!r})" for b in unmarked))
    for (page, head), how in EXECUTED.items():
        matches = [b for b in python if b.page == page and b.head == head]
        assert len(matches) == 1, f"EXECUTED names docs/{page} {head!r} ({how}): found {len(matches)} blocks"
        assert not matches[0].fragment, f"{matches[0]} is marked as a fragment but listed in EXECUTED"


# -- the programs run ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [k for k, how in EXECUTED.items() if how == SERVER], ids=lambda k: k[0])
def test_programs_print_what_their_page_shows(key: tuple[str, str], own_server: Any, tmp_path: Path) -> None:
    program = block(*key)
    result = run_program(program.code, tmp_path, REDIS_URL=own_server().url)
    expected = output_after(program)
    if program.page in INTERLEAVED:
        # Each subject's lines in the page's order and the same lines overall: which subject's retry
        # comes first is up to timers (on a loaded machine three 0.05 s retries can run past one 0.5 s).
        assert by_subject(result.stdout) == by_subject(expected), f"{program} printed:\n{result.stdout}"
        assert sorted(result.stdout.splitlines()) == sorted(expected.splitlines()), (
            f"{program} printed:\n{result.stdout}")
    else:
        assert result.stdout == expected, f"{program} printed:\n{result.stdout}"


def by_subject(text: str) -> dict[str, list[str]]:
    """The lines of ``text`` grouped by what comes before their first ``": "``, each group in order."""
    groups: dict[str, list[str]] = {}
    for line in text.splitlines():
        groups.setdefault(line.partition(": ")[0], []).append(line)
    return groups


@pytest.mark.parametrize("key", [k for k, how in EXECUTED.items() if how == NO_SERVER], ids=lambda k: k[0])
def test_programs_that_need_no_server_run(key: tuple[str, str], tmp_path: Path) -> None:
    run_program(block(*key).code, tmp_path)


def test_the_quickstart_program_runs_on_a_throwaway_server(redis_server: Any, tmp_path: Path) -> None:
    # The program starts a ThrowawayServer of its own: like the other tests that start servers, it skips
    # when the session's server is not a process of this machine's (REDIS_URL, a container).
    if redis_server.kind is None or not find_server_kinds():
        pytest.skip("the quick start starts a server process (REDIS_URL or a container given, or no binary)")
    (tmp_path / "orders.py").write_text(block("quickstart.md", ORDERS_HEAD).code, encoding="utf-8")
    lines = run_program(block("quickstart.md", "import asyncio").code, tmp_path).stdout.splitlines()
    assert [line.split(";")[0] for line in lines[:3]] == [f"order {i} placed" for i in (1, 2, 3)], lines
    # Orders 2 and 3 may be due in the same millisecond: ties come out in no particular order.
    assert sorted(lines[3:]) == ["order 1 unpaid: cancelled", "order 2 was paid: nothing to do",
                                 "order 3 unpaid: cancelled"], lines


def test_blocks_that_copy_an_example_file_are_that_file() -> None:
    for (page, head), how in EXECUTED.items():
        if how.startswith("docs/examples/"):
            assert block(page, head).code == (REPO_ROOT / how).read_text(encoding="utf-8"), \
                f"docs/{page}: the block starting {head!r} differs from {how} (tests/test_web.py runs the file)"


async def test_quickstart_fragments_do_what_they_say(own_server: Any, make_client: Any) -> None:
    redis = make_client(own_server())
    names = {"redis": redis, "DelayedQueue": DelayedQueue}
    opening = block("quickstart.md", 'queue = DelayedQueue(redis, "orders:cancel-unpaid")')
    assert await exec_fragment(opening.code, dict(names)) == []
    polling = block("quickstart.md", 'async with DelayedQueue(redis, "reminders", codec="str") as queue:')
    assert await exec_fragment(polling.code, dict(names)) == ["None", "ping", "None"]
    cancelling = block("quickstart.md", 'await queue.offer("late", 1.0)')
    async with DelayedQueue(redis, "reminders", codec="str") as queue:
        printed = await exec_fragment(cancelling.code, {"queue": queue, "asyncio": asyncio})
    assert printed == ["nothing within 0.3 s", "late"]


# -- the errors page ---------------------------------------------------------------------------------


def test_the_errors_page_tree_is_the_exception_tree() -> None:
    [tree] = [b.code for b in page_blocks(DOCS / "errors.md") if b.lang == "text" and
              b.code.startswith("DelayedQueueError")]
    names: list[str] = []
    stack: list[str] = []
    for line in tree.splitlines():
        m = re.match(r"(?P<lead>[│├└─ ]*)(?P<name>\w+)(?P<rest>.*)", line)
        assert m is not None, line
        depth = len(m["lead"]) // 4
        name = m["name"]
        stack[depth:] = [name]
        extra = re.match(r"\s+\((\w+)\)", m["rest"])
        cls = getattr(aiodelayq.exceptions, name)
        parent = getattr(aiodelayq.exceptions, stack[depth - 1]) if depth else Exception
        expected = (parent, getattr(builtins, extra[1])) if extra else (parent,)
        assert cls.__bases__ == expected, f"docs/errors.md: {name}'s bases are {cls.__bases__}, not {expected}"
        names.append(name)
    assert sorted(names) == sorted(aiodelayq.exceptions.__all__)


# -- the dead-letter reasons -------------------------------------------------------------------------


def test_the_dead_letter_reasons_the_docs_name_are_the_codes() -> None:
    reasons = set(typing.get_args(DeadReason))
    table = re.findall(r"^\| `(\w+)` \|", (DOCS / "reliable.md").read_text(encoding="utf-8").split(
        "| reason | how it got there |")[1].split("\n\n")[0], flags=re.M)
    assert sorted(table) == sorted(reasons), "docs/reliable.md's table of dead-letter reasons"
    cli = (DOCS / "cli.md").read_text(encoding="utf-8").split("## `dead-letters list NAME")[1].split("```")[0]
    assert set(re.findall(r"`(\w+)`", cli)) & {"unknown", *reasons} == reasons, "docs/cli.md, dead-letters list"


# -- module paths named in prose exist ---------------------------------------------------------------

PACKAGE = REPO_ROOT / "aiodelayq"
# A private module path named in prose, slashed (`_wire/elements.py`, `_scripts/lua/`,
# `aiodelayq/_util/tasks.TaskOwner`) or dotted (`_wire.elements`, `_util.observe.transfer_limit`,
# `aiodelayq._queue`): it starts with `_` and a lowercase letter, like the package's private modules,
# and with nothing before it that makes it an attribute or part of a longer path (`self._pending.peek`,
# `tests/_x`). A bare name (`_pending`) may as well be an attribute: not checked.
_SLASHED = re.compile(r"(?<![\w./-])(?:aiodelayq/)?(_[a-z][a-z0-9_]*/[\w./]*[\w/])")
_DOTTED = re.compile(r"(?<![\w./-])(?:aiodelayq\.)?(_[a-z][a-z0-9_]*(?:\.[A-Za-z_]\w*)+)")


def _prose() -> list[tuple[str, str]]:
    """(where, text) of every page (docs/*.md, README.md), and of the comments and docstrings of
    every module of the package (and the comments of its Lua)."""
    found = [(page.name if page.parent == REPO_ROOT else f"docs/{page.name}", page.read_text(encoding="utf-8"))
             for page in [*sorted(DOCS.glob("*.md")), REPO_ROOT / "README.md"]]
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        parts = [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                 if token.type == tokenize.COMMENT]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                parts.append(ast.get_docstring(node, clean=False) or "")
        found.append((str(path.relative_to(REPO_ROOT)), "\n".join(parts)))
    for path in sorted(PACKAGE.rglob("*.lua")):
        comments = [line.split("--", 1)[1] for line in path.read_text(encoding="utf-8").splitlines() if "--" in line]
        found.append((str(path.relative_to(REPO_ROOT)), "\n".join(comments)))
    return found


def _dotted_exists(dotted: str) -> bool:
    """Whether ``dotted`` (after ``aiodelayq.``) names a module of the package, or an attribute of
    one (``_util.tasks.TaskOwner``); ``_options.py``: a file."""
    if dotted.endswith((".py", ".lua")):
        stem, suffix = dotted.rsplit(".", 1)
        return (PACKAGE / f"{stem.replace('.', '/')}.{suffix}").is_file()
    parts = dotted.split(".")
    obj: Any = None
    where = PACKAGE
    for index, part in enumerate(parts):
        if obj is None or inspect.ismodule(obj):
            if (where / f"{part}.py").is_file() or (where / part / "__init__.py").is_file():
                obj = importlib.import_module("aiodelayq." + ".".join(parts[:index + 1]))
                where = where / part
                continue
            if obj is None:
                return False  # not one of the package's modules
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _slashed_exists(path: str) -> bool:
    """Whether ``path`` (after ``aiodelayq/``) is a file or folder of the package, a module named
    without its ``.py``, or a module then an attribute of it (``_util/tasks.TaskOwner``)."""
    target = PACKAGE / path.rstrip("/")
    if target.exists() or target.with_name(f"{target.name}.py").is_file():
        return True
    folder, _, last = path.rpartition("/")
    module, dot, attribute = last.partition(".")
    return bool(dot) and (PACKAGE / folder / f"{module}.py").is_file() and _dotted_exists(
        f"{folder.replace('/', '.')}.{module}.{attribute}")


def test_every_module_path_named_in_the_docs_and_the_code_exists() -> None:
    missing = []
    for where, text in _prose():
        missing += [f"{where}: {m[1]}" for m in _SLASHED.finditer(text) if not _slashed_exists(m[1])]
        missing += [f"{where}: {m[1]}" for m in _DOTTED.finditer(text) if not _dotted_exists(m[1])]
    assert not missing, ("module paths (or their attributes) that do not exist, named in docs or in comments and "
                         "docstrings: " + "; ".join(missing))


def test_the_module_path_matcher_tells_paths_from_attributes() -> None:
    text = ("see `_wire/elements.py`, _scripts/lua/lib/, `_util/tasks.TaskOwner`, ``_wire.elements.wrap``, "
            "aiodelayq._util.observe.install(sink), and `_observe.install`, _wire/envelope.py, _scripts/take; "
            "not self._pending.peek(), q._life.state, tests/_x/y.py, 2_000.5, `_pending`")
    slashed = [m[1] for m in _SLASHED.finditer(text)]
    dotted = [m[1] for m in _DOTTED.finditer(text)]
    assert slashed == ["_wire/elements.py", "_scripts/lua/lib/", "_util/tasks.TaskOwner", "_wire/envelope.py",
                       "_scripts/take"]
    assert dotted == ["_wire.elements.wrap", "_util.observe.install", "_observe.install"]
    assert [_slashed_exists(path) for path in slashed] == [True, True, True, False, False]
    assert [_dotted_exists(name) for name in dotted] == [True, True, False]


# -- the site builds -----------------------------------------------------------------------------------


def test_the_site_builds_with_mkdocs_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' (or python3 noxfile.py -s docs)")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO_ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    for page in sorted(DOCS.glob("*.md")):
        html = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert html.is_file(), f"docs/{page.name} was not built"
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("DelayedQueue.offer", "DelayedQueue.receive", "Queues.lifespan", "Message.ack",
                 "exceptions.BackendError", "run_worker", "QueueMetrics", "ThrowawayServer"):
        assert name in api, f"the API page has no {name}"
    # The examples are copied as files (the pages link to them), not rendered as pages.
    for example in sorted((DOCS / "examples").glob("*.py")):
        assert (site / "examples" / example.name).read_bytes() == example.read_bytes()
