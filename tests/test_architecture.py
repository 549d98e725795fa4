"""The shape of the package, checked on its source: no import cycles, small modules, a thin facade,
Lua and byte layouts each in one place (docs/design.md, "Map")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "aiodelayq"


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


def test_no_module_passes_500_lines_and_the_facade_stays_thin() -> None:
    sizes = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
             for path in PACKAGE.rglob("*.py")}
    assert {f: n for f, n in sizes.items() if n > 500} == {}
    # The facade grows by one delegating method (with its docstring, which the API reference is
    # made of) per public call: bounded in size, and every method body stays a delegation.
    assert sizes["aiodelayq/_queue.py"] <= 470
    tree = ast.parse((PACKAGE / "_queue.py").read_text())
    fat = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "__init__":  # it assembles
            body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            if len(body) > 4:
                fat[node.name] = len(body)
    assert fat == {}, f"facade methods doing more than delegating: {fat}"


def test_lua_lives_in_the_scripts_package_and_byte_layouts_in_elements() -> None:
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith("_scripts/"):
            assert "redis.call(" not in text, f"Lua outside aiodelayq/_scripts/: {relative}"
        if relative != "_elements.py":
            assert "import struct" not in text, f"a byte layout outside aiodelayq/_elements.py: {relative}"
