"""The observations an execution backend has queued for the loop's next `poll`, shared by the backends that
run real processes (the local executor, the Ray backend)."""

from __future__ import annotations

import time

from gpufleet.domain.jobs import JobId
from gpufleet.ports import Clock, Observation, ObservationKind

Key = tuple[JobId, int]


class ObservationInbox:
    """Observations on `clock`, each once, and the attempts a backend is done with (`finished`)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.finished: set[Key] = set()
        self._queued: list[Observation] = []

    def emit(
        self,
        key: Key,
        kind: ObservationKind,
        *,
        wall: float | None = None,
        exit_code: int | None = None,
        detail: str = "",
        resize_count: int | None = None,
    ) -> None:
        """Queue an observation. `wall` (when known) is when it happened on the wall clock: it is carried onto
        the backend's clock as `now - how long ago`, so a job that ended while the control plane was down is
        not billed for the downtime."""
        now = self.clock.now()
        at = now - max(0.0, time.time() - wall) if wall is not None else now
        self._queued.append(
            Observation(key[0], key[1], kind, at, exit_code=exit_code, detail=detail, resize_count=resize_count)
        )

    def lose(self, key: Key, detail: str) -> None:
        """The attempt is lost before anything of it ran (or after it was given up): LOST, and done with."""
        self.finished.add(key)
        self.emit(key, ObservationKind.LOST, detail=detail)

    def add(self, observation: Observation) -> None:
        """Queue an observation made elsewhere (with a time of its own)."""
        self._queued.append(observation)

    def take(self) -> list[Observation]:
        """Everything queued since the last call, oldest first."""
        out, self._queued = self._queued, []
        return out
