"""What the SQL stores add to the StateStore contract: durability, store-assigned submission order, and
the checks a shared store makes (unknown queue, unknown job)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from gpufleet.domain import GpufleetError, JobState, QueueSpec, SpecError, UnknownNameError, WorkerRequest, make_node
from gpufleet.domain import JobState as S
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.jobs import Job, RunSpec
from gpufleet.domain.records import StopCause
from gpufleet.ports import RequestKind, StaleWriteError
from gpufleet.ports.admin import JobQuery
from tests.storage.conftest import Harness
from tests.storage.test_contract import ids, job, move


def test_submit_numbers_jobs_in_submission_order(sql: Harness) -> None:
    store = sql.store
    numbers = [store.submit(job(name, submit_seq=99), at=1.0).job.submit_seq for name in "abc"]
    assert numbers == [1, 2, 3]
    stored = store.get("b")
    assert stored is not None
    assert stored.job.submit_seq == 2


def test_submit_to_an_unknown_queue_names_the_known_ones(sql: Harness) -> None:
    store = sql.store
    with pytest.raises(UnknownNameError) as caught:
        store.submit(job("a", "nope"), at=1.0)
    assert "'nope'" in caught.value.message
    assert "default" in caught.value.fix
    assert "team-a" in caught.value.fix
    assert store.get("a") is None
    # The refused submit used no number: the next job is still number 1.
    assert store.submit(job("b"), at=1.0).job.submit_seq == 1


def test_request_for_an_unknown_job_is_refused(sql: Harness) -> None:
    with pytest.raises(UnknownNameError, match="'ghost'"):
        sql.store.request("ghost", RequestKind.CANCEL, "why", 1.0)
    assert list(sql.store.take_requests(0)[0]) == []


def test_everything_survives_a_reopen(sql: Harness) -> None:
    store = sql.store
    sql.set_cluster(nodes=[make_node("n1", "A100-80GB", 8, 80 << 30)])
    version = store.cluster_version()
    run = RunSpec(("python", "train.py"), env=(("A", "1"),), max_runtime_s=3600.0, retries=2)
    a = store.submit(job("a", run=run, expected_duration=60.0, name="train"), at=1.0)
    store.submit(job("b"), at=2.0)
    placement = WorkerPlacement("n1", (GpuShare(0), GpuShare(1)), cpu_milli=4000, memory=1 << 30)
    (expected, running), tr = move(a, S.ADMITTED, 3.0, attempt=1, workers=(placement,), started_at=3.0)
    (_, evicting), tr2 = move(running, S.EVICTING, 4.0, stop_cause=StopCause.PREEMPTED, evicting_for="b")
    store.write([(expected, evicting)], [tr, tr2])
    store.request("b", RequestKind.CANCEL, "no longer needed", 5.0)
    submissions, cursor = store.take_submissions(0)
    requests, request_cursor = store.take_requests(0)

    reopened = sql.reopen()
    assert reopened.get("a") == evicting
    assert list(reopened.history("a")) == [tr, tr2]
    assert [r.id for r in reopened.active()] == ["a", "b"]
    assert reopened.cluster_version() == version
    assert [n.name for n in reopened.nodes()] == ["n1"]
    assert reopened.take_submissions(0)[0] == submissions
    assert list(reopened.take_submissions(cursor)[0]) == []
    assert reopened.take_requests(0)[0] == requests
    assert list(reopened.take_requests(request_cursor)[0]) == []
    # Numbers keep growing across restarts.
    assert reopened.submit(job("c"), at=6.0).job.submit_seq == 3
    reopened.request("c", RequestKind.CANCEL, "x", 7.0)
    (new_request,), _ = reopened.take_requests(request_cursor)
    assert new_request.seq > requests[-1].seq


def test_a_second_store_on_the_same_database_sees_the_first_ones_writes(sql: Harness) -> None:
    other = sql.open_another()
    record = sql.store.submit(job("a"), at=1.0)
    assert other.get("a") == record
    update, tr = move(record, S.ADMITTED, 2.0)
    other.write([update], [tr])
    seen = sql.store.get("a")
    assert seen is not None
    assert seen.state is JobState.ADMITTED


def test_queue_names_and_weights_round_trip(sql: Harness) -> None:
    spec = QueueSpec("big", cohort="research", weight=float("inf"))
    sql.sql.set_queue(spec)
    assert {q.name: q for q in sql.store.queues()}["big"] == spec


def test_non_finite_times_round_trip(sql: Harness) -> None:
    record = sql.store.submit(job("a", expected_duration=float("inf"), submitted_at=float("-inf")), at=float("inf"))
    assert sql.store.get("a") == record


def test_fractional_request_round_trips(sql: Harness) -> None:
    request = WorkerRequest(gpus=1, gpu_milli=250, gpu_memory=10 << 30, models=frozenset({"A100-80GB", "H100"}))
    record = sql.store.submit(Job("f", "team-a", request), at=1.0)
    assert sql.store.get("f") == record


def test_duplicate_job_id_across_queues_is_a_spec_error(sql: Harness) -> None:
    sql.store.submit(job("a"), at=1.0)
    with pytest.raises(SpecError, match="id: is taken"):
        sql.store.submit(job("a", "team-a"), at=1.0)


def test_nul_characters_are_refused_with_a_clear_error(sql: Harness) -> None:
    with pytest.raises(SpecError, match="id: contains a NUL character"):
        sql.store.submit(job("a\x00b"), at=1.0)
    record = sql.store.submit(job("a", name="ok"), at=1.0)
    # Elsewhere SQLite keeps a NUL; PostgreSQL's text cannot, which must be an error, not a stack trace.
    with pytest.raises(GpufleetError, match="refused a value") if sql.kind == "postgres" else contextlib.nullcontext():
        sql.store.request("a", RequestKind.CANCEL, "why\x00", 2.0)
    assert sql.store.get("a") == record


def test_a_rewrite_sets_the_job_columns_that_changed_and_keeps_the_others(sql: Harness) -> None:
    """Rows that hold the job's queue, name, priority and submitter take the state, version and record alone;
    a job whose name or priority changed gets them rewritten too, in the same write, and a stale version is still
    refused."""
    store = sql.sql
    kept = store.submit(job("a", name="train", priority=1, user="ann"), at=1.0)
    changed = store.submit(job("b", name="eval", priority=1, user="bob"), at=1.0)
    update_a, tr_a = move(kept, S.ADMITTED, 2.0)
    renamed = changed.evolve(
        job=dataclasses.replace(changed.job, name="eval-2", priority=2, user="carl", queue="team-a"),
        state=S.ADMITTED,
    )
    store.write([update_a, (changed.version, renamed)], [tr_a])
    assert store.get("a") == update_a[1]
    assert store.get("b") == renamed
    assert ids(store.jobs(JobQuery(name="eval-2"))) == ["b"]
    assert ids(store.jobs(JobQuery(user="carl"))) == ["b"]
    assert ids(store.jobs(JobQuery(queue="team-a"))) == ["b"]
    assert list(store.jobs(JobQuery(name="eval"))) == []
    assert ids(store.jobs(JobQuery(name="train", states=frozenset({S.ADMITTED})))) == ["a"]
    with pytest.raises(StaleWriteError):
        store.write([update_a], [])
    assert store.get("a") == update_a[1]
