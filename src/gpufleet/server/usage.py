"""GPU usage over time: measured use kept in the store's settings, and allocation read from job history.

**Where measured use is kept.** In the store's settings (so it lives with the jobs, on SQLite or
PostgreSQL, and survives restarts), as JSON under two kinds of keys:

- `usage:hour:<hour>` (`<hour>` = Unix time // 3600): per queue, GPU-seconds `[sampled, used, idle]` in that
  hour (see `gpufleet.server.idle` for what each counts);
- `usage:job:<job id>`: the same three totals for one job over its life, with its queue;
- `usage:hours`: the list of hours stored, so that a report reads only those.

Ticks add to memory; `flush()` adds what accumulated to the stored values (read, add, write: one control
plane writes them) every flush interval and when the control plane stops. Readers see stored plus unflushed.

**Allocation** comes from the store's transition history: every interval a job spent holding resources
(admitted, launching, running, evicting) x its GPUs, clipped to the report's window. Measured use has an
hour's resolution (an hour at either end of the window counts whole); allocation is exact.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.domain.costs import HOUR
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AdminStore
from gpufleet.server.idle import JobUsage

log = logging.getLogger("gpufleet.telemetry")

HOUR_KEY = "usage:hour:{hour}"
HOURS_KEY = "usage:hours"
JOB_KEY = "usage:job:{job}"
HOLDING = frozenset({JobState.ADMITTED, JobState.LAUNCHING, JobState.RUNNING, JobState.EVICTING})
PAGE = 500


def _decode(text: str | None) -> dict[str, object]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        log.warning("usage: a stored usage value is not JSON; starting it again from zero")
        return {}
    return value if isinstance(value, dict) else {}


def _usage(value: object) -> JobUsage:
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
        return JobUsage(float(value[0]), float(value[1]), float(value[2]))
    return JobUsage()


class UsageBook:
    """Measured GPU usage per queue and hour, and per job, in the store's settings (see the module doc)."""

    def __init__(self, store: AdminStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._hours: dict[int, dict[str, JobUsage]] = {}  # unflushed
        self._jobs: dict[str, tuple[str, JobUsage]] = {}  # unflushed
        self.since_start: dict[str, JobUsage] = {}  # per queue, since this process started (metric counters)

    def add(self, now: float, usage: Mapping[str, tuple[str, JobUsage]]) -> None:
        hour = int(now // 3600)
        with self._lock:
            per_queue = self._hours.setdefault(hour, {})
            for job, (queue, use) in usage.items():
                per_queue.setdefault(queue, JobUsage()).add(use)
                self.since_start.setdefault(queue, JobUsage()).add(use)
                entry = self._jobs.get(job)
                if entry is None:
                    entry = self._jobs[job] = (queue, JobUsage())
                entry[1].add(use)

    def flush(self) -> None:
        """Add what accumulated to the stored values."""
        with self._lock:
            hours, self._hours = self._hours, {}
            jobs, self._jobs = self._jobs, {}
        known = self._hours_stored()
        if not set(hours) <= known:
            self.store.set_setting(HOURS_KEY, json.dumps(sorted(known | set(hours))))
        for hour, per_queue in hours.items():
            key = HOUR_KEY.format(hour=hour)
            stored = _decode(self.store.get_setting(key))
            for queue, use in per_queue.items():
                total = _usage(stored.get(queue))
                total.add(use)
                stored[queue] = total.as_list()
            self.store.set_setting(key, json.dumps(stored, sort_keys=True))
        for job, (queue, use) in jobs.items():
            key = JOB_KEY.format(job=job)
            stored = _decode(self.store.get_setting(key))
            total = _usage(stored.get("usage"))
            total.add(use)
            self.store.set_setting(key, json.dumps({"queue": queue, "usage": total.as_list()}))

    def _hours_stored(self) -> set[int]:
        """The hours that have a stored value (an index, so a report reads only those)."""
        try:
            value = json.loads(self.store.get_setting(HOURS_KEY) or "[]")
        except ValueError:
            value = []
        return {int(h) for h in value if isinstance(h, int)} if isinstance(value, list) else set()

    def job(self, job: str) -> JobUsage:
        """A job's usage over its life: stored plus unflushed."""
        total = _usage(_decode(self.store.get_setting(JOB_KEY.format(job=job))).get("usage"))
        with self._lock:
            entry = self._jobs.get(job)
            if entry is not None:
                total.add(entry[1])
        return total

    def by_queue(self, since: float, until: float) -> dict[str, JobUsage]:
        """Per queue, the usage of the hours that overlap [since, until]: stored plus unflushed."""
        first, last = int(since // 3600), int(until // 3600)
        out: dict[str, JobUsage] = {}
        for hour in sorted(h for h in self._hours_stored() if first <= h <= last):
            for queue, value in _decode(self.store.get_setting(HOUR_KEY.format(hour=hour))).items():
                out.setdefault(queue, JobUsage()).add(_usage(value))
        with self._lock:
            for hour, per_queue in self._hours.items():
                if first <= hour <= last:
                    for queue, use in per_queue.items():
                        out.setdefault(queue, JobUsage()).add(use)
        return out


def holding_intervals(record: JobRecord, history: Iterable[Transition], until: float) -> list[tuple[float, float]]:
    """The (start, end) intervals a job held resources, from its transitions; one still holding ends `until`."""
    intervals: list[tuple[float, float]] = []
    start: float | None = None
    for transition in history:
        source, target, at = transition.source, transition.target, transition.at
        if target in HOLDING and source not in HOLDING:
            start = at
        elif target not in HOLDING and source in HOLDING and start is not None:
            intervals.append((start, at))
            start = None
    if start is not None and record.state in HOLDING:
        intervals.append((start, max(start, until)))
    return intervals


@dataclass(frozen=True, slots=True)
class QueueUsage:
    queue: str
    allocated_gpu_seconds: float = 0.0
    sampled_gpu_seconds: float = 0.0
    used_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    jobs: int = 0


@dataclass(frozen=True, slots=True)
class UsageReport:
    since: float
    until: float
    queues: tuple[QueueUsage, ...] = ()
    notes: tuple[str, ...] = field(default=())


def allocated_by_queue(
    store: AdminStore, since: float, until: float, queues: set[str] | None = None
) -> tuple[dict[str, float], dict[str, int]]:
    """GPU-seconds allocated per queue in [since, until], and the jobs that held GPUs there: the GPU-hours of
    `report cost` (what each attempt held, from its stored placement, over its holding intervals), so that the
    usage and cost reports of the same jobs agree. Counting what a job asked for instead overstated an elastic
    job that ran with fewer workers than its most."""
    from gpufleet.server.chargeback import cost_report  # it reads this module's history helpers

    report = cost_report(store, None, since, until, queues)
    allocated: dict[str, float] = {}
    for line in report.lines:
        allocated[line.queue] = allocated.get(line.queue, 0.0) + line.gpu_hours * HOUR
    return allocated, dict(report.jobs)


def usage_report(
    store: AdminStore, book: UsageBook | None, since: float, until: float, queues: set[str] | None = None
) -> UsageReport:
    """Per queue: GPU-seconds allocated (history), sampled, used and reserved-idle (measured)."""
    allocated, jobs = allocated_by_queue(store, since, until, queues)
    measured = book.by_queue(since, until) if book is not None else {}
    names = set(allocated) | set(measured)
    if queues is not None:
        names &= queues
    rows = []
    for name in sorted(names):
        use = measured.get(name, JobUsage())
        rows.append(QueueUsage(name, allocated.get(name, 0.0), use.sampled, use.used, use.idle, jobs.get(name, 0)))
    notes = ["allocated: exact, from job history; sampled/used/reserved-idle: measured, per whole hour"]
    if book is None:
        notes.append("no GPU telemetry in this control plane: only allocation is known")
    return UsageReport(since, until, tuple(rows), tuple(notes))
