"""The simulated backend's resize: the work done is kept, the restart costs `restart_penalty_s`, the job goes
on at its new speed, RESIZED is reported at once, the end planned before the resize is dropped, and a
repeated resize of the same count is ignored."""

from __future__ import annotations

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.jobs import Job
from gpufleet.ports import Launch, Observation, ObservationKind
from gpufleet.sim.engine import SimClock
from gpufleet.sim.simulated_backend import BackendSettings, SimulatedBackend
from tests.kit import make_job


def workers(count: int) -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement("n0", (GpuShare(i),)) for i in range(count))


def test_a_resize_keeps_the_work_done_and_pays_the_restart() -> None:
    clock = SimClock(0.0)
    scheduled: list[Observation] = []
    # Speed in proportion to the workers: 1000 s of work at one worker's speed.
    backend = SimulatedBackend(
        clock,
        lambda at, obs: scheduled.append(obs),
        {"e": 1000.0},
        lambda job, ws: float(len(ws)),
        BackendSettings(restart_penalty_s=30.0),
    )
    job: Job = make_job("e").gpus(1).elastic(1, 4).build()
    backend.launch(Launch(job, 1, workers(1)))
    assert backend.capabilities.resize
    clock.t = 400.0  # 400 s of work done at one worker
    backend.resize(Launch(job, 1, workers(4)), 10.0, 1)
    backend.resize(Launch(job, 1, workers(4)), 10.0, 1)  # the same resize again: nothing
    assert [o.kind for o in backend.poll()] == [ObservationKind.STARTED, ObservationKind.RESIZED]
    assert backend.stats.resizes == 1
    assert backend.stats.done["e"] == 400.0
    first_end, new_end = (o for o in scheduled if o.kind is ObservationKind.EXITED)
    assert first_end.at == 1000.0
    assert new_end.at == 400.0 + 30.0 + 600.0 / 4  # restart, then the rest at four workers' speed
    backend.deliver(first_end)  # the end planned before the resize is stale
    assert backend.poll() == []
    backend.deliver(new_end)
    assert [o.kind for o in backend.poll()] == [ObservationKind.EXITED]
