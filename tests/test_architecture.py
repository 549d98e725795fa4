"""The shape of the package, checked on its source: imports flow down the layers, no import cycles, a
thin facade, Lua and byte layouts each in one place (docs/design.md, "Map")."""

from __future__ import annotations

import ast
import importlib
import itertools
import re
import subprocess
import sys
from pathlib import Path

import aiodelayq
from aiodelayq._scripts import SCRIPTS, _header

PACKAGE = Path(__file__).resolve().parents[1] / "aiodelayq"
LUA = PACKAGE / "_scripts" / "lua"
# A Lua token: a comment, a string, '..', a name (with the '.' or ':' of a field before it), a number.
_LUA_TOKEN = re.compile(r"""--[^\n]*|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"|\.\.|[.:]?[A-Za-z_]\w*|\d\w*""")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports anywhere: top level, under ``TYPE_CHECKING``, in functions."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # A package's __init__ re-exports its children; the children must not import it back.
    cycles = []
    for start in graph:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join([*trail, nxt]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


# The layers, bottom first: a module imports only from its own layer or those below it.
LAYERS: list[tuple[str, ...]] = [
    ("aiodelayq.exceptions",),
    ("aiodelayq._util",),
    ("aiodelayq._wire",),
    ("aiodelayq._redis",),
    ("aiodelayq._scripts",),
    ("aiodelayq._options",),
    ("aiodelayq._recurring",),
    ("aiodelayq._producing", "aiodelayq._consuming", "aiodelayq._contents"),
    ("aiodelayq._runtime",),
    ("aiodelayq._parts",),
    ("aiodelayq._sharding",),
    ("aiodelayq._queue", "aiodelayq._queue_consuming", "aiodelayq._queue_contents", "aiodelayq._queue_controls"),
    ("aiodelayq._admin",),
    ("aiodelayq.dashboard",),
    ("aiodelayq", "aiodelayq._web", "aiodelayq.worker", "aiodelayq.prometheus", "aiodelayq.cli",
     "aiodelayq.demo", "aiodelayq.testing", "aiodelayq.__main__"),
]


def _layer(module: str) -> int:
    best, index = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    assert index >= 0, f"{module} is in no layer: add it to LAYERS"
    return index


def test_imports_flow_down_the_layers() -> None:
    modules = _modules()
    upward = sorted(f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
                    for name, path in modules.items() for target in _imports(name, path, modules)
                    if _layer(target) > _layer(name))
    assert upward == [], "imports against the layers:\n" + "\n".join(upward)
    # Producing and consuming sit side by side: neither imports the other.
    across = sorted(f"{name} imports {target}" for name, path in modules.items()
                    for target in _imports(name, path, modules)
                    if {_subpackage(name), _subpackage(target)} == {"_producing", "_consuming"})
    assert across == [], "producing and consuming import each other:\n" + "\n".join(across)
    # The dashboard and the command line share what sits below both (_admin): the dashboard imports
    # nothing of the command line, which serves the dashboard from one command.
    of_cli = sorted(f"{name} imports {target}" for name, path in modules.items()
                    if _subpackage(name) == "dashboard" for target in _imports(name, path, modules)
                    if _subpackage(target) == "cli")
    assert of_cli == [], "the dashboard imports the command line:\n" + "\n".join(of_cli)


def _subpackage(module: str) -> str:
    """``_producing`` of ``aiodelayq._producing.keyed``; ``""`` for ``aiodelayq`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_facade_stays_thin() -> None:
    # The facade grows by one delegating method (with its docstring, which the API reference is
    # made of) per public call: every method body stays a delegation.
    fat = {}
    for node in (node for name in ("_queue.py", "_queue_consuming.py", "_queue_contents.py")
                 for node in ast.walk(ast.parse((PACKAGE / name).read_text()))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "__init__":  # it assembles
            body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            if len(body) > 4:
                fat[node.name] = len(body)
    assert fat == {}, f"facade methods doing more than delegating: {fat}"


def test_no_two_modules_differ_by_one_letter() -> None:
    names = sorted({path.stem.lstrip("_") for path in PACKAGE.rglob("*.py") if path.stem != "__init__"}
                   | {path.name.lstrip("_") for path in PACKAGE.iterdir() if path.is_dir() and
                      (path / "__init__.py").exists()})
    close = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if _one_letter_apart(a, b)]
    assert close == []


def _one_letter_apart(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def test_lua_lives_in_lua_files_with_headers_and_byte_layouts_in_elements() -> None:
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        relative = path.relative_to(PACKAGE).as_posix()
        assert "redis.call(" not in text, f"Lua in a Python file: {relative}"
        if relative != "_wire/elements.py":
            assert "import struct" not in text, f"a byte layout outside aiodelayq/_wire/elements.py: {relative}"
    scripts = sorted((PACKAGE / "_scripts" / "lua").glob("*.lua"))
    assert scripts
    for path in scripts:
        head = [line for line in path.read_text().splitlines() if line.startswith("--")]
        name = path.stem.upper()
        assert head[0].startswith(f"-- {name}: "), f"{path.name}: first line '-- {name}: what it does'"
        for part in ("-- KEYS:", "-- ARGV", "-- returns"):
            assert any(line.startswith(part) for line in head), f"{path.name}: no '{part}' header line"


def _lua_names(path: Path) -> set[str]:
    """The names a Lua file's code reads or defines: outside comments and strings, no field names."""
    return {token for token in _LUA_TOKEN.findall(path.read_text()) if token[0].isalpha() or token[0] == "_"}


def test_each_script_is_declared_and_each_lua_file_names_the_library_files_it_uses() -> None:
    # A script's text is the library files its '-- uses:' line names (and theirs): a name used
    # without its file would be a nil global at run time, on whichever path reaches it.
    assert sorted(script.name for script in SCRIPTS) == sorted(path.stem for path in LUA.glob("*.lua"))
    defines = {f"lib/{path.name}": set(_header(path.read_text(), "defines") or ())
               for path in sorted((LUA / "lib").glob("*.lua"))}
    assert all(defines.values()), "a library file starts with '-- defines: <names>'"
    for path in sorted(LUA.rglob("*.lua")):
        relative = path.relative_to(LUA).as_posix()
        names = _lua_names(path)
        used = sorted(lib for lib, defined in defines.items() if lib != relative and defined & names)
        assert sorted(_header(path.read_text(), "uses") or ()) == used, f"{relative}: '-- uses: {' '.join(used)}'"
    for script in SCRIPTS:
        assert script.text  # assembles: every file it uses exists, and none uses itself


def _keys_read(tokens: list[str]) -> set[str]:
    """The keys Lua tokens read from the table of keys by name: ``K.timeout_set`` -> ``timeout_set``."""
    return {field[1:] for name, field in itertools.pairwise(tokens) if name == "K" and field.startswith(".")}


def test_each_script_reads_its_keys_by_the_names_its_header_gives() -> None:
    # The loader makes a script's KEYS line the table K (K.timeout_set is KEYS[i] of that line), which
    # the script hands to the library functions: a name the line lacks would be nil at run time, on
    # whichever path reaches it. So no file indexes KEYS, and every K.<name> that a script, or a
    # library function it calls (directly or not), reads is on its KEYS line.
    functions: dict[str, tuple[set[str], set[str]]] = {}  # library function -> its keys read, its names
    for path in sorted((LUA / "lib").glob("*.lua")):
        for name, body in re.findall(r"^local function (\w+)(.*?)(?=^local function |\Z)", path.read_text(),
                                     re.M | re.S):
            tokens = _LUA_TOKEN.findall(body)
            functions[name] = (_keys_read(tokens), {t for t in tokens if t[0].isalpha() or t[0] == "_"})
    for path in sorted(LUA.rglob("*.lua")):
        code = _LUA_TOKEN.sub(lambda token: "" if token.group().startswith("--") else token.group(), path.read_text())
        assert not re.search(r"\bKEYS\s*\[", code), f"{path.relative_to(LUA)}: KEYS[i] instead of K.<name>"
    for script in SCRIPTS:
        tokens = _LUA_TOKEN.findall((LUA / f"{script.name}.lua").read_text())
        read, calls, seen = _keys_read(tokens), [t for t in tokens if t in functions], set()
        while calls:
            function = calls.pop()
            if function not in seen:
                seen.add(function)
                read |= functions[function][0]
                calls += functions[function][1] & functions.keys()
        lacking = read - set(script.key_names)
        assert not lacking, f"{script.name}.lua reads keys its KEYS line lacks: {sorted(lacking)}"


def test_the_package_names_load_on_first_access() -> None:
    # aiodelayq/__init__.py imports the exceptions; every other public name is imported under
    # TYPE_CHECKING (what mypy sees) and, at run time, from the module _LAZY gives on first access.
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    eager: set[str] = set()
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "exceptions":
            eager.update(alias.name for alias in node.names)
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            typed.update({alias.name: f".{imp.module}" for imp in node.body if isinstance(imp, ast.ImportFrom)
                          for alias in imp.names})
    assert typed == aiodelayq._LAZY
    assert sorted(aiodelayq.__all__) == sorted(eager | set(typed))
    for name in aiodelayq.__all__:
        module = importlib.import_module(typed.get(name, ".exceptions"), "aiodelayq")
        assert getattr(aiodelayq, name) is getattr(module, name), name
    assert set(aiodelayq.__all__) <= set(dir(aiodelayq))


def test_import_aiodelayq_loads_neither_redis_nor_asyncio(tmp_path: Path) -> None:
    # What `import aiodelayq` (and with it the command line's --help) loads: the exceptions only.
    code = ("import sys, aiodelayq; print(*sorted(m for m in sys.modules "
            "if m.partition('.')[0] in ('aiodelayq', 'redis', 'asyncio', 'anyio')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=tmp_path, timeout=60).stdout.split()
    assert loaded == ["aiodelayq", "aiodelayq.exceptions"]


def test_every_module_imports_on_this_python() -> None:
    # The runs on other Pythons cover the modules whose asyncio behaviour differs between versions;
    # this covers the rest at import: syntax, and what a module uses of the standard library and of
    # its extras at its top level (an extra the test environment lacks skips only that module).
    missing: list[str] = []
    for name in _modules():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] == "aiodelayq":
                raise
            missing.append(f"{name} ({exc.name})")
    assert len(missing) < len(_modules()) / 4, missing


_LOG_METHODS = ("debug", "info", "warning", "error", "exception", "critical", "log")


def test_log_messages_leave_the_logger_name_to_the_format() -> None:
    # The library logs to the "aiodelayq" logger: a format with %(name)s says so once, and a message
    # that said it again read "aiodelayq: aiodelayq: ...".
    prefixed = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _LOG_METHODS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "log"):
                continue
            args = node.args[1:] if node.func.attr == "log" else node.args
            message = args[0] if args else None
            first = message.values[0] if isinstance(message, ast.JoinedStr) and message.values else message
            if isinstance(first, ast.Constant) and str(first.value).lower().startswith("aiodelayq"):
                prefixed.append(f"{name}:{node.lineno}")
    assert prefixed == []


# Sizes that creep back unseen: each limit is one a reader can still take in (KB = 1,000 bytes).
REPO = PACKAGE.parent
SIZE_LIMITS = {"README.md": 12_000, "benchmarks/README.md": 15_000, "docs/design.md": 40_000}
BENCHMARK_LINES = 3_750


def test_the_long_pages_stay_within_their_limits() -> None:
    # README: what aiodelayq is and how to start; the benchmarks' README: the method and the checks
    # (figures go to the results files); the design page: the architecture and its reasons (its
    # measurements belong to benchmarks/).
    over = {page: size for page, limit in SIZE_LIMITS.items()
            if (size := len((REPO / page).read_bytes())) > limit}
    assert over == {}, f"pages over their limit {SIZE_LIMITS}: {over}"


def test_the_benchmarks_stay_within_their_lines() -> None:
    # One way to run a process, time and report (benchmarks/_harness.py, report.py): a scenario that
    # needs more lines than that leaves says so by failing here.
    lines = sum(len(path.read_text().splitlines()) for path in (REPO / "benchmarks").rglob("*.py"))
    assert lines <= BENCHMARK_LINES, f"benchmarks/ has {lines} lines of Python (at most {BENCHMARK_LINES})"


MODULE_LINES = 500


def test_every_module_stays_within_its_lines() -> None:
    # A module a reader takes in at once: one that grows past this splits by concern.
    over = {str(path.relative_to(PACKAGE)): lines for path in PACKAGE.rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MODULE_LINES}
    assert over == {}, f"modules over {MODULE_LINES} lines: {over}"
