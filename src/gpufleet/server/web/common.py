"""What every dashboard page shares: templates, the signed-in session, links under the path prefix, HTML
error pages and the security headers of every answer."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from markupsafe import Markup

from gpufleet.domain.costs import gpu_hours_text
from gpufleet.domain.errors import GpufleetError
from gpufleet.ports.admin import Role
from gpufleet.server.http_errors import TeamTokenRefusedError, UnauthorizedError
from gpufleet.server.request_deps import authenticate, error_status
from gpufleet.server.service import Service
from gpufleet.server.web.security import (
    SESSION_COOKIE,
    CsrfError,
    CsrfKeys,
    SignInRequiredError,
    WebSession,
    WebSessions,
    cookie_path,
)

log = logging.getLogger("gpufleet.web")

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
TEMPLATES_DIR = HERE / "templates"

# Scripts and styles only from our own files (no inline code, no eval): htmx runs with allowEval off.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _asset_versions() -> dict[str, str]:
    """A content hash per static file, put in asset URLs so a new release is never served from cache."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:10] for path in STATIC_DIR.iterdir() if path.is_file()
    }


ASSET_VERSIONS = _asset_versions()


# ------------------------------------------------------------------------------------------- formatting


def duration(seconds: float | None) -> str:
    """People's durations: 42 s, 3 min 05 s, 2 h 07 min, 3 d 04 h."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def isotime(at: float | None) -> str:
    if at is None:
        return "–"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def size(value: float | None) -> str:
    """Bytes in binary units: 512 MiB, 80 GiB."""
    if value is None:
        return "–"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" or amount >= 100 else f"{amount:.3g} {unit}"
        amount /= 1024
    return f"{amount:.3g} TiB"  # pragma: no cover - the loop returns at TiB


def number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "–"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".")


def script_json(value: Any) -> Markup:
    """JSON to embed in `<script type="application/json">`: `<`, `>` and `&` escaped, so no text from a job or
    an uploaded file can end the element."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} %"


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)
_env.filters.update(
    duration=duration,
    isotime=isotime,
    size=size,
    number=number,
    percent=percent,
    script_json=script_json,
    gpu_hours=gpu_hours_text,
)


def compile_templates() -> None:
    """Compile every template once, at start, so no visitor's first page pays for it."""
    for name in _env.list_templates(extensions=["html"]):
        _env.get_template(name)


# ------------------------------------------------------------------------------------------------ links


def prefix_of(request: Request) -> str:
    return str(request.scope.get("root_path") or "")


def url_for(request: Request, path: str, query: Mapping[str, Any] | None = None) -> str:
    """A link to one of our paths (starting with `/`), under the prefix the request came through."""
    link = prefix_of(request) + path
    kept = {k: v for k, v in (query or {}).items() if v not in (None, "", [])}
    return f"{link}?{urlencode(kept, doseq=True)}" if kept else link


def static_url(request: Request, name: str) -> str:
    return url_for(request, f"/static/{name}", {"v": ASSET_VERSIONS.get(name, "")})


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


# --------------------------------------------------------------------------------------------- sessions


def service_of(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


def csrf_keys(request: Request) -> CsrfKeys:
    keys: CsrfKeys = request.app.state.web_csrf
    return keys


def web_sessions(request: Request) -> WebSessions:
    sessions: WebSessions = request.app.state.web_sessions
    return sessions


def web_session(request: Request) -> WebSession:
    """The signed-in browser: its cookie's session id, whose token is checked as an API call checks a bearer
    token (a revoked or refused token ends the session)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id:
        raise SignInRequiredError()
    sessions = web_sessions(request)
    secret_hash = sessions.token_hash(session_id)
    if secret_hash is None:  # signed out, expired, or from before a restart: sign in again, nothing to explain
        raise SignInRequiredError("ended")
    try:
        principal = authenticate(service_of(request), request, secret_hash=secret_hash)
    except UnauthorizedError:
        sessions.close_token(secret_hash)
        raise SignInRequiredError("revoked") from None
    except TeamTokenRefusedError:  # the same rule as the API's (--single-user); the session ends
        sessions.close_token(secret_hash)
        raise SignInRequiredError("team-refused") from None
    if principal.token.role is Role.METRICS:  # sign-in refuses these; kept in case a token's role ever changes
        sessions.close(session_id)
        raise SignInRequiredError("metrics")
    return WebSession(principal, csrf_keys(request).token_for(session_id), session_id)


# ------------------------------------------------------------------------------------------- rendering


def render(
    request: Request,
    template: str,
    session: WebSession | None,
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    **values: Any,
) -> HTMLResponse:
    """A page, or only its live part when htmx asks for it (`HX-Request`), so polling stays cheap."""
    svc = service_of(request)
    ctx = svc.ctx
    context: dict[str, Any] = {
        "request": request,
        "session": session,
        "page": "",
        "prefix": prefix_of(request),
        "fragment": is_htmx(request),
        "emulated": ctx.emulated,
        "inventory_source": ctx.inventory_source,
        "now": ctx.clock.now(),
        "url": lambda target, /, **query: url_for(request, target, query),
        "static": lambda name: static_url(request, name),
        "self_url": url_for(request, request.url.path.removeprefix(prefix_of(request)) or "/", request.query_params),
        **values,
    }
    body = _env.get_template(template).render(context)
    return HTMLResponse(body, status_code=status_code, headers=dict(headers or {}))


def error_page(request: Request, status: int, message: str, fix: str, session: WebSession | None) -> HTMLResponse:
    return render(request, "error.html", session, status_code=status, title=f"Error {status}", message=message, fix=fix)


def sign_in_redirect(request: Request, message: str = "") -> Response:
    target = url_for(
        request,
        "/signin",
        {"next": request.url.path.removeprefix(prefix_of(request)) or "/", "why": message or None},
    )
    if is_htmx(request):
        # A poll whose session ended: htmx would swap the sign-in page into the table; send the page there.
        response: Response = Response(status_code=200, headers={"HX-Redirect": target})
    else:
        response = RedirectResponse(target, status_code=303)
    if message:
        response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))
    return response


class WebRoute(APIRoute):
    """A dashboard route: user mistakes become HTML pages (not the API's JSON), a missing or dead session
    goes to the sign-in page, and every answer carries the security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            started = time.perf_counter()
            try:
                response = await handler(request)
            except SignInRequiredError as signin:
                response = sign_in_redirect(request, signin.message)
            except GpufleetError as error:
                status = 403 if isinstance(error, CsrfError) else error_status(error)[0]
                session = _quiet_session(request)
                response = error_page(request, status, error.message, error.fix, session)
            except RequestValidationError as error:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ())[1:])}: {e.get('msg', '')}" for e in error.errors()
                )
                response = error_page(
                    request, 400, f"the address is not valid ({problems})", "use the dashboard's links", None
                )
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            # What the server spent on the page (browsers' developer tools show it; `bench web` reads it).
            response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
            return response

        return run


def _quiet_session(request: Request) -> WebSession | None:
    try:
        return web_session(request)
    except (SignInRequiredError, GpufleetError):
        return None
