"""The job state machine: one transition table, every transition recorded with reason and time."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpufleet.domain.errors import InvalidTransitionError


class JobState(enum.StrEnum):
    PENDING = "pending"
    HELD = "held"  # kept out of the scheduler's sight until released (`gpufleet hold`)
    ADMITTED = "admitted"
    LAUNCHING = "launching"
    RUNNING = "running"
    EVICTING = "evicting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

S = JobState
TRANSITIONS: dict[tuple[JobState, JobState], str] = {
    (S.PENDING, S.ADMITTED): "the core placed it: quota reserved, GPUs chosen",
    (S.PENDING, S.CANCELLED): "cancelled before it ever ran",
    (S.PENDING, S.FAILED): "rejected for good (e.g. its spec can never be satisfied)",
    (S.PENDING, S.HELD): "held by its submitter or an admin: not offered to the scheduler until released",
    (S.HELD, S.PENDING): "released: back in its queue, in the place its priority and submit time give it",
    (S.HELD, S.CANCELLED): "cancelled while held (or a dependency it waited for can never be met)",
    (S.ADMITTED, S.LAUNCHING): "the backend was asked to start its workers",
    (S.ADMITTED, S.PENDING): "the placement went stale (node lost, cordoned) before launch",
    (S.ADMITTED, S.CANCELLED): "cancelled after placement, before launch",
    (S.LAUNCHING, S.RUNNING): "observed: every worker's process is up",
    (S.LAUNCHING, S.FAILED): "observed: a worker could not be started",
    (S.LAUNCHING, S.EVICTING): "preempted or cancelled while starting",
    (S.LAUNCHING, S.PENDING): "launch lost (backend restart); retried",
    (S.RUNNING, S.SUCCEEDED): "observed: all workers exited 0",
    (S.RUNNING, S.FAILED): "observed: a worker failed, or the node was lost with no retries left",
    (S.RUNNING, S.EVICTING): "preemption or cancel: checkpoint signal sent, grace period running",
    (S.RUNNING, S.PENDING): "observed: node lost or worker failed, retried from its last checkpoint",
    # No change of state, but a line of the job's history: how many GPUs it holds changed.
    (S.RUNNING, S.RUNNING): "an elastic job's resize started (checkpoint signal to the workers it changes) or ended",
    (S.EVICTING, S.PENDING): "observed: stopped after preemption; back in its queue",
    (S.EVICTING, S.CANCELLED): "observed: stopped after a cancel",
    (S.EVICTING, S.SUCCEEDED): "observed: finished on its own during the grace period",
    (S.EVICTING, S.FAILED): "observed: failed during the grace period",
}


@dataclass(frozen=True, slots=True)
class Transition:
    job_id: str
    source: JobState
    target: JobState
    reason: str
    at: float


def transition(job_id: str, source: JobState, target: JobState, reason: str, at: float) -> Transition:
    """Check a transition against TRANSITIONS and return its record."""
    if (source, target) not in TRANSITIONS:
        allowed = sorted(t.value for (s, t) in TRANSITIONS if s == source) or ["nothing (terminal)"]
        raise InvalidTransitionError(
            f"job {job_id!r} cannot go from {source.value} to {target.value}",
            f"from {source.value} it may go to: {', '.join(allowed)}",
        )
    if not reason:
        raise InvalidTransitionError(f"transition of job {job_id!r} has no reason", "say why it changed state")
    return Transition(job_id, source, target, reason, at)
