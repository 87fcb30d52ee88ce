"""What every route and page depends on: the service, the caller's principal (bearer token, rate limits),
the error each of our exceptions maps to, and the isolation report's API shape. Routes, pages and the app
import it; it imports none of them (the app builds on the routes, never the other way round)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpufleet.adapters.storage.sql_engine import StoreFullError, StoreUnavailableError
from gpufleet.domain.errors import (
    FieldProblem,
    GpufleetError,
    InvalidTransitionError,
    LimitError,
    SpecError,
    UnknownNameError,
    WorkloadError,
)
from gpufleet.ports.admin import Role
from gpufleet.server.auth import Principal
from gpufleet.server.context import ApiContext
from gpufleet.server.http_errors import ConflictError, ForbiddenError, UnauthorizedError, UnavailableError
from gpufleet.server.ratelimit import RateLimitedError
from gpufleet.server.schemas import ErrorOut, IsolationOut
from gpufleet.server.service import Service

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="`Authorization: Bearer gf_…` (printed by `gpufleet up`, or made by `gpufleet token create`).",
)

# Error responses every authenticated route may give, for the OpenAPI document.
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "No token, or an unknown or revoked one"},
    403: {"model": ErrorOut, "description": "The token may not do this"},
    404: {"model": ErrorOut, "description": "Unknown job, queue, node or token"},
    409: {"model": ErrorOut, "description": "Conflicts with the current state, or a limit an admin set"},
    413: {"model": ErrorOut, "description": "The request body is larger than the API accepts"},
    422: {"model": ErrorOut, "description": "Invalid input; every bad field named with a fix"},
    429: {"model": ErrorOut, "description": "Too many requests for this token; retry after Retry-After seconds"},
}


async def service(request: Request) -> Service:  # async: cheap, no worker-thread hop per request
    svc: Service = request.app.state.service
    return svc


async def principal(  # async: tokens are cached; a miss is one indexed read
    request: Request,
    svc: Annotated[Service, Depends(service)],
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> Principal:
    who = authenticate(svc, request)
    if who.token.role is Role.METRICS:
        raise ForbiddenError(
            f"token {who.token.name!r} is a metrics token: it may only scrape /metrics",
            "use a team or admin token for the API",
        )
    return who


def authenticate(
    svc: Service, request: Request, authorization: str | None = None, *, secret_hash: str | None = None
) -> Principal:
    """The caller's principal (from `authorization`, a dashboard session's `secret_hash`, or the request's
    header), within its token's rate limit (429 beyond it; failed attempts are limited per address)."""
    address = client_address(request)
    try:
        if secret_hash is not None:
            who = svc.auth.authenticate_hash(secret_hash, address)
        else:
            who = svc.auth.authenticate(authorization or request.headers.get("authorization"), address)
    except UnauthorizedError:
        svc.limits.check_failed_auth(address)
        raise
    svc.limits.check_token(who.token.id, who.token.name, who.token.role)
    return who


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


METRICS_FIX = (
    "create one with `gpufleet token create prometheus --role metrics` and give it to Prometheus (scrape config: "
    "`authorization: {type: Bearer, credentials_file: FILE}`), or start `gpufleet up --public-metrics`"
)


def metrics_reader(svc: Service, request: Request) -> Principal:
    """Who may scrape /metrics: a metrics or admin token. Its series name every queue's jobs, so neither a team
    token nor a job's own token (`gfj_…`, which is no API token) reads them, and on loopback neither does a
    job running on this host."""
    authorization = request.headers.get("authorization")
    if not authorization:
        raise UnauthorizedError(
            "/metrics needs a metrics or admin token: its series name jobs, queues and hosts", METRICS_FIX
        )
    who = authenticate(svc, request)
    if who.token.role is Role.TEAM:
        raise ForbiddenError(
            f"token {who.token.name!r} is a team token, which may not read every queue's metrics",
            "scrape with a metrics token (`gpufleet token create prometheus --role metrics`)",
        )
    return who


def health_reader(svc: Service, request: Request) -> Principal | None:
    """Who asks /healthz: None without a token (liveness only); an invalid token is refused, as elsewhere."""
    if not request.headers.get("authorization"):
        return None
    return authenticate(svc, request)


def error_status(error: GpufleetError) -> tuple[int, str]:
    if isinstance(error, StoreFullError):
        return 503, "disk_full"
    if isinstance(error, RateLimitedError):
        return 429, "rate_limited"
    if isinstance(error, StoreUnavailableError):
        return 503, "store_unavailable"
    if isinstance(error, UnavailableError):
        return 503, "unavailable"
    if isinstance(error, UnauthorizedError):
        return 401, "unauthorized"
    if isinstance(error, ForbiddenError):
        return 403, "forbidden"
    if isinstance(error, UnknownNameError):
        return 404, "not_found"
    if isinstance(error, (ConflictError, InvalidTransitionError)):
        return 409, "conflict"
    if isinstance(error, LimitError):
        return 409, "limit_reached"
    if isinstance(error, (SpecError, WorkloadError)):
        return 422, "invalid"
    return 400, "bad_request"


def error_body(code: str, message: str, fields: tuple[FieldProblem, ...] | list[FieldProblem] = ()) -> dict[str, Any]:
    return ErrorOut(
        code=code,
        message=message,
        fields=[{"field": f.field, "problem": f.problem, "fix": f.fix} for f in fields],  # type: ignore[misc]
    ).model_dump()


def isolation_out(ctx: ApiContext) -> IsolationOut | None:
    report = ctx.isolation
    if report is None:
        return None
    return IsolationOut(
        users=report.users,
        cgroups=report.cgroups,
        single_trust_domain=report.single_trust_domain,
        team_tokens=ctx.team_tokens_refused is None,
        notes=list(report.notes),
    )
