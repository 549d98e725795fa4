"""The demo (the README's main job) runs end to end and loses nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import pytest

from aiodelayq import demo
from tests.faults import REPO_ROOT

# Run with the first server kind only: the demo's end-to-end run.
pytestmark = pytest.mark.once


async def test_demo_cancels_every_unpaid_order(redis_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    status = await demo.run(redis_server.url, orders=8, max_delay_s=1.0, paid_share=0.4, seed=3)
    out = capsys.readouterr().out
    assert status == 0
    assert "lost: 0" in out
    paid, unpaid = out.count(" paid     ->"), out.count("UNPAID")
    assert paid + unpaid == 8
    assert "lateness (delivered minus due, server clock)" in out or unpaid == 0


@pytest.mark.parametrize("command", [
    ["-m", "aiodelayq.demo"],
    ["-m", "aiodelayq", "worker", "orders_worker:cancel_unpaid", "--queue", "q"],
])
def test_an_unreachable_redis_url_is_one_line(command: list[str]) -> None:
    # The newcomer's first mistake (no server there, or a typo): one line on stderr, no traceback.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens once the socket is closed
    url = f"redis://user:secret@127.0.0.1:{port}/0"
    done = subprocess.run([sys.executable, *command, "--redis-url", url], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT / "docs" / "examples")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot" in lines[0]
    assert "secret" not in done.stderr + done.stdout
