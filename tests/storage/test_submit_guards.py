"""What the SQL stores add around submits and admin actions: a queue's cap on pending jobs, idempotency
keys, and the audit log. SQLite and PostgreSQL, each reopened to check what is durable."""

from __future__ import annotations

import pytest

from gpufleet.domain import JobState, LimitError, QueueSpec, SpecError
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AuditEntry, SubmitKey
from tests.storage.conftest import Harness
from tests.storage.test_contract import job, move


def key(name: str, body: str = "body-1", token: str = "t-1") -> SubmitKey:
    return SubmitKey(token, name, body)


def test_a_queue_with_max_pending_refuses_the_jobs_beyond_it_and_counts_only_pending_ones(sql: Harness) -> None:
    store = sql.sql
    store.set_queue(QueueSpec("capped", max_pending=2))
    first = store.submit_many([job("a", queue="capped"), job("b", queue="capped"), job("c", queue="capped")], 1.0)
    assert [type(r).__name__ for r in first] == ["JobRecord", "JobRecord", "LimitError"]
    assert "already has 2 pending jobs" in str(first[2])
    assert "quota set capped --max-pending" in str(first[2])
    # Other queues are not affected, and a job that leaves `pending` makes room for one more.
    assert isinstance(store.submit(job("d"), at=1.5), JobRecord)
    with pytest.raises(LimitError):
        store.submit(job("e", queue="capped"), at=2.0)
    a = store.get("a")
    assert a is not None
    update, change = move(a, JobState.CANCELLED, 2.5)
    store.write([update], [change])
    assert isinstance(store.submit(job("e", queue="capped"), at=3.0), JobRecord)
    assert sorted(r.id for r in sql.reopen().active()) == ["b", "d", "e"]


def test_a_key_used_again_returns_the_first_job_and_stores_nothing_new(sql: Harness) -> None:
    store = sql.sql
    made = store.submit_many([job("a")], 1.0, keys=[key("k1")])[0]
    assert isinstance(made, JobRecord)
    again = store.submit_many([job("b")], 2.0, keys=[key("k1")])[0]
    assert isinstance(again, JobRecord)
    assert (again.id, again.job.submit_seq, again.submitted_at) == ("a", made.job.submit_seq, 1.0)
    # Another token's key of the same name is its own.
    other = store.submit_many([job("c")], 2.0, keys=[key("k1", token="t-2")])[0]
    assert isinstance(other, JobRecord)
    assert other.id == "c"
    # It survives a restart of the control plane (it is in the store).
    reopened = sql.reopen()
    replay = reopened.submit_many([job("d")], 3.0, keys=[key("k1")])[0]
    assert isinstance(replay, JobRecord)
    assert replay.id == "a"
    assert sorted(r.id for r in reopened.active()) == ["a", "c"]


def test_a_key_with_another_body_is_refused_naming_the_header(sql: Harness) -> None:
    store = sql.sql
    store.submit_many([job("a")], 1.0, keys=[key("k1")])
    refused = store.submit_many([job("b")], 2.0, keys=[key("k1", body="body-2")])[0]
    assert isinstance(refused, SpecError)
    assert refused.fields[0].field == "Idempotency-Key"
    assert "different request body" in refused.fields[0].problem
    assert store.get("b") is None


def test_keys_repeated_inside_one_batch_make_one_job(sql: Harness) -> None:
    store = sql.sql
    results = store.submit_many(
        [job("a"), job("b"), job("c"), job("d")],
        1.0,
        keys=[key("k1"), key("k1"), key("k1", body="body-2"), None],
    )
    assert [r.id if isinstance(r, JobRecord) else type(r).__name__ for r in results] == ["a", "a", "SpecError", "d"]
    assert sorted(r.id for r in store.active()) == ["a", "d"]


def test_keys_are_kept_for_a_bounded_time(sql: Harness) -> None:
    store = sql.sql
    store.submit_many([job("a")], 1.0, keys=[key("k1")])
    # Past the key's lifetime the same key makes a new job, and names that one from then on.
    fresh = store.submit_many([job("b")], 100.0, keys=[key("k1", body="body-2")], key_ttl_s=50.0)[0]
    assert isinstance(fresh, JobRecord)
    assert fresh.id == "b"
    replay = store.submit_many([job("c")], 101.0, keys=[key("k1", body="body-2")], key_ttl_s=50.0)[0]
    assert isinstance(replay, JobRecord)
    assert replay.id == "b"
    store.submit_many([job("d")], 200.0, keys=[key("k2")])
    assert store.forget_idempotency_keys(before=150.0) == 1
    assert store.forget_idempotency_keys(before=150.0) == 0
    again = store.submit_many([job("e")], 201.0, keys=[key("k1", body="body-2")])[0]
    assert isinstance(again, JobRecord)
    assert again.id == "e"


def test_the_audit_log_keeps_entries_in_order_and_pages_by_time(sql: Harness) -> None:
    store = sql.sql
    for at, action in ((1.0, "token.create"), (2.0, "queue.set"), (3.0, "node.drain")):
        store.audit(AuditEntry(at, "admin", action, f"target-{at:g}", "{}", "10.0.0.7", "t-1"))
    store.audit(AuditEntry(4.0, "alice", "queue.set", "team-b", "", "10.0.0.8", "t-2", outcome="denied"))
    reopened = sql.reopen()
    assert [e.action for e in reopened.audit_log()] == ["token.create", "queue.set", "node.drain", "queue.set"]
    assert [e.at for e in reopened.audit_log(since=2.5)] == [3.0, 4.0]
    assert [e.at for e in reopened.audit_log(limit=2)] == [3.0, 4.0]
    last = reopened.audit_log()[-1]
    assert (last.actor, last.source, last.token_id, last.outcome) == ("alice", "10.0.0.8", "t-2", "denied")
