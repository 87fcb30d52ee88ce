"""An admin's window set while jobs run: the loop stops the jobs it must not find on its nodes, their grace period
before it starts, puts them back in their queue, and starts them again where the windows let them."""

from __future__ import annotations

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import GiB, JobState, QueueSpec, make_node
from gpufleet.domain.windows import Window
from gpufleet.policies.catalog import profile
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState


def setup() -> tuple[InMemoryStore, ScriptedBackend, ManualClock, Reconciler]:
    store = InMemoryStore(
        [make_node(f"n{i}", "A100-80GB", 4, 80 * GiB) for i in range(2)], [QueueSpec("a"), QueueSpec("b")]
    )
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("fifo-backfill"), settings=ReconcilerSettings(grace_s=12.0))
    return store, backend, clock, loop


def node_of(backend: ScriptedBackend, job_id: str) -> str:
    return [launch for launch in backend.launches if launch.job.id == job_id][-1].workers[0].node


def test_maintenance_stops_the_jobs_on_its_nodes_a_grace_period_before_and_they_start_elsewhere() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("x").gpus(4).queue("a").build(), at=0.0)
    loop.step()
    backend.started("x", 0.0)
    loop.step()
    first = node_of(backend, "x")
    other = "n1" if first == "n0" else "n0"
    store.set_window(Window("fw", (first,), start=1_000.0, end=2_000.0))
    clock.t = 900.0
    loop.step()
    assert backend.stops == []
    assert loop.next_retry_at() == 1_000.0 - 12.0  # its grace period before the window
    clock.t = 988.0
    loop.step()
    assert backend.stops == [("x", 1, 12.0)]
    assert "reservation fw (maintenance" in store.history("x")[-1].reason
    backend.stopped("x", 995.0)
    clock.t = 995.0
    loop.step()
    loop.step()
    assert store.get("x").state in (S.LAUNCHING, S.RUNNING)
    assert node_of(backend, "x") == other


def test_a_queues_window_stops_other_queues_jobs_on_its_nodes_and_not_its_own() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("a1").gpus(4).queue("a").build(), at=0.0)
    store.submit(make_job("b1").gpus(4).queue("b").build(), at=0.0)
    loop.step()
    for job_id in ("a1", "b1"):
        backend.started(job_id, 0.0)
    loop.step()
    nodes = {node_of(backend, "a1"), node_of(backend, "b1")}
    assert nodes == {"n0", "n1"}
    store.set_window(Window("demo", ("n0", "n1"), start=500.0, end=5_000.0, queue="b"))
    clock.t = 490.0
    loop.step()
    assert backend.stops == [("a1", 1, 12.0)]
    assert store.get("b1").state is S.RUNNING


def test_a_job_that_ends_before_the_window_is_not_stopped_for_it() -> None:
    """The cycle lets a job with a limit that ends it by the window's start use the nodes; the loop must not then
    stop it for the window, however long its grace period (it once did, again and again)."""
    store, backend, clock, loop = setup()
    store.set_window(Window("fw", ("n0", "n1"), start=100.0, end=2_000.0))
    clock.t = 10.0
    store.submit(make_job("short").gpus(4).queue("a").duration(50.0).build(), at=10.0)
    loop.step()
    backend.started("short", 10.0)
    for t in (11.0, 60.0, 95.0):
        clock.t = t
        loop.step()
    assert backend.stops == []
    assert store.get("short").state is S.RUNNING
