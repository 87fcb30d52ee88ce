"""Reported checkpoints in the control loop: victim choice reads them, each start is given a Young/Daly
interval from the reported cost, and each attempt that ends by preemption, loss or failure keeps the work it
lost since its last checkpoint."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.domain.checkpoints import DEFAULT_GPU_FAILURES_PER_HOUR, LossCause, ObservedPool
from gpufleet.policies.catalog import profile
from gpufleet.ports import ObservationKind, RequestKind
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState


def setup(
    nodes: int = 1, pools: dict[str, ObservedPool] | None = None, spot: bool = False
) -> tuple[InMemoryStore, ScriptedBackend, ManualClock, Reconciler]:
    made = [make_node(f"n{i}", "A100-80GB", 8, 80 * GiB) for i in range(nodes)]
    if spot:
        made = [dataclasses.replace(n, pool="spot", zone="us-east-1a") for n in made]
    store = InMemoryStore(made)
    backend = ScriptedBackend()
    clock = ManualClock()
    settings = ReconcilerSettings(grace_s=5.0)
    observed = pools or {}
    loop = Reconciler(store, backend, clock, profile("default"), settings=settings, observed_pools=lambda: observed)
    return store, backend, clock, loop


def start(store: InMemoryStore, backend: ScriptedBackend, clock: ManualClock, loop: Reconciler, *ids: str) -> None:
    for job_id in ids:
        store.submit(make_job(job_id).gpus(4).priority(0).build(), at=clock.t)
    loop.step()
    for job_id in ids:
        backend.started(job_id, clock.t)
    loop.step()
    assert all(store.get(job_id).state is S.RUNNING for job_id in ids)


@pytest.mark.parametrize("saved", ["a", "b"])
def test_of_two_equal_victims_the_one_that_reported_a_recent_checkpoint_is_stopped(saved: str) -> None:
    store, backend, clock, loop = setup()
    start(store, backend, clock, loop, "a", "b")
    clock.t = 3000.0
    store.request(saved, RequestKind.CHECKPOINT, "checkpoint saved in 20 s", at=2990.0, value=20.0)
    loop.step()
    assert store.get(saved).last_checkpoint_at == 2990.0
    assert store.get(saved).checkpoint_cost_s == 20.0
    store.submit(make_job("high").gpus(4).priority(5).build(), at=3000.0)
    loop.step()
    victims = [job_id for job_id in ("a", "b") if store.get(job_id).state is S.EVICTING]
    assert victims == [saved]  # it loses 10 s of work; the other would lose 3000 s


@pytest.mark.parametrize("declares", ["a", "b"])
def test_a_declared_interval_is_the_fallback_when_nothing_was_reported(declares: str) -> None:
    store, backend, clock, loop = setup()
    for job_id in ("a", "b"):
        job = make_job(job_id).gpus(4).build()
        store.submit(dataclasses.replace(job, checkpoint_interval=1000.0 if job_id == declares else None), at=0.0)
    loop.step()
    backend.started("a", 0.0)
    backend.started("b", 0.0)
    loop.step()
    clock.t = 2100.0  # the declaring job saved (by its declaration) at 2000: loses 100 s; the other 2100 s
    store.submit(make_job("high").gpus(4).priority(5).build(), at=2100.0)
    loop.step()
    assert [job_id for job_id in ("a", "b") if store.get(job_id).state is S.EVICTING] == [declares]


def test_each_start_is_given_the_young_daly_interval_from_the_reported_cost() -> None:
    store, backend, clock, loop = setup()
    start(store, backend, clock, loop, "a")
    assert backend.launches[0].checkpoint_interval_s is None  # no checkpoint reported yet: no C
    clock.t = 100.0
    store.request("a", RequestKind.CHECKPOINT, "", at=90.0, value=30.0)
    store.request("a", RequestKind.REQUEUE, "drain", at=100.0)
    loop.step()
    backend.stopped("a", 101.0)
    clock.t = 101.0
    loop.step()
    loop.step()
    relaunch = backend.launches[-1]
    assert relaunch.attempt == 2
    mtbf = 3600.0 / (8 * DEFAULT_GPU_FAILURES_PER_HOUR)  # the whole 8-GPU node fails with any GPU
    assert relaunch.checkpoint_interval_s == pytest.approx(math.sqrt(2 * 30.0 * mtbf))
    plan = store.get("a").checkpoint_plan
    assert plan is not None
    assert plan.cost_s == 30.0
    assert plan.mtbf_s == pytest.approx(mtbf)
    assert "Llama 3" in plan.mtbf_source


def test_a_spot_pool_observed_rate_shortens_the_interval() -> None:
    observed = {"us-east-1a": ObservedPool(rate_per_node_hour=0.5, node_hours=10.0)}
    store, backend, clock, loop = setup(pools=observed, spot=True)
    job = make_job("a").gpus(4).build()
    store.submit(dataclasses.replace(job, request=dataclasses.replace(job.request, spot="allowed")), at=0.0)
    store.request("a", RequestKind.CHECKPOINT, "", at=0.0, value=60.0)
    loop.step()
    plan = store.get("a").checkpoint_plan
    assert plan is not None
    rate = 0.5 + 8 * DEFAULT_GPU_FAILURES_PER_HOUR
    assert plan.mtbf_s == pytest.approx(3600.0 / rate)
    assert plan.interval_s == pytest.approx(math.sqrt(2 * 60.0 * 3600.0 / rate))
    assert "observed 0.5/node-h" in plan.mtbf_source


def test_a_preempted_attempt_keeps_the_work_since_its_last_checkpoint_as_lost() -> None:
    store, backend, clock, loop = setup()
    start(store, backend, clock, loop, "a")
    clock.t = 1000.0
    store.request("a", RequestKind.CHECKPOINT, "", at=700.0, value=10.0)
    store.submit(make_job("high").gpus(8).priority(5).build(), at=1000.0)
    loop.step()
    assert store.get("a").state is S.EVICTING
    # It saves once more on its stop signal and reports it before it exits: that save counts.
    clock.t = 1004.0
    store.request("a", RequestKind.CHECKPOINT, "", at=1003.0, value=3.0)
    backend.stopped("a", 1004.0)
    loop.step()
    loss = store.get("a").attempt_loss
    assert loss is not None
    assert loss.cause is LossCause.PREEMPTED
    assert loss.lost_s == pytest.approx(1.0)
    assert loss.gpus == 4.0


def test_a_lost_and_a_failed_attempt_lose_the_work_since_start_without_checkpoints() -> None:
    store, backend, clock, loop = setup()
    start(store, backend, clock, loop, "a", "b")
    clock.t = 500.0
    backend.observe("a", ObservationKind.LOST, 500.0)
    backend.exited("b", 400.0, code=1)
    loop.step()
    lost, failed = store.get("a").attempt_loss, store.get("b").attempt_loss
    assert lost is not None
    assert lost.cause is LossCause.LOST
    assert lost.lost_s == pytest.approx(500.0)
    assert failed is not None
    assert failed.cause is LossCause.FAILED
    assert failed.lost_s == pytest.approx(400.0)


def test_a_checkpoint_of_a_job_that_ended_is_ignored() -> None:
    store, backend, clock, loop = setup()
    start(store, backend, clock, loop, "a")
    backend.exited("a", 10.0, code=0)
    clock.t = 10.0
    loop.step()
    store.request("a", RequestKind.CHECKPOINT, "", at=11.0, value=1.0)
    loop.step()
    assert store.get("a").state is S.SUCCEEDED
    assert store.get("a").last_checkpoint_at is None
