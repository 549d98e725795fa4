"""The peers' own environments, under ``.nox/`` at the repository root (git-ignored, outside
``benchmarks/``): one virtualenv per Python peer (``.nox/peers-<peer>/``: their redis-py pins conflict with
each other and with aiodelayq's) and ``.nox/peers-node/node_modules`` for BullMQ, installed from the
package registries on first use with pinned versions. A peer that cannot be installed is returned as
skipped, with the reason; the run reports it instead of dropping it (``run.py --setup-only``: install only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NOX_DIR = REPO / ".nox"
NODE_DIR = NOX_DIR / "peers-node"

# Pinned to the versions current when this benchmark was written; bump them here (the stamp files make
# the next run reinstall). saq 0.26.4 imports typing_extensions without declaring it.
PYTHON_PEERS: dict[str, list[str]] = {"arq": ["arq==0.28.0"],
                                      "saq": ["saq[redis,hiredis]==0.26.4", "typing_extensions>=4.7"]}
# bullmq 6 made its Redis client an optional peer dependency: ioredis is pinned to the version bullmq's
# own development pins (its devDependencies), the combination its tests run.
NODE_PEERS: dict[str, list[str]] = {"bullmq": ["bullmq@6.7.0", "ioredis@5.11.1"]}
NODE_MIN_MAJOR = 18
INSTALL_TIMEOUT_S = 900


@dataclass
class Peer:
    """How to run one peer's driver, or why it cannot run."""

    name: str
    command: list[str] = field(default_factory=list)  # driver command, before the protocol's arguments
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the driver
    versions: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None  # the reason, when it cannot run


def tail(text: str, lines: int = 4) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip() and "WARNING: Location" not in line]
    text = " | ".join(kept[-lines:]) or "(no output)"
    return text if len(text) <= 300 else text[:297] + "..."


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = INSTALL_TIMEOUT_S,
         env: dict[str, str] | None = None) -> tuple[bool, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **env} if env else None)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, repr(exc)
    return proc.returncode == 0, proc.stdout + proc.stderr


def _stamp_matches(stamp: Path, spec: object) -> bool:
    try:
        return bool(json.loads(stamp.read_text()) == spec)
    except (OSError, ValueError):
        return False


def python_peer(name: str) -> Peer:
    """A virtualenv with the peer's pinned requirements (reused while the pins are unchanged)."""
    reqs = PYTHON_PEERS[name]
    env_dir = NOX_DIR / f"peers-{name}"
    python = env_dir / "bin" / "python"
    stamp = env_dir / "peers-stamp.json"
    spec = {"requirements": reqs, "python": sys.version.split()[0]}
    if not (python.exists() and _stamp_matches(stamp, spec)):
        print(f"setup: creating {env_dir.relative_to(REPO)} and installing {' '.join(reqs)}", flush=True)
        shutil.rmtree(env_dir, ignore_errors=True)
        ok, out = _run([sys.executable, "-m", "venv", str(env_dir)])
        if not ok:
            return Peer(name, skipped=f"venv creation failed: {tail(out)}")
        ok, out = _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *reqs])
        if not ok:
            return Peer(name, skipped=f"pip install {' '.join(reqs)} failed: {tail(out)}")
        stamp.write_text(json.dumps(spec))
    probe = (f"import json, importlib.metadata as m, {name}; "
             f"print(json.dumps({{d: m.version(d) for d in ({name!r}, 'redis', 'hiredis')}}))")
    ok, out = _run([str(python), "-c", probe], timeout=60)
    if not ok:
        return Peer(name, skipped=f"installed but `import {name}` fails: {tail(out)}")
    versions = json.loads(out.strip().splitlines()[-1])
    versions["python"] = sys.version.split()[0]
    # No PYTHONPATH: the driver imports nothing of this checkout.
    return Peer(name, [str(python), str(HERE / "python_peer.py"), "--peer", name], {"PYTHONPATH": ""}, versions)


def node_peer(name: str) -> Peer:
    """``npm install`` of the pinned packages into :data:`NODE_DIR` (the driver ``require``s them from there)."""
    packages = NODE_PEERS[name]
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return Peer(name, skipped="node and npm not found on PATH (BullMQ needs Node.js >= "
                    f"{NODE_MIN_MAJOR})")
    ok, out = _run([node, "--version"], timeout=30)
    version = out.strip().lstrip("v")
    if not ok or not version.split(".")[0].isdigit() or int(version.split(".")[0]) < NODE_MIN_MAJOR:
        return Peer(name, skipped=f"Node.js {version or '?'} found, BullMQ needs >= {NODE_MIN_MAJOR}")
    stamp = NODE_DIR / "peers-stamp.json"
    spec = {"packages": packages, "node": version}
    if not ((NODE_DIR / "node_modules" / name).is_dir() and _stamp_matches(stamp, spec)):
        print(f"setup: npm install {' '.join(packages)} into {NODE_DIR.relative_to(REPO)}", flush=True)
        shutil.rmtree(NODE_DIR, ignore_errors=True)
        NODE_DIR.mkdir(parents=True)
        (NODE_DIR / "package.json").write_text(json.dumps({"name": "aiodelayq-peers", "private": True}) + "\n")
        ok, out = _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", *packages],
                       cwd=NODE_DIR)
        if not ok:
            return Peer(name, skipped=f"npm install {' '.join(packages)} failed: {tail(out)}")
        stamp.write_text(json.dumps(spec))
    ok, out = _run([node, "-e", f"console.log(require('{name}/package.json').version)"], cwd=NODE_DIR, timeout=60)
    if not ok:
        return Peer(name, skipped=f"installed but require('{name}') fails: {tail(out)}")
    versions = {name: out.strip(), "node": version}
    ok, out = _run([node, "-e", "console.log(require('ioredis/package.json').version)"], cwd=NODE_DIR, timeout=60)
    if ok:
        versions["ioredis"] = out.strip()
    return Peer(name, [node, str(HERE / f"{name}_peer.mjs")], {"PEERS_NODE_DIR": str(NODE_DIR)}, versions)


def aiodelayq_peer() -> Peer:
    """aiodelayq from this checkout (first on ``PYTHONPATH``, ahead of any installed copy), with the
    interpreter running the benchmark."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ok, out = _run([sys.executable, "-c", "import json, importlib.metadata as m, redis, aiodelayq; "
                    "print(json.dumps({'aiodelayq': aiodelayq.__version__, 'from': aiodelayq.__file__, "
                    "'redis': redis.__version__, 'hiredis': m.version('hiredis')}))"],
                   timeout=60, env={"PYTHONPATH": path})
    if not ok:
        return Peer("aiodelayq", skipped=f"`import aiodelayq` fails in {sys.executable}: {tail(out)}")
    versions = json.loads(out.strip().splitlines()[-1])
    versions["python"] = sys.version.split()[0]
    ok, commit = _run(["git", "describe", "--always", "--dirty"], cwd=REPO, timeout=30)
    versions["commit"] = commit.strip() if ok else "?"
    return Peer("aiodelayq", [sys.executable, str(HERE / "python_peer.py"), "--peer", "aiodelayq"],
                {"PYTHONPATH": path}, versions)


def ensure(name: str) -> Peer:
    """Install (when needed) and describe one peer: ``aiodelayq``, ``bullmq``, ``arq`` or ``saq``."""
    if name == "aiodelayq":
        return aiodelayq_peer()
    if name in PYTHON_PEERS:
        return python_peer(name)
    if name in NODE_PEERS:
        return node_peer(name)
    raise ValueError(f"unknown peer {name!r}")

