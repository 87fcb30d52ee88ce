"""The control loop feeds the profile's learner the facts it sees, and hands what it learned to the cycle as
data: runs that ended on their own are learned once, with their run time at the moment they ended; runs
that were stopped, preempted or lost never are; pending jobs carry their estimate until they end or leave."""

from __future__ import annotations

import dataclasses

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.domain.jobs import RunSpec
from gpufleet.policies.catalog import profile
from gpufleet.policies.order.qssf import RunTimeLearner
from gpufleet.ports import ObservationKind, RequestKind
from gpufleet.sim.engine import Simulation
from gpufleet.sim.workloads import generate_synthetic
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState


def setup(policy: str = "default-qssf") -> tuple[InMemoryStore, ScriptedBackend, ManualClock, Reconciler]:
    store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile(policy), settings=ReconcilerSettings(grace_s=12.0))
    return store, backend, clock, loop


def learner_of(loop: Reconciler) -> RunTimeLearner:
    learner = loop.profile.learner
    assert isinstance(learner, RunTimeLearner)
    return learner


def test_a_run_is_learned_when_it_exits_with_its_exact_run_time_even_with_nothing_else_to_decide() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("a").gpus(2).build(), at=0.0)
    loop.step()
    backend.started("a", 1.0)
    clock.t = 100.0
    backend.exited("a", 100.0)
    loop.step()  # nothing is pending: no job is keyed or decided in this step
    learner = learner_of(loop)
    assert learner.predictor.learned == 1
    assert list(learner.predictor.overall.runs) == [100.0]  # from its launch to the step that saw it exit


def test_a_preempted_run_is_not_learned_and_its_estimate_is_kept() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("low").gpus(8).priority(0).build(), at=0.0)
    loop.step()
    estimate = loop.learning.estimates["low"]
    backend.started("low", 0.0)
    clock.t = 10.0
    store.submit(make_job("high").gpus(8).priority(5).build(), at=10.0)
    loop.step()
    assert store.get("low").state is S.EVICTING
    clock.t = 20.0
    backend.stopped("low", 20.0)  # stopped right away: no step in between saw it being stopped
    loop.step()
    assert store.get("low").state is S.PENDING
    assert store.get("high").state is S.LAUNCHING
    assert learner_of(loop).predictor.learned == 0
    assert loop.learning.estimates["low"] is estimate  # back in the queue with the estimate it had
    backend.started("high", 20.0)
    clock.t = 500.0
    backend.exited("high", 500.0)
    loop.step()
    assert list(learner_of(loop).predictor.overall.runs) == [480.0]
    assert "high" not in loop.learning.estimates  # it will not be ordered again


def test_a_lost_run_is_not_learned_and_a_crashed_one_retried_is_estimated_afresh() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("lost").gpus(4).build(), at=0.0)
    crash = make_job("crash").gpus(4).build()
    store.submit(dataclasses.replace(crash, run=RunSpec(command=("python", "train.py"), retries=1)), at=0.0)
    loop.step()
    backend.started("lost", 0.0)
    backend.started("crash", 0.0)
    clock.t = 50.0
    backend.observe("lost", ObservationKind.LOST, 50.0)
    backend.exited("crash", 50.0, code=1)
    loop.step()
    learner = learner_of(loop)
    assert list(learner.predictor.overall.runs) == [50.0]  # the crashed run ended on its own; the lost one did not
    assert store.get("crash").state in (S.PENDING, S.ADMITTED, S.LAUNCHING)
    assert "lost" in loop.learning.estimates


def test_a_cancelled_job_leaves_no_estimate_behind() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("big").gpus(8).build(), at=0.0)
    store.submit(make_job("waits").gpus(8).build(), at=0.0)
    loop.step()
    assert "waits" in loop.learning.estimates
    store.request("waits", RequestKind.CANCEL, "not needed", at=1.0)
    clock.t = 1.0
    loop.step()
    assert store.get("waits").state is S.CANCELLED
    assert "waits" not in loop.learning.estimates


def test_in_a_simulation_each_run_that_ended_on_its_own_is_learned_once_and_no_stopped_run_is() -> None:
    # Heavy contention under `default`: LAS and priority preemption fire, victims stop within the grace period.
    workload = generate_synthetic(seed=3, jobs=120, nodes=4, arrival_rate_per_hour=600.0, duration_median_s=900.0)
    prof = profile("default")
    learner = prof.learner
    assert isinstance(learner, RunTimeLearner)
    learned: list[tuple[str, float, float]] = []
    add = learner.predictor.add

    def recording(queue: str, gpus: float, seconds: float) -> None:
        learned.append((queue, gpus, seconds))
        add(queue, gpus, seconds)

    learner.predictor.add = recording  # type: ignore[method-assign]
    log = Simulation(workload, prof).run().store.log
    ended_on_their_own = [t for t in log if t.reason.startswith(("all workers exited 0", "a worker exited"))]
    preempted = [t for t in log if t.target is S.EVICTING]
    assert len(preempted) >= 5  # preemption fired: stopped runs were there to be mistaken for finished ones
    assert len(learned) == len(ended_on_their_own)
    # A run of a job that was never stopped: learned as the time from its launch to its exit.
    launched = {t.job_id: t.at for t in log if t.target is S.LAUNCHING}
    once = {t.job_id for t in ended_on_their_own} - {t.job_id for t in preempted}
    exact = sorted(t.at - launched[t.job_id] for t in ended_on_their_own if t.job_id in once)
    assert exact
    assert set(exact) <= {seconds for _, _, seconds in learned}
