"""The dashboard's token: a request gets in with it as a bearer token or with a session cookie from a login.

A session cookie is ``ISSUED.SID.MAC`` (login time in Unix seconds, random session id, HMAC-SHA256 of both
under a key derived from the token): it never holds the token. Logged-out session ids are refused, kept in
memory until their time is up, so dashboards sharing a token accept each other's sessions but refuse only
logouts made through themselves; a new token ends every session. A session's forms carry a CSRF token derived
from its id under the same key, which a page of another origin cannot make even when it sets cookies for this
host (cookies are not separated by port). The login form uses the double-submit token of :mod:`._http`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping

from ..exceptions import ConfigurationError
from ._http import CSRF_FIELD, Request, cookie_header

__all__ = ["SESSION_COOKIE", "SESSION_TTL_S", "TokenGate", "after_login", "check_token", "new_token"]

SESSION_COOKIE = "aiodelayq_dashboard_session"
# Seconds; the cookie's Max-Age, and checked on the server.
SESSION_TTL_S = 12 * 3600
# Characters: a short token can be guessed over the network; a token travels in a header.
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 1024
# A session cookie issued up to this many seconds in the future still counts (clocks of workers).
_CLOCK_SLACK_S = 60

_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")
_SESSION = re.compile(r"(\d{1,12})\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})")
_NEXT = re.compile(r"(queue)?(\?[\x21-\x7e]*)?")


def check_token(token: object, option: str = "token") -> str:
    """``token``, when it can be a dashboard's token: a ``str`` of :data:`MIN_TOKEN_CHARS` to
    :data:`MAX_TOKEN_CHARS` visible ASCII characters (no spaces).

    Raises:
        ConfigurationError: it is not; the message names ``option`` and never shows the token.
    """
    if not isinstance(token, str):
        raise ConfigurationError(f"{option} must be a str, not {type(token).__name__}")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(f"{option} must be at least {MIN_TOKEN_CHARS} characters (secrets.token_urlsafe() "
                                 f"makes one of 43), not {len(token)}")
    if len(token) > MAX_TOKEN_CHARS:
        raise ConfigurationError(f"{option} must be at most {MAX_TOKEN_CHARS} characters, not {len(token)}")
    if not _VISIBLE_ASCII.fullmatch(token):
        raise ConfigurationError(f"{option} must be visible ASCII characters without spaces: it is sent in an "
                                 f"Authorization header")
    return token


def new_token() -> str:
    """A random token (256 bits, 43 URL-safe characters), for a dashboard given none."""
    return secrets.token_urlsafe(32)


def after_login(next_page: str) -> str:
    """Where a login leads (a relative ``Location``): ``next_page`` when it is one of the dashboard's
    pages (``""``, ``queue?...``), else the index. No other site, no other path."""
    if not _NEXT.fullmatch(next_page):
        return "./"
    return next_page if next_page.startswith("queue") else "./" + next_page


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class TokenGate:
    """Who may use a dashboard that has a token. Every comparison is in constant time.

    Args:
        token: the token (:func:`check_token` has checked it).
        clock: the wall clock sessions are dated and expired by (Unix seconds).
    """

    def __init__(self, token: str, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._ended: dict[str, int] = {}  # the session ids that logged out -> when their login was
        self._key = hmac.new(token.encode("ascii"), b"aiodelayq dashboard sessions", hashlib.sha256).digest()
        self._token_mac = self._mac("token", token)

    def __repr__(self) -> str:
        return "<TokenGate>"  # never the token, nor its key

    def _mac(self, purpose: str, text: str) -> bytes:
        return hmac.new(self._key, f"{purpose}\0{text}".encode("utf-8", "surrogateescape"), hashlib.sha256).digest()

    def is_token(self, text: str) -> bool:
        """Whether ``text`` is the token (their HMACs are compared: the time says nothing of the
        token's length either)."""
        return hmac.compare_digest(self._mac("token", text), self._token_mac)

    def bearer(self, request: Request) -> bool:
        """Whether the request sends ``Authorization: Bearer TOKEN`` (another scheme counts for nothing)."""
        scheme, _, sent = request.headers.get("authorization", "").strip().partition(" ")
        return scheme.lower() == "bearer" and self.is_token(sent.strip())

    def session_of(self, request: Request) -> str | None:
        """The session id of the request's session cookie, when it is one this token signed, that has
        not expired nor logged out; else ``None``."""
        found = None
        for value in request.cookies(SESSION_COOKIE):
            session = self._session(value)
            if session is not None and found is None:  # every cookie is checked: none is skipped early
                found = session[0]
        return found

    def _session(self, value: str) -> tuple[str, int] | None:
        match = _SESSION.fullmatch(value)
        if match is None:
            return None
        issued, sid, mac = match.groups()
        signed = hmac.compare_digest(_b64(self._mac("session", f"{issued}.{sid}")), mac)
        live = -_CLOCK_SLACK_S <= self._clock() - int(issued) <= SESSION_TTL_S
        return (sid, int(issued)) if signed and live and sid not in self._ended else None

    def lets_in(self, request: Request) -> bool:
        """Whether the request carries the token, as a bearer token or through a session."""
        return self.bearer(request) or self.session_of(request) is not None

    def new_session(self, request: Request) -> str:
        """The ``Set-Cookie`` value of a new session (a new session id), for a login with the token."""
        issued, sid = str(int(self._clock())), secrets.token_urlsafe(16)
        value = f"{issued}.{sid}.{_b64(self._mac('session', f'{issued}.{sid}'))}"
        return cookie_header(request, SESSION_COOKIE, value, SESSION_TTL_S)

    def end_session(self, request: Request) -> str:
        """Log the request's session out; returns the ``Set-Cookie`` value that deletes the cookie."""
        now = self._clock()
        for sid, issued in [*self._ended.items()]:
            if now - issued > SESSION_TTL_S + _CLOCK_SLACK_S:
                del self._ended[sid]
        for value in request.cookies(SESSION_COOKIE):
            session = self._session(value)
            if session is not None:
                self._ended[session[0]] = session[1]
        return cookie_header(request, SESSION_COOKIE, "", 0)

    def csrf_token(self, sid: str) -> str:
        """The CSRF token of the forms of session ``sid``."""
        return _b64(self._mac("csrf", sid))

    def csrf_refusal(self, request: Request, form: Mapping[str, str]) -> str | None:
        """Why a POST of a request that :meth:`lets_in` is refused (a 403), or ``None``: it has a
        session whose CSRF token the form lacks. A bearer token needs no CSRF token: a browser never
        sends one by itself."""
        if self.bearer(request):
            return None
        sid = self.session_of(request)
        if sid is None:
            return "no session (log in again)"
        sent = form.get(CSRF_FIELD, "")
        if not hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), self.csrf_token(sid).encode("ascii")):
            return "a CSRF token that is not this session's (load the page again)"
        return None
