"""A store that refuses writes for a while (a full disk, a database down): the loop loses no observation, runs
no job twice, and places nothing the store never took."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.domain.lifecycle import Transition
from gpufleet.domain.records import JobRecord
from gpufleet.policies.catalog import profile
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState


class DiskFullError(OSError):
    pass


class FillingStore(InMemoryStore):
    """Refuses every write while `full` is set, as a store on a full disk does (nothing is written)."""

    full = False

    def write(self, updates: Sequence[tuple[int, JobRecord]], transitions: Sequence[Transition]) -> None:
        if self.full:
            raise DiskFullError(28, "No space left on device")
        super().write(updates, transitions)


def setup() -> tuple[FillingStore, ScriptedBackend, ManualClock, Reconciler]:
    store = FillingStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    return store, backend, clock, Reconciler(store, backend, clock, profile("default"))


def failing_step(loop: Reconciler) -> None:
    try:
        loop.step()
    except DiskFullError:
        return
    raise AssertionError("the step should have failed: the store refuses writes")


def test_an_exit_observed_while_the_store_refuses_writes_is_written_once_it_takes_them() -> None:
    store, backend, clock, loop = setup()
    store.submit(make_job("a").gpus(1).build(), at=0.0)
    loop.step()
    backend.started("a", 1.0)
    loop.step()
    assert store.get("a").state is S.RUNNING
    store.full = True
    clock.t = 10.0
    backend.exited("a", 10.0, code=3)  # the backend reports it once
    for _ in range(3):
        failing_step(loop)
    assert store.get("a").state is S.RUNNING  # not written yet, and not dropped either
    store.full = False
    loop.step()
    record = store.get("a")
    assert (record.state, record.exit_code, record.finished_at) == (S.FAILED, 3, 10.0)
    assert len(backend.launches) == 1  # it ran once


def test_a_placement_the_store_refused_is_not_launched_and_is_placed_again_later() -> None:
    store, backend, _clock, loop = setup()
    store.submit(make_job("b").gpus(8).build(), at=0.0)
    store.full = True
    failing_step(loop)
    assert backend.launches == []
    assert store.get("b").state is S.PENDING
    store.full = False
    loop.step()
    assert [launch.job.id for launch in backend.launches] == ["b"]
    assert store.get("b").state is S.LAUNCHING


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_whatever_steps_fail_every_job_ends_once_and_is_launched_once(full_before_step: list[bool]) -> None:
    store, backend, clock, loop = setup()
    for i in range(3):
        store.submit(make_job(f"j{i}").gpus(4).build(), at=0.0)
    for step, full in enumerate(full_before_step):
        clock.t = float(step + 1)
        for launch in list(backend.launches):
            record = store.get(launch.job.id)
            if record.state is S.LAUNCHING and launch.attempt == record.attempt:
                backend.started(launch.job.id, clock.t)
                backend.exited(launch.job.id, clock.t, code=0)
        store.full = full
        with contextlib.suppress(DiskFullError):
            loop.step()
    store.full = False
    for _ in range(10):  # the store is back: everything finishes
        clock.t += 1.0
        for launch in list(backend.launches):
            record = store.get(launch.job.id)
            if record.state is S.LAUNCHING and launch.attempt == record.attempt:
                backend.started(launch.job.id, clock.t)
                backend.exited(launch.job.id, clock.t, code=0)
        loop.step()
    for i in range(3):
        assert store.get(f"j{i}").state is S.SUCCEEDED
    launched = [(launch.job.id, launch.attempt) for launch in backend.launches]
    assert sorted(launched) == [("j0", 1), ("j1", 1), ("j2", 1)]  # each once: no exit lost, no rerun
