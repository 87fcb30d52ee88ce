"""The live loop's collector policy: what survives a step is frozen out of the collector's walks, a loop state
is never a reference cycle, and a full collection still reclaims cycles that formed among frozen objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.adapters.storage.sql import default_sqlite_url
from gpufleet.bench import control_loop as bench_loop
from gpufleet.control.collector import LongLivedObjects
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.policies.catalog import profile
from gpufleet.scheduling import plugin_api
from gpufleet.scheduling.state import CycleState
from tests.kit import cluster, make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend


class _Node:
    """A container the collector tracks; two of them referring to each other are a reference cycle."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Every test leaves the process's collector as it found it: nothing frozen, collecting."""
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def _cycle() -> _Node:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return first


def test_what_survives_a_step_is_frozen_and_later_collections_skip_it() -> None:
    collector = LongLivedObjects(full_every=10)
    kept = [_Node() for _ in range(100)]
    collector.after_step()
    assert collector.full_collections == 0
    assert gc.get_freeze_count() >= len(kept)
    walked = {id(obj) for obj in gc.get_objects()}
    assert not any(id(node) in walked for node in kept)
    young = _Node()
    assert any(obj is young for obj in gc.get_objects())  # made after the freeze: walked until the next step
    collector.after_step()
    assert not any(obj is young for obj in gc.get_objects())


def test_a_cycle_among_frozen_objects_waits_for_the_next_full_collection() -> None:
    collector = LongLivedObjects(full_every=3)
    held = _cycle()
    dropped = weakref.ref(held)
    collector.after_step()  # frozen while alive
    del held  # garbage now, but only a walk of the collector could find it
    gc.collect()  # an ordinary full collection does not walk frozen objects
    assert dropped() is not None
    collector.after_step()
    assert dropped() is not None
    assert collector.full_collections == 0
    collector.after_step()  # the third step runs the full collection
    assert collector.full_collections == 1
    assert dropped() is None
    for _ in range(3):
        collector.after_step()
    assert collector.full_collections == 2  # and every third step after it


def test_garbage_a_step_leaves_is_collected_before_the_freeze() -> None:
    collector = LongLivedObjects(full_every=1_000)
    left = weakref.ref(_cycle())  # young garbage when the step ends
    collector.after_step()
    assert left() is None
    assert collector.full_collections == 0


def test_a_paused_collector_is_left_alone() -> None:
    collector = LongLivedObjects()
    gc.disable()
    collector.after_step()
    assert gc.get_freeze_count() == 0
    assert collector.full_collections == 0
    assert not gc.isenabled()


def test_a_cycle_state_is_freed_by_its_reference_count_and_its_view_keeps_it() -> None:
    snapshot = cluster().nodes(2, "A100-80GB").snapshot()
    gc.disable()  # only reference counts free anything here
    state = CycleState(snapshot)
    view = state.view
    assert state.view is view  # the same view while someone holds it
    freed = weakref.ref(state)
    del state
    assert freed() is not None  # the view holds its state
    assert len(view.nodes.names) == 2
    del view
    assert freed() is None  # no reference cycle: gone without the collector


def test_the_loop_freezes_after_each_step_only_when_asked() -> None:
    def loop(freeze: bool) -> Reconciler:
        store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
        store.submit(make_job("a").gpus(2).build(), at=0.0)
        settings = ReconcilerSettings(freeze_long_lived=freeze)
        return Reconciler(store, ScriptedBackend(), ManualClock(), profile("default"), settings=settings)

    plain = loop(freeze=False)
    assert plain.long_lived is None
    plain.step()
    assert gc.get_freeze_count() == 0
    frozen = loop(freeze=True)
    frozen.step()
    assert frozen.long_lived is not None
    assert gc.get_freeze_count() > 0
    assert frozen.store.get("a").state is JobState.LAUNCHING


def test_a_loop_step_builds_a_view_per_cycle_not_per_plugin_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The state refers to its view weakly, so a cycle and the loop hold theirs: otherwise every plugin call
    would build one (3,595 a step at 1,000 nodes in `bench loop`)."""
    built = [0]  # counted, not kept: keeping them would keep them alive
    build = plugin_api.ClusterView.__init__

    def counted(view: plugin_api.ClusterView, state: CycleState) -> None:
        built[0] += 1
        build(view, state)

    monkeypatch.setattr(plugin_api.ClusterView, "__init__", counted)
    store = bench_loop.TimedStore.open(default_sqlite_url(tmp_path))
    try:
        world = bench_loop.SteadyLoop(store, 40, rate=8, backlog=200, seed=1, policy="default")
        world.fill()
        cycles = preempted = 0
        for _ in range(6):
            built[0] = 0
            report, _, _ = world.step()
            assert built[0] <= report.cycles + 1
            cycles, preempted = cycles + report.cycles, preempted + report.preempted
        assert cycles > 0
        assert preempted > 0  # victim searches ran, each asking plugins for the view
    finally:
        store.close()
