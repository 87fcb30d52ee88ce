"""`gpufleet bench store`: the SQL store's own speed, without HTTP, as one JSON object.

On a fresh SQLite file (or the PostgreSQL database given with `--db`): submits per second, single-job
writes per second (one record and its transition per transaction, as the loop writes an observation),
records per second in one batched write (as the loop writes a cycle's placements), and `active()` time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain.jobs import Job, RunSpec
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.domain.resources import WorkerRequest


def _move(record: JobRecord, target: JobState, at: float) -> tuple[tuple[int, JobRecord], Transition]:
    reason = f"to {target.value}"
    return (record.version, record.evolve(state=target, reason=reason)), Transition(
        record.id, record.state, target, reason, at
    )


def run(jobs: int = 2000, db_url: str | None = None) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-store-"))
    try:
        store = SqlStore.open(db_url or default_sqlite_url(root))
        try:
            queue = f"bench-{int(time.time() * 1000)}"
            store.set_queue(QueueSpec(queue))
            run_spec = RunSpec(("python", "train.py", "--epochs", "10"), env=(("SEED", "1"),))
            specs = [Job(f"{queue}-{i}", queue, WorkerRequest(gpus=1), run=run_spec, name="train") for i in range(jobs)]
            started = time.perf_counter()
            records = [store.submit(job, at=1.0) for job in specs]
            submit_s = time.perf_counter() - started

            started = time.perf_counter()
            admitted = []
            for record in records:
                update, transition = _move(record, JobState.ADMITTED, 2.0)
                store.write([update], [transition])
                admitted.append(update[1])
            write_s = time.perf_counter() - started

            moves = [_move(r, JobState.LAUNCHING, 3.0) for r in admitted]
            started = time.perf_counter()
            store.write([m[0] for m in moves], [m[1] for m in moves])
            batch_s = time.perf_counter() - started

            started = time.perf_counter()
            active = len(store.active())
            active_s = time.perf_counter() - started
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "store": "postgresql" if db_url and db_url.startswith("postgresql") else "sqlite",
        "jobs": jobs,
        "submits_per_s": round(jobs / submit_s, 1),
        "single_writes_per_s": round(jobs / write_s, 1),
        "batch_records_per_s": round(jobs / batch_s, 1),
        "active_jobs": active,
        "active_ms": round(active_s * 1000, 1),
    }
