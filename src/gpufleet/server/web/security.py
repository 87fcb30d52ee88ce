"""Sign-in, the session cookie and CSRF protection of the dashboard.

- The session is the API token itself, in an `HttpOnly; SameSite=Strict` cookie scoped to the dashboard's
  path (and `Secure` over HTTPS): scripts cannot read it, other sites cannot send it, it never appears in a
  URL. Every request authenticates it like an API call (revoking the token signs the browser out).
- Every POST carries a CSRF token, an HMAC of the token's hash under a key kept in the store, sent as the
  `X-CSRF-Token` header (htmx) or a `csrf` form field, and must come from our own origin (`Origin`, else
  `Referer`, matches the host the browser addressed). The sign-in form, made before any session, is
  protected by a double-submit nonce and the same origin check.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from gpufleet.domain.errors import GpufleetError
from gpufleet.ports.admin import AdminStore
from gpufleet.server.auth import Principal

SESSION_COOKIE = "gpufleet_session"
SIGNIN_COOKIE = "gpufleet_signin"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
CSRF_KEY_SETTING = "web:csrf_key"


SIGN_IN_REASONS = {
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


@dataclass(frozen=True, slots=True)
class WebSession:
    principal: Principal
    csrf: str

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

    def token_for(self, principal: Principal) -> str:
        return hmac.new(self.key(), principal.token.secret_hash.encode(), hashlib.sha256).hexdigest()


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
