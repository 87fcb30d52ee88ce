"""`gpufleet bench loop` at a small size: the real loop on a real SQLite file keeps every invariant of what it
stores, preemption fires, the backlog holds steady, and the printed figures add up."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.bench import control_loop as loop
from gpufleet.cli.main import app
from gpufleet.domain.records import JobRecord

NODES = 40


def check_store(store: SqlStore, records: list[JobRecord]) -> None:
    """No GPU share, CPU or memory of a node is given beyond its capacity; only placed jobs hold anything."""
    nodes = {n.name: n for n in store.nodes()}
    gpu_milli: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    for record in records:
        assert bool(record.workers) == record.holds_resources, record
        for worker in record.workers:
            cpu[worker.node] += worker.cpu_milli
            for share in worker.gpus:
                gpu_milli[(worker.node, share.index)] += share.milli
    over = {key: milli for key, milli in gpu_milli.items() if milli > 1000}
    assert not over, f"GPUs given beyond 1000 milli: {over}"
    assert all(cpu[name] <= nodes[name].cpu_milli for name in cpu)
    assert all(index < len(nodes[name].gpus) for name, index in gpu_milli)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[loop.TimedStore]:
    timed = loop.TimedStore.open(default_sqlite_url(tmp_path))
    assert isinstance(timed, loop.TimedStore)
    yield timed
    timed.close()


def test_the_steady_loop_keeps_the_store_consistent_and_preempts(store: loop.TimedStore) -> None:
    world = loop.SteadyLoop(store, NODES, rate=8, backlog=200, seed=1, policy="default")
    report, _, _ = world.fill()
    assert report.placed > 0
    check_store(store, list(store.active()))
    placed = preempted = finished = 0
    backlog = []
    for _ in range(12):
        report, seconds, cpu = world.step()
        assert seconds > 0
        assert cpu >= 0
        placed, preempted, finished = placed + report.placed, preempted + report.preempted, finished + report.finished
        active = list(store.active())
        check_store(store, active)
        backlog.append(sum(1 for r in active if not r.holds_resources))
        assert backlog[-1] == len(world.loop.pending)
    assert placed > 0
    assert finished > 0
    assert preempted > 0  # higher-priority arrivals stop lower ones, as in a real fleet
    assert store.write_seconds > 0
    assert store.write_cpu_seconds > 0
    assert max(backlog) < 2 * min(backlog)  # arrivals and departures balance: the backlog holds steady


def test_bench_loop_prints_its_figures() -> None:
    result = CliRunner().invoke(app, ["bench", "loop", "--nodes", str(NODES), "--steps", "4", "--pending", "100"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["decisions"] == figures["placed"] + figures["preempted"]
    assert figures["decisions_per_s"] > 0
    assert figures["decisions_per_cpu_s"] > 0
    assert 0 < figures["decisions_per_cpu_s_with_collector"] <= figures["decisions_per_cpu_s"]
    assert 0 <= figures["collector_between_steps_cpu_s_per_step"] <= figures["collector_cpu_s_per_step"]
    assert 0 < figures["cycle_p50_s"] <= figures["cycle_p99_s"] <= figures["cycle_max_s"]
    assert 0 <= figures["store_write_share"] <= 1
    assert 0 < figures["store_write_cpu_p50_s"] <= figures["store_write_cpu_p99_s"] <= figures["cycle_cpu_p99_s"]
    assert 0 < figures["store_write_cpu_share"] < 1
    assert figures["arrivals_per_step"] == NODES // loop.NODES_PER_ARRIVAL
    assert "fake backend" in figures["backend"]
    assert figures["store"].startswith("sqlite")
    for moment in ("host_yardstick_before", "host_yardstick_after"):
        assert figures[moment]["total_ms"] > 0  # the host's speed beside the figures


def test_bench_loop_refuses_an_unknown_policy() -> None:
    result = CliRunner().invoke(app, ["bench", "loop", "--nodes", "20", "--policy", "nope"])
    assert result.exit_code == 2
    assert "no scheduling profile named 'nope'" in result.stderr


def test_the_decisions_digest_names_the_decisions() -> None:
    """Same arguments, same decisions, same digest (what `scripts/loop-ab` compares across versions); another
    seed makes other decisions and another digest."""
    first = loop.run(NODES, pending=100, steps=3, seed=2)
    again = loop.run(NODES, pending=100, steps=3, seed=2)
    other = loop.run(NODES, pending=100, steps=3, seed=3)
    assert first["decisions_digest"] == again["decisions_digest"]
    assert first["decisions_digest"] != other["decisions_digest"]
