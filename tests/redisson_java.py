"""The real Java Redisson, driven from the tests: ``tests/java/RedissonDriver.java`` compiled once per
run and per Redisson build, one JVM per test module and build.

The two builds and the Debian libraries they need are described in ``shared/redisson/README.md``
(``../shared`` next to the repository, or ``AIODELAYQ_REDISSON_DIR``). :func:`unavailable` says why the
Java tests cannot run here (no ``java``/``javac``, no jar, a missing library), so they skip with that
reason, which the test summary prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DRIVER_SOURCE = Path(__file__).resolve().parent / "java" / "RedissonDriver.java"
DEBIAN_JAVA = Path("/usr/share/java")
# The classpath of shared/redisson/README.md, besides the Redisson jar itself.
LIBRARIES = ("netty-buffer", "netty-codec", "netty-codec-dns", "netty-common", "netty-handler", "netty-resolver",
             "netty-resolver-dns", "netty-transport", "netty-transport-native-epoll",
             "netty-transport-native-unix-common", "jackson-core", "jackson-databind", "jackson-annotations",
             "jackson-dataformat-yaml", "slf4j-api", "snakeyaml", "byte-buddy", "slf4j-simple")
# Bounds: a JVM starts in ~0.6-2.5 s here; a command answers within its own timeout plus this.
START_TIMEOUT_S = 60.0
ANSWER_SLACK_S = 30.0


@dataclass(frozen=True)
class Build:
    """One Redisson build and the aiodelayq ``wire_format`` that matches its transfer."""

    version: str
    jar: str
    wire_format: str


BUILDS = (Build("3.52.0", "redisson-3.52.0-stripped.jar", "redisson"),
          Build("3.20.1", "redisson-3.20.1-stripped.jar", "redisson-legacy"))


def redisson_dir() -> Path:
    """Where the Redisson jars are."""
    configured = os.environ.get("AIODELAYQ_REDISSON_DIR")
    return Path(configured) if configured else REPO_ROOT.parent / "shared" / "redisson"


def classpath(build: Build) -> list[Path]:
    """The jar of ``build`` and the Debian libraries Redisson needs."""
    return [redisson_dir() / build.jar, *(DEBIAN_JAVA / f"{name}.jar" for name in LIBRARIES)]


def unavailable(build: Build) -> str | None:
    """Why ``build`` cannot run here, or ``None`` if it can."""
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (install openjdk-17-jdk-headless, see shared/redisson/README.md)"
    missing = [str(path) for path in classpath(build) if not path.is_file()]
    if missing:
        return f"Redisson {build.version}: missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else "")
    return None


def compile_driver(build: Build, cache_dir: Path) -> Path:
    """Compile the driver against ``build`` into ``cache_dir`` (once per source and jar); returns the
    class directory."""
    digest = hashlib.sha256(DRIVER_SOURCE.read_bytes() + build.jar.encode()).hexdigest()[:16]
    out = cache_dir / f"driver-{build.version}-{digest}"
    if not (out / "RedissonDriver.class").is_file():
        out.mkdir(parents=True, exist_ok=True)
        cp = os.pathsep.join(str(p) for p in classpath(build))
        subprocess.run(["javac", "-nowarn", "-d", str(out), "-cp", cp, str(DRIVER_SOURCE)], check=True,
                       capture_output=True, timeout=120)
    return out


class JavaError(Exception):
    """A command the driver answered with an error."""


class JavaRedisson:
    """One JVM running one Redisson client on ``url`` (a ``redis://host:port`` address).

    :meth:`call` sends one command and waits (bounded) for its answer; it is blocking, so async tests
    call it through ``asyncio.to_thread``. Use as a context manager: the JVM is shut down, or killed,
    on exit.
    """

    def __init__(self, build: Build, classes: Path, url: str) -> None:
        self.build = build
        cp = os.pathsep.join([*(str(p) for p in classpath(build)), str(classes)])
        self._proc = subprocess.Popen(
            ["java", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", cp, "RedissonDriver",
             url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(self._proc.stdout, self._answers.put, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self._proc.stderr, self._stderr.append, False), daemon=True).start()
        if self._answer(START_TIMEOUT_S) != "ready":
            raise JavaError("the driver did not start")

    def __repr__(self) -> str:
        return f"<JavaRedisson {self.build.version} pid={self._proc.pid} rc={self._proc.poll()}>"

    @staticmethod
    def _read(stream: Any, put: Any, mark_end: bool) -> None:
        for line in stream:
            put(line)
        if mark_end:
            put(None)  # the JVM closed stdout: no answer will come

    def _answer(self, timeout_s: float) -> Any:
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise JavaError(f"no answer within {timeout_s} s; stderr: {self.stderr_tail()}") from None
        if line is None:
            raise JavaError(f"the JVM exited (rc={self._proc.poll()}); stderr: {self.stderr_tail()}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise JavaError(answer["error"])
        return answer.get("result")

    def call(self, op: str, *, timeout_s: float = 10.0, **args: Any) -> Any:
        """Run one command (see the driver's header); returns its result.

        Raises:
            JavaError: the command failed, the JVM died, or no answer came within ``timeout_s`` plus slack.
        """
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self._proc.stdin.flush()
            return self._answer(timeout_s + ANSWER_SLACK_S)

    def stderr_tail(self, lines: int = 20) -> str:
        """The last lines Redisson logged."""
        return "".join(self._stderr[-lines:])

    def close(self) -> None:
        """Shut the client down (bounded), else kill the JVM."""
        if self._proc.poll() is None:
            try:
                self.call("shutdown", timeout_s=0)
                self._proc.wait(timeout=15)
            except (JavaError, OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(timeout=15)

    def __enter__(self) -> JavaRedisson:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
