"""The AdminStore part of the SQL stores: queues, nodes, tokens, job queries, settings."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import JobState, QueueSpec, Quota, SpecError, UnknownNameError, make_node
from gpufleet.domain import JobState as S
from gpufleet.ports.admin import JobQuery, Notice, Role, Token
from tests.storage.conftest import Harness
from tests.storage.test_contract import job, move

NODE_MEMORY = 80 << 30


def token(token_id: str, queue: str | None = "team-a", role: Role = Role.TEAM, **changes: object) -> Token:
    made = Token(token_id, f"{token_id}-name", role, queue, f"hash-{token_id}", created_at=1.0)
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


# --- queues ---------------------------------------------------------------------------------------------------


def test_set_queue_creates_replaces_and_bumps_only_on_change(sql: Harness) -> None:
    store = sql.sql
    before = store.cluster_version()
    spec = QueueSpec("ml", quotas={"gpu": Quota(8000, 4000, 2000)}, cohort="research", weight=2.0)
    store.set_queue(spec)
    assert store.cluster_version() == before + 1
    store.set_queue(spec)
    assert store.cluster_version() == before + 1
    changed = dataclasses.replace(spec, weight=3.0)
    store.set_queue(changed)
    assert store.cluster_version() == before + 2
    assert [q for q in store.queues() if q.name == "ml"] == [changed]
    assert [q.name for q in store.queues()] == ["default", "ml", "team-a"]


def test_delete_queue_removes_it_and_bumps(sql: Harness) -> None:
    store = sql.sql
    before = store.cluster_version()
    store.delete_queue("team-a")
    assert [q.name for q in store.queues()] == ["default"]
    assert store.cluster_version() == before + 1


def test_delete_unknown_queue_names_the_known_ones(sql: Harness) -> None:
    with pytest.raises(UnknownNameError) as caught:
        sql.sql.delete_queue("nope")
    assert "default" in caught.value.fix
    assert "team-a" in caught.value.fix


def test_a_queue_with_active_jobs_or_live_tokens_cannot_be_deleted(sql: Harness) -> None:
    store = sql.sql
    record = store.submit(job("a", "team-a"), at=1.0)
    store.create_token(token("t1"))
    before = store.cluster_version()
    with pytest.raises(SpecError) as caught:
        store.delete_queue("team-a")
    assert [p.field for p in caught.value.fields] == ["jobs", "tokens"]
    assert "1 active" in str(caught.value)
    assert "revoke" in str(caught.value)
    assert [q.name for q in store.queues()] == ["default", "team-a"]
    assert store.cluster_version() == before
    # Once the job ended and the token is revoked, the queue can go (its finished jobs stay queryable).
    update, tr = move(record, S.CANCELLED, 2.0)
    store.write([update], [tr])
    store.revoke_token("t1")
    store.delete_queue("team-a")
    assert [r.id for r in store.jobs(JobQuery(queue="team-a"))] == ["a"]


# --- nodes ----------------------------------------------------------------------------------------------------


def test_set_nodes_replaces_the_inventory_keeping_cordons(sql: Harness) -> None:
    store = sql.sql
    n1, n2, n3 = (make_node(f"n{i}", "H100", 8, NODE_MEMORY) for i in (1, 2, 3))
    store.set_nodes([n2, n1])
    assert [n.name for n in store.nodes()] == ["n1", "n2"]
    store.set_node_flags("n1", cordoned=True)
    version = store.cluster_version()
    # Rediscovery: n1 comes back uncordoned from discovery, n2 is gone, n3 is new and marked unhealthy.
    store.set_nodes([n1, dataclasses.replace(n3, healthy=False)])
    nodes = {n.name: n for n in store.nodes()}
    assert sorted(nodes) == ["n1", "n3"]
    assert nodes["n1"].cordoned
    assert not nodes["n3"].healthy
    assert store.cluster_version() == version + 1
    store.set_nodes([n1, dataclasses.replace(n3, healthy=False)])
    assert store.cluster_version() == version + 1  # nothing changed


def test_set_nodes_refuses_duplicate_names(sql: Harness) -> None:
    node = make_node("n1", "H100", 8, NODE_MEMORY)
    with pytest.raises(SpecError, match="appears twice"):
        sql.sql.set_nodes([node, node])
    assert sql.sql.nodes() == ()


def test_set_node_flags(sql: Harness) -> None:
    store = sql.sql
    store.set_nodes([make_node("n1", "H100", 8, NODE_MEMORY)])
    version = store.cluster_version()
    cordoned = store.set_node_flags("n1", cordoned=True)
    assert cordoned.cordoned
    assert cordoned.healthy
    assert store.nodes() == (cordoned,)
    assert store.cluster_version() == version + 1
    same = store.set_node_flags("n1", cordoned=True)
    assert same == cordoned
    assert store.cluster_version() == version + 1
    sick = store.set_node_flags("n1", cordoned=False, healthy=False)
    assert not sick.cordoned
    assert not sick.healthy
    assert store.cluster_version() == version + 2
    with pytest.raises(UnknownNameError, match="'n9'") as caught:
        store.set_node_flags("n9", cordoned=True)
    assert "n1" in caught.value.fix


# --- tokens ---------------------------------------------------------------------------------------------------


def test_tokens_are_stored_found_by_hash_and_revoked(sql: Harness) -> None:
    store = sql.sql
    admin = token("a1", None, Role.ADMIN, created_at=0.5)
    team = token("t1")
    store.create_token(team)
    store.create_token(admin)
    assert store.tokens() == [admin, team]
    assert store.token_by_hash("hash-t1") == team
    assert store.token_by_hash("nope") is None
    store.revoke_token("t1")
    store.revoke_token("t1")  # idempotent
    assert store.token_by_hash("hash-t1") == dataclasses.replace(team, revoked=True)
    with pytest.raises(UnknownNameError):
        store.revoke_token("nope")


def test_bad_tokens_are_refused(sql: Harness) -> None:
    store = sql.sql
    store.create_token(token("t1"))
    with pytest.raises(SpecError, match="id: is taken"):
        store.create_token(token("t1", secret_hash="other"))
    with pytest.raises(SpecError, match="secret: is already in use"):
        store.create_token(token("t2", secret_hash="hash-t1"))
    with pytest.raises(SpecError, match="queue: is not set for a team token"):
        store.create_token(token("t3", None))
    with pytest.raises(UnknownNameError, match="'nope'"):
        store.create_token(token("t4", "nope"))
    assert [t.id for t in store.tokens()] == ["t1"]


# --- job queries and settings ---------------------------------------------------------------------------------


def test_jobs_are_listed_newest_first_with_filters_and_paging(sql: Harness) -> None:
    store = sql.sql
    for i in range(7):
        store.submit(job(f"j{i}", "team-a" if i % 2 else "default", name="even" if i % 2 == 0 else "odd"), at=i)
    first = store.get("j0")
    assert first is not None
    update, tr = move(first, JobState.ADMITTED, 9.0)
    store.write([update], [tr])

    assert [r.id for r in store.jobs(JobQuery())] == [f"j{i}" for i in reversed(range(7))]
    assert [r.id for r in store.jobs(JobQuery(queue="team-a"))] == ["j5", "j3", "j1"]
    assert [r.id for r in store.jobs(JobQuery(states=frozenset({S.ADMITTED})))] == ["j0"]
    assert [r.id for r in store.jobs(JobQuery(states=frozenset({S.ADMITTED, S.PENDING}), name="even"))] == [
        "j6",
        "j4",
        "j2",
        "j0",
    ]
    page1 = store.jobs(JobQuery(limit=3))
    page2 = store.jobs(JobQuery(limit=3, before_seq=page1[-1].job.submit_seq))
    page3 = store.jobs(JobQuery(limit=3, before_seq=page2[-1].job.submit_seq))
    assert [r.id for r in (*page1, *page2, *page3)] == [f"j{i}" for i in reversed(range(7))]
    with pytest.raises(SpecError, match="limit"):
        store.jobs(JobQuery(limit=0))


def test_settings(sql: Harness) -> None:
    store = sql.sql
    assert store.get_setting("policy") is None
    store.set_setting("policy", "fair-share")
    store.set_setting("policy", "default")
    assert store.get_setting("policy") == "default"
    assert sql.reopen().get_setting("policy") == "default"


def test_notices_are_kept_per_job_in_order_and_survive_a_reopen(sql: Harness) -> None:
    store = sql.sql
    store.set_queue(QueueSpec("default"))
    store.submit(job("a"), at=1.0)
    store.submit(job("b"), at=1.0)
    store.add_notice(Notice("a", "reserved-idle", "under 5 % for 30 min", 10.0))
    store.add_notice(Notice("a", "reserved-idle", "again", 20.0))
    assert [n.message for n in store.notices("a")] == ["under 5 % for 30 min", "again"]
    assert store.notices("b") == ()
    with pytest.raises(UnknownNameError, match="'nope' does not exist"):
        store.add_notice(Notice("nope", "x", "y", 1.0))
    assert sql.reopen().notices("a")[1] == Notice("a", "reserved-idle", "again", 20.0)


def test_submit_many_writes_a_batch_in_order_and_refuses_only_the_bad_jobs(sql: Harness) -> None:
    store = sql.sql
    store.set_queue(QueueSpec("default"))
    store.submit(job("taken"), at=0.5)
    results = store.submit_many([job("a"), job("b", queue="nope"), job("c")], at=2.0)
    assert [type(r).__name__ for r in results] == ["JobRecord", "UnknownNameError", "JobRecord"]
    assert "submit to one of: default" in str(results[1])
    seqs = [r.job.submit_seq for r in results if not isinstance(r, Exception)]
    assert seqs == [2, 3]
    taken, _ = store.take_submissions(1)
    assert [r.id for r in taken] == ["a", "c"]
    assert all(r.submitted_at == 2.0 for r in taken)
    # A taken id cannot go in with the batch: the others are still stored, one by one.
    again = store.submit_many([job("d"), job("taken"), job("e")], at=3.0)
    assert isinstance(again[1], SpecError)
    assert [r.id for r in (again[0], again[2]) if not isinstance(r, Exception)] == ["d", "e"]
    assert {r.id for r in sql.reopen().active()} == {"taken", "a", "c", "d", "e"}
