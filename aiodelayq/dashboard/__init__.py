"""A web dashboard of aiodelayq queues: ``pip install 'aiodelayq[dashboard]'`` (Jinja2; uvicorn for
:func:`serve`).

>>> dashboard = Dashboard(redis)                                  # every queue SCAN finds
>>> app.mount("/queues", dashboard.asgi_app())                    # FastAPI / Starlette
>>> web_app.add_subapp("/queues", dashboard.aiohttp_app())        # aiohttp
>>> await serve("redis://localhost:6379/0", port=8000)            # standalone (aiodelayq dashboard)

Without a ``token`` it has no authentication of its own (the app it is mounted in protects it); with one,
every request needs it. :func:`serve` off loopback always needs one. See ``docs/dashboard.md``.
"""

from __future__ import annotations

from ._app import Dashboard
from ._serve import CannotListen, serve

__all__ = ["CannotListen", "Dashboard", "serve"]
