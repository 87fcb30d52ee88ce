"""Throughputs learned from what running jobs report, merged with the table an admin imported.

A job that declares its `job_type` and reports `samples` (`gpufleet.runtime.report`) is measured at each size and
GPU model it ran on (`progress.SizeThroughput`). Pooled over every job of a type, that is a measurement in the
throughput table's sense: job type x GPU model x GPU count (x placement) -> samples/s. Jobs of a type report in
their own unit (samples, or steps), and what a heterogeneity-aware policy reads is only the ratio of one type's
speeds on different models, so a type's learned speeds are used as they are, in the unit its jobs report.

Merging with an imported table (`gpufleet throughput import`), whose unit may differ:
- a job type the import lacks takes the learned measurements as they are;
- a type the import has keeps every imported measurement, and a learned one fills a model or GPU count the
  import lacks, rescaled by the median ratio imported / learned over what both measured (with nothing in
  common there is no common unit, and the learned ones are left out).

What jobs that ended did is kept as pooled sums (`Pooled`, per type, model, GPU count and placement), which the
control plane stores (`pooled_to_json`), so a restart forgets nothing learned.

Pure functions of their inputs (no clock, no store); the loop's learner calls them (`control/throughput_learner.py`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.progress import JobProgress
from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable, model_key

# A size measured for less than this, or over fewer reports, is noise (a start, a stall): not learned from.
MIN_LEARN_SECONDS = 60.0
MIN_LEARN_REPORTS = 3

Key = tuple[str, str, int, bool]  # job type, model key, GPUs, consolidated


@dataclass(frozen=True, slots=True)
class TypedProgress:
    """One job's reports, with what the learner needs of the job: its type and whether it is one worker."""

    job_type: str
    single_worker: bool
    progress: JobProgress


@dataclass(frozen=True, slots=True)
class Pooled:
    """What every job of one type did at one model, GPU count and placement, added up."""

    samples: float
    seconds: float
    reports: int

    def plus(self, other: Pooled) -> Pooled:
        return Pooled(self.samples + other.samples, self.seconds + other.seconds, self.reports + other.reports)


def pooled_measurements(jobs: Iterable[TypedProgress], start: Mapping[Key, Pooled] | None = None) -> dict[Key, Pooled]:
    """Per job type, model, GPU count and placement, over every job, added to `start` (what ended jobs did); a
    job's time at a size with no single model (mixed, or unknown) is not counted."""
    pooled: dict[Key, Pooled] = dict(start or {})
    for job in jobs:
        if not job.job_type:
            continue
        for entry in job.progress.throughput:
            if not entry.model or entry.gpus < 1 or entry.seconds <= 0:
                continue
            key = (job.job_type, model_key(entry.model), entry.gpus, job.single_worker)
            measured = Pooled(entry.samples, entry.seconds, entry.reports)
            pooled[key] = pooled[key].plus(measured) if key in pooled else measured
    return dict(sorted(pooled.items()))


def learned_table(jobs: Iterable[TypedProgress], ended: Mapping[Key, Pooled] | None = None) -> ThroughputTable:
    """The measurements with enough time and reports behind them, over `jobs` and what `ended` jobs did, as a
    table (the jobs' own unit per s)."""
    entries = tuple(
        ThroughputEntry(job_type, model, gpus, sums.samples / sums.seconds, consolidated)
        for (job_type, model, gpus, consolidated), sums in pooled_measurements(jobs, ended).items()
        if sums.seconds >= MIN_LEARN_SECONDS and sums.reports >= MIN_LEARN_REPORTS
    )
    return ThroughputTable(entries, source=f"learned from progress reports ({len(entries)} measurements)")


def merged(imported: ThroughputTable | None, learned: ThroughputTable) -> ThroughputTable | None:
    """The table policies read: `imported` with `learned` merged in (see the module docstring); None when both
    are empty."""
    if imported is None:
        return learned if learned.entries else None
    if not learned.entries:
        return imported
    have = {_key(e): e.throughput for e in imported.entries}
    imported_types = set(imported.job_types)
    by_type: dict[str, list[ThroughputEntry]] = defaultdict(list)
    for entry in learned.entries:
        by_type[entry.job_type].append(entry)
    added: list[ThroughputEntry] = []
    for job_type, entries in sorted(by_type.items()):
        if job_type not in imported_types:
            added.extend(entries)
            continue
        ratios = [have[_key(e)] / e.throughput for e in entries if _key(e) in have and e.throughput > 0]
        if not ratios:
            continue
        scale = statistics.median(ratios)
        added.extend(
            ThroughputEntry(e.job_type, e.model, e.gpus, e.throughput * scale, e.consolidated)
            for e in entries
            if _key(e) not in have
        )
    if not added:
        return imported
    return ThroughputTable(
        (*imported.entries, *added),
        source=f"{imported.source or 'imported table'} + {len(added)} learned from progress reports",
        reference=imported.reference,
    )


def _key(entry: ThroughputEntry) -> Key:
    return entry.job_type, model_key(entry.model), entry.gpus, entry.consolidated


def pooled_to_json(pooled: Mapping[Key, Pooled]) -> str:
    """Pooled sums as JSON (what the control plane stores of the jobs that ended), in key order."""
    rows = [
        {
            "job_type": job_type,
            "model": model,
            "gpus": gpus,
            "consolidated": consolidated,
            "samples": sums.samples,
            "seconds": sums.seconds,
            "reports": sums.reports,
        }
        for (job_type, model, gpus, consolidated), sums in sorted(pooled.items())
    ]
    return json.dumps({"version": 1, "pooled": rows}, separators=(",", ":"))


def pooled_from_json(text: str) -> dict[Key, Pooled]:
    """What `pooled_to_json` wrote. GpufleetError if it is not that."""
    try:
        rows = json.loads(text)["pooled"]
        pooled: dict[Key, Pooled] = {}
        for row in rows:
            key = (str(row["job_type"]), str(row["model"]), int(row["gpus"]), bool(row["consolidated"]))
            sums = Pooled(float(row["samples"]), float(row["seconds"]), int(row["reports"]))
            if not (key[0] and key[1] and key[2] >= 1 and sums.reports >= 0):
                raise ValueError(f"a measurement out of range: {row}")
            if not all(math.isfinite(v) and v >= 0 for v in (sums.samples, sums.seconds)):
                raise ValueError(f"a measurement out of range: {row}")
            pooled[key] = pooled[key].plus(sums) if key in pooled else sums
    except (ValueError, TypeError, KeyError) as error:
        raise GpufleetError(
            f"the stored learned throughputs are unreadable ({error})",
            "nothing to do: the control plane learns them again from the jobs that report progress",
        ) from error
    return dict(sorted(pooled.items()))
