"""The HTTP API: `create_app(ctx)` builds the FastAPI application the `up` process serves.

Routers are thin (`routes_jobs`, `routes_admin`); rules live in `service.Service`. Every error is JSON
`{code, message, fields}`; user mistakes are 4xx, never 500.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpufleet import __version__
from gpufleet.adapters.storage.engine import StoreFullError, StoreUnavailableError
from gpufleet.domain.errors import (
    FieldProblem,
    GpufleetError,
    InvalidTransitionError,
    SpecError,
    UnknownNameError,
    WorkloadError,
)
from gpufleet.server.auth import Principal
from gpufleet.server.context import ApiContext
from gpufleet.server.errors import ConflictError, ForbiddenError, UnauthorizedError, UnavailableError
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
    409: {"model": ErrorOut, "description": "Conflicts with the current state"},
    422: {"model": ErrorOut, "description": "Invalid input; every bad field named with a fix"},
}


async def service(request: Request) -> Service:  # async: cheap, no worker-thread hop per request
    svc: Service = request.app.state.service
    return svc


async def principal(  # async: tokens are cached; a miss is one indexed read
    request: Request,
    svc: Annotated[Service, Depends(service)],
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> Principal:
    return svc.auth.authenticate(request.headers.get("authorization"))


def error_status(error: GpufleetError) -> tuple[int, str]:
    if isinstance(error, StoreFullError):
        return 503, "disk_full"
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
    from gpufleet.server import routes_admin, routes_jobs, routes_telemetry

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        description="The control plane of a shared GPU fleet: jobs, queues with quotas, nodes and tokens.",
        responses={422: ERRORS[422]},
    )
    app.state.service = Service(ctx)
    app.state.ctx = ctx

    @app.exception_handler(GpufleetError)
    async def _gpufleet_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, GpufleetError)
        status, code = error_status(error)
        fields = error.fields if isinstance(error, SpecError) else ()
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
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
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 403: "forbidden"}
        fixes = {404: "see /docs for the API's paths", 405: "see /docs for the methods this path takes"}
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

    @app.get("/healthz", tags=["health"])
    def healthz() -> HealthOut:
        """Liveness, and how jobs are isolated from each other and from the control plane; needs no token."""
        return HealthOut(isolation=isolation_out(ctx))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        if ctx.metrics is None:
            return JSONResponse(error_body("not_found", "metrics are not enabled"), status_code=404)
        body, content_type = ctx.metrics()
        return Response(body, media_type=content_type)

    app.include_router(routes_jobs.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_admin.router, prefix="/v1", responses=ERRORS)
    app.include_router(routes_telemetry.router, prefix="/v1", responses=ERRORS)
    return app
