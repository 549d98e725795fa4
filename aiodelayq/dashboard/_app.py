"""The :class:`Dashboard`: its routes, its pages (Jinja2 templates), its actions (POSTs behind the
CSRF checks of ``_http``) and, with a token, its login (``_auth``), served by the ASGI or the aiohttp
adapter."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

try:
    import jinja2
except ImportError as exc:  # only users of the extra import this package
    raise ImportError("aiodelayq.dashboard needs Jinja2: pip install 'aiodelayq[dashboard]'") from exc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from .._admin.durations import format_duration
from .._admin.reads import recorded_shards, server_now_ms, with_queue
from .._options import check_client
from .._queue import DelayedQueue
from .._wire.item_keys import check_key
from .._wire.key_names import QueueKeys
from ..exceptions import (
    AccessDeniedError,
    BackendError,
    ConfigurationError,
    InvalidDelayError,
    InvalidKeyError,
    InvalidNameError,
)
from ._auth import TokenGate, after_login, check_token
from ._http import (
    CSRF_FIELD,
    ASGIApp,
    BadRequest,
    Request,
    Response,
    aiohttp_application,
    asgi_application,
    csrf_cookie,
    origin_refusal,
    post_refusal,
)
from ._pages import (
    HOUR_MS,
    MINUTE_MS,
    QueueList,
    Row,
    as_text,
    count_queues,
    find_queues,
    format_rate,
    format_utc,
    is_empty,
    make_chart,
    preview,
    queue_histogram,
    relative,
)

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["Dashboard"]

log = logging.getLogger("aiodelayq")

# Auto-refresh periods the pages offer (?refresh=N, seconds).
REFRESH_CHOICES = (5, 10, 30, 60)
# The queue page's last events (set_events turns the stream on), newest first.
EVENTS_SHOWN = 50
# Rows of the queue page: soonest pending items, oldest dead letters (?peek=N, ?dead=N).
DEFAULT_PEEK = 20
DEFAULT_DEAD = 50
MAX_ROWS = 1000
# What a dashboard with a token serves to anyone (the login page uses the stylesheet).
_OPEN = frozenset({"/static/dashboard.css", "/login"})
# The pages a login may lead back to.
_PAGES = frozenset({"/", "/queue"})

_DONE = {"paused": "Paused: its consumers hand nothing out until it is resumed.",
         "resumed": "Resumed.",
         "requeued": "Requeued {n} dead letter(s).",
         "purged": "Purged {n} dead letter(s)."}


class _NotFound(Exception):
    """A page or queue that does not exist: answered with a 404 page that says why."""


class Dashboard:
    """A web dashboard of aiodelayq queues, the Bull Board pattern: mount it in your web app, which
    protects it with its own authentication, or give it a ``token``.

    Every link is relative: it works under any mount path.

    >>> dashboard = Dashboard(redis)
    >>> app.mount("/queues", dashboard.asgi_app())                  # FastAPI / Starlette
    >>> web_app.add_subapp("/queues", dashboard.aiohttp_app())      # aiohttp

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` client with ``decode_responses=False``;
            the dashboard never closes it.
        read_only: show no write buttons, and answer every POST of an action with 403.
        queues: the names of the queues to show; ``None``: every queue found by ``SCAN`` (as
            ``aiodelayq ls`` finds them) at each load of the index. With a list, other names get 404.
        token: ``None``: no authentication of its own. A token (16 to 1,024 visible ASCII characters;
            ``secrets.token_urlsafe()`` makes one): every request but the stylesheet's and the login's
            needs it, as ``Authorization: Bearer TOKEN`` or a 12-hour session cookie from the login
            form, else it gets 401 and the login form. See ``docs/dashboard.md``.

    Raises:
        ConfigurationError: a client that is not one of those, or decodes responses; an empty or
            non-``str`` queue name, or on a ``RedisCluster`` one whose keys do not all hash to one slot;
            a ``token`` that is not a ``str`` of 16 to 1,024 visible ASCII characters (the message never
            shows it).
    """

    def __init__(self, redis: Redis | RedisCluster, *, read_only: bool = False,
                 queues: Iterable[str] | None = None, token: str | None = None) -> None:
        self._client = check_client(redis)
        self._read_only = bool(read_only)
        self._gate = None if token is None else TokenGate(check_token(token))
        self._queues: list[str] | None = None
        if queues is not None:
            if isinstance(queues, str):
                raise ConfigurationError("queues must be a list of names, not a str")
            self._queues = list(dict.fromkeys(queues))
            for name in self._queues:
                try:
                    QueueKeys.for_name(name, cluster=isinstance(redis, RedisCluster))
                except InvalidNameError as exc:
                    raise ConfigurationError(f"queues: {exc}") from None
        self._env = jinja2.Environment(
            loader=jinja2.PackageLoader("aiodelayq.dashboard", "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self._env.filters.update(
            duration=format_duration, utc=format_utc, rate=format_rate, preview=preview,
            text=as_text, q=lambda value: quote(str(value), safe=""), number=lambda n: f"{n:,}")
        self._env.globals.update(relative=relative, csrf_field=CSRF_FIELD)
        self._css = resources.files("aiodelayq.dashboard").joinpath("static/dashboard.css").read_bytes()
        self._routes: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {
            "/": {"GET": self._index},
            "/queue": {"GET": self._queue_page},
            "/static/dashboard.css": {"GET": self._stylesheet},
            "/pause": {"POST": self._action("paused", self._pause)},
            "/resume": {"POST": self._action("resumed", self._resume)},
            "/requeue": {"POST": self._action("requeued", self._requeue)},
            "/purge": {"POST": self._action("purged", self._purge)},
        }
        if self._gate is not None:
            self._routes["/login"] = {"GET": self._login_page, "POST": self._login}
            self._routes["/logout"] = {"POST": self._logout}

    @property
    def read_only(self) -> bool:
        """Whether the dashboard shows no write buttons and refuses every action."""
        return self._read_only

    @property
    def needs_token(self) -> bool:
        """Whether every request needs the dashboard's token (it was given one)."""
        return self._gate is not None

    @property
    def queues(self) -> list[str] | None:
        """The queues it shows, or ``None``: those ``SCAN`` finds."""
        return None if self._queues is None else list(self._queues)

    def __repr__(self) -> str:
        which = "scanned" if self._queues is None else f"{len(self._queues)} queues"
        return (f"<Dashboard {which}{' read-only' if self._read_only else ''}"
                f"{' token' if self._gate is not None else ''}>")

    def asgi_app(self) -> ASGIApp:
        """An ASGI app to mount in FastAPI or Starlette, or to serve alone (it answers the lifespan
        protocol). It needs no framework."""
        return asgi_application(self._handle)

    def aiohttp_app(self) -> web.Application:
        """An aiohttp application to add as a sub-application (the parent's middlewares run first), or
        to run alone. Needs aiohttp."""
        return aiohttp_application(self._handle)

    async def _handle(self, request: Request) -> Response:
        """Answer one request (what both adapters call): a page, the stylesheet, an action's redirect,
        or an error page (400 bad input, 401 the login form, 403 refused POST, 404 unknown page or
        queue, 405, 503 when Redis does not answer)."""
        if request.path == "":  # the mount point without its slash: relative links need it
            segment = request.mount.rstrip("/").rpartition("/")[2]
            location = quote(segment) + "/" + (f"?{request.query}" if request.query else "")
            return Response(308, b"", "text/plain; charset=utf-8", [("Location", location)])
        if self._gate is not None and request.path not in _OPEN and not self._gate.lets_in(request):
            return self._login_form(request, 401)  # before the routes: an unknown page says nothing either
        methods = self._routes.get(request.path)
        if methods is None:
            return self._error(request, 404, "Not found", f"There is no page {request.path!r} here.")
        method = "GET" if request.method == "HEAD" else request.method
        view = methods.get(method)
        if view is None:
            allowed = ", ".join(sorted({*methods, "HEAD"} if "GET" in methods else set(methods)))
            response = self._error(request, 405, "Method not allowed", f"{request.path} takes {allowed}.")
            response.headers.append(("Allow", allowed))
            return response
        try:
            return await view(request)
        except BadRequest as exc:
            return self._error(request, 400, "Bad request", str(exc))
        except (InvalidKeyError, InvalidNameError, InvalidDelayError, ConfigurationError) as exc:
            return self._error(request, 400, "Bad request", str(exc))
        except _NotFound as exc:
            return self._error(request, 404, "Not found", str(exc))
        except (BackendError, RedisError, OSError, asyncio.TimeoutError) as exc:
            what = "Redis refused the call" if isinstance(exc, (AccessDeniedError, ResponseError)) else \
                "Redis did not answer"
            log.warning("dashboard: %s %s%s: %s: %s", request.method, request.mount, request.path, what,
                        exc or type(exc).__name__)
            return self._error(request, 503, what, f"{type(exc).__name__}: {exc}")

    # -- pages -----------------------------------------------------------------------------------

    def _render(self, request: Request, template: str, code: int = 200, **context: Any) -> Response:
        headers: list[tuple[str, str]] = [("Cache-Control", "no-store")]
        token = ""
        sid = None if self._gate is None else self._gate.session_of(request)
        if self._gate is not None and sid is not None:
            token = self._gate.csrf_token(sid)
        elif self._gate is not None or not self._read_only:
            token, cookie = csrf_cookie(request)  # the login form's, or the forms of a dashboard without a token
            if cookie is not None:
                headers.append(("Set-Cookie", cookie))
        depth = max(request.path.count("/") - 1, 0)
        html = self._env.get_template(template).render(
            root="../" * depth or "./", read_only=self._read_only, csrf_token=token, logged_in=sid is not None,
            **context)
        return Response(code, html.encode("utf-8"), headers=headers)

    def _error(self, request: Request, status: int, title: str, message: str) -> Response:
        return self._render(request, "error.html", status, status=status, title=title, message=message,
                            refresh=None, refresh_choices=(), here="")

    def _login_form(self, request: Request, status: int, next_page: str | None = None, failed: bool = False
                    ) -> Response:
        """The login page: with 401, what every request without the token gets (``WWW-Authenticate``
        names the bearer scheme); ``next_page`` is where the login leads (by default, the page asked
        for)."""
        if next_page is None:
            asked = request.method in ("GET", "HEAD") and request.path in _PAGES
            next_page = request.path[1:] + (f"?{request.query}" if request.query else "") if asked else ""
        response = self._render(request, "login.html", status, next_page=next_page, failed=failed, refresh=None,
                                refresh_choices=(), here="")
        if status == 401:
            response.headers.append(("WWW-Authenticate", 'Bearer realm="aiodelayq dashboard"'))
        return response

    async def _stylesheet(self, request: Request) -> Response:
        return Response(200, self._css, "text/css; charset=utf-8", [("Cache-Control", "max-age=300")])

    async def _index(self, request: Request) -> Response:
        params = request.params()
        refresh = _refresh(params)
        if self._queues is None:
            listing = await find_queues(self._client)
        else:
            listing = QueueList(list(self._queues), None)
        rows = await count_queues(self._client, listing.names, listing.shards)
        now_ms = await self._server_ms(rows)
        return self._render(request, "index.html", rows=rows, note=listing.note, scanned=self._queues is None,
                            now_ms=now_ms, refresh=refresh, refresh_choices=REFRESH_CHOICES, here="")

    async def _server_ms(self, rows: list[Row]) -> int:
        """The server's clock, to show due times against (from the node of the first queue read)."""
        read = [row.name for row in rows if row.counts is not None]
        return await server_now_ms(self._client, route=QueueKeys.for_name(read[0]).timeout_set) if read else 0

    async def _queue_page(self, request: Request) -> Response:
        params = request.params()
        name = params.get("name", "")
        if not name:
            raise BadRequest("which queue? The page is queue?name=NAME")
        self._known(name)
        refresh = _refresh(params)
        peek = _int_param(params, "peek", DEFAULT_PEEK)
        dead = _int_param(params, "dead", DEFAULT_DEAD)
        key = params.get("key", "")
        if key:
            check_key(key)  # a bad key is a 400 before any call starts
        record = await recorded_shards(self._client, name)
        async with with_queue(self._client, name, shards=record.count) as queue:
            # Every read is awaited to its end, whatever fails: none outlives the page (or the queue).
            results = await asyncio.gather(
                queue.counts(), queue_histogram(self._client, [QueueKeys.for_name(n) for n in record.names(name)]),
                queue.peek(peek),
                queue.dead_letters(dead),
                queue.get(key) if key else _none(), queue.recent_events(EVENTS_SHOWN), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        counts, histogram, pending, letters, found, events = results
        if self._queues is None and is_empty(counts):
            raise _NotFound(_no_queue(name))
        now = histogram.now_ms
        charts = [make_chart("Due in the next hour (5-minute bars)", histogram.hour, now, 5 * MINUTE_MS,
                                   3, MINUTE_MS, " min"),
                  make_chart("Due in the next 24 hours (1-hour bars)", histogram.day, now, HOUR_MS,
                                   6, HOUR_MS, " h")]
        done = params.get("done")
        message = None
        if done in _DONE:
            n = params.get("n", "")
            message = _DONE[done].format(n=int(n) if n.isdigit() else "?")
        here = f"queue?name={quote(name, safe='')}"
        return self._render(request, "queue.html", name=name, counts=counts, histogram=histogram, charts=charts,
                            pending=pending, peek=peek, letters=letters, dead=dead, key=key, found=found,
                            events=events,
                            now_ms=now, message=message, refresh=refresh, refresh_choices=REFRESH_CHOICES,
                            here=here)

    def _known(self, name: str) -> QueueKeys:
        """The keys of queue ``name``; 404 for a name the dashboard was not given, 400 for a bad one."""
        if self._queues is not None and name not in self._queues:
            raise _NotFound(f"This dashboard shows no queue named {name!r}.")
        try:
            return QueueKeys.for_name(name, cluster=isinstance(self._client, RedisCluster))
        except InvalidNameError as exc:
            raise BadRequest(str(exc)) from None

    # -- actions ---------------------------------------------------------------------------------

    def _action(self, done: str, act: Callable[[DelayedQueue[bytes], Mapping[str, str]], Awaitable[int | None]]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def post(request: Request) -> Response:
            if self._read_only:
                return self._error(request, 403, "Read-only", "This dashboard is read-only: it changes nothing.")
            form = request.form()
            refusal = self._post_refusal(request, form)
            if refusal is not None:
                return self._error(request, 403, "Forbidden", f"Refused: {refusal}.")
            name = form.get("queue", "")
            if not name:
                raise BadRequest("the form names no queue")
            self._known(name)
            async with with_queue(self._client, name) as queue:
                if self._queues is None and is_empty(await queue.counts()):
                    raise _NotFound(_no_queue(name))
                n = await act(queue, form)
            location = f"queue?name={quote(name, safe='')}&done={done}" + ("" if n is None else f"&n={n}")
            return Response(303, b"", "text/plain; charset=utf-8", [("Location", location)])

        return post

    def _post_refusal(self, request: Request, form: Mapping[str, str]) -> str | None:
        """Why an action or a logout is refused (403), or ``None``: another site or origin; without a
        token, a double-submit token that is not the cookie's; with one, a session's form without
        the session's CSRF token (a bearer token needs none)."""
        if self._gate is None:
            return post_refusal(request, form)
        return origin_refusal(request) or self._gate.csrf_refusal(request, form)

    # -- login (a dashboard with a token) ------------------------------------------------------------

    async def _login_page(self, request: Request) -> Response:
        assert self._gate is not None
        if self._gate.lets_in(request):
            return Response(303, b"", "text/plain; charset=utf-8", [("Location", "./")])
        return self._login_form(request, 401)

    async def _login(self, request: Request) -> Response:
        """A login: the form's own CSRF check (origin and double-submit token), then the token; a new
        session when it is the token, the login form again (401) when not."""
        assert self._gate is not None
        form = request.form()
        refusal = post_refusal(request, form)
        if refusal is not None:
            return self._error(request, 403, "Forbidden", f"Refused: {refusal}.")
        next_page = form.get("next", "")
        if not self._gate.is_token(form.get("token", "")):
            return self._login_form(request, 401, next_page, failed=True)
        return Response(303, b"", "text/plain; charset=utf-8",
                        [("Location", after_login(next_page)), ("Set-Cookie", self._gate.new_session(request)),
                         ("Cache-Control", "no-store")])

    async def _logout(self, request: Request) -> Response:
        assert self._gate is not None
        form = request.form()
        refusal = self._post_refusal(request, form)
        if refusal is not None:
            return self._error(request, 403, "Forbidden", f"Refused: {refusal}.")
        return Response(303, b"", "text/plain; charset=utf-8",
                        [("Location", "./"), ("Set-Cookie", self._gate.end_session(request))])

    @staticmethod
    async def _pause(queue: DelayedQueue[bytes], form: Mapping[str, str]) -> None:
        await queue.pause()

    @staticmethod
    async def _resume(queue: DelayedQueue[bytes], form: Mapping[str, str]) -> None:
        await queue.resume()

    @staticmethod
    async def _requeue(queue: DelayedQueue[bytes], form: Mapping[str, str]) -> int:
        limit_text = form.get("limit", "").strip()
        limit = None
        if limit_text:
            if not limit_text.isdigit() or int(limit_text) < 1:
                raise BadRequest(f"limit must be a whole number >= 1 (or empty: all), not {limit_text!r}")
            limit = int(limit_text)
        delay_text = form.get("delay", "").strip() or "0"
        try:
            delay = float(delay_text)
        except ValueError:
            delay = math.nan
        if not math.isfinite(delay) or delay < 0:
            raise BadRequest(f"delay must be a number of seconds >= 0, not {delay_text!r}")
        return int(await queue.requeue_dead_letters(limit, delay))

    @staticmethod
    async def _purge(queue: DelayedQueue[bytes], form: Mapping[str, str]) -> int:
        if form.get("confirm") != "yes":
            raise BadRequest("purging deletes every dead letter: tick the box to confirm")
        return int(await queue.purge_dead_letters())


async def _none() -> None:
    return None


def _no_queue(name: str) -> str:
    return (f"No queue named {name!r} is in Redis: nothing of it is stored (an empty queue leaves no key "
            f"behind).")


def _refresh(params: Mapping[str, str]) -> int | None:
    text = params.get("refresh", "")
    if not text:
        return None
    if not text.isdigit() or int(text) not in REFRESH_CHOICES:
        raise BadRequest(f"refresh is one of {', '.join(map(str, REFRESH_CHOICES))} seconds, not {text!r}")
    return int(text)


def _int_param(params: Mapping[str, str], name: str, default: int) -> int:
    text = params.get(name, "")
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_ROWS:
        raise BadRequest(f"{name} is a number of rows from 1 to {MAX_ROWS}, not {text!r}")
    return int(text)
