"""The HTTP API: `create_app(ctx)` builds the FastAPI application the `up` process serves.

Routers are thin (`routes_jobs`, `routes_admin`); rules live in `service.Service`. Every error is JSON
`{code, message, fields}`; user mistakes are 4xx, never 500.
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpufleet import __version__
from gpufleet.domain.errors import (
    FieldProblem,
    GpufleetError,
    SpecError,
)
from gpufleet.server.body_limit import BodyLimit
from gpufleet.server.context import ApiContext
from gpufleet.server.limits import MAX_BODY_BYTES
from gpufleet.server.ratelimit import RateLimitedError
from gpufleet.server.request_deps import (
    ERRORS,
    error_body,
    error_status,
    health_reader,
    isolation_out,
    metrics_reader,
)
from gpufleet.server.schemas import HealthOut
from gpufleet.server.service import Service
from gpufleet.server.spec import JobSpec, problems_from_errors

log = logging.getLogger("gpufleet.api")


def _known_fields(request: Request) -> tuple[str, ...]:
    # Unknown-field hints need the body model's field names; only the job spec has many to confuse.
    return tuple(JobSpec.model_fields) if request.url.path.rstrip("/") == "/v1/jobs" else ()


def create_app(ctx: ApiContext) -> FastAPI:
    from gpufleet.server import (
        routes_admin,
        routes_config,
        routes_cost,
        routes_jobs,
        routes_progress,
        routes_reservations,
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
    app.include_router(routes_reservations.router, prefix="/v1", responses=ERRORS)
    mount_web(app)  # the dashboard at `/`, over the same service
    return app
