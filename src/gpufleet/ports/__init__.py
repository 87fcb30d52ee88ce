"""The ports of the control loop: Protocols only. Real and simulated adapters implement them.

Timing and idempotency are part of each contract, stated in the docstrings.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import Transition
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.domain.windows import Window


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on the control plane's clock (wall clock live, simulated time in the simulator)."""
        ...


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    multi_node: bool
    gpu_isolation: bool
    checkpoint_signal: bool
    resize: bool = False  # backends that implement `resize` set it True


class ObservationKind(enum.StrEnum):
    STARTED = "started"  # every worker's process is up
    EXITED = "exited"  # all workers ended by themselves; `exit_code` is the job's (first non-zero)
    STOPPED = "stopped"  # ended because `stop` was called
    LOST = "lost"  # the backend lost the job (node gone, process vanished)
    RESIZED = "resized"  # the attempt restarted at its new size (after `resize`); every new worker is up


@dataclass(frozen=True, slots=True)
class Observation:
    job_id: JobId
    attempt: int
    kind: ObservationKind
    at: float
    exit_code: int | None = None
    detail: str = ""
    checkpoint_at: float | None = None  # the job's last checkpoint, when the backend knows it
    # RESIZED: which resize of the attempt is done (a restart may report an earlier one again); None: not said.
    resize_count: int | None = None


@dataclass(frozen=True, slots=True)
class Launch:
    job: Job
    attempt: int
    workers: tuple[WorkerPlacement, ...]
    # The OS user an administrator mapped the job's queue to (`QueueSpec.run_as`); None: the backend's
    # own choice. How a worker is started as that user is the backend's business.
    run_as: str | None = None
    # What the node enforces for the queue beyond the placement (`QueueSpec.memory_per_gpu`, `memory_no_gpu`,
    # `disk`; None: the node's defaults). The scheduler never reads them.
    memory_per_gpu: int | None = None
    memory_no_gpu: int | None = None
    disk: int | None = None
    # How often the job should save its work (GPUFLEET_CHECKPOINT_INTERVAL_S; `domain/checkpoints.py`), None
    # while the job has reported no checkpoint.
    checkpoint_interval_s: float | None = None


class ExecutionBackend(Protocol):
    capabilities: BackendCapabilities

    def launch(self, launch: Launch) -> None:
        """Start the job's workers. Returns quickly; STARTED comes later through `poll`.
        Idempotent per (job id, attempt): a second call for the same attempt does nothing."""
        ...

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        """Send the checkpoint signal, wait up to `grace_s`, then kill. Returns quickly; STOPPED (or
        EXITED, if it ended by itself first) comes through `poll`. Idempotent; unknown jobs are ignored.
        `grace_s <= 0` kills at once, also a job already stopping with a longer grace."""
        ...

    def poll(self) -> Sequence[Observation]:
        """What happened since the last call: observed truth only, each observation once."""
        ...

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        """Change a running attempt's size: send the checkpoint signal to the workers of (launch.job.id,
        launch.attempt), wait up to `grace_s` for them to exit (then kill the rest), and start
        `launch.workers` (the new placement; same job id and attempt) with WORLD_SIZE = the new number of
        workers and GPUFLEET_RESIZE_COUNT = resize_count in their env. Returns quickly; RESIZED comes
        through `poll` once every new worker is up. The old workers' exit is not EXITED/STOPPED; a failure
        to start the new ones is LOST. Idempotent per (job id, attempt, resize_count)."""
        ...

    def adopt(self, live: Sequence[Launch]) -> None:
        """Called once at start with every launch the store believes holds resources (LAUNCHING,
        RUNNING, EVICTING). The backend keeps watching those it still has, reports through `poll`
        what ended while the control plane was down (EXITED) and what it cannot find (LOST), and
        stops whatever it runs that is not in `live`."""
        ...


class RequestKind(enum.StrEnum):
    CANCEL = "cancel"  # stop it for good (cancelled)
    FORCE_CANCEL = "force-cancel"  # stop it for good now: SIGKILL, whatever its grace period
    REQUEUE = "requeue"  # stop it and put it back in its queue (drain of its node)
    RECLAIM = "reclaim"  # reserved but idle: stop it and put it back in its queue
    # The job reported a saved checkpoint: `at` is when, `value` how long saving it took (seconds).
    CHECKPOINT = "checkpoint"
    HOLD = "hold"  # a pending job: keep it from the scheduler until released
    RELEASE = "release"  # a held job: back to its queue
    UPDATE = "update"  # a pending or held job: new fields, as JSON in the request's reason


@dataclass(frozen=True, slots=True)
class Request:
    """A user's request for the loop to act on a job. The loop is the only writer of job state, so the
    API records requests and the loop turns them into transitions."""

    seq: int
    job_id: JobId
    kind: RequestKind
    reason: str
    at: float
    value: float | None = None  # a number the kind carries (CHECKPOINT: its duration)


class StaleWriteError(Exception):
    """A write whose expected version no longer matches the store: the cycle that made it is stale."""


class StateStore(Protocol):
    """Durable job state. Every method is one short transaction; no backend call happens inside one."""

    def nodes(self) -> tuple[Node, ...]: ...

    def queues(self) -> tuple[QueueSpec, ...]: ...

    def cluster_version(self) -> int:
        """Bumped whenever nodes, queues or windows change."""
        ...

    def windows(self) -> tuple[Window, ...]:
        """An admin's maintenance windows and queue reservations, ended ones included until deleted."""
        ...

    def submit(self, job: Job, at: float) -> JobRecord:
        """Store a new pending job (the API's and the simulator's way in)."""
        ...

    def take_submissions(self, cursor: int) -> tuple[Sequence[JobRecord], int]:
        """Jobs submitted after `cursor`, and the cursor to pass next time."""
        ...

    def submission_cursor(self) -> int:
        """The cursor after the last submission so far: a loop that has read `active()` starts from it
        instead of reading every job ever submitted."""
        ...

    def get(self, job_id: JobId) -> JobRecord | None: ...

    def active(self) -> Sequence[JobRecord]:
        """Every job not in a terminal state, in submission order."""
        ...

    def write(self, updates: Sequence[tuple[int, JobRecord]], transitions: Sequence[Transition]) -> None:
        """Replace each record whose stored version equals the expected one given with it, and append
        the transitions, all or nothing. Raises StaleWriteError if any version does not match."""
        ...

    def history(self, job_id: JobId) -> Sequence[Transition]: ...

    def request(self, job_id: JobId, kind: RequestKind, reason: str, at: float, value: float | None = None) -> None:
        """Record a request (e.g. cancel) for the loop; the API's way to act on an existing job."""
        ...

    def take_requests(self, cursor: int) -> tuple[Sequence[Request], int]:
        """Requests recorded after `cursor`, and the cursor to pass next time."""
        ...


class EventSink(Protocol):
    def emit(self, transition: Transition) -> None:
        """Told of every recorded transition, after it is stored."""
        ...
