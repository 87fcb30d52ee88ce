"""Resizes re-place a spread elastic job: a grow gathers all its workers onto fewer nodes when they fit there
(its own GPUs count as free for that), holding its old and new GPUs until RESIZED; a shrink gives back the
workers on the nodes where the job has the fewest GPUs first."""

from __future__ import annotations

from collections import Counter

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.control.resize import kept_on_densest
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.records import JobRecord
from gpufleet.policies.catalog import profile
from tests.kit import fingerprint, make_job
from tests.kit.fake_backend import ManualClock, ResizingBackend, ScriptedBackend

S = JobState


def setup() -> tuple[InMemoryStore, ResizingBackend, ManualClock, Reconciler]:
    store = InMemoryStore([make_node(f"n{i}", "A100-80GB", 4, 80 * GiB) for i in range(2)])
    backend = ResizingBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("default"), settings=ReconcilerSettings(grace_s=12.0))
    return store, backend, clock, loop


def step_at(clock: ManualClock, loop: Reconciler, t: float) -> None:
    clock.t = t
    loop.step()


def per_node(workers: tuple[WorkerPlacement, ...]) -> dict[str, int]:
    return dict(Counter(w.node for w in workers for _ in w.gpus))


def record_of(store: InMemoryStore, job_id: str) -> JobRecord:
    record = store.get(job_id)
    assert record is not None
    return record


def matches_the_store(loop: Reconciler, store: InMemoryStore, clock: ManualClock) -> bool:
    fresh = Reconciler(store, ScriptedBackend(), clock, profile("default")).base
    return fingerprint(loop.base.state) == fingerprint(fresh.state)


def test_a_grow_gathers_a_job_spread_over_two_nodes_onto_one() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("f0").gpus(3).build(), at=0.0)
    store.submit(make_job("f1").gpus(3).build(), at=0.0)
    store.submit(make_job("elastic").gpus(1).elastic(2, 4).build(), at=0.0)
    step_at(clock, loop, 0.0)
    assert per_node(record_of(store, "elastic").workers) == {"n0": 1, "n1": 1}  # one GPU left on each node
    for job_id in ("f0", "f1", "elastic"):
        backend.started(job_id, 1.0)
    f0_node = record_of(store, "f0").workers[0].node
    backend.exited("f0", 10.0)
    step_at(clock, loop, 10.0)
    step_at(clock, loop, 60.0)  # the next resize interval
    record = record_of(store, "elastic")
    assert (record.resizing, record.resizes) == (True, 1)
    assert per_node(record.resize_to) == {f0_node: 4}  # all four on the node that has room for them
    held = per_node(record.workers)
    assert held[f0_node] == 4
    assert sum(held.values()) == 5  # and its old GPU elsewhere too, until RESIZED
    launch, _, count = backend.resizes[-1]
    assert (per_node(launch.workers), count) == ({f0_node: 4}, 1)  # the backend restarts it there
    assert matches_the_store(loop, store, clock)
    backend.resized("elastic", 61.0)
    step_at(clock, loop, 61.0)
    record = record_of(store, "elastic")
    assert (record.resizing, per_node(record.workers), record.resize_to) == (False, {f0_node: 4}, ())
    assert matches_the_store(loop, store, clock)


def test_a_shrink_gives_back_the_workers_on_the_sparsest_node_first() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("f").gpus(3).build(), at=0.0)
    store.submit(make_job("elastic").gpus(1).elastic(1, 5).build(), at=0.0)
    step_at(clock, loop, 0.0)
    f_node = record_of(store, "f").workers[0].node
    other = "n1" if f_node == "n0" else "n0"
    assert per_node(record_of(store, "elastic").workers) == {f_node: 1}  # it starts on one node
    backend.started("f", 1.0)
    backend.started("elastic", 1.0)
    step_at(clock, loop, 60.0)  # it grows to 5: 5 GPUs fit on no node, so it keeps its one and adds 4
    backend.resized("elastic", 61.0)
    step_at(clock, loop, 61.0)
    assert per_node(record_of(store, "elastic").workers) == {f_node: 1, other: 4}
    store.submit(make_job("new").gpus(1).build(), at=400.0)  # past the least time between its resizes
    step_at(clock, loop, 400.0)
    step_at(clock, loop, 420.0)
    record = record_of(store, "elastic")
    assert record.resizing
    assert per_node(record.resize_to) == {other: 4}  # the lone GPU beside `f` is the one given back
    backend.resized("elastic", 425.0)
    step_at(clock, loop, 425.0)
    assert per_node(record_of(store, "elastic").workers) == {other: 4}
    assert per_node(record_of(store, "new").workers) == {f_node: 1}
    assert matches_the_store(loop, store, clock)


def worker(node: str, index: int) -> WorkerPlacement:
    return WorkerPlacement(node, (GpuShare(index, 1000),))


def test_kept_workers_are_those_on_the_densest_nodes_in_their_order() -> None:
    workers = (worker("a", 0), worker("b", 0), worker("b", 1), worker("c", 0), worker("b", 2), worker("c", 1))
    assert kept_on_densest(workers, 3) == (workers[1], workers[2], workers[4])
    assert kept_on_densest(workers, 5) == workers[1:]
    assert kept_on_densest(workers, 6) == workers
