"""Signing in with an API token (which opens a server-side session) and signing out (which ends it)."""

from __future__ import annotations

import hmac
import re
import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from gpufleet.ports.admin import Role
from gpufleet.server.http_errors import TeamTokenRefusedError, UnauthorizedError
from gpufleet.server.request_deps import authenticate
from gpufleet.server.web.common import (
    WebRoute,
    prefix_of,
    render,
    service_of,
    url_for,
    web_session,
    web_sessions,
)
from gpufleet.server.web.security import (
    SESSION_COOKIE,
    SIGN_IN_REASONS,
    SIGNIN_COOKIE,
    CsrfError,
    SignInRequiredError,
    WebSession,
    check_csrf,
    check_origin,
    cookie_path,
    secure_request,
)

router = APIRouter(route_class=WebRoute, include_in_schema=False)

SIGNIN_NONCE_S = 1800  # how long a sign-in form stays usable
_OWN_PATH = re.compile(r"(/[A-Za-z0-9._~:-]+)*/?")


def _safe_next(next_path: str | None) -> str:
    """Where to go after signing in: one of our own paths only (never another site)."""
    if not next_path or not next_path.startswith("/") or next_path.startswith("//"):
        return "/"
    path, _, _query = next_path.partition("?")
    return path if _OWN_PATH.fullmatch(path) else "/"


def _signin_form(
    request: Request, next_path: str, error: str | None = None, notice: str | None = None, status_code: int = 200
) -> Response:
    nonce = secrets.token_urlsafe(24)
    response = render(
        request,
        "signin.html",
        None,
        status_code=status_code,
        title="Sign in",
        page="signin",
        nonce=nonce,
        next_path=next_path,
        error=error,
        notice=notice,
    )
    response.set_cookie(
        SIGNIN_COOKIE,
        nonce,
        max_age=SIGNIN_NONCE_S,
        path=cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=secure_request(request),
    )
    return response


@router.get("/signin")
def signin_page(
    request: Request,
    next: Annotated[str | None, Query(max_length=2000)] = None,
    why: Annotated[str | None, Query(max_length=20)] = None,
) -> Response:
    target = _safe_next(next)
    try:
        web_session(request)
    except SignInRequiredError:
        return _signin_form(request, target, notice=SIGN_IN_REASONS.get(why or ""))
    return RedirectResponse(prefix_of(request) + target, status_code=303)


@router.post("/signin")
def signin(
    request: Request,
    token: Annotated[str, Form(max_length=500)] = "",
    nonce: Annotated[str, Form(max_length=100)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    target = _safe_next(next)
    check_origin(request)
    expected = request.cookies.get(SIGNIN_COOKIE, "")
    if not expected or not hmac.compare_digest(expected.encode(), nonce.encode()):
        raise CsrfError("this sign-in form is out of date", "reload the sign-in page and sign in again")
    secret = token.strip()
    if not secret:
        error = "no token given; to fix: paste your API token (gf_…)"
        return _signin_form(request, target, error=error, status_code=401)
    try:
        who = authenticate(service_of(request), request, f"Bearer {secret}")
    except UnauthorizedError as error:
        return _signin_form(request, target, error=f"{error.message}; to fix: {error.fix}", status_code=401)
    except TeamTokenRefusedError as error:
        return _signin_form(request, target, error=f"{error.message}; to fix: {error.fix}", status_code=403)
    if who.token.role is Role.METRICS:
        refused = "a metrics token only reads /metrics; to fix: sign in with a team or admin token"
        return _signin_form(request, target, error=refused, status_code=403)
    sessions = web_sessions(request)
    previous = request.cookies.get(SESSION_COOKIE)
    if previous:  # signing in again (another token) ends the browser's earlier session
        sessions.close(previous)
    session_id = sessions.open(who.token.secret_hash)
    response = RedirectResponse(prefix_of(request) + target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        path=cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=secure_request(request),
    )
    response.delete_cookie(SIGNIN_COOKIE, path=cookie_path(request))
    return response


@router.post("/signout")
def signout(
    request: Request,
    session: Annotated[WebSession, Depends(web_session)],
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    check_csrf(request, session.csrf, csrf)
    web_sessions(request).close(session.id)
    response = RedirectResponse(url_for(request, "/signin"), status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))
    return response
