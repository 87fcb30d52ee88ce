"""Sign-in, the session cookie and CSRF protection of the dashboard.

- Signing in with an API token makes a session: a random id (`secrets.token_urlsafe`, 256 bits) that the
  server maps to the token's hash, in memory. The cookie holds only that id, never the token, so a cookie that
  leaks (a proxy's log, a shared browser profile) is not an API token: it is refused as a bearer token, dies
  at sign-out, after `SESSION_IDLE_S` unused or `SESSION_MAX_S` in all, and with the server process (a
  restart signs browsers out; sessions are kept out of the store, so a backup of it holds none). Every request
  checks the session's token as an API call checks a bearer token, so revoking the token ends its sessions.
- The cookie is `HttpOnly; SameSite=Strict`, scoped to the dashboard's path, and `Secure` over HTTPS: scripts
  cannot read it, other sites cannot send it, it never appears in a URL.
- Every POST carries a CSRF token, an HMAC of the session id under a key kept in the store, sent as the
  `X-CSRF-Token` header (htmx) or a `csrf` form field, and must come from our own origin (`Origin`, else
  `Referer`, matches the host the browser addressed). The sign-in form, made before any session, is
  protected by a double-submit nonce and the same origin check.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from gpufleet.domain.errors import GpufleetError
from gpufleet.ports.admin import AdminStore
from gpufleet.server.auth import Principal

SESSION_COOKIE = "gpufleet_session"
SIGNIN_COOKIE = "gpufleet_signin"
CSRF_HEADER = "x-csrf-token"
CSRF_KEY_SETTING = "web:csrf_key"


SIGN_IN_REASONS = {
    "ended": "Your session has ended (signed out, unused for a while, or the server restarted): sign in again.",
    "revoked": "Your token is no longer valid (unknown or revoked): sign in with a valid one.",
    "metrics": "A metrics token only reads /metrics: sign in with a team or admin token.",
    "team-refused": "This control plane refuses team tokens: it runs every job as its own user, so teams are not "
    "kept apart (start it as root, or with --single-user if every team may read every other's jobs). Sign in "
    "with an admin token.",
}


class SignInRequiredError(Exception):
    """No session cookie, or one whose token is unknown, revoked or refused: the browser goes to the sign-in page.
    `reason` is a key of `SIGN_IN_REASONS` (the sign-in page shows only those texts, never one from a URL)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.message = reason


class CsrfError(GpufleetError):
    """A POST without our CSRF token or from another origin (403)."""


SESSION_IDLE_S = 8 * 3600.0  # a session unused this long is gone
SESSION_MAX_S = 7 * 86400.0  # and any session after this long, used or not
MAX_SESSIONS = 10_000  # beyond this many, signing in drops the least recently used


@dataclass(slots=True)
class _Stored:
    secret_hash: str  # the token's, as the store keeps it: the secret itself is never held
    created: float
    used: float


class WebSessions:
    """The dashboard's sessions: id -> the token it was opened with. Ids are kept as their SHA-256, so this
    map, seen in a memory dump, opens no session either."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_id: dict[str, _Stored] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(session_id: str) -> str:
        return hashlib.sha256(session_id.encode()).hexdigest()

    def open(self, secret_hash: str) -> str:
        """A new session for the token with this hash; returns its id (the cookie's value)."""
        session_id = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._expire(now)
            if len(self._by_id) >= MAX_SESSIONS:
                oldest = min(self._by_id, key=lambda key: self._by_id[key].used)
                del self._by_id[oldest]
            self._by_id[self._key(session_id)] = _Stored(secret_hash, now, now)
        return session_id

    def token_hash(self, session_id: str) -> str | None:
        """The hash of the session's token, or None for an unknown, closed or expired session."""
        now = self._clock()
        key = self._key(session_id)
        with self._lock:
            stored = self._by_id.get(key)
            if stored is None:
                return None
            if now - stored.used > SESSION_IDLE_S or now - stored.created > SESSION_MAX_S:
                del self._by_id[key]
                return None
            stored.used = now
            return stored.secret_hash

    def close(self, session_id: str) -> None:
        with self._lock:
            self._by_id.pop(self._key(session_id), None)

    def close_token(self, secret_hash: str) -> int:
        """End every session of a token (it was revoked or refused); returns how many there were."""
        with self._lock:
            keys = [key for key, stored in self._by_id.items() if stored.secret_hash == secret_hash]
            for key in keys:
                del self._by_id[key]
        return len(keys)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)

    def _expire(self, now: float) -> None:
        dead = [
            key
            for key, stored in self._by_id.items()
            if now - stored.used > SESSION_IDLE_S or now - stored.created > SESSION_MAX_S
        ]
        for key in dead:
            del self._by_id[key]


@dataclass(frozen=True, slots=True)
class WebSession:
    principal: Principal
    csrf: str
    id: str = ""

    @property
    def admin(self) -> bool:
        return self.principal.admin


class CsrfKeys:
    """The HMAC key of CSRF tokens: made once, kept in the store so tokens survive a restart."""

    def __init__(self, store: AdminStore) -> None:
        self._store = store
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def key(self) -> bytes:
        with self._lock:
            if self._key is None:
                stored = self._store.get_setting(CSRF_KEY_SETTING)
                if not stored:
                    stored = secrets.token_hex(32)
                    self._store.set_setting(CSRF_KEY_SETTING, stored)
                self._key = bytes.fromhex(stored)
            return self._key

    def token_for(self, session_id: str) -> str:
        """Bound to the session, so a form of a session that ended is refused in the next one."""
        return hmac.new(self.key(), session_id.encode(), hashlib.sha256).hexdigest()


def secure_request(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto.split(",")[0].strip().lower() == "https"


def cookie_path(request: Request) -> str:
    return (request.scope.get("root_path") or "") + "/"


def _addressed_host(request: Request) -> str:
    forwarded = request.headers.get("x-forwarded-host")
    host = forwarded.split(",")[0].strip() if forwarded else request.headers.get("host", "")
    return host.lower()


def check_origin(request: Request) -> None:
    """Refuse a state-changing request that a page of another origin made the browser send."""
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if referer is None:
            return  # not a browser's cross-site request (browsers send Origin on POST); the CSRF token decides
        origin = referer
    if origin == "null" or urlsplit(origin).netloc.lower() != _addressed_host(request):
        raise CsrfError(
            f"this request came from {origin!r}, not from this dashboard",
            "use the dashboard's own pages; behind a proxy, forward the Host header (or X-Forwarded-Host)",
        )


def check_csrf(request: Request, expected: str, given: str | None) -> None:
    check_origin(request)
    sent = request.headers.get(CSRF_HEADER) or given or ""
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise CsrfError(
            "the form's security token is missing or out of date",
            "reload the page and try again",
        )
