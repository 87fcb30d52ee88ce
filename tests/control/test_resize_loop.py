"""Resizes in the control loop: an elastic job grows into idle GPUs (holding them from the decision), shrinks
to admit a waiting job (holding its old GPUs until RESIZED), is recorded as a resize of the same attempt, and
its progress history gets the new size; a backend that cannot resize is never asked."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.control.resize import MILLI, _one_node_gpus
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.records import JobRecord
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.plugin_api import ResizeInput
from gpufleet.scheduling.table import NodeTable
from tests.kit import fingerprint, make_job
from tests.kit.fake_backend import ManualClock, ResizingBackend, ScriptedBackend
from tests.kit.scripted_resize import ScriptedResize

S = JobState


def setup(backend: ScriptedBackend | None = None) -> tuple[InMemoryStore, ScriptedBackend, ManualClock, Reconciler]:
    store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = backend if backend is not None else ResizingBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("default"), settings=ReconcilerSettings(grace_s=12.0))
    return store, backend, clock, loop


def gpus(store: InMemoryStore, job_id: str) -> int:
    record = store.get(job_id)
    assert record is not None
    return sum(s.milli for w in record.workers for s in w.gpus) // 1000


def step_at(clock: ManualClock, loop: Reconciler, t: float) -> None:
    clock.t = t
    loop.step()


def matches_the_store(loop: Reconciler, store: InMemoryStore, clock: ManualClock) -> bool:
    fresh = Reconciler(store, ScriptedBackend(), clock, profile("default")).base
    return fingerprint(loop.base.state) == fingerprint(fresh.state)


def test_an_elastic_job_grows_into_gpus_that_became_idle() -> None:
    store, backend, clock, loop = setup()
    assert isinstance(backend, ResizingBackend)
    store.submit(make_job("fixed").gpus(4).build(), at=0.0)
    store.submit(make_job("elastic").gpus(1).elastic(1, 8).build(), at=0.0)
    step_at(clock, loop, 0.0)
    assert (gpus(store, "fixed"), gpus(store, "elastic")) == (4, 4)  # it starts at what fits
    backend.started("fixed", 1.0)
    backend.started("elastic", 1.0)
    backend.exited("fixed", 10.0)
    step_at(clock, loop, 10.0)
    step_at(clock, loop, 60.0)  # the next resize interval
    record = store.get("elastic")
    assert record is not None
    assert record.state is S.RUNNING
    assert (gpus(store, "elastic"), record.resizes, record.resizing, record.attempt) == (8, 1, True, 1)
    launch, grace, count = backend.resizes[-1]
    assert (len(launch.workers), launch.attempt, count, grace) == (8, 1, 1, 12.0)
    assert matches_the_store(loop, store, clock)  # the grow holds its new GPUs from the decision on
    backend.resized("elastic", 61.0)
    step_at(clock, loop, 61.0)
    record = store.get("elastic")
    assert record is not None
    assert (record.resizing, record.state, record.failures) == (False, S.RUNNING, 0)
    assert "resized to 8 GPU(s)" in record.reason
    progress = store.job_progress("elastic")
    assert progress is not None
    assert progress.sizes[-1] == (61.0, 8)
    # GPU-time: 4 GPUs from its start (1 s) to the grow (60 s), then 8.
    assert record.attained_gpu_seconds == 4 * 59.0 + 8 * 1.0
    # the resize is in the job's history (what explain and the dashboard show): when it started and ended
    history = [(t.source, t.target, t.at, t.reason) for t in store.history("elastic")]
    assert [(s, t) for s, t, _, _ in history] == [
        (S.PENDING, S.ADMITTED),
        (S.ADMITTED, S.LAUNCHING),
        (S.LAUNCHING, S.RUNNING),
        (S.RUNNING, S.RUNNING),
        (S.RUNNING, S.RUNNING),
    ]
    assert history[3][2:] == (60.0, "growing from 4 to 8 GPU(s) into idle GPUs")
    assert history[4][2] == 61.0
    assert history[4][3].startswith("resized to 8 GPU(s) in 8 worker(s)")


def test_an_elastic_job_shrinks_to_admit_a_waiting_job_and_holds_its_gpus_until_resized() -> None:
    store, backend, clock, loop = setup()
    assert isinstance(backend, ResizingBackend)
    store.submit(make_job("elastic").gpus(1).elastic(2, 8).build(), at=0.0)
    step_at(clock, loop, 0.0)
    backend.started("elastic", 1.0)
    step_at(clock, loop, 1.0)
    assert gpus(store, "elastic") == 8
    store.submit(make_job("new").gpus(4).build(), at=30.0)
    step_at(clock, loop, 30.0)
    assert store.get("new").state is S.PENDING  # type: ignore[union-attr]
    step_at(clock, loop, 60.0)
    record = store.get("elastic")
    assert record is not None
    assert (gpus(store, "elastic"), len(record.resize_to), record.resizes) == (8, 4, 1)  # still holds all 8
    assert store.get("new").state is S.PENDING  # type: ignore[union-attr]  # nothing given twice
    assert matches_the_store(loop, store, clock)
    backend.resized("elastic", 65.0)
    step_at(clock, loop, 65.0)
    assert gpus(store, "elastic") == 4
    assert store.get("new").state is S.LAUNCHING  # type: ignore[union-attr]
    assert backend.stops == []  # a shrink, not a preemption
    assert matches_the_store(loop, store, clock)


def test_a_restart_during_a_shrink_asks_for_it_again_and_only_its_own_resized_ends_it() -> None:
    store, backend, clock, loop = setup()
    assert isinstance(backend, ResizingBackend)
    store.submit(make_job("elastic").gpus(1).elastic(2, 8).build(), at=0.0)
    step_at(clock, loop, 0.0)
    backend.started("elastic", 1.0)
    step_at(clock, loop, 1.0)
    store.submit(make_job("new").gpus(4).build(), at=30.0)
    step_at(clock, loop, 30.0)
    step_at(clock, loop, 60.0)
    [(asked, _, _)] = backend.resizes
    # The control plane restarts before RESIZED: the new one adopts the job as it runs (all 8 GPUs) and asks
    # for the same resize again (the backend does it once per count).
    again = ResizingBackend(launches=list(backend.launches))
    loop = Reconciler(store, again, clock, profile("default"), settings=ReconcilerSettings(grace_s=12.0))
    [adopted] = again.adopted
    assert len(adopted.workers) == 8
    assert again.resizes == [(asked, 12.0, 1)]
    assert len(asked.workers) == 4
    # A RESIZED of another resize (a backend saying an earlier one again) changes nothing.
    again.observe_resized("elastic", 62.0, resize_count=0)
    step_at(clock, loop, 62.0)
    record = store.get("elastic")
    assert record is not None
    assert (record.resizing, gpus(store, "elastic")) == (True, 8)
    assert store.get("new").state is S.PENDING  # type: ignore[union-attr]
    again.observe_resized("elastic", 65.0, resize_count=1)
    step_at(clock, loop, 65.0)
    record = store.get("elastic")
    assert record is not None
    assert (record.resizing, gpus(store, "elastic"), record.resizes) == (False, 4, 1)
    assert store.get("new").state is S.LAUNCHING  # type: ignore[union-attr]
    assert matches_the_store(loop, store, clock)


def test_a_backend_that_cannot_resize_is_never_asked() -> None:
    store, backend, clock, loop = setup(ScriptedBackend())
    store.submit(make_job("fixed").gpus(4).build(), at=0.0)
    store.submit(make_job("elastic").gpus(1).elastic(1, 8).build(), at=0.0)
    step_at(clock, loop, 0.0)
    backend.started("elastic", 1.0)
    backend.exited("fixed", 10.0)
    for t in (10.0, 60.0, 120.0, 600.0):
        step_at(clock, loop, t)
    assert gpus(store, "elastic") == 4
    assert loop.resizer is None
    assert loop.next_retry_at() is None


def test_fixed_size_jobs_and_baselines_never_resize() -> None:
    assert profile("tiresias").resize is None
    assert profile("fifo").resize is None
    store, backend, clock, loop = setup()
    assert isinstance(backend, ResizingBackend)
    store.submit(make_job("a").gpus(2).build(), at=0.0)
    step_at(clock, loop, 0.0)
    backend.started("a", 1.0)
    for t in (60.0, 120.0, 180.0):
        step_at(clock, loop, t)
    assert backend.resizes == []
    assert gpus(store, "a") == 2


def test_a_jobs_node_boundary_is_where_it_runs() -> None:
    """On one node: what it holds there and the whole GPUs free there; on several: one GPU (every larger
    size is across nodes, as the network terms of its goodput say)."""
    table = NodeTable([make_node(name, "T4", 4, 16 * GiB) for name in ("n0", "n1")])
    job = make_job("elastic").gpus(1).elastic(1, 8).build()
    alone = (WorkerPlacement("n0", (GpuShare(0),)), WorkerPlacement("n0", (GpuShare(1),)))
    table.apply_many(alone, -1)
    whole_free = (table.gpu_milli_free == MILLI) & table.schedulable[:, None]
    assert _one_node_gpus(table, whole_free, JobRecord(job, S.RUNNING, workers=alone)) == 4
    table.apply(WorkerPlacement("n0", (GpuShare(2),)), -1)  # another job takes one of its node's GPUs
    whole_free = (table.gpu_milli_free == MILLI) & table.schedulable[:, None]
    assert _one_node_gpus(table, whole_free, JobRecord(job, S.RUNNING, workers=alone)) == 3
    spread = (alone[0], WorkerPlacement("n1", (GpuShare(0),)))
    assert _one_node_gpus(table, whole_free, JobRecord(job, S.RUNNING, workers=spread)) == 1


def test_the_resize_policy_sees_the_gpu_time_each_job_has_had() -> None:
    seen: list[ResizeInput] = []

    class Recording(ScriptedResize):
        def resize(self, given: ResizeInput) -> Mapping[str, int]:
            seen.append(given)
            return super().resize(given)

    store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = ResizingBackend()
    clock = ManualClock()
    chosen = dataclasses.replace(profile("default"), resize=Recording())
    loop = Reconciler(store, backend, clock, chosen, settings=ReconcilerSettings(grace_s=12.0))
    store.submit(make_job("elastic").gpus(1).elastic(1, 8).build(), at=0.0)
    store.submit(make_job("fixed").gpus(4).build(), at=0.0)
    step_at(clock, loop, 0.0)
    backend.started("elastic", 1.0)
    backend.started("fixed", 1.0)
    backend.exited("fixed", 10.0)
    step_at(clock, loop, 10.0)
    step_at(clock, loop, 100.0)
    last = seen[-1]
    assert last.now == 100.0
    (job,) = last.jobs
    assert job.id == "elastic"
    assert job.attained_gpu_s == job.gpus * (100.0 - 1.0)  # its GPUs since it started, at the time of asking
