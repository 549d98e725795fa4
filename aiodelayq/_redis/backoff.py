"""The backoff of a loop that tries again after Redis failures, and what its log says while they last.

Every retrying loop paces itself with one :class:`Backoff`, so a restarted server is found within
about 2 s and a down one sees at most a few commands a second.

The log of one streak of failures (until the next success): a first failure a reconnect usually mends
is DEBUG; another first failure is one WARNING, then one every :data:`SUMMARY_EVERY_S`; a refusal the
server repeats to every try is ERROR at most every :data:`REFUSAL_EVERY_S`; the success ending a
streak logged above DEBUG is one INFO. No tracebacks: these are the server's failures.
"""

from __future__ import annotations

import asyncio
import logging
import math

from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ResponseError

from ..exceptions import NotReplicatedError
from .connections import is_permanent

__all__ = ["REFUSAL_EVERY_S", "RETRY_BACKOFF", "SUMMARY_EVERY_S", "Backoff", "is_refusal", "may_resend"]

log = logging.getLogger("aiodelayq")

# Delay before the n-th retry after a Redis error: full jitter, 50 ms doubling up to 2 s.
RETRY_BACKOFF = ExponentialWithJitterBackoff(cap=2.0, base=0.05)
# A streak of failures logs one line when it starts, then one summary line this often (seconds).
SUMMARY_EVERY_S = 300.0
# A refusal the server repeats is logged at ERROR at most this often (seconds).
REFUSAL_EVERY_S = 60.0
# 2**n overflows a float near n = 1,024; past 32 doublings every pause is the cap anyway.
_MAX_DOUBLINGS = 32
# Error replies that say "not now" rather than "never": retried at the same pace, logged as outages.
_TRANSIENT_REPLIES = ("BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")


def may_resend(exc: BaseException) -> bool:
    """Whether a failed call may be tried again: not refused, not permanent, and not an unconfirmed
    durable write (it waited ``replication_timeout_s`` already: the caller decides)."""
    return (not is_permanent(exc) and not isinstance(exc.__cause__, ResponseError)
            and not isinstance(exc, NotReplicatedError))


def is_refusal(exc: BaseException) -> bool:
    """Whether the server refused the call in a way it repeats to every try until someone acts (a
    permanent error, or an error reply other than "busy, try again")."""
    if is_permanent(exc):
        return True
    cause = exc.__cause__
    return isinstance(cause, ResponseError) and not str(cause).startswith(_TRANSIENT_REPLIES)


def _duration(seconds: float) -> str:
    """``seconds`` for a log line: ``"42 s"``, ``"12 min 5 s"``, ``"2 h 3 min"``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


class Backoff:
    """One loop's streak of failures: the pause before its next try, and its log lines (see the
    module docstring). ``what`` names the loop's call in them (``"transfer for 'orders'"``).

    A loop calls :meth:`failed` after each failure (it logs and returns the pause) and
    :meth:`succeeded` after each success. Times are the running event loop's.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0
        self._since = 0.0  # loop time of the streak's first failure
        self._logged_at = -math.inf  # loop time of the streak's last line above DEBUG
        self._logged_level = logging.NOTSET  # the highest level of the streak's lines

    def __repr__(self) -> str:
        return f"<Backoff {self.what} failures={self.failures}>"

    def pause_s(self) -> float:
        """The pause before the next try after the failures counted (seconds, at most the cap)."""
        return RETRY_BACKOFF.compute(min(self.failures, _MAX_DOUBLINGS))

    def count(self) -> float:
        """Count a failure without logging it; returns the pause before the next try (seconds)."""
        if self.failures == 0:
            self._since = asyncio.get_running_loop().time()
            self._logged_at, self._logged_level = -math.inf, logging.NOTSET
        self.failures += 1
        return self.pause_s()

    def level(self, exc: BaseException) -> int:
        """The level the failure just counted is logged at: DEBUG unless its streak is due a line."""
        if is_refusal(exc):
            wanted, every_s = logging.ERROR, REFUSAL_EVERY_S
        elif self.failures <= 1 and may_resend(exc):
            return logging.DEBUG
        else:
            wanted, every_s = logging.WARNING, SUMMARY_EVERY_S
        now = asyncio.get_running_loop().time()
        return wanted if wanted > self._logged_level or now - self._logged_at >= every_s else logging.DEBUG

    def failed(self, exc: BaseException, *, advice: str = "", quiet: bool = False) -> float:
        """Count the failure ``exc`` and log it as its streak is due (``quiet``: at DEBUG, for a
        caller that reports it itself); returns the pause before the next try (seconds).
        ``advice``: what to do about it, appended to its line."""
        pause = self.count()
        self.report(exc, pause, advice=advice, quiet=quiet)
        return pause

    def report(self, exc: BaseException, pause: float, *, advice: str = "", quiet: bool = False) -> None:
        """Log the failure just counted (:meth:`count`), as :meth:`failed` does."""
        level = logging.DEBUG if quiet else self.level(exc)
        tail = f"; {advice}" if advice else ""
        if level > logging.DEBUG and self._logged_level > logging.DEBUG:
            log.log(level, "%s still failing after %d attempts over %s: %s%s", self.what, self.failures,
                    self._elapsed(), exc, tail)
        else:
            log.log(level, "%s failed (%s)%s; retrying in %.2f s", self.what, exc, tail, pause)
        if level > logging.DEBUG:
            self._logged_at = asyncio.get_running_loop().time()
            self._logged_level = max(self._logged_level, level)

    @property
    def reported(self) -> bool:
        """Whether the current streak was logged above DEBUG."""
        return self.failures > 0 and self._logged_level > logging.DEBUG

    def succeeded(self) -> None:
        """A success: ends the streak (one INFO line if it was logged above DEBUG)."""
        if self.failures:
            log.log(logging.INFO if self.reported else logging.DEBUG,
                    "%s works again after %d failed attempt(s) over %s", self.what, self.failures,
                    self._elapsed())
        self.failures = 0

    def _elapsed(self) -> str:
        return _duration(asyncio.get_running_loop().time() - self._since)

