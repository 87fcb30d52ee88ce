"""`/v1/config`: the fleet's declarative config (queues, quotas, cohorts, budgets, prices, token bindings), read
whole (`gpufleet export`) and applied whole (`gpufleet apply -f`); see `fleet_config.py`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from gpufleet.server.auth import Principal
from gpufleet.server.fleet_config import ApplyIn, ApplyOut, FleetConfig, FleetConfigOut
from gpufleet.server.request_deps import principal, service
from gpufleet.server.service import Service

router = APIRouter(tags=["config"])

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]


@router.get("/config")
def export(who: Who, svc: Svc) -> FleetConfigOut:
    """The fleet's config, in the format `POST /v1/config/apply` takes (admin)."""
    return FleetConfig(svc).export(who)


@router.post("/config/apply")
def apply(body: ApplyIn, who: Who, svc: Svc) -> ApplyOut:
    """Make the fleet match a config for what it names (admin): every entry checked first, all or nothing;
    `dry_run` only lists the changes; `prune` also removes the queues and prices it does not list."""
    return FleetConfig(svc).apply(who, body)
