"""An in-memory `StateStore`: the simulator's store, and a reference for the SQL one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, SpecError, UnknownNameError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.progress import JobProgress
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.domain.windows import Window
from gpufleet.ports import Request, RequestKind, StaleWriteError


class InMemoryStore:
    def __init__(self, nodes: Sequence[Node] = (), queues: Sequence[QueueSpec] = ()) -> None:
        self._nodes = tuple(nodes)
        self._queues = tuple(queues)
        self._cluster_version = 1
        self._records: dict[JobId, JobRecord] = {}
        self._active: dict[JobId, None] = {}  # insertion-ordered set: submission order
        self._submissions: list[JobId] = []
        self._history: dict[JobId, list[Transition]] = {}
        self.log: list[Transition] = []
        self._requests: list[Request] = []
        self._progress: dict[JobId, JobProgress] = {}
        self._windows: dict[str, Window] = {}

    def nodes(self) -> tuple[Node, ...]:
        return self._nodes

    def queues(self) -> tuple[QueueSpec, ...]:
        return self._queues

    def cluster_version(self) -> int:
        return self._cluster_version

    def windows(self) -> tuple[Window, ...]:
        return tuple(self._windows[name] for name in sorted(self._windows))

    def set_window(self, window: Window) -> bool:
        """Create or replace a window (the cluster changes). True if it was new."""
        new = window.name not in self._windows
        self._windows[window.name] = window
        self._cluster_version += 1
        return new

    def delete_window(self, name: str) -> None:
        if self._windows.pop(name, None) is None:
            raise UnknownNameError(f"reservation {name!r} does not exist", "name one of: " + ", ".join(self._windows))
        self._cluster_version += 1

    def set_cluster(self, nodes: Sequence[Node] | None = None, queues: Sequence[QueueSpec] | None = None) -> None:
        if nodes is not None:
            self._nodes = tuple(nodes)
        if queues is not None:
            self._queues = tuple(queues)
        self._cluster_version += 1

    def submit(self, job: Job, at: float) -> JobRecord:
        if job.id in self._records:
            raise SpecError(f"job {job.id!r}", (FieldProblem("id", "is taken", "give the job a new id"),))
        record = JobRecord(job, JobState.PENDING, submitted_at=at)
        self._records[job.id] = record
        self._active[job.id] = None
        self._submissions.append(job.id)
        return record

    def take_submissions(self, cursor: int) -> tuple[Sequence[JobRecord], int]:
        ids = self._submissions[cursor:]
        return [self._records[j] for j in ids], len(self._submissions)

    def submission_cursor(self) -> int:
        return len(self._submissions)

    def get(self, job_id: JobId) -> JobRecord | None:
        return self._records.get(job_id)

    def active(self) -> Sequence[JobRecord]:
        return [self._records[j] for j in self._active]

    def all(self) -> Sequence[JobRecord]:
        return list(self._records.values())

    def write(self, updates: Sequence[tuple[int, JobRecord]], transitions: Sequence[Transition]) -> None:
        for expected, record in updates:
            current = self._records.get(record.id)
            if current is None or current.version != expected:
                found = None if current is None else current.version
                raise StaleWriteError(f"job {record.id}: expected version {expected}, store has {found}")
        for _, record in updates:
            self._records[record.id] = record
            if record.state.terminal:
                self._active.pop(record.id, None)
        for t in transitions:
            self._history.setdefault(t.job_id, []).append(t)
            self.log.append(t)

    def history(self, job_id: JobId) -> Sequence[Transition]:
        return tuple(self._history.get(job_id, ()))

    def request(self, job_id: JobId, kind: RequestKind, reason: str, at: float, value: float | None = None) -> None:
        self._requests.append(Request(len(self._requests) + 1, job_id, kind, reason, at, value))

    def take_requests(self, cursor: int) -> tuple[Sequence[Request], int]:
        return self._requests[cursor:], len(self._requests)

    def job_progress(self, job_id: str) -> JobProgress | None:
        """The job's progress history (None: it never reported)."""
        return self._progress.get(job_id)

    def update_progress(self, job_id: str, now: float, update: Callable[[JobProgress], JobProgress]) -> JobProgress:
        """Apply `update` to the job's history (an empty one if it has none); return the result."""
        after = update(self._progress.get(job_id, JobProgress()))
        self._progress[job_id] = after
        return after
