"""The control loop with an in-memory store and a scripted backend: transitions, preemption,
parking and strict FIFO, observed through the store and the backend calls."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import GiB, JobState, QueueSpec, Quota, make_node
from gpufleet.policies.catalog import profile
from gpufleet.ports import Observation, ObservationKind
from gpufleet.scheduling.state import CycleState
from tests.kit import fingerprint, make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState


def setup(
    policy: str = "default", nodes: int = 1, gpus: int = 8, queues: tuple[QueueSpec, ...] | list[QueueSpec] = ()
) -> tuple[InMemoryStore, ScriptedBackend, ManualClock, Reconciler]:
    store = InMemoryStore([make_node(f"n{i}", "A100-80GB", gpus, 80 * GiB) for i in range(nodes)], queues)
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile(policy), settings=ReconcilerSettings(grace_s=12.0))
    return store, backend, clock, loop


def states(store: InMemoryStore, job_id: str) -> list[tuple[str, str]]:
    return [(t.source.value, t.target.value) for t in store.history(job_id)]


def test_a_job_goes_from_pending_to_succeeded_with_every_transition_recorded() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("a").gpus(2).build(), at=0.0)
    report = loop.step()
    assert report.placed == 1
    assert [launch.job.id for launch in backend.launches] == ["a"]
    assert backend.launches[0].attempt == 1
    assert store.get("a").state is S.LAUNCHING
    clock.t = 5.0
    backend.started("a", 1.0)
    loop.step()
    assert store.get("a").state is S.RUNNING
    clock.t = 100.0
    backend.exited("a", 100.0, code=0)
    loop.step()
    record = store.get("a")
    assert record.state is S.SUCCEEDED
    assert record.finished_at == 100.0
    assert record.attained_gpu_seconds == pytest.approx(2 * 99.0)
    assert states(store, "a") == [
        ("pending", "admitted"),
        ("admitted", "launching"),
        ("launching", "running"),
        ("running", "succeeded"),
    ]
    assert all(t.reason for t in store.history("a"))


def test_a_failing_exit_code_is_recorded_as_failed_with_the_code() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("a").build(), at=0.0)
    loop.step()
    backend.started("a", 1.0)
    backend.exited("a", 2.0, code=3)
    loop.step()
    record = store.get("a")
    assert record.state is S.FAILED
    assert record.exit_code == 3
    assert "exited 3" in store.history("a")[-1].reason


def test_preemption_stops_the_victim_with_grace_requeues_it_and_places_the_preemptor() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("low").gpus(8).priority(0).build(), at=0.0)
    loop.step()
    backend.started("low", 0.0)
    clock.t = 10.0
    store.submit(make_job("high").gpus(8).priority(5).build(), at=10.0)
    report = loop.step()
    assert report.preempted == 1
    assert store.get("low").state is S.EVICTING
    assert store.get("low").evicting_for == "high"
    assert backend.stops == [("low", 1, 12.0)]
    assert store.get("high").state is S.PENDING
    assert "preempting" in store.get("high").waiting_reason
    clock.t = 20.0
    backend.stopped("low", 20.0)
    loop.step()
    assert store.get("high").state is S.LAUNCHING  # the room went to the job that preempted for it
    low = store.get("low")
    assert low.state is S.PENDING
    assert low.preemptions == 1
    assert low.attained_gpu_seconds == pytest.approx(8 * 20.0)
    assert low.waiting_code == "unschedulable"  # back in its queue, waiting for room
    # Nothing is left of the preemption in the loop's state: every cycle copies what is there.
    assert not loop.base.evicting
    assert not loop.base.state.evicting_for


def test_a_job_that_does_not_fit_is_parked_until_something_is_released() -> None:
    store, backend, clock, loop = setup(policy="best-fit")
    store.submit(make_job("big").gpus(8).build(), at=0.0)
    loop.step()
    backend.started("big", 0.0)
    store.submit(make_job("waits").gpus(4).build(), at=1.0)
    first = loop.step()
    assert first.decided == 1
    assert first.placed == 0
    assert store.get("waits").waiting_code == "unschedulable"
    assert "too few free GPUs" in store.get("waits").waiting_reason
    idle = loop.step()
    assert idle.decided == 0  # parked: nothing changed that could let it in
    backend.exited("big", 50.0)
    woken = loop.step()
    assert woken.placed == 1
    assert store.get("waits").state is S.LAUNCHING


def test_strict_fifo_keeps_a_small_job_behind_a_blocked_head() -> None:
    store, backend, clock, loop = setup(policy="fifo")
    store.submit(make_job("running").gpus(6).build(), at=0.0)
    loop.step()
    store.submit(make_job("head").gpus(4).build(), at=1.0)
    store.submit(make_job("small").gpus(1).build(), at=2.0)
    loop.step()
    assert store.get("head").state is S.PENDING
    assert store.get("small").state is S.PENDING
    assert "behind job head" in store.get("small").waiting_reason


def test_backfill_lets_the_small_job_go_first() -> None:
    store, backend, clock, loop = setup(policy="fifo-backfill")
    store.submit(make_job("running").gpus(6).build(), at=0.0)
    loop.step()
    store.submit(make_job("head").gpus(4).build(), at=1.0)
    store.submit(make_job("small").gpus(1).build(), at=2.0)
    loop.step()
    assert store.get("head").state is S.PENDING
    assert store.get("small").state is S.LAUNCHING


def test_an_observation_of_an_earlier_attempt_is_ignored() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("low").gpus(8).build(), at=0.0)
    loop.step()
    store.submit(make_job("high").gpus(8).priority(9).build(), at=1.0)
    loop.step()
    backend.stopped("low", 2.0)
    loop.step()  # high placed; low pending again (attempt 1 is over)
    stale = store.get("low")
    backend._inbox.append(Observation("low", 1, ObservationKind.EXITED, 3.0, exit_code=0))
    loop.step()
    assert store.get("low").state is S.PENDING
    assert store.get("low").version == stale.version


def test_quota_is_respected_and_a_release_in_the_queue_wakes_its_jobs() -> None:
    queues = [QueueSpec("team-a", {"gpu": Quota(nominal=4000)})]
    store, backend, clock, loop = setup(policy="best-fit", queues=queues)
    store.submit(make_job("a1").gpus(4).queue("team-a").build(), at=0.0)
    store.submit(make_job("a2").gpus(2).queue("team-a").build(), at=0.0)
    loop.step()
    assert store.get("a1").state is S.LAUNCHING
    assert store.get("a2").waiting_code == "unschedulable"
    assert "quota" in store.get("a2").waiting_reason
    backend.exited("a1", 10.0)
    loop.step()
    assert store.get("a2").state is S.LAUNCHING


def test_the_base_state_stays_equal_to_one_built_from_the_store() -> None:
    store, backend, clock, loop = setup(policy="default", nodes=2)
    for i in range(6):
        store.submit(make_job(f"j{i}").gpus(1 + i % 4).priority(i % 3).build(), at=float(i))
        clock.t = float(i)
        loop.step()
    backend.exited("j0", 10.0)
    clock.t = 10.0
    loop.step()
    fresh = Reconciler(store, ScriptedBackend(), clock, profile("default")).base
    assert fingerprint(loop.base.state) == fingerprint(fresh.state)
    assert isinstance(fresh.state, CycleState)


class MoveAt:
    """Moves `job_id` in the cycles run at `when` (a policy's move, as data)."""

    name = "move-at"

    def __init__(self, job_id: str, when: float) -> None:
        self.job_id = job_id
        self.when = when

    def migrations(self, cluster: object) -> list[tuple[str, str]]:
        now = getattr(cluster, "now", None)
        return [(self.job_id, "the test moves it")] if now == self.when else []


def test_a_moved_job_stops_with_grace_goes_back_to_its_queue_and_starts_again() -> None:
    store, backend, clock, loop = setup(nodes=2)
    loop.profile = dataclasses.replace(loop.profile, migrate=MoveAt("a", 10.0))
    store.submit(make_job("a").gpus(8).build(), at=0.0)
    loop.step()
    backend.started("a", 0.0)
    clock.t = 10.0
    store.submit(make_job("b").gpus(8).build(), at=10.0)  # a cycle runs at 10 s: the policy is asked then
    report = loop.step()
    assert report.migrated == 1
    assert report.preempted == 0
    moved = store.get("a")
    assert moved.state is S.EVICTING
    assert moved.reason == "moved: the test moves it"
    assert moved.evicting_for is None
    assert backend.stops == [("a", 1, 12.0)]  # the checkpoint signal and the grace period of any stop
    assert store.get("b").state is S.LAUNCHING  # nobody waits for its room
    clock.t = 20.0
    backend.stopped("a", 20.0)
    loop.step()
    again = store.get("a")
    assert again.state is S.LAUNCHING
    assert again.attempt == 2  # a restart: the simulator charges its restart cost on this attempt
    assert again.preemptions == 1
    assert again.attained_gpu_seconds == pytest.approx(8 * 20.0)
    assert not loop.base.evicting
