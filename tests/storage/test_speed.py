"""Throughput floors of the SQLite store. The API's goal is 500 submitted jobs/s through HTTP, so the store
alone must do several times that; the loop writes each cycle's changes in one call.

Measured on the 2-core development machine: about 4,000 submits/s and 3,800 single-job writes/s (1,400
and 1,600 while other test suites ran beside it), about 24,000 records/s in one batched write. The
floors below leave room for slower or busier CI machines."""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain import JobState as S
from gpufleet.domain import QueueSpec
from gpufleet.domain.jobs import RunSpec
from tests.storage.test_contract import job, move

COUNT = 400


def test_sqlite_submits_and_writes_are_fast(tmp_path: Path) -> None:
    with SqlStore.open(default_sqlite_url(tmp_path)) as store:
        store.set_queue(QueueSpec("default"))
        run = RunSpec(("python", "train.py", "--epochs", "10"), env=(("SEED", "1"),))
        jobs = [job(f"j{i}", run=run, name="train") for i in range(COUNT)]

        started = time.perf_counter()
        records = [store.submit(j, at=1.0) for j in jobs]
        submits_per_s = COUNT / (time.perf_counter() - started)

        started = time.perf_counter()
        admitted = []
        for record in records:
            update, tr = move(record, S.ADMITTED, 2.0)
            store.write([update], [tr])
            admitted.append(update[1])
        writes_per_s = COUNT / (time.perf_counter() - started)

        moves = [move(r, S.LAUNCHING, 3.0) for r in admitted]
        started = time.perf_counter()
        store.write([m[0] for m in moves], [m[1] for m in moves])
        batch_per_s = COUNT / (time.perf_counter() - started)

        started = time.perf_counter()
        active = store.active()
        active_s = time.perf_counter() - started

    print(
        f"\nSQLite: {submits_per_s:.0f} submits/s, {writes_per_s:.0f} single-job writes/s, "
        f"{batch_per_s:.0f} records/s in one write, active() of {len(active)} in {active_s * 1000:.0f} ms"
    )
    assert len(active) == COUNT
    assert submits_per_s >= 500
    assert writes_per_s >= 500
    assert batch_per_s >= 2_000
