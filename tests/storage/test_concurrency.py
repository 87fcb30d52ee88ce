"""Concurrent use of one database through several stores (as the API's threads, the loop, and other
processes would): no submission lost or seen twice, submission numbers without gaps, and version checks
that hold, so that no job is ever claimed twice."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable

from gpufleet.adapters.storage.sql import SqlStore
from gpufleet.domain import JobState as S
from gpufleet.ports import StaleWriteError
from tests.storage.conftest import Harness
from tests.storage.test_contract import job, move

SUBMITTERS = 16
JOBS_EACH = 25
STORES = 4  # threads share a few stores, as threads of a few processes would


def run_all(targets: list[Callable[[], None]]) -> list[BaseException]:
    failures: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as error:
                failures.append(error)

        return run

    threads = [threading.Thread(target=guarded(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return failures


def test_submissions_are_seen_once_while_the_loop_writes(sql: Harness) -> None:
    stores: list[SqlStore] = [sql.open_another() for _ in range(STORES)]
    loop_store = sql.sql
    done = threading.Event()
    expected = {f"s{t}-{i}" for t in range(SUBMITTERS) for i in range(JOBS_EACH)}
    seen: list[str] = []
    stale_refused = 0

    def submitter(t: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(JOBS_EACH):
                stores[t % STORES].submit(job(f"s{t}-{i}", "team-a" if i % 2 else "default"), at=float(i))

        return run

    def loop() -> None:
        nonlocal stale_refused
        cursor = 0
        while True:
            finished = done.is_set()  # read before taking: a take after the last submit sees everything
            taken, cursor = loop_store.take_submissions(cursor)
            for record in taken:
                seen.append(record.id)
                update, tr = move(record, S.ADMITTED, 1.0)
                loop_store.write([update], [tr])
                try:
                    loop_store.write([update], [tr])  # the same write again: its version is now stale
                except StaleWriteError:
                    stale_refused += 1
            if finished and not taken:
                return

    submitters = [submitter(t) for t in range(SUBMITTERS)]

    def all_submitters() -> None:
        failures = run_all(submitters)
        done.set()
        if failures:
            raise failures[0]

    assert run_all([all_submitters, loop]) == []
    assert len(seen) == len(set(seen))
    assert set(seen) == expected
    assert stale_refused == len(expected)
    records = [loop_store.get(job_id) for job_id in expected]
    assert sorted(r.job.submit_seq for r in records if r) == list(range(1, len(expected) + 1))
    assert all(r is not None and r.state is S.ADMITTED and r.version == 2 for r in records)
    assert all(len(loop_store.history(job_id)) == 1 for job_id in expected)


def test_concurrent_claims_never_claim_a_job_twice(sql: Harness) -> None:
    stores: list[SqlStore] = [sql.open_another() for _ in range(STORES)]
    ids = [sql.store.submit(job(f"j{i}"), at=0.0).id for i in range(60)]
    claims: Counter[str] = Counter()
    lock = threading.Lock()

    def claimer(n: int) -> Callable[[], None]:
        store = stores[n % STORES]
        order = ids[:]
        random.Random(n).shuffle(order)

        def run() -> None:
            for job_id in order:
                record = store.get(job_id)
                if record is None or record.state is not S.PENDING:
                    continue
                update, tr = move(record, S.ADMITTED, float(n))
                try:
                    store.write([update], [tr])
                except StaleWriteError:
                    continue  # another claimer got there first
                with lock:
                    claims[job_id] += 1

        return run

    assert run_all([claimer(n) for n in range(8)]) == []
    assert claims == Counter(dict.fromkeys(ids, 1))
    for job_id in ids:
        history = sql.store.history(job_id)
        assert len(history) == 1
        record = sql.store.get(job_id)
        assert record is not None
        assert record.version == 2
