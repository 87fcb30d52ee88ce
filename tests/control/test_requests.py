"""Users' requests (cancel, requeue), retries and max runtime, as the loop turns them into transitions;
and adoption of what the store believes is running at start."""

from __future__ import annotations

import dataclasses

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import GiB, Job, JobState, QueueSpec, make_node
from gpufleet.domain.jobs import RunSpec
from gpufleet.domain.records import StopCause
from gpufleet.policies.catalog import profile
from gpufleet.ports import ObservationKind, RequestKind
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState


def with_run(job: Job, **run: object) -> Job:
    return dataclasses.replace(job, run=RunSpec(command=("python", "train.py"), **run))  # type: ignore[arg-type]


def setup() -> tuple[InMemoryStore, ScriptedBackend, ManualClock, Reconciler]:
    store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    return store, backend, clock, Reconciler(store, backend, clock, profile("default"))


def run_job(store: InMemoryStore, backend: ScriptedBackend, loop: Reconciler, job: Job) -> None:
    store.submit(job, at=0.0)
    loop.step()
    backend.started(job.id, 0.0)
    loop.step()
    assert store.get(job.id).state is S.RUNNING


def test_cancel_of_a_pending_job_ends_it_and_it_is_never_placed() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("big").gpus(8).build(), at=0.0)
    store.submit(make_job("waits").gpus(8).build(), at=0.0)
    loop.step()
    store.request("waits", RequestKind.CANCEL, "by alice", at=1.0)
    clock.t = 1.0
    loop.step()
    assert store.get("waits").state is S.CANCELLED
    assert store.history("waits")[-1].reason == "cancelled: by alice"
    backend.started("big", 1.0)
    backend.exited("big", 2.0, code=0)
    clock.t = 2.0
    loop.step()
    assert [launch.job.id for launch in backend.launches] == ["big"]


def test_cancel_of_a_running_job_stops_it_with_its_grace_and_ends_cancelled_whatever_its_exit_code() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, with_run(make_job("a").gpus(2).build(), grace_s=7.0))
    store.request("a", RequestKind.CANCEL, "", at=1.0)
    loop.step()
    assert store.get("a").state is S.EVICTING
    assert store.get("a").stop_cause is StopCause.CANCELLED
    assert backend.stops == [("a", 1, 7.0)]
    backend.exited("a", 2.0, code=143)
    loop.step()
    record = store.get("a")
    assert record.state is S.CANCELLED
    assert record.exit_code == 143


def test_a_stopped_cancelled_job_is_cancelled_and_its_gpus_go_to_the_next_job() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, make_job("a").gpus(8).build())
    store.submit(make_job("b").gpus(8).build(), at=1.0)
    store.request("a", RequestKind.CANCEL, "", at=1.0)
    loop.step()
    assert [launch.job.id for launch in backend.launches] == ["a"]
    backend.observe("a", ObservationKind.STOPPED, 3.0)
    loop.step()
    assert store.get("a").state is S.CANCELLED
    assert [launch.job.id for launch in backend.launches] == ["a", "b"]


def test_cancel_during_preemption_ends_cancelled_not_requeued() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, make_job("low").gpus(8).priority(0).build())
    store.submit(make_job("high").gpus(8).priority(10).build(), at=1.0)
    loop.step()
    assert store.get("low").state is S.EVICTING
    store.request("low", RequestKind.CANCEL, "", at=2.0)
    loop.step()
    backend.observe("low", ObservationKind.STOPPED, 3.0)
    loop.step()
    assert store.get("low").state is S.CANCELLED
    assert store.get("high").state is S.LAUNCHING


def test_requeue_puts_a_running_job_back_in_its_queue_and_a_replayed_request_does_not_stop_it_again() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, make_job("a").gpus(2).build())
    store.request("a", RequestKind.REQUEUE, "node n0 drained", at=0.5)
    clock.t = 1.0
    loop.step()
    backend.observe("a", ObservationKind.STOPPED, 1.0)
    clock.t = 2.0
    loop.step()
    record = store.get("a")
    assert record.state is S.LAUNCHING
    assert record.attempt == 2
    assert "requeued: node n0 drained" in store.history("a")[-3].reason
    # A new loop (restart) replays every request: the old requeue predates the new attempt.
    backend.started("a", 2.0)
    loop.step()
    again = Reconciler(store, backend, clock, profile("default"))
    again.step()
    assert store.get("a").state is S.RUNNING
    assert [launch.job.id for launch in backend.adopted] == ["a"]


def test_a_failed_attempt_is_retried_until_its_retries_are_spent() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, with_run(make_job("a").gpus(1).build(), retries=1))
    backend.exited("a", 1.0, code=3)
    loop.step()
    record = store.get("a")
    assert record.state is S.LAUNCHING
    assert record.failures == 1
    assert "retry 1 of 1" in store.history("a")[-3].reason
    backend.started("a", 1.0)
    backend.exited("a", 2.0, code=4)
    loop.step()
    record = store.get("a")
    assert record.state is S.FAILED
    assert record.exit_code == 4
    assert record.failures == 2


def test_an_attempt_past_its_max_runtime_is_stopped_and_fails_with_the_reason() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, with_run(make_job("a").gpus(1).build(), max_runtime_s=60.0, grace_s=5.0))
    clock.t = 59.0
    loop.step()
    assert backend.stops == []
    clock.t = 60.0
    loop.step()
    assert backend.stops == [("a", 1, 5.0)]
    backend.observe("a", ObservationKind.STOPPED, 61.0)
    loop.step()
    record = store.get("a")
    assert record.state is S.FAILED
    assert "max runtime of 60 s" in store.history("a")[-1].reason


def test_a_lost_launch_is_retried_and_a_cancelled_job_lost_while_stopping_is_cancelled() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("a").gpus(1).build(), at=0.0)
    loop.step()
    backend.observe("a", ObservationKind.LOST, 1.0)
    loop.step()
    assert store.get("a").state is S.LAUNCHING
    assert store.get("a").attempt == 2
    backend.started("a", 1.0)
    loop.step()
    store.request("a", RequestKind.CANCEL, "", at=2.0)
    loop.step()
    backend.observe("a", ObservationKind.LOST, 3.0)
    loop.step()
    assert store.get("a").state is S.CANCELLED


def test_the_loop_tells_the_backend_at_start_what_the_store_believes_is_running() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, make_job("a").gpus(1).build())
    store.submit(make_job("b").gpus(1).build(), at=0.0)
    fresh = ScriptedBackend()
    Reconciler(store, fresh, clock, profile("default"))
    assert [(launch.job.id, launch.attempt) for launch in fresh.adopted] == [("a", 1)]


def test_a_reclaim_stops_an_idle_job_and_requeues_it_as_reclaimed_not_preempted() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, make_job("idle").gpus(8).build())
    store.submit(make_job("waits").gpus(8).build(), at=1.0)
    store.request("idle", RequestKind.RECLAIM, "reserved but idle: 8 GPU(s) under 5 % for 30 min", at=1.0)
    clock.t = 1.0
    loop.step()
    assert store.get("idle").stop_cause is StopCause.RECLAIMED
    backend.observe("idle", ObservationKind.STOPPED, 2.0)
    clock.t = 2.0
    loop.step()
    reasons = [t.reason for t in store.history("idle")]
    assert reasons[-2].startswith("reclaimed: reserved but idle")
    assert "at the back of queue default" in reasons[-1]
    assert store.get("idle").state is S.PENDING
    assert store.get("waits").state is S.LAUNCHING


def test_force_cancel_kills_at_once_whatever_the_grace_and_is_recorded_as_such() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, with_run(make_job("a").gpus(2).build(), grace_s=3600.0))
    store.request("a", RequestKind.FORCE_CANCEL, "by alice", at=1.0)
    loop.step()
    assert backend.stops == [("a", 1, 0.0)]
    backend.observe("a", ObservationKind.STOPPED, 1.1)
    loop.step()
    record = store.get("a")
    assert record.state is S.CANCELLED
    assert record.reason == "force-cancelled (killed at once, without its grace period): by alice"


def test_force_cancel_of_a_job_already_stopping_with_its_grace_kills_it_now() -> None:
    store, backend, clock, loop = setup()
    run_job(store, backend, loop, with_run(make_job("a").gpus(2).build(), grace_s=600.0))
    store.request("a", RequestKind.CANCEL, "by alice", at=1.0)
    loop.step()
    assert backend.stops == [("a", 1, 600.0)]
    store.request("a", RequestKind.FORCE_CANCEL, "by admin", at=2.0)
    loop.step()
    assert backend.stops == [("a", 1, 600.0), ("a", 1, 0.0)]
    assert store.get("a").state is S.EVICTING
    assert "force-cancelled" in store.get("a").reason
    backend.observe("a", ObservationKind.STOPPED, 2.1)
    loop.step()
    assert store.get("a").state is S.CANCELLED


def test_force_cancel_of_a_pending_job_cancels_it() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("big").gpus(8).build(), at=0.0)
    store.submit(make_job("waits").gpus(8).build(), at=0.0)
    loop.step()
    store.request("waits", RequestKind.FORCE_CANCEL, "by alice", at=1.0)
    loop.step()
    assert store.get("waits").state is S.CANCELLED
    assert backend.stops == []


def test_a_stop_never_waits_longer_than_the_queues_maximum_grace() -> None:
    """A job stored before its queue had a cap (or with the cap lowered since) asks for a day: it gets the cap."""
    store = InMemoryStore(
        [make_node("n0", "A100-80GB", 8, 80 * GiB)],
        [QueueSpec("default", max_grace_s=60.0), QueueSpec("free")],
    )
    backend = ScriptedBackend()
    loop = Reconciler(store, backend, ManualClock(), profile("default"), settings=ReconcilerSettings(max_grace_s=3600))
    run_job(store, backend, loop, with_run(make_job("capped").gpus(1).build(), grace_s=86400.0))
    run_job(store, backend, loop, with_run(make_job("other").queue("free").gpus(1).build(), grace_s=86400.0))
    store.request("capped", RequestKind.CANCEL, "", at=1.0)
    store.request("other", RequestKind.CANCEL, "", at=1.0)
    loop.step()
    assert sorted(backend.stops) == [("capped", 1, 60.0), ("other", 1, 3600.0)]
