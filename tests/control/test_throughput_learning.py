"""Throughputs learned live: jobs that declare a type report progress through the real report service (job
tokens, SQLite store), the report is tagged with the GPU model the job holds, the loop pools the reports into a
table every minute, and the heterogeneity-aware plugins read it as cycle data: the next job of that type goes to
the model its type runs fastest on, where without learning it goes where packing puts it (the fuller node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.control.throughput_learner import LEARNED_SETTING
from gpufleet.domain import GiB, JobState, QueueSpec, make_node
from gpufleet.domain.quotas import DEFAULT_QUEUE
from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable
from gpufleet.policies.catalog import PolicyData, profile
from gpufleet.server.job_tokens import JobTokens
from gpufleet.server.progress_reports import ProgressService
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

RATES = {"A100-80GB": 400.0, "T4": 50.0}  # samples/s of a "bert" job on one GPU of each model


def model_of(store: SqlStore, job_id: str) -> str:
    record = store.get(job_id)
    assert record is not None
    assert len(record.workers) == 1
    node = record.workers[0].node
    return "A100-80GB" if node.startswith("a100") else "T4"


def run_and_report(
    store: SqlStore, backend: ScriptedBackend, clock: ManualClock, loop: Reconciler, ids: list[str]
) -> None:
    """Start one-GPU bert jobs, then each reports through the report service for 3 minutes at the speed of
    the model it got, the loop stepping every minute."""
    for job_id in ids:
        store.submit(make_job(job_id).gpus(1).job_type("bert").build(), at=clock.t)
    loop.step()
    for job_id in ids:
        backend.started(job_id, clock.t)
    loop.step()
    service = ProgressService(store, clock, JobTokens(store))
    start = clock.t
    for minute in range(4):
        clock.t = start + 60.0 * minute
        for job_id in ids:
            samples = RATES[model_of(store, job_id)] * 60.0 * minute
            token = f"Bearer {JobTokens(store).token(job_id, 1)}"
            service.receive(job_id, token, {"reports": [{"kind": "progress", "at": clock.t, "samples": samples}]})
        loop.step()


@pytest.mark.parametrize("learn", [True, False])
def test_a_learned_type_goes_to_the_model_it_runs_fastest_on(tmp_path: Path, learn: bool) -> None:
    store = SqlStore.open(default_sqlite_url(tmp_path))
    try:
        store.set_queue(QueueSpec(DEFAULT_QUEUE))
        store.set_nodes([make_node("a100-0", "A100-80GB", 2, 80 * GiB), make_node("t4-0", "T4", 2, 16 * GiB)])
        clock, backend = ManualClock(t=1_000.0), ScriptedBackend()
        settings = ReconcilerSettings(learn_throughput_s=60.0 if learn else None)
        loop = Reconciler(store, backend, clock, profile("gavel-greedy"), settings=settings)
        # Four bert jobs fill both nodes, and each reports for 3 minutes at its model's speed.
        ids = [f"bert-{i}" for i in range(4)]
        run_and_report(store, backend, clock, loop, ids)
        assert sorted(model_of(store, j) for j in ids) == ["A100-80GB", "A100-80GB", "T4", "T4"]
        progress = store.job_progress(ids[0])
        assert progress is not None
        assert [(e.model, e.gpus) for e in progress.throughput] == [(model_of(store, ids[0]).upper(), 1)]
        # All but one on a T4 finish: packing alone prefers the T4 node, now half full, for the next job.
        kept = next(job_id for job_id in ids if model_of(store, job_id) == "T4")
        for job_id in ids:
            if job_id != kept:
                backend.exited(job_id, clock.t)
        loop.step()
        learned = loop.throughput_learner.table if loop.throughput_learner is not None else None
        if learn:
            assert learned is not None
            assert learned.get("bert", "A100-80GB", 1) == pytest.approx(400.0)
            assert learned.get("bert", "T4", 1) == pytest.approx(50.0)
        else:
            assert learned is None
        clock.t += 10.0
        store.submit(make_job("next").gpus(1).job_type("bert").build(), at=clock.t)
        loop.step()
        record = store.get("next")
        assert record is not None
        assert record.state is JobState.LAUNCHING
        assert model_of(store, "next") == ("A100-80GB" if learn else "T4")
    finally:
        store.close()


def test_an_imported_table_keeps_its_figures_and_learned_ones_fill_its_gaps(tmp_path: Path) -> None:
    imported = ThroughputTable((ThroughputEntry("bert", "A100-80GB", 1, 8.0),), source="import", reference="A100-80GB")
    store = SqlStore.open(default_sqlite_url(tmp_path))
    try:
        store.set_queue(QueueSpec(DEFAULT_QUEUE))
        store.set_nodes([make_node("a100-0", "A100-80GB", 1, 80 * GiB), make_node("t4-0", "T4", 1, 16 * GiB)])
        clock, backend = ManualClock(t=1_000.0), ScriptedBackend()
        settings = ReconcilerSettings(learn_throughput_s=60.0)
        policy = profile("gavel-greedy", PolicyData(throughput=imported))
        loop = Reconciler(store, backend, clock, policy, settings=settings, throughput=imported)
        run_and_report(store, backend, clock, loop, ["bert-0", "bert-1"])
        table = loop.throughput_learner.table if loop.throughput_learner is not None else None
        assert table is not None
        # The import's A100 figure stands (8 steps/s); T4 is learned and put in its unit: 8 x 50 / 400.
        assert table.get("bert", "A100-80GB", 1) == 8.0
        assert table.get("bert", "T4", 1) == pytest.approx(1.0)
        assert loop.base.view.throughput is table
    finally:
        store.close()


def test_what_ended_jobs_taught_survives_a_restart_of_the_control_plane(tmp_path: Path) -> None:
    """The bert jobs end, the control plane stops; a new one on the same database still sends the next bert job
    to the A100 node, where packing alone would send it to the half-full T4 node."""
    url = default_sqlite_url(tmp_path)
    store = SqlStore.open(url)
    settings = ReconcilerSettings(learn_throughput_s=60.0)
    clock, backend = ManualClock(t=1_000.0), ScriptedBackend()
    ids = [f"bert-{i}" for i in range(4)]
    try:
        store.set_queue(QueueSpec(DEFAULT_QUEUE))
        store.set_nodes([make_node("a100-0", "A100-80GB", 2, 80 * GiB), make_node("t4-0", "T4", 2, 16 * GiB)])
        loop = Reconciler(store, backend, clock, profile("gavel-greedy"), settings=settings)
        run_and_report(store, backend, clock, loop, ids)
        kept = next(job_id for job_id in ids if model_of(store, job_id) == "T4")
        for job_id in ids:
            if job_id != kept:
                backend.exited(job_id, clock.t)
        clock.t += 60.0
        loop.step()
    finally:
        store.close()
    store = SqlStore.open(url)
    try:
        clock.t += 60.0
        again = Reconciler(store, backend, clock, profile("gavel-greedy"), settings=settings)
        assert again.throughput_learner is not None
        table = again.throughput_learner.table
        assert table is not None
        # Only the three jobs that ended are remembered (the running one is read again when the loop looks).
        assert table.get("bert", "A100-80GB", 1) == pytest.approx(400.0)
        assert table.get("bert", "T4", 1) == pytest.approx(50.0)
        again.step()
        store.submit(make_job("next").gpus(1).job_type("bert").build(), at=clock.t)
        again.step()
        assert model_of(store, "next") == "A100-80GB"
    finally:
        store.close()


def test_unreadable_stored_sums_are_learned_again_and_not_fatal(tmp_path: Path) -> None:
    store = SqlStore.open(default_sqlite_url(tmp_path))
    try:
        store.set_setting(LEARNED_SETTING, "{not json")
        loop = Reconciler(
            store,
            ScriptedBackend(),
            ManualClock(t=1.0),
            profile("default"),
            settings=ReconcilerSettings(learn_throughput_s=60.0),
        )
        assert loop.throughput_learner is not None
        assert loop.throughput_learner.table is None
    finally:
        store.close()
