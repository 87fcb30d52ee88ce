"""Reservations an admin sets on nodes (`/v1/reservations`, `gpufleet reservation`): GPUs held for a queue for a
time, or taken out of service for maintenance (`domain/windows.py`). The loop honours them: jobs that would still
run at a window's start do not start on its nodes, and running ones there are stopped a grace period before it.

Every check is made before anything is written; a window that names an unknown node or queue, or has already
ended, is refused with the fix."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.windows import Window
from gpufleet.server.auth import Principal
from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.service import Service

MAX_NODES = 10_000


class ReservationIn(BaseModel):
    """Nodes held from `start` to `end` for `queue`, or for maintenance (`maintenance: true`, no queue): the nodes
    named, or whole nodes with at least `gpus` GPUs (of `gpu_model`, if given) chosen when it is made."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[str] | None = Field(None, min_length=1, max_length=MAX_NODES)
    gpus: int | None = Field(None, ge=1, le=1_000_000)
    gpu_model: str | None = Field(None, max_length=100)
    start: datetime = Field(description="ISO 8601 (with a time zone, else UTC) or seconds since the epoch")
    end: datetime
    queue: str | None = Field(None, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    maintenance: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> ReservationIn:
        if self.maintenance == (self.queue is not None):
            raise ValueError("give either a queue the nodes are held for, or maintenance: true (not both)")
        if (self.nodes is None) == (self.gpus is None):
            raise ValueError("give either the nodes, or how many GPUs (gpus, and gpu_model if it matters)")
        if self.gpu_model is not None and self.gpus is None:
            raise ValueError("gpu_model goes with gpus (nodes named are taken as they are)")
        return self


class ReservationOut(BaseModel):
    name: str
    nodes: list[str]
    start: datetime
    end: datetime
    queue: str | None
    maintenance: bool
    state: str  # upcoming, active or ended


class ReservationsOut(BaseModel):
    reservations: list[ReservationOut]


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def reservation_out(window: Window, now: float) -> ReservationOut:
    state = "ended" if now >= window.end else "active" if now >= window.start else "upcoming"
    return ReservationOut(
        name=window.name,
        nodes=list(window.nodes),
        start=datetime.fromtimestamp(window.start, UTC),
        end=datetime.fromtimestamp(window.end, UTC),
        queue=window.queue,
        maintenance=window.maintenance,
        state=state,
    )


def list_reservations(svc: Service, principal: Principal) -> ReservationsOut:
    """Every reservation (any token may look: a team sees when its GPUs go away)."""
    del principal
    now = svc.ctx.clock.now()
    return ReservationsOut(reservations=[reservation_out(w, now) for w in svc.store.windows()])


def set_reservation(svc: Service, principal: Principal, name: str, body: ReservationIn) -> tuple[ReservationOut, bool]:
    """Create or replace a reservation (admin). Returns it and whether it is new."""
    svc.audit.require_admin(principal, "changing a reservation", "reservation.set", name)
    now = svc.ctx.clock.now()
    start, end = _epoch(body.start), _epoch(body.end)
    nodes = body.nodes if body.nodes is not None else _pick_nodes(svc, name, body.gpus or 0, body.gpu_model, start, end)
    window = Window(name, tuple(nodes), start, end, body.queue)
    problems: list[FieldProblem] = []
    known_nodes = {node.name for node in svc.store.nodes()}
    unknown = [node for node in window.nodes if node not in known_nodes]
    if unknown:
        problems.append(
            FieldProblem("nodes", f"names unknown node(s): {', '.join(unknown)}", "list nodes with `gpufleet nodes`")
        )
    if window.queue is not None and window.queue not in {q.name for q in svc.store.queues()}:
        problems.append(FieldProblem("queue", f"{window.queue!r} does not exist", "list queues with `gpufleet queues`"))
    if window.end <= now:
        problems.append(FieldProblem("end", "is in the past", "give an end later than now"))
    if problems:
        raise SpecError(f"reservation {name!r}", tuple(problems))
    new = svc.store.set_window(window)
    svc.audit.record(principal, "reservation.set", name, {"nodes": list(window.nodes), "queue": window.queue})
    svc.ctx.wake()
    return reservation_out(window, now), new


def _pick_nodes(svc: Service, name: str, gpus: int, model: str | None, start: float, end: float) -> list[str]:
    """Whole nodes with at least `gpus` GPUs (of `model`) between them: schedulable ones that no other reservation
    holds in that time, those whose GPUs run the fewest jobs now first (less to stop), then by name."""
    held = {node for w in svc.store.windows() if w.name != name and w.start < end and start < w.end for node in w.nodes}
    busy: dict[str, int] = {}
    for record in svc._holding():
        for worker in record.workers:
            busy[worker.node] = busy.get(worker.node, 0) + len(worker.gpus)
    candidates = [
        n for n in svc.store.nodes()
        if n.schedulable and n.name not in held and n.gpus and (model is None or n.models == frozenset({model}))
    ]  # fmt: skip
    candidates.sort(key=lambda n: (busy.get(n.name, 0), -len(n.gpus), n.name))
    chosen: list[str] = []
    total = 0
    for node in candidates:
        if total >= gpus:
            break
        chosen.append(node.name)
        total += len(node.gpus)
    if total < gpus:
        of = f" of model {model}" if model else ""
        raise SpecError(
            f"reservation {name!r}",
            (
                FieldProblem(
                    "gpus",
                    f"asks for {gpus} GPUs{of}; the nodes up and not held by another reservation then have {total}",
                    "ask for fewer, name the nodes, or move the window",
                ),
            ),
        )
    return chosen


def delete_reservation(svc: Service, principal: Principal, name: str) -> None:
    svc.audit.require_admin(principal, "deleting a reservation", "reservation.delete", name)
    if name not in {w.name for w in svc.store.windows()}:
        raise NotFoundError(f"no reservation named {name!r}", "list them with `gpufleet reservation list`")
    svc.store.delete_window(name)
    svc.audit.record(principal, "reservation.delete", name)
    svc.ctx.wake()
