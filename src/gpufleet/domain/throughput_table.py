"""Measured throughput of job types on GPU models: what heterogeneity-aware policies and the simulator read.

    ThroughputEntry  one measurement: job type x GPU model x GPU count (x placement) -> steps/s
    ThroughputTable  the table, with lookups that ignore model-name case and relative speeds

Gavel (Narayanan et al., OSDI 2020) publishes such a table; the simulator loads it with
`gpufleet.sim.workloads.gavel.load_throughput_table`, and the `throughput` score and `throughput_fair` order
plugins read it. Errors are `WorkloadError`s (a bad table is bad input data), stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.domain.errors import WorkloadError
from gpufleet.domain.jobs import Job


@dataclass(frozen=True, slots=True)
class ThroughputEntry:
    """Measured throughput (steps/s) of `job_type` alone on `gpus` GPUs of `model`.

    `consolidated`: all GPUs on one server (Gavel's "consolidated" placement) or spread over servers.
    """

    job_type: str
    model: str
    gpus: int
    throughput: float
    consolidated: bool = True


def model_key(model: str) -> str:
    """How the table compares model names: stripped, upper case (`v100` = `V100`)."""
    return model.strip().upper()


@dataclass(frozen=True, slots=True)
class ThroughputTable:
    """Job type x GPU model x GPU count -> throughput. Model names match case-insensitively (`v100` = `V100`).

    A throughput of 0 is kept: it is a measurement (the job does not run there, e.g. out of memory).
    `reference` is the model that trace durations are given on (Gavel: V100), the default for relative speeds.
    """

    entries: tuple[ThroughputEntry, ...]
    source: str = ""
    reference: str | None = None
    _index: Mapping[tuple[str, str, int, bool], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[tuple[str, str, int, bool], float] = {}
        for entry in self.entries:
            what = f"throughput of {entry.job_type!r} on {entry.gpus} x {entry.model!r}"
            if not entry.job_type.strip() or not entry.model.strip():
                raise WorkloadError(f"{what}: empty job type or model", "name every job type and model")
            if entry.gpus < 1:
                raise WorkloadError(f"{what}: GPU count {entry.gpus}", "give 1 or more GPUs")
            if not (math.isfinite(entry.throughput) and entry.throughput >= 0):
                raise WorkloadError(f"{what} is {entry.throughput}", "give a finite throughput >= 0 (steps/s)")
            key = (entry.job_type, model_key(entry.model), entry.gpus, entry.consolidated)
            if key in index:
                raise WorkloadError(f"{what} is given twice", "keep one row per job type, model, GPUs, placement")
            index[key] = entry.throughput
        object.__setattr__(self, "_index", index)

    @property
    def job_types(self) -> tuple[str, ...]:
        return tuple(sorted({e.job_type for e in self.entries}))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({model_key(e.model) for e in self.entries}))

    def scale_factors(self, job_type: str) -> tuple[int, ...]:
        """GPU counts that `job_type` was measured at."""
        return tuple(sorted({e.gpus for e in self.entries if e.job_type == job_type}))

    def get(self, job_type: str, model: str, gpus: int, *, consolidated: bool = True) -> float | None:
        """Throughput, or None when not measured. On one GPU, placement makes no difference; spread over servers
        (unconsolidated) on a model measured only on one server, the one-server measurement says whether and how
        fast it runs there (Gavel's table has ResNet-50 on 8 K80s only consolidated, at 0: it does not fit)."""
        value = self._index.get((job_type, model_key(model), gpus, consolidated))
        if value is None and (gpus == 1 or not consolidated):
            value = self._index.get((job_type, model_key(model), gpus, not consolidated))
        return value

    def speed(self, job_type: str, model: str, gpus: int, *, consolidated: bool = True) -> float:
        """Throughput in steps/s; raises WorkloadError when the table has no such measurement."""
        value = self.get(job_type, model, gpus, consolidated=consolidated)
        if value is None:
            if job_type not in self.job_types:
                fix = f"use a job type the table has: {', '.join(self.job_types)}"
            else:
                fix = (
                    f"models measured: {', '.join(self.models)}; "
                    f"GPU counts for {job_type!r}: {', '.join(map(str, self.scale_factors(job_type)))}"
                )
            placement = "consolidated" if consolidated else "unconsolidated"
            raise WorkloadError(
                f"no throughput for {job_type!r} on {gpus} x {model} ({placement}) in {self.source or 'the table'}",
                fix,
            )
        return value

    def relative_speed(
        self, job_type: str, model: str, gpus: int, *, reference: str | None = None, consolidated: bool = True
    ) -> float:
        """Speed on `model` relative to `reference` (default: the table's) for the same job type, GPU count and
        placement: 2.0 = twice as fast. A job whose duration is given at reference speed runs
        `duration / relative_speed` seconds on `model`.
        """
        reference = reference or self.reference
        if reference is None:
            raise WorkloadError("no reference model to compare with", "pass reference=MODEL, e.g. V100")
        base = self.speed(job_type, reference, gpus, consolidated=consolidated)
        if base == 0:
            raise WorkloadError(
                f"{job_type!r} has throughput 0 on {gpus} x {reference}, so nothing is relative to it",
                "pick a reference model the job type runs on",
            )
        return self.speed(job_type, model, gpus, consolidated=consolidated) / base


def job_scale(job: Job) -> tuple[int, bool]:
    """(GPU count, consolidated) a job's throughput is read at: all its GPUs (`gpus` per worker x workers),
    consolidated when it has one worker (Gavel's scale factor and placement)."""
    return job.request.gpus * job.workers, job.workers == 1


def table_to_json(table: ThroughputTable) -> str:
    """The table as JSON (what the control plane stores: `gpufleet throughput import`)."""
    import json

    return json.dumps(
        {
            "source": table.source,
            "reference": table.reference,
            "entries": [[e.job_type, e.model, e.gpus, e.throughput, e.consolidated] for e in table.entries],
        },
        separators=(",", ":"),
    )


def table_from_json(text: str) -> ThroughputTable:
    """A table stored by `table_to_json`; WorkloadError if it is not one."""
    import json

    try:
        data = json.loads(text)
        entries = tuple(ThroughputEntry(str(t), str(m), int(g), float(s), bool(c)) for t, m, g, s, c in data["entries"])
        return ThroughputTable(entries, source=str(data.get("source", "")), reference=data.get("reference"))
    except (ValueError, KeyError, TypeError) as error:
        raise WorkloadError(
            f"the stored throughput table is unreadable ({error})", "import it again: gpufleet throughput import FILE"
        ) from None
