"""Job listings for the dashboard's Jobs page: filters by submitter and part of the name, orders, offsets
and counts, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

from gpufleet.domain.lifecycle import JobState
from gpufleet.ports.admin import JobOrder, JobQuery
from tests.kit.builders import make_job
from tests.storage.conftest import Harness


def fill(h: Harness) -> None:
    jobs = [
        dataclasses.replace(
            make_job(f"j{i:02d}").queue("team-a" if i % 3 else "default").build(),
            name=["Train-big", "eval", "train_small", "50%_done"][i % 4],
            user=["alice", "bob", ""][i % 3],
        )
        for i in range(24)
    ]
    assert all(not isinstance(r, Exception) for r in h.sql.submit_many(jobs, 0.0))


def ids(h: Harness, query: JobQuery) -> list[str]:
    return [r.id for r in h.sql.jobs(query)]


def test_filters_by_submitter_and_by_part_of_the_name_in_any_case(sql: Harness) -> None:
    fill(sql)
    alice = ids(sql, JobQuery(user="alice", limit=100))
    assert alice == [f"j{i:02d}" for i in range(23, -1, -1) if i % 3 == 0]
    assert sql.sql.count_jobs(JobQuery(user="alice")) == 8
    train = ids(sql, JobQuery(name_contains="TRAIN", limit=100))
    assert sorted(train) == sorted(f"j{i:02d}" for i in range(24) if i % 4 in (0, 2))
    # `%` and `_` are matched as themselves, not as wildcards
    assert ids(sql, JobQuery(name_contains="50%", limit=100)) == [f"j{i:02d}" for i in range(23, -1, -1) if i % 4 == 3]
    assert sql.sql.count_jobs(JobQuery(name_contains="n_s")) == 6
    assert sql.sql.count_jobs(JobQuery(user="alice", queue="default", states=frozenset({JobState.PENDING}))) == 8


def test_orders_and_offsets_page_through_every_job_once(sql: Harness) -> None:
    fill(sql)
    for order in JobOrder:
        for ascending in (True, False):
            pages = [
                ids(sql, JobQuery(order=order, ascending=ascending, limit=5, offset=offset))
                for offset in range(0, 25, 5)
            ]
            seen = [job for page in pages for job in page]
            assert sorted(seen) == sorted(f"j{i:02d}" for i in range(24)), (order, ascending)
            records = [r for offset in range(0, 25, 5) for r in sql.sql.jobs(
                JobQuery(order=order, ascending=ascending, limit=5, offset=offset))]  # fmt: skip
            key = {
                JobOrder.SUBMITTED: lambda r: r.job.submit_seq,
                JobOrder.NAME: lambda r: r.job.name,
                JobOrder.QUEUE: lambda r: r.job.queue,
                JobOrder.STATE: lambda r: r.state.value,
                JobOrder.USER: lambda r: r.job.user,
            }[order]
            values = [key(r) for r in records]
            assert values == sorted(values, reverse=not ascending), (order, ascending)


def test_the_submitter_survives_a_round_trip(sql: Harness) -> None:
    fill(sql)
    record = sql.sql.get("j01")
    assert record is not None
    assert record.job.user == "bob"
    other = sql.sql.get("j02")
    assert other is not None
    assert other.job.user == ""


def test_pending_ahead_counts_and_lists_the_jobs_that_go_first(sql: Harness) -> None:
    jobs = [make_job(f"p{i:02d}").queue("team-a").priority([0, 5, -1, 5][i % 4]).build() for i in range(20)]
    assert all(not isinstance(r, Exception) for r in sql.sql.submit_many(jobs, 0.0))
    sql.sql.submit_many([make_job("other").queue("default").priority(9).build()], 0.0)
    records = sql.sql.jobs(JobQuery(queue="team-a", limit=100))
    order = [r.id for r in sorted(records, key=lambda r: (-r.job.priority, r.job.submit_seq))]
    for record in records:
        count, first = sql.sql.pending_ahead("team-a", record.job.priority, record.job.submit_seq, 3)
        place = order.index(record.id)
        assert count == place  # the job in the other queue never counts
        assert first == order[: min(place, 3)]
