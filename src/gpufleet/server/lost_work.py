"""Work lost to preemptions, node losses and failures: each attempt that ended so (`attempt_losses`, written by
the store with the transition that ended it) lost the work since its last checkpoint, or since its start;
priced like the cost report, at the price its attempt started under (`charges`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.domain.checkpoints import AttemptLoss
from gpufleet.domain.costs import Charge, Pool, attempt_cost
from gpufleet.ports.admin import AdminStore
from gpufleet.server.chargeback import UNKNOWN_MODEL

GROUPS = ("queue", "user")


@dataclass(slots=True)
class LostWorkGroup:
    key: str
    attempts: int = 0
    lost_s: float = 0.0  # seconds of work lost, summed over attempts (not GPU-weighted)
    gpu_hours: float = 0.0
    usd: float = 0.0
    unpriced_gpu_hours: float = 0.0
    by_cause: dict[str, float] = field(default_factory=dict)  # cause -> GPU-hours

    def add(self, loss: AttemptLoss, charges: Iterable[Charge]) -> None:
        self.attempts += 1
        self.lost_s += loss.lost_s
        for line in attempt_cost(tuple(charges), loss.lost_s, queue="", user=""):
            self.gpu_hours += line.gpu_hours
            self.by_cause[loss.cause.value] = self.by_cause.get(loss.cause.value, 0.0) + line.gpu_hours
            if line.usd is None:
                self.unpriced_gpu_hours += line.gpu_hours
            else:
                self.usd += line.usd


@dataclass(frozen=True, slots=True)
class LostWorkReport:
    since: float
    until: float
    by: str
    groups: tuple[LostWorkGroup, ...]
    total: LostWorkGroup


def _charges_of(loss: AttemptLoss, per_attempt: dict[float, tuple[Charge, ...]]) -> tuple[Charge, ...]:
    """The charges of the attempt the loss is of: the last one that began holding at or before it ran."""
    starts = [at for at in per_attempt if at <= loss.started_at]
    if starts:
        return per_attempt[max(starts)]
    return (Charge(UNKNOWN_MODEL, Pool.ON_DEMAND, loss.gpus, None),)


def lost_work_report(
    store: AdminStore, since: float, until: float, by: str = "queue", queues: set[str] | None = None
) -> LostWorkReport:
    """Lost work in [since, until] per queue or user, largest cost first (then most GPU-hours);
    `queues` limits it to those."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of {GROUPS}")
    losses = store.attempt_losses(since, until)
    records = {job_id: store.get(job_id) for job_id in {job_id for job_id, _ in losses}}
    charges = store.charges(sorted(records)) if records else {}
    groups: dict[str, LostWorkGroup] = {}
    total = LostWorkGroup("all")
    for job_id, loss in losses:
        record = records.get(job_id)
        if record is None or (queues is not None and record.job.queue not in queues):
            continue
        key = record.job.queue if by == "queue" else record.job.user
        priced = _charges_of(loss, charges.get(job_id, {}))
        groups.setdefault(key, LostWorkGroup(key)).add(loss, priced)
        total.add(loss, priced)
    ordered = tuple(sorted(groups.values(), key=lambda g: (-g.usd, -g.gpu_hours, g.key)))
    return LostWorkReport(since, until, by, ordered, total)
