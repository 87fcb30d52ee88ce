"""A snapshot of the live cluster for the simulator: its nodes, queues, and the jobs of a recent window
(every active job, and every job submitted since the window's start), as stored. `gpufleet sim --workload
snapshot.json` replays it: "what if this week had run under another policy, or with 16 more GPUs?"."""

from __future__ import annotations

from typing import Any

from gpufleet.adapters.storage.codec import encode_node, encode_queue, encode_record, encode_window
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AdminStore, JobQuery

FORMAT = "gpufleet-snapshot"
VERSION = 1
PAGE = 1000


def take_snapshot(store: AdminStore, now: float, since: float, source: str, emulated: bool) -> dict[str, Any]:
    records: dict[str, JobRecord] = {r.id: r for r in store.active()}
    before: int | None = None
    while True:
        page = store.jobs(JobQuery(limit=PAGE, before_seq=before))
        for record in page:
            if record.submitted_at >= since:
                records.setdefault(record.id, record)
        if len(page) < PAGE or all(r.submitted_at < since for r in page):
            break
        before = page[-1].job.submit_seq
    ordered = sorted(records.values(), key=lambda r: r.job.submit_seq)
    return {
        "format": FORMAT,
        "version": VERSION,
        "taken_at": now,
        "since": since,
        "inventory": source,
        "emulated": emulated,
        "nodes": [encode_node(n) for n in store.nodes()],
        "queues": [encode_queue(q) for q in store.queues()],
        "jobs": [encode_record(r) for r in ordered],
        "windows": [encode_window(w) for w in store.windows()],
    }
