"""HTTP for the dashboard without a web framework: plain request/response objects, the ASGI and aiohttp
adapters (aiohttp imported only when :func:`aiohttp_application` runs), and the checks a POST passes."""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, urlsplit

from .._util.asgi import ASGIApp, Receive, Scope, Send, answer_lifespan

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["ASGIApp", "CSRF_COOKIE", "CSRF_FIELD", "MAX_BODY_BYTES", "BadRequest", "Request", "Response",
           "aiohttp_application", "asgi_application", "cookie_header", "csrf_cookie", "csrf_token_of",
           "origin_refusal", "post_refusal"]

Handler = Callable[["Request"], Awaitable["Response"]]

# The largest body a POST may have: the forms carry a queue name, a token and two numbers.
MAX_BODY_BYTES = 64 * 1024
MAX_FIELDS = 20

CSRF_COOKIE = "aiodelayq_dashboard_csrf"
CSRF_FIELD = "csrf_token"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)

# Every response: no framing (a click-jacked "purge"), no sniffing, nothing cached, no script at all.
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
)


class BadRequest(Exception):
    """A request the dashboard cannot use: answered with a 400 page that says why."""


@dataclass(frozen=True)
class Request:
    """One HTTP request, as both adapters hand it to the dashboard.

    Attributes:
        method: ``GET``, ``POST``, ...
        path: the path under the mount point, ``/`` for its root (``""`` for the mount point itself,
            without its trailing slash).
        query: the raw (percent-encoded) query string.
        headers: lower-case names; a header sent several times is joined with ``, `` (cookies ``; ``).
        body: the request body (at most :data:`MAX_BODY_BYTES`).
        mount: the path the dashboard is mounted at (``""`` at the root of a server).
        secure: whether the request came over TLS (the cookie is then ``Secure``).
    """

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes = b""
    mount: str = ""
    secure: bool = False

    def params(self) -> dict[str, str]:
        """The query string's fields (the first value of each).

        Raises:
            BadRequest: more than :data:`MAX_FIELDS` fields, or text that is not UTF-8.
        """
        return _fields(self.query)

    def form(self) -> dict[str, str]:
        """The fields of a form POST (``application/x-www-form-urlencoded``).

        Raises:
            BadRequest: another content type, or a body that is not a form.
        """
        kind = self.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise BadRequest(f"a form post is application/x-www-form-urlencoded, not {kind or 'without a type'}")
        try:
            text = self.body.decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest("a form body is ASCII (percent-encoded)") from None
        return _fields(text)

    def cookies(self, name: str) -> list[str]:
        """Every value of the cookie ``name`` the browser sent (one per path it holds it for)."""
        found = []
        for part in self.headers.get("cookie", "").split(";"):
            key, eq, value = part.strip().partition("=")
            if eq and key == name:
                found.append(value.strip().strip('"'))
        return found


@dataclass
class Response:
    """An HTTP response: status, body, content type and extra headers."""

    status: int
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def all_headers(self) -> list[tuple[str, str]]:
        """The headers to send: content type and length, the security headers, then the extra ones."""
        return [("Content-Type", self.content_type), ("Content-Length", str(len(self.body))),
                *SECURITY_HEADERS, *self.headers]


def _fields(text: str) -> dict[str, str]:
    try:
        parsed = parse_qs(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=MAX_FIELDS)
    except UnicodeDecodeError:
        raise BadRequest("a field is not UTF-8 text") from None
    except ValueError as exc:  # max_num_fields
        raise BadRequest(str(exc)) from None
    return {key: values[0] for key, values in parsed.items()}


# -- CSRF: a double-submit token, and the origin of a POST ----------------------------------------------


def cookie_header(request: Request, name: str, value: str, max_age_s: int | None = None) -> str:
    """A ``Set-Cookie`` value for the dashboard's cookies: ``HttpOnly``, ``SameSite=Strict``, for the
    mount's path, ``Secure`` over TLS; with ``max_age_s``, kept that many seconds (0: deleted)."""
    path = quote(request.mount.rstrip("/") + "/", safe="/")
    cookie = f"{name}={value}; Path={path}; HttpOnly; SameSite=Strict"
    if max_age_s is not None:
        cookie += f"; Max-Age={max_age_s}"
    return cookie + ("; Secure" if request.secure else "")


def csrf_token_of(request: Request) -> str | None:
    """The request's CSRF cookie, when it holds a well-formed token."""
    for value in request.cookies(CSRF_COOKIE):
        if _TOKEN.fullmatch(value):
            return value
    return None


def csrf_cookie(request: Request) -> tuple[str, str | None]:
    """``(token, Set-Cookie value or None)``: the request's token, or a new one and the cookie that
    carries it (see :func:`cookie_header`)."""
    token = csrf_token_of(request)
    if token is not None:
        return token, None
    token = secrets.token_urlsafe(32)
    return token, cookie_header(request, CSRF_COOKIE, token)


def post_refusal(request: Request, form: Mapping[str, str]) -> str | None:
    """Why a POST is refused (a 403), or ``None``: :func:`origin_refusal`, or its form's token is not
    its cookie's (compared in constant time)."""
    refusal = origin_refusal(request)
    if refusal is not None:
        return refusal
    sent = form.get(CSRF_FIELD, "")
    cookies = [value for value in request.cookies(CSRF_COOKIE) if _TOKEN.fullmatch(value)]
    if not sent or not cookies:
        return "no CSRF token (load the page again)"
    # Every cookie is compared: none is skipped early on a mismatch.
    matches = [hmac.compare_digest(sent.encode(), value.encode()) for value in cookies]
    return None if any(matches) else "a CSRF token that is not this browser's (load the page again)"


def origin_refusal(request: Request) -> str | None:
    """Why a POST is refused for where it comes from, or ``None``: ``Sec-Fetch-Site``, ``Origin`` or
    ``Referer`` name another site or host than ``Host``/``X-Forwarded-Host``."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "a request from another site"
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is not None and not _same_host(origin, request):
        return "a request from another origin"
    return None


def _same_host(origin: str, request: Request) -> bool:
    if origin == "null":
        return False
    try:
        parts = urlsplit(origin)
        host = _normal_host(parts.netloc, parts.scheme)
    except ValueError:
        return False
    scheme = "https" if request.secure else "http"
    ours = {_normal_host(request.headers.get("host", ""), scheme)}
    forwarded = request.headers.get("x-forwarded-host")
    if forwarded:
        ours.add(_normal_host(forwarded.split(",")[0].strip(), parts.scheme))
    return bool(host) and host in ours


def _normal_host(netloc: str, scheme: str) -> str:
    """``host[:port]`` in lower case, without the scheme's default port."""
    netloc = netloc.rpartition("@")[2].lower()
    default = {"http": ":80", "https": ":443"}.get(scheme)
    if default and netloc.endswith(default):
        netloc = netloc[:-len(default)]
    return netloc


# -- the adapters ---------------------------------------------------------------------------------


def asgi_application(handle: Handler) -> ASGIApp:
    """An ASGI app that hands every HTTP request to ``handle`` (and answers the lifespan protocol, so
    a server may run it alone). Its path under the mount point is ``path`` minus ``root_path``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        root = str(scope.get("root_path", "")).rstrip("/")
        path = str(scope.get("path", "/"))
        # Starlette's Mount keeps the whole path and adds the mount to root_path (older versions cut
        # the path instead): either way, what is under the mount point.
        relative = path[len(root):] if root and (path == root or path.startswith(root + "/")) else path
        body, too_large = await _read_body(receive)
        headers = _joined((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", ()))
        if too_large:
            response = Response(413, b"request body too large\n", "text/plain; charset=utf-8")
        else:
            response = await handle(Request(
                method=str(scope.get("method", "GET")).upper(), path=relative,
                query=bytes(scope.get("query_string", b"")).decode("latin-1"), headers=headers, body=body,
                mount=path[:len(path) - len(relative)] if relative else path, secure=scope.get("scheme") == "https"))
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.all_headers()]})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else response.body})

    return app


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    too_large = False
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            too_large = True  # read on to the end, keeping nothing
        else:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks), too_large


def _joined(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in pairs:
        if name in headers:
            headers[name] = headers[name] + ("; " if name == "cookie" else ", ") + value
        else:
            headers[name] = value
    return headers


def aiohttp_application(handle: Handler) -> web.Application:
    """An aiohttp application that hands every request to ``handle``: a sub-application
    (``app.add_subapp("/queues", ...)``) or an application of its own."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        tail = request.match_info.get("tail")
        path = request.path
        # The route "" is the mount point of a sub-application ("/queues"), and "/" in an application
        # of its own.
        relative = ("/" if path.endswith("/") else "") if tail is None else "/" + tail
        mount = path[:len(path) - len(relative)] if relative and path.endswith(relative) else path
        body = await request.read() if request.can_read_body else b""
        if len(body) > MAX_BODY_BYTES:
            response = Response(413, b"request body too large\n", "text/plain; charset=utf-8")
        else:
            response = await handle(Request(
                method=request.method.upper(), path=relative, query=request.rel_url.raw_query_string,
                headers=_joined((k.lower(), v) for k, v in request.headers.items()), body=body, mount=mount,
                secure=request.secure))
        out = web.Response(status=response.status, body=response.body)
        for name, value in response.all_headers():
            if name != "Content-Length":  # aiohttp writes it
                out.headers.add(name, value)
        return out

    app = web.Application()
    app.router.add_route("*", "", handler)  # the mount point itself, without its slash: redirected
    app.router.add_route("*", "/{tail:.*}", handler)
    return app
