"""At submit: could any node of the fleet ever hold this job, and could its queue's quota ever admit it?

A job no node could hold (more GPUs per worker than the largest node, a GPU model the fleet lacks, more CPU or
memory than any node) would wait forever; it is refused at once with the scheduler's own reason. A job its
queue's quota could never admit as it stands is accepted (an admin may raise the quota) with a warning.

The answers are the scheduling core's: its gang and quota admission plugins, asked over every node the store
knows (cordoned, unhealthy and lost ones too: they may come back) with nothing running, so that these rules
live in one place. A fleet with no node yet (a cluster still joining) refuses nothing.
"""

from __future__ import annotations

import threading
import time

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.jobs import Job
from gpufleet.domain.snapshot import ClusterSnapshot
from gpufleet.policies.admit.gang import GangAdmission
from gpufleet.policies.admit.quota import QuotaAdmission
from gpufleet.ports.admin import AdminStore
from gpufleet.scheduling.plugin_api import JobView
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.status import Code

# The spec field each of the gang check's reasons is about, by how the reason begins, and how to fix it.
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("no node has GPU model", "gpu_models", "ask for a model the fleet has, or leave gpu_models out"),
    ("no GPU (", "gpu_memory", "ask for less GPU memory (`gpufleet nodes` shows each GPU's)"),
    ("needs more memory per worker", "memory", "ask for less memory per worker, e.g. with more workers"),
    ("gang of", "workers", "ask for fewer workers (or fewer GPUs each), or add nodes to the fleet"),
)
_DEFAULT_FIELD = ("gpus", "ask for what one node has (`gpufleet nodes` lists them), or add a node that has more")
_CPU_FIELD = ("cpu", "ask for fewer CPUs per worker, e.g. with more workers")


class FleetFit:
    """The admission check at submit, over a view of the fleet rebuilt at most every `ttl_s` seconds."""

    def __init__(self, store: AdminStore, ttl_s: float = 2.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._state: CycleState | None = None
        self._built_at = -float("inf")
        self._version: int | None = None
        self._gang = GangAdmission()
        self._quota = QuotaAdmission()

    def forget(self) -> None:
        """Read the fleet and the queues again at the next check (a node or a quota changed here)."""
        with self._lock:
            self._built_at = -float("inf")

    def _fleet(self) -> CycleState | None:
        with self._lock:
            now = time.monotonic()
            if now - self._built_at > self.ttl_s:
                # Rebuilt only when a node or a queue changed: at 10,000 nodes a rebuild takes ~0.1 s.
                version = self.store.cluster_version()
                if version != self._version or self._built_at == -float("inf"):
                    nodes = tuple(self.store.nodes())
                    snapshot = ClusterSnapshot(nodes=nodes, queues=tuple(self.store.queues()))
                    self._state = CycleState(snapshot) if nodes else None
                    self._version = version
                self._built_at = now
            return self._state

    def check(self, job: Job) -> list[str]:
        """Warnings for the submitter; a SpecError, naming the field and its fix, for a job no node could hold."""
        state = self._fleet()
        if state is None:
            return []
        cluster = state.view
        status = self._gang.admit(JobView(job, state.table.model_lut(job.request.models)), cluster)
        if status.code is Code.UNRESOLVABLE:
            reason = "; ".join(status.reasons)
            field, fix = _field_of(reason)
            raise SpecError("job spec", (FieldProblem(field, f"cannot run on this fleet: {reason}", fix),))
        quota = self._quota.admit(JobView(job, state.table.model_lut(job.request.models)), cluster)
        if quota.code is Code.UNRESOLVABLE:
            return [
                f"queue {job.queue!r}'s quota can never admit this job as it stands ({'; '.join(quota.reasons)}); "
                f"it waits until an admin raises it (`gpufleet quota set {job.queue} …`), or cancel it and ask "
                "for less"
            ]
        return []


def _field_of(reason: str) -> tuple[str, str]:
    for start, field, fix in _FIELDS:
        if reason.startswith(start):
            return field, fix
    if reason.startswith("needs ") and " CPUs per worker" in reason:
        return _CPU_FIELD
    return _DEFAULT_FIELD
