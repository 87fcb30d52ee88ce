"""`/v1/reservations`: nodes held for a queue, or for maintenance, for a time (`server/reservations.py`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from gpufleet.server.auth import Principal
from gpufleet.server.request_deps import principal, service
from gpufleet.server.reservations import (
    ReservationIn,
    ReservationOut,
    ReservationsOut,
    delete_reservation,
    list_reservations,
    set_reservation,
)
from gpufleet.server.service import Service

router = APIRouter()

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]
Name = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="e.g. fw-upgrade-dec")]


@router.get("/reservations", tags=["reservations"])
def reservations(who: Who, svc: Svc) -> ReservationsOut:
    """Every reservation, upcoming, active and ended (until deleted)."""
    return list_reservations(svc, who)


@router.put("/reservations/{name}", tags=["reservations"])
def put_reservation(name: Name, body: ReservationIn, who: Who, svc: Svc, response: Response) -> ReservationOut:
    """Create or replace a reservation (admin): `{"nodes": ["node-3"], "start": "2026-12-24T02:00:00Z", "end":
    "2026-12-24T06:00:00Z", "maintenance": true}` or with `"queue": "team-a"` instead of maintenance."""
    out, new = set_reservation(svc, who, name, body)
    response.status_code = 201 if new else 200
    return out


@router.delete("/reservations/{name}", tags=["reservations"], status_code=204)
def remove_reservation(name: Name, who: Who, svc: Svc) -> Response:
    """Delete a reservation (admin); its nodes are free for every job again."""
    delete_reservation(svc, who, name)
    return Response(status_code=204)
