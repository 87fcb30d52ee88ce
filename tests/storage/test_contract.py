"""The StateStore contract, asserted alike for the in-memory reference, SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import Job, JobState, QueueSpec, SpecError, WorkerRequest, make_node
from gpufleet.domain import JobState as S
from gpufleet.domain.lifecycle import Transition
from gpufleet.domain.records import JobRecord
from gpufleet.ports import RequestKind, StaleWriteError
from tests.storage.conftest import Harness


def job(job_id: str, queue: str = "default", **changes: object) -> Job:
    return dataclasses.replace(Job(job_id, queue, WorkerRequest(gpus=1)), **changes)  # type: ignore[arg-type]


def move(record: JobRecord, target: JobState, at: float, **changes: object) -> tuple[tuple[int, JobRecord], Transition]:
    """The update and the transition that move `record` to `target`."""
    new = record.evolve(state=target, reason=f"to {target.value}", **changes)
    return (record.version, new), Transition(record.id, record.state, target, f"to {target.value}", at)


def ids(records: object) -> list[str]:
    return [r.id for r in records]  # type: ignore[attr-defined]


def test_submit_stores_a_pending_record(any_store: Harness) -> None:
    store = any_store.store
    record = store.submit(job("a", priority=3, name="train"), at=10.5)
    assert record.state is S.PENDING
    assert record.version == 1
    assert record.submitted_at == 10.5
    assert record.job.priority == 3
    assert record.job.name == "train"
    assert store.get("a") == record
    assert store.get("missing") is None


def test_take_submissions_sees_each_job_once_in_order(any_store: Harness) -> None:
    store = any_store.store
    for name in ("a", "b", "c"):
        store.submit(job(name), at=1.0)
    first, cursor = store.take_submissions(0)
    assert ids(first) == ["a", "b", "c"]
    again, same = store.take_submissions(cursor)
    assert list(again) == []
    assert same == cursor
    store.submit(job("d"), at=2.0)
    store.submit(job("e", "team-a"), at=2.0)
    later, next_cursor = store.take_submissions(cursor)
    assert ids(later) == ["d", "e"]
    assert next_cursor > cursor
    assert list(store.take_submissions(next_cursor)[0]) == []


def test_take_submissions_returns_current_records(any_store: Harness) -> None:
    store = any_store.store
    record = store.submit(job("a"), at=1.0)
    update, tr = move(record, S.ADMITTED, 2.0)
    store.write([update], [tr])
    (taken,), _ = store.take_submissions(0)
    assert taken.state is S.ADMITTED
    assert taken.version == 2


def test_duplicate_id_is_refused_and_nothing_changes(any_store: Harness) -> None:
    store = any_store.store
    store.submit(job("a"), at=1.0)
    with pytest.raises(SpecError) as caught:
        store.submit(job("a", "team-a"), at=2.0)
    assert [p.field for p in caught.value.fields] == ["id"]
    assert "to fix" in str(caught.value)
    taken, _ = store.take_submissions(0)
    assert ids(taken) == ["a"]
    record = store.get("a")
    assert record is not None
    assert record.job.queue == "default"


def test_active_is_in_submission_order_and_drops_terminal_jobs(any_store: Harness) -> None:
    store = any_store.store
    records = {name: store.submit(job(name), at=float(i)) for i, name in enumerate("abcde")}
    assert ids(store.active()) == list("abcde")
    moves = [move(records["b"], S.CANCELLED, 5.0), move(records["d"], S.ADMITTED, 5.0)]
    store.write([m[0] for m in moves], [m[1] for m in moves])
    assert ids(store.active()) == ["a", "c", "d", "e"]
    states = {r.id: r.state for r in store.active()}
    assert states["d"] is S.ADMITTED
    cancelled = store.get("b")
    assert cancelled is not None
    assert cancelled.state is S.CANCELLED


def test_write_replaces_records_and_appends_history(any_store: Harness) -> None:
    store = any_store.store
    record = store.submit(job("a"), at=1.0)
    (expected, admitted), t1 = move(record, S.ADMITTED, 2.0, attempt=1)
    store.write([(expected, admitted)], [t1])
    (expected, launching), t2 = move(admitted, S.LAUNCHING, 3.0)
    store.write([(expected, launching)], [t2])
    assert store.get("a") == launching
    assert list(store.history("a")) == [t1, t2]
    assert list(store.history("missing")) == []


def test_stale_write_raises_and_writes_nothing(any_store: Harness) -> None:
    store = any_store.store
    a = store.submit(job("a"), at=1.0)
    b = store.submit(job("b"), at=1.0)
    (_, b_admitted), tb = move(b, S.ADMITTED, 2.0)
    store.write([(1, b_admitted)], [tb])
    # One good update and one made from b's old version: neither may land, nor any transition.
    good, ta = move(a, S.ADMITTED, 3.0)
    stale, tb_stale = move(b, S.CANCELLED, 3.0)
    with pytest.raises(StaleWriteError, match="job b: expected version 1, store has 2"):
        store.write([good, stale], [ta, tb_stale])
    assert store.get("a") == a
    assert store.get("b") == b_admitted
    assert list(store.history("a")) == []
    assert list(store.history("b")) == [tb]


def test_write_of_an_unknown_job_is_stale(any_store: Harness) -> None:
    store = any_store.store
    ghost = JobRecord(job("ghost"), S.ADMITTED, version=2)
    with pytest.raises(StaleWriteError, match="job ghost: expected version 1, store has None"):
        store.write([(1, ghost)], [])
    assert store.get("ghost") is None


def test_write_with_nothing_is_a_no_op(any_store: Harness) -> None:
    store = any_store.store
    store.write([], [])
    assert list(store.active()) == []


def test_requests_are_taken_once_in_order(any_store: Harness) -> None:
    store = any_store.store
    store.submit(job("a"), at=1.0)
    store.submit(job("b"), at=1.0)
    store.request("a", RequestKind.CANCEL, "user asked", 5.0)
    store.request("b", RequestKind.REQUEUE, "drain node-1", 6.0)
    taken, cursor = store.take_requests(0)
    assert [(r.job_id, r.kind, r.reason, r.at) for r in taken] == [
        ("a", RequestKind.CANCEL, "user asked", 5.0),
        ("b", RequestKind.REQUEUE, "drain node-1", 6.0),
    ]
    assert taken[0].seq < taken[1].seq <= cursor
    assert list(store.take_requests(cursor)[0]) == []
    store.request("a", RequestKind.CANCEL, "again", 7.0)
    (again,), _ = store.take_requests(cursor)
    assert again.reason == "again"


def test_cluster_version_bumps_when_nodes_or_queues_change(any_store: Harness) -> None:
    store = any_store.store
    before = store.cluster_version()
    nodes = [make_node("n1", "A100-80GB", 8, 80 << 30), make_node("n2", "H100", 8, 80 << 30)]
    any_store.set_cluster(nodes=nodes)
    after_nodes = store.cluster_version()
    assert after_nodes > before
    assert store.nodes() == tuple(nodes)
    any_store.set_cluster(queues=[QueueSpec("default", weight=2.0)])
    assert store.cluster_version() > after_nodes
    assert {q.name: q.weight for q in store.queues()}["default"] == 2.0
