"""What running jobs tell the control plane about themselves, and the bounded history kept of it per job.

A job reports through one channel (`gpufleet.runtime` in Python, or `POST /v1/jobs/{id}/reports` with its
job token); every report has a `kind`. Each kind is one entry of `REPORT_KINDS`: the fields it carries
(name -> (type, lowest value, required)) and the function that folds one report into a `JobProgress`.
Adding a kind is adding one entry here and one function in `gpufleet.runtime`; the API, the store and
`show` need no change (docs/ARCHITECTURE.md, "Progress reports").

`JobProgress` is immutable and bounded whatever a job sends: the loss curve keeps at most `MAX_LOSS_POINTS`
points (when full, every other point of the older half is dropped, so the whole run stays drawn, coarser
where it is older), the GPU count over time keeps its last `MAX_SIZE_POINTS` changes, throughput is one
entry per size and GPU model the job ran at, and extra metrics are capped in number and name length.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpufleet.domain.errors import FieldProblem, SpecError

MAX_LOSS_POINTS = 512
MAX_SIZE_POINTS = 256
MAX_METRICS = 32
MAX_METRIC_NAME = 64
MAX_REPORTS_PER_BATCH = 1000
# A gap between two reports longer than this is not counted as time spent computing at that size (the job
# was stopped, or stalled on I/O or a checkpoint we were told about separately).
MAX_THROUGHPUT_GAP_S = 600.0


@dataclass(frozen=True, slots=True)
class SizeThroughput:
    """What a job did at one size (workers x GPUs) on one GPU model: samples over the seconds between
    consecutive reports. `model` is the GPU model it held (upper case; "" when unknown or mixed)."""

    gpus: int
    samples: float = 0.0
    seconds: float = 0.0
    reports: int = 0
    model: str = ""

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.seconds > 0 else None


@dataclass(frozen=True, slots=True)
class JobProgress:
    """The bounded history of one job's reports. Times are seconds since the epoch (the reporting job's clock,
    never later than the control plane's)."""

    reports: int = 0
    last_at: float | None = None
    step: int | None = None
    samples: float | None = None
    loss: float | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    # (samples, loss), in order of samples; bounded (see the module docstring).
    loss_curve: tuple[tuple[float, float], ...] = ()
    # (time, GPUs held) each time the size changed.
    sizes: tuple[tuple[float, int], ...] = ()
    throughput: tuple[SizeThroughput, ...] = ()  # one per size and model, by GPUs then model
    last_checkpoint_at: float | None = None
    checkpoint_duration_s: float | None = None
    checkpoints: int = 0
    # The last progress report counted for throughput: (attempt, GPUs, time, samples).
    anchor: tuple[int, int, float, float] | None = None

    def samples_per_s(self, gpus: int) -> float | None:
        """Throughput at `gpus` GPUs, over every model the job ran on at that size."""
        at_size = [entry for entry in self.throughput if entry.gpus == gpus]
        seconds = sum(entry.seconds for entry in at_size)
        return sum(entry.samples for entry in at_size) / seconds if seconds > 0 else None


@dataclass(frozen=True, slots=True)
class Report:
    """One report as received: its kind, when the job made it, and its validated fields."""

    kind: str
    at: float
    values: Mapping[str, float]
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportContext:
    """What the control plane knows of the reporting job when a batch arrives."""

    attempt: int
    gpus: int  # GPUs the job holds in this attempt
    now: float
    model: str = ""  # the GPU model it holds (upper case; "" when unknown or mixed)


Field = tuple[type, float, bool]  # (int or float, lowest accepted value, required)
Apply = Callable[[JobProgress, Report, ReportContext], JobProgress]


@dataclass(frozen=True, slots=True)
class ReportKind:
    fields: Mapping[str, Field]
    apply: Apply
    extra_metrics: bool = False  # whether unknown numeric fields are kept as metrics


def _apply_progress(progress: JobProgress, report: Report, ctx: ReportContext) -> JobProgress:
    values = report.values
    samples = values.get("samples")
    loss = values.get("loss")
    changes: dict[str, object] = {"step": int(values["step"]) if "step" in values else progress.step}
    if samples is not None:
        changes["samples"] = samples
    if loss is not None:
        changes["loss"] = loss
        at_samples = samples if samples is not None else (progress.samples or 0.0)
        changes["loss_curve"] = _bounded_curve((*progress.loss_curve, (at_samples, loss)))
    for name in ("grad_sqr", "grad_var"):
        if name in values:
            changes[name] = values[name]
    if report.metrics:
        merged = {**progress.metrics, **report.metrics}
        changes["metrics"] = dict(list(merged.items())[-MAX_METRICS:])
    if samples is not None:
        changes.update(_throughput(progress, report.at, samples, ctx))
    return dataclasses.replace(progress, **changes)  # type: ignore[arg-type]


def _throughput(progress: JobProgress, at: float, samples: float, ctx: ReportContext) -> dict[str, object]:
    """Count the samples since the previous report of the same attempt and size as done at that size."""
    anchor = progress.anchor
    out: dict[str, object] = {"anchor": (ctx.attempt, ctx.gpus, at, samples)}
    if not progress.sizes or progress.sizes[-1][1] != ctx.gpus:
        out["sizes"] = (*progress.sizes, (at, ctx.gpus))[-MAX_SIZE_POINTS:]
    if anchor is None or anchor[0] != ctx.attempt or anchor[1] != ctx.gpus:
        return out
    seconds = at - anchor[2]
    done = samples - anchor[3]
    if not 0 < seconds <= MAX_THROUGHPUT_GAP_S or done < 0:
        return out  # out of order, a long stall, or a counter that went back (restart): not a measurement
    table = {(entry.gpus, entry.model): entry for entry in progress.throughput}
    key = (ctx.gpus, ctx.model)
    entry = table.get(key, SizeThroughput(ctx.gpus, model=ctx.model))
    table[key] = dataclasses.replace(
        entry, samples=entry.samples + done, seconds=entry.seconds + seconds, reports=entry.reports + 1
    )
    out["throughput"] = tuple(table[k] for k in sorted(table))
    return out


def _bounded_curve(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    if len(points) <= MAX_LOSS_POINTS:
        return points
    half = len(points) // 2
    return (*points[:half:2], *points[half:])


def _apply_checkpoint(progress: JobProgress, report: Report, _ctx: ReportContext) -> JobProgress:
    return dataclasses.replace(
        progress,
        last_checkpoint_at=report.at,
        checkpoint_duration_s=report.values["duration_s"],
        checkpoints=progress.checkpoints + 1,
    )


REPORT_KINDS: dict[str, ReportKind] = {
    "progress": ReportKind(
        fields={
            "step": (int, 0, False),
            "samples": (float, 0, False),
            "loss": (float, -math.inf, False),
            "grad_sqr": (float, 0, False),
            "grad_var": (float, 0, False),
        },
        apply=_apply_progress,
        extra_metrics=True,
    ),
    "checkpoint": ReportKind(fields={"duration_s": (float, 0, True)}, apply=_apply_checkpoint),
}


def parse_report(raw: Mapping[str, object], where: str, now: float) -> Report:
    """A report from its JSON form `{"kind": …, "at": …, <fields>}`. SpecError names every bad field."""
    problems: list[FieldProblem] = []
    kind_name = raw.get("kind")
    kind = REPORT_KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        known = ", ".join(sorted(REPORT_KINDS))
        raise SpecError("report", (FieldProblem(f"{where}.kind", f"is {kind_name!r}", f"use one of: {known}"),))
    at = raw.get("at", now)
    if not _is_number(at) or not math.isfinite(float(at)) or float(at) <= 0:  # type: ignore[arg-type]
        problems.append(FieldProblem(f"{where}.at", f"is {at!r}", "send the time as seconds since the epoch"))
        at = now
    values: dict[str, float] = {}
    metrics: dict[str, float] = {}
    for name, value in raw.items():
        if name in ("kind", "at"):
            continue
        spec = kind.fields.get(name)
        if spec is None and not kind.extra_metrics:
            known = ", ".join(sorted(kind.fields)) or "none"
            problems.append(FieldProblem(f"{where}.{name}", "is not a field of this kind", f"use: {known}"))
            continue
        if not _is_number(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
            problems.append(FieldProblem(f"{where}.{name}", f"is {value!r}", "send a finite number"))
            continue
        number = float(value)  # type: ignore[arg-type]
        if spec is None:
            if len(name) > MAX_METRIC_NAME or not name.isidentifier():
                problems.append(
                    FieldProblem(f"{where}.{name}", "is not a metric name", "use a short identifier, e.g. lr")
                )
            else:
                metrics[name] = number
            continue
        typ, lowest, _required = spec
        if typ is int and not float(number).is_integer():
            problems.append(FieldProblem(f"{where}.{name}", f"is {value!r}", "send a whole number"))
        elif number < lowest:
            problems.append(FieldProblem(f"{where}.{name}", f"is {value!r}", f"send a value >= {lowest:g}"))
        else:
            values[name] = number
    for name, (_typ, _lowest, required) in kind.fields.items():
        if required and name not in raw:
            problems.append(FieldProblem(f"{where}.{name}", "is missing", f"send {name} with every {kind_name} report"))
    if len(metrics) > MAX_METRICS:
        problems.append(FieldProblem(where, f"has {len(metrics)} metrics", f"send at most {MAX_METRICS}"))
    if problems:
        raise SpecError("report", tuple(problems))
    return Report(kind_name, min(float(at), now), values, metrics)  # type: ignore[arg-type]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fold(progress: JobProgress, reports: list[Report], ctx: ReportContext) -> JobProgress:
    """The history after `reports` (in the order the job made them)."""
    for report in sorted(reports, key=lambda r: r.at):
        progress = REPORT_KINDS[report.kind].apply(progress, report, ctx)
    return dataclasses.replace(
        progress,
        reports=progress.reports + len(reports),
        last_at=max([progress.last_at or 0.0, *(r.at for r in reports)]) or None,
    )


def with_size(progress: JobProgress, at: float, gpus: int) -> JobProgress:
    """The history with the job's GPU count changed to `gpus` at `at` (a resize), as reports at that size would
    record it."""
    if progress.sizes and progress.sizes[-1][1] == gpus:
        return progress
    return dataclasses.replace(progress, sizes=(*progress.sizes, (at, gpus))[-MAX_SIZE_POINTS:])


def progress_to_dict(progress: JobProgress) -> dict[str, object]:
    """The JSON form the store keeps and the API shows (lists for tuples; nothing but numbers and names)."""
    out = dataclasses.asdict(progress)
    out["metrics"] = dict(progress.metrics)
    out["loss_curve"] = [list(point) for point in progress.loss_curve]
    out["sizes"] = [list(point) for point in progress.sizes]
    out["throughput"] = [
        {"gpus": e.gpus, "model": e.model, "samples": e.samples, "seconds": e.seconds, "reports": e.reports}
        for e in progress.throughput
    ]
    out["anchor"] = list(progress.anchor) if progress.anchor is not None else None
    return out


def progress_from_dict(data: Mapping[str, object]) -> JobProgress:
    """The inverse of `progress_to_dict`; fields it does not know (from a newer gpufleet) are ignored."""
    known = {f.name for f in dataclasses.fields(JobProgress)}
    values: dict[str, object] = {k: v for k, v in data.items() if k in known}
    values["metrics"] = dict(data.get("metrics") or {})  # type: ignore[call-overload]
    values["loss_curve"] = tuple((float(s), float(v)) for s, v in data.get("loss_curve") or ())  # type: ignore[attr-defined]
    values["sizes"] = tuple((float(at), int(g)) for at, g in data.get("sizes") or ())  # type: ignore[attr-defined]
    values["throughput"] = tuple(
        SizeThroughput(
            int(e["gpus"]), float(e["samples"]), float(e["seconds"]), int(e["reports"]), str(e.get("model", ""))
        )
        for e in data.get("throughput") or ()  # type: ignore[attr-defined]
    )
    anchor = data.get("anchor")
    values["anchor"] = (
        (int(anchor[0]), int(anchor[1]), float(anchor[2]), float(anchor[3])) if anchor else None  # type: ignore[index]
    )
    return JobProgress(**values)  # type: ignore[arg-type]
