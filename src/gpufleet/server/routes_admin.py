"""`/v1/info`, `/v1/queues`, `/v1/nodes`, `/v1/tokens`."""

from __future__ import annotations

import shutil
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from gpufleet.ports.admin import Role
from gpufleet.server.auth import Principal
from gpufleet.server.fleet_export import take_snapshot
from gpufleet.server.request_deps import isolation_out, principal, service
from gpufleet.server.schemas import (
    AuditOut,
    DrainOut,
    InfoOut,
    NodeOut,
    NodesOut,
    QueueIn,
    QueueOut,
    QueuesOut,
    TokenCreatedOut,
    TokenIn,
    TokenOut,
    TokensOut,
)
from gpufleet.server.service import Service
from gpufleet.server.views import audit_entry_out

router = APIRouter()

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]
QueueName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", description="e.g. team-a")]
NodeName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")]
TokenId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", description="e.g. t-1a2b3c4d")]


@router.get("/info", tags=["info"])
def info(who: Who, svc: Svc) -> InfoOut:
    """Version, scheduling policy, inventory (labelled when emulated) and the caller's role."""
    return svc.info(who)


@router.get("/queues", tags=["queues"])
def queues(who: Who, svc: Svc) -> QueuesOut:
    """Queues with their quotas (GPUs, cores, bytes) and what their jobs use now. Team tokens see theirs."""
    return QueuesOut(queues=svc.queues(who))


@router.put("/queues/{name}", tags=["queues"])
def set_queue(name: QueueName, body: QueueIn, who: Who, svc: Svc) -> QueueOut:
    """Create or replace a queue (admin). Quotas: `{"gpu": 8, "gpu:A100-80GB": {"nominal": 4,
    "borrowing_limit": 2}, "cpu": 64, "memory": "512GiB"}`."""
    return svc.set_queue(who, name, body)


@router.delete("/queues/{name}", tags=["queues"], status_code=204)
def delete_queue(name: QueueName, who: Who, svc: Svc) -> Response:
    """Delete a queue (admin); refused while it has active jobs or tokens."""
    svc.delete_queue(who, name)
    return Response(status_code=204)


@router.get("/nodes", tags=["nodes"])
def nodes(who: Who, svc: Svc) -> NodesOut:
    """Nodes and their GPUs, with what is allocated on each GPU."""
    del who  # any valid token may look
    return NodesOut(nodes=svc.nodes(), isolation=isolation_out(svc.ctx))


@router.post("/nodes/{name}/cordon", tags=["nodes"])
def cordon(name: NodeName, who: Who, svc: Svc) -> NodeOut:
    """Stop placing new jobs on the node (admin); running jobs stay."""
    return svc.set_cordon(who, name, True)


@router.post("/nodes/{name}/uncordon", tags=["nodes"])
def uncordon(name: NodeName, who: Who, svc: Svc) -> NodeOut:
    return svc.set_cordon(who, name, False)


@router.post("/nodes/{name}/drain", tags=["nodes"])
def drain(name: NodeName, who: Who, svc: Svc) -> DrainOut:
    """Cordon the node and requeue every job holding resources on it (admin)."""
    return svc.drain(who, name)


@router.delete("/nodes/{name}", tags=["nodes"], status_code=204)
def remove_node(name: NodeName, who: Who, svc: Svc) -> Response:
    """Forget a node (admin), e.g. one that left for good; refused while jobs hold resources on it."""
    svc.remove_node(who, name)
    return Response(status_code=204)


@router.post("/tokens", tags=["tokens"], status_code=201)
def create_token(body: TokenIn, who: Who, svc: Svc) -> TokenCreatedOut:
    """Create a token (admin). The secret is in this answer only; the server keeps its hash."""
    return svc.create_token(who, body.name, Role(body.role), body.queue)


@router.get("/tokens", tags=["tokens"])
def tokens(who: Who, svc: Svc) -> TokensOut:
    return TokensOut(tokens=svc.tokens(who))


@router.delete("/tokens/{token_id}", tags=["tokens"])
def revoke_token(token_id: TokenId, who: Who, svc: Svc) -> TokenOut:
    """Revoke a token (admin); it stops working at once."""
    return svc.revoke_token(who, token_id)


@router.get("/snapshot", tags=["info"])
def snapshot(
    who: Who,
    svc: Svc,
    since_s: Annotated[
        float, Query(ge=0, le=1e10, description="Window: jobs submitted in the last this many seconds")
    ] = 7 * 86400,
) -> dict[str, Any]:
    """The cluster for the simulator (admin): nodes, queues, every active job and every job submitted in the
    window, as stored. Replay it with `gpufleet sim --workload snapshot.json`."""
    svc.audit.require_admin(who, "taking a snapshot", "cluster.snapshot", "cluster")
    now = svc.ctx.clock.now()
    snapshot = take_snapshot(svc.store, now, now - since_s, svc.ctx.inventory_source, svc.ctx.emulated)
    svc.audit.record(who, "cluster.snapshot", "cluster", {"since_s": since_s})
    return snapshot


@router.get("/audit", tags=["info"])
def audit(
    who: Who,
    svc: Svc,
    since: Annotated[float | None, Query(ge=0, le=1e11, description="Only entries at or after (Unix seconds).")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="At most this many, the newest.")] = 1000,
) -> AuditOut:
    """The audit log of admin actions (admin): who, what, when, from where, done or denied; oldest first."""
    who.require_admin("reading the audit log")
    return AuditOut(entries=[audit_entry_out(e) for e in svc.store.audit_log(since, limit)])


@router.post(
    "/backup",
    tags=["info"],
    response_class=FileResponse,
    responses={200: {"content": {"application/vnd.sqlite3": {}}, "description": "The store, as a SQLite file"}},
)
def backup(who: Who, svc: Svc) -> FileResponse:
    """An online backup of the store (admin): SQLite's backup API, a consistent copy taken while the control
    plane keeps running. PostgreSQL stores answer 409 with how to use pg_dump."""
    svc.audit.require_admin(who, "backing up the store", "store.backup", "store")
    path = svc.backup(who)
    cleanup = BackgroundTask(shutil.rmtree, path.parent, ignore_errors=True)
    return FileResponse(path, media_type="application/vnd.sqlite3", filename="gpufleet-backup.db", background=cleanup)
