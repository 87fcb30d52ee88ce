"""A scriptable `ExecutionBackend` for control-loop tests: it records calls, and the test says what the
backend observes (started, exited, stopped) and when. The real local backend is tested with real processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from gpufleet.domain.jobs import JobId
from gpufleet.ports import BackendCapabilities, Launch, Observation, ObservationKind


@dataclass
class ManualClock:
    t: float = 0.0

    def now(self) -> float:
        return self.t


@dataclass
class ScriptedBackend:
    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(
        multi_node=True, gpu_isolation=True, checkpoint_signal=True
    )
    launches: list[Launch] = field(default_factory=list)
    stops: list[tuple[JobId, int, float]] = field(default_factory=list)
    _inbox: list[Observation] = field(default_factory=list)
    adopted: list[Launch] = field(default_factory=list)

    def launch(self, launch: Launch) -> None:
        if any(done.job.id == launch.job.id and done.attempt == launch.attempt for done in self.launches):
            return
        self.launches.append(launch)

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        self.stops.append((job_id, attempt, grace_s))

    def adopt(self, live: Sequence[Launch]) -> None:
        self.adopted = list(live)

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        raise AssertionError("the loop asked a backend without the resize capability to resize")

    def poll(self) -> Sequence[Observation]:
        out, self._inbox = self._inbox, []
        return out

    def attempt_of(self, job_id: JobId) -> int:
        return max(launch.attempt for launch in self.launches if launch.job.id == job_id)

    def observe(self, job_id: JobId, kind: ObservationKind, at: float, exit_code: int | None = None) -> None:
        self._inbox.append(Observation(job_id, self.attempt_of(job_id), kind, at, exit_code=exit_code))

    def started(self, job_id: JobId, at: float) -> None:
        self.observe(job_id, ObservationKind.STARTED, at)

    def exited(self, job_id: JobId, at: float, code: int = 0) -> None:
        self.observe(job_id, ObservationKind.EXITED, at, exit_code=code)

    def stopped(self, job_id: JobId, at: float) -> None:
        self.observe(job_id, ObservationKind.STOPPED, at)


@dataclass
class ResizingBackend(ScriptedBackend):
    """A scripted backend that can resize: it records each resize; the test says when RESIZED is observed."""

    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(
        multi_node=True, gpu_isolation=True, checkpoint_signal=True, resize=True
    )
    resizes: list[tuple[Launch, float, int]] = field(default_factory=list)

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        self.resizes.append((launch, grace_s, resize_count))

    def resized(self, job_id: JobId, at: float) -> None:
        self.observe(job_id, ObservationKind.RESIZED, at)

    def observe_resized(self, job_id: JobId, at: float, resize_count: int) -> None:
        """RESIZED that says which resize of the attempt is done."""
        attempt = self.attempt_of(job_id)
        self._inbox.append(Observation(job_id, attempt, ObservationKind.RESIZED, at, resize_count=resize_count))
