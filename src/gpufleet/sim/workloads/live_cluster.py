"""A snapshot of a live gpufleet cluster (`gpufleet snapshot`) as a workload: the cluster's own nodes and
queues, and its jobs arriving when they were submitted, each running as long as it ran there.

How long a job runs here, in this order: the GPU time it received over all its attempts divided by its
GPUs (finished jobs, cancelled jobs that ran, and running jobs so far: a lower bound); its own
`expected_duration`; the median of the finished jobs of its queue; one hour. Jobs cancelled before they
ever ran are left out. Each of these choices is listed in the workload's assumptions.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.adapters.storage.codec import decode_node, decode_queue, decode_record, decode_window
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError

FORMAT = "gpufleet-snapshot"
DEFAULT_DURATION_S = 3600.0
FIX = "take one with `gpufleet snapshot --out FILE` against a running control plane"


def is_snapshot(path: Path) -> bool:
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(200)
    return FORMAT.encode() in head


def _ran_seconds(record: JobRecord, taken_at: float) -> float:
    gpus = record.job.gpu_milli_total / 1000
    attained = record.attained_gpu_seconds
    if record.state in (JobState.RUNNING, JobState.EVICTING) and record.started_at is not None:
        attained += gpus * max(0.0, taken_at - record.started_at)
    if gpus > 0:
        return attained / gpus
    if record.started_at is not None:
        end = record.finished_at if record.finished_at is not None else taken_at
        return max(0.0, end - record.started_at)
    return 0.0


def load_snapshot(path: str | Path) -> Workload:
    source = Path(path).expanduser()
    try:
        data: dict[str, Any] = json.loads(source.read_text())
    except (OSError, ValueError) as error:
        raise WorkloadError(f"cannot be read as a snapshot: {error}", FIX, path=source) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WorkloadError("is not a gpufleet snapshot (no format: gpufleet-snapshot)", FIX, path=source)
    if data.get("version") != 1:
        raise WorkloadError(f"is snapshot version {data.get('version')!r}; this gpufleet reads version 1", FIX)
    try:
        nodes = tuple(decode_node(n) for n in data["nodes"])
        queues = tuple(decode_queue(q) for q in data["queues"])
        records = [decode_record(r) for r in data["jobs"]]
        windows = [decode_window(w) for w in data.get("windows", ())]  # snapshots before reservations have none
        taken_at = float(data["taken_at"])
    except (KeyError, TypeError, ValueError) as error:
        raise WorkloadError(f"has a malformed field: {error}", FIX, path=source) from None
    if not nodes:
        raise WorkloadError("has no nodes", FIX, path=source)

    finished: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if record.state is JobState.SUCCEEDED and (ran := _ran_seconds(record, taken_at)) > 0:
            finished[record.job.queue].append(ran)
    assumptions = [
        "run time = GPU time received over all attempts / GPUs (running jobs: so far, a lower bound)",
        "jobs cancelled before they ran are left out",
    ]
    guessed = 0
    jobs: list[TraceJob] = []
    start = min((r.submitted_at for r in records), default=taken_at)
    for record in sorted(records, key=lambda r: (r.submitted_at, r.job.submit_seq)):
        ran = _ran_seconds(record, taken_at)
        if ran <= 0 and record.state is JobState.CANCELLED:
            continue
        if ran <= 0:
            queue_runs = finished.get(record.job.queue)
            if record.job.expected_duration is not None:
                ran = record.job.expected_duration
            elif queue_runs:
                ran = statistics.median(queue_runs)
                guessed += 1
            else:
                ran = DEFAULT_DURATION_S
                guessed += 1
        job = dataclasses.replace(record.job, submitted_at=record.submitted_at - start, attained_gpu_seconds=0.0)
        jobs.append(TraceJob(job, duration=max(ran, 1e-3)))
    if guessed:
        assumptions.append(
            f"{guessed} job(s) that had not run: their expected_duration, else their queue's median run time, else 1 h"
        )
    # Reservations on the workload's clock (seconds from the first submission); those over by then are left out.
    shifted = tuple(
        dataclasses.replace(w, start=max(w.start - start, 0.0), end=w.end - start) for w in windows if w.end > start
    )
    if shifted:
        assumptions.append(
            f"{len(shifted)} reservation(s) of the cluster, as set there: {', '.join(w.name for w in shifted)}"
        )
    taken = datetime.fromtimestamp(taken_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    emulated = " (emulated GPUs)" if data.get("emulated") else ""
    return Workload(
        name=f"snapshot {source.name}",
        citation=f"a snapshot of a gpufleet control plane{emulated}, inventory {data.get('inventory', '?')}, "
        f"taken {taken}",
        license="your own cluster's data",
        nodes=nodes,
        queues=queues,
        jobs=tuple(jobs),
        assumptions=tuple(assumptions),
        windows=shifted,
    )
