"""Overview, Queues and Nodes, and the node actions of admins (cordon, uncordon, drain)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gpufleet.server.request_deps import isolation_out
from gpufleet.server.web.common import WebRoute, render, service_of, url_for, web_session
from gpufleet.server.web.fleet import gpu_grid, overview, queue_views, telemetry_of
from gpufleet.server.web.security import WebSession, check_csrf

router = APIRouter(route_class=WebRoute, include_in_schema=False)

Session = Annotated[WebSession, Depends(web_session)]
NodeName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")]


@router.get("/")
def overview_page(request: Request, session: Session) -> Response:
    view = overview(service_of(request), session.principal)
    return render(request, "overview.html", session, title="Overview", page="overview", view=view)


@router.get("/overview/series.json")
def overview_series(request: Request, session: Session) -> Response:
    """The fleet chart's data: GPUs allocated, used, reserved-idle and free per telemetry tick."""
    return JSONResponse(overview(service_of(request), session.principal).series())


@router.get("/queues")
def queues_page(request: Request, session: Session) -> Response:
    views = queue_views(service_of(request), session.principal)
    return render(request, "queues.html", session, title="Queues", page="queues", views=views)


@router.get("/nodes")
def nodes_page(
    request: Request,
    session: Session,
    done: Literal["cordon", "uncordon", "drain"] | None = None,
    node: Annotated[str | None, Query(max_length=253)] = None,
    requeued: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    svc = service_of(request)
    nodes = svc.nodes()
    tel = telemetry_of(svc)
    telemetry = svc.telemetry(session.principal) if tel is not None else None
    return render(
        request,
        "nodes.html",
        session,
        title="Nodes",
        page="nodes",
        nodes=nodes,
        grid=gpu_grid(nodes, telemetry),
        telemetry=telemetry,
        done=done,
        done_node=node,
        requeued=requeued,
        isolation=isolation_out(svc.ctx),
    )


@router.post("/nodes/{name}/{action}")
def node_action(
    request: Request,
    session: Session,
    name: NodeName,
    action: Literal["cordon", "uncordon", "drain"],
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    check_csrf(request, session.csrf, csrf)
    svc = service_of(request)
    requeued = 0
    if action == "drain":
        requeued = len(svc.drain(session.principal, name).requeued)
    else:
        svc.set_cordon(session.principal, name, action == "cordon")
    target = url_for(request, "/nodes", {"done": action, "node": name, "requeued": requeued or None})
    return RedirectResponse(target, status_code=303)
