"""The demo (the README's main job) runs end to end and loses nothing."""

from __future__ import annotations

from typing import Any

import pytest

from aiodelayq import demo


async def test_demo_cancels_every_unpaid_order(redis_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    status = await demo.run(redis_server.url, orders=8, max_delay_s=1.0, paid_share=0.4, seed=3)
    out = capsys.readouterr().out
    assert status == 0
    assert "lost: 0" in out
    paid, unpaid = out.count(" paid     ->"), out.count("UNPAID")
    assert paid + unpaid == 8
    assert "lateness (delivered minus due, server clock)" in out or unpaid == 0
