"""The HTTP API: `create_app(ctx)` builds the FastAPI application the `up` process serves.

Routers are thin (`routes_jobs`, `routes_admin`); rules live in `service.Service`. Every error is JSON
`{code, message, fields}`; user mistakes are 4xx, never 500.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpufleet import __version__
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
from gpufleet.server.body_limit import BodyLimit
from gpufleet.server.context import ApiContext
from gpufleet.server.http_errors import ConflictError, ForbiddenError, UnauthorizedError, UnavailableError
from gpufleet.server.limits import MAX_BODY_BYTES
from gpufleet.server.ratelimit import RateLimitedError
from gpufleet.server.schemas import ErrorOut, HealthOut, IsolationOut
from gpufleet.server.service import Service
from gpufleet.server.spec import JobSpec, problems_from_errors

log = logging.getLogger("gpufleet.api")

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


def _known_fields(request: Request) -> tuple[str, ...]:
    # Unknown-field hints need the body model's field names; only the job spec has many to confuse.
    return tuple(JobSpec.model_fields) if request.url.path.rstrip("/") == "/v1/jobs" else ()


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


def create_app(ctx: ApiContext) -> FastAPI:
    from gpufleet.server import (
        routes_admin,
        routes_config,
        routes_cost,
        routes_jobs,
        routes_progress,
        routes_telemetry,
        routes_verbs,
    )
    from gpufleet.server.job_tokens import JobTokens
    from gpufleet.server.progress_reports import ProgressService
    from gpufleet.server.web import mount_web

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        description="The control plane of a shared GPU fleet: jobs, queues with quotas, nodes and tokens.",
        responses={422: ERRORS[422]},
    )
    app.state.service = Service(ctx)
    app.state.ctx = ctx
    app.state.progress = ProgressService(ctx.store, ctx.clock, JobTokens(ctx.store))
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.exception_handler(GpufleetError)
    async def _gpufleet_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, GpufleetError)
        status, code = error_status(error)
        fields = error.fields if isinstance(error, SpecError) else ()
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(error, RateLimitedError):
            headers = {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
        return JSONResponse(error_body(code, str(error), fields), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        errors = list(error.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid")
            where = detail.get("ctx", {}).get("error", "")
            message = f"the request body is not valid JSON ({where}); to fix: send a JSON object"
            return JSONResponse(error_body("malformed_json", message), status_code=422)
        # FastAPI locations start with where the value came from (body, query, path); keep it for
        # query and path values, drop it for the body, whose fields are the spec's own names.
        problems: list[FieldProblem] = []
        for item in errors:
            loc = tuple(item.get("loc", ()))
            strip = 1 if loc[:1] == ("body",) else 0
            problems.extend(problems_from_errors([item], _known_fields(request), strip=strip))
        listed = "; ".join(str(p) for p in problems)
        return JSONResponse(error_body("invalid", f"invalid request: {listed}", problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        codes = {
            404: "not_found",
            405: "method_not_allowed",
            401: "unauthorized",
            403: "forbidden",
            413: "body_too_large",
        }
        fixes = {
            400: "send a JSON object no deeper than a job spec needs",  # a body FastAPI could not even parse
            404: "see /docs for the API's paths",
            405: "see /docs for the methods this path takes",
        }
        message = str(error.detail)
        if error.status_code in fixes:
            message = f"{message}; to fix: {fixes[error.status_code]}"
        return JSONResponse(
            error_body(codes.get(error.status_code, "http_error"), message),
            status_code=error.status_code,
            headers=getattr(error, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, error: Exception) -> JSONResponse:  # pragma: no cover - bugs only
        log.exception("unexpected error in the API", exc_info=error)
        message = f"internal error ({error.__class__.__name__}); to fix: this is a gpufleet bug, please report it"
        return JSONResponse(error_body("internal_error", message), status_code=500)

    @app.get("/healthz", tags=["health"], response_model_exclude_none=True)
    def healthz(request: Request) -> HealthOut:
        """Liveness (`{"status": "ok"}`), which needs no token. With an admin token also how jobs are isolated
        from each other and from the control plane, and whether /metrics needs a token: details that would
        help an attacker, so nobody else gets them."""
        who = health_reader(app.state.service, request)
        if who is None or not who.admin:
            return HealthOut()
        return HealthOut(isolation=isolation_out(ctx), metrics="token" if ctx.metrics_need_token else "public")

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if ctx.metrics_need_token:
            metrics_reader(app.state.service, request)
        if ctx.metrics is None:
            return JSONResponse(error_body("not_found", "metrics are not enabled"), status_code=404)
        body, content_type = ctx.metrics()
        return Response(body, media_type=content_type)

    app.include_router(routes_verbs.router, prefix="/v1", responses=ERRORS)  # before /jobs/{id}: not job ids
    app.include_router(routes_config.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_jobs.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_admin.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_telemetry.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_progress.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_cost.router, prefix="/v1", responses=ERRORS)
    mount_web(app)  # the dashboard at `/`, over the same service
    return app
