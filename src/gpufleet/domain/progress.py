"""What running jobs tell the control plane about themselves, and the bounded history kept of it per job.

A job reports through one channel (`gpufleet.runtime` in Python, or `POST /v1/jobs/{id}/reports` with its
job token); every report has a `kind`. Each kind is one entry of `REPORT_KINDS`: the fields it carries
(name -> (type, lowest value, required)) and the function that folds one report into a `JobProgress`.
Adding a kind is adding one entry here and one function in `gpufleet.runtime`; the API, the store and
`show` need no change (docs/ARCHITECTURE.md, "Progress reports").

`JobProgress` is immutable and bounded whatever a job sends: the loss curve keeps at most `MAX_LOSS_POINTS`
points (when full, every other point of the older half is dropped, so the whole run stays drawn, coarser
where it is older), the GPU count over time keeps its last `MAX_SIZE_POINTS` changes, throughput is one
entry per size, GPU model, node count and batch the job ran at (at most `MAX_THROUGHPUT_ENTRIES`, the least
measured dropped first), and extra metrics are capped in number and name length.

A progress report may also say how the job trains now: its total `batch` (samples per step, all workers
together) and the range it may choose it from (`min_batch`, `max_batch`: an adaptive job's), and where it runs
(`gpus`, `nodes` spanned). With `step` and `samples` counted between two reports, each throughput entry then
holds steps as well, so the control plane knows the mean step time at a mean batch for each placement: what
`control/goodput.py` fits its batch-aware throughput model to. All optional: a report without them is read as
before.
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
MAX_THROUGHPUT_ENTRIES = 128
# Steps counted at a mean batch are kept per quarter octave of that batch (2 ** (k / 4)): enough to tell the
# step time's dependence on the batch, few enough to stay bounded.
BATCH_BUCKETS_PER_OCTAVE = 4
# A gap between two reports longer than this is not counted as time spent computing at that size (the job
# was stopped, or stalled on I/O or a checkpoint we were told about separately).
MAX_THROUGHPUT_GAP_S = 600.0


@dataclass(frozen=True, slots=True)
class SizeThroughput:
    """What a job did at one size (workers x GPUs) on one GPU model: samples over the seconds between
    consecutive reports. `model` is the GPU model it held (upper case; "" when unknown or mixed). When the
    reports said where it ran and counted its steps: `nodes` it spanned and `steps` done (0: not reported),
    `batch` the quarter octave of its mean batch (samples / steps) the entry collects."""

    gpus: int
    samples: float = 0.0
    seconds: float = 0.0
    reports: int = 0
    model: str = ""
    nodes: int = 0
    steps: float = 0.0
    batch: float = 0.0

    @property
    def step_s(self) -> float | None:
        """Mean seconds per step (None: steps not reported)."""
        return self.seconds / self.steps if self.steps > 0 and self.seconds > 0 else None

    @property
    def mean_batch(self) -> float | None:
        """Mean total batch (samples per step; None: steps not reported)."""
        return self.samples / self.steps if self.steps > 0 else None

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
    batch: float | None = None  # total batch now (samples per step)
    min_batch: float | None = None  # the range the job may choose its batch from (an adaptive job's)
    max_batch: float | None = None
    max_local_batch: float | None = None  # the largest batch per GPU it may train at (its memory's limit)
    nodes: int | None = None  # nodes it spans now
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
    anchor_step: int | None = None  # its step, when it said

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
    # Problems between fields of one report (each field already valid on its own).
    check: Callable[[Mapping[str, float], str], list[FieldProblem]] | None = None


def _check_progress(values: Mapping[str, float], where: str) -> list[FieldProblem]:
    """A placement spans at most one node per GPU; a batch lies in the range the job says it chooses from."""
    problems = []
    gpus, nodes = values.get("gpus"), values.get("nodes")
    if gpus is not None and nodes is not None and nodes > gpus:
        problems.append(
            FieldProblem(
                f"{where}.nodes",
                f"is {nodes:g} with gpus {gpus:g}",
                "send the nodes the job's GPUs are on (at most one node per GPU)",
            )
        )
    low, high, batch = values.get("min_batch"), values.get("max_batch"), values.get("batch")
    if low is not None and high is not None and low > high:
        problems.append(
            FieldProblem(f"{where}.min_batch", f"is {low:g}, above max_batch {high:g}", "send min_batch <= max_batch")
        )
    elif batch is not None and ((low is not None and batch < low) or (high is not None and batch > high)):
        problems.append(
            FieldProblem(
                f"{where}.batch",
                f"is {batch:g}, outside min_batch..max_batch ({_or_dash(low)}..{_or_dash(high)})",
                "send the total batch the job trains at now, within the range it may choose from",
            )
        )
    return problems


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


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
    for name in ("grad_sqr", "grad_var", "batch", "min_batch", "max_batch", "max_local_batch"):
        if name in values:
            changes[name] = values[name]
    if "nodes" in values:
        changes["nodes"] = int(values["nodes"])
    if report.metrics:
        merged = {**progress.metrics, **report.metrics}
        changes["metrics"] = dict(list(merged.items())[-MAX_METRICS:])
    if samples is not None:
        step = int(values["step"]) if "step" in values else None
        nodes = int(values["nodes"]) if "nodes" in values else 0
        changes.update(_throughput(progress, report.at, samples, ctx, step, nodes))
    return dataclasses.replace(progress, **changes)  # type: ignore[arg-type]


def _throughput(
    progress: JobProgress, at: float, samples: float, ctx: ReportContext, step: int | None = None, nodes: int = 0
) -> dict[str, object]:
    """Count the samples since the previous report of the same attempt and size as done at that size (and,
    when both reports counted steps and this one says where it runs, at that placement and mean batch)."""
    anchor = progress.anchor
    out: dict[str, object] = {"anchor": (ctx.attempt, ctx.gpus, at, samples), "anchor_step": step}
    if not progress.sizes or progress.sizes[-1][1] != ctx.gpus:
        out["sizes"] = (*progress.sizes, (at, ctx.gpus))[-MAX_SIZE_POINTS:]
    if anchor is None or anchor[0] != ctx.attempt or anchor[1] != ctx.gpus:
        return out
    seconds = at - anchor[2]
    done = samples - anchor[3]
    if not 0 < seconds <= MAX_THROUGHPUT_GAP_S or done < 0:
        return out  # out of order, a long stall, or a counter that went back (restart): not a measurement
    steps = 0.0
    if step is not None and progress.anchor_step is not None and nodes > 0 and step > progress.anchor_step and done > 0:
        steps = float(step - progress.anchor_step)
    else:
        nodes = 0
    bucket = _bucket(done / steps) if steps else 0.0
    table = {(e.gpus, e.model, e.nodes, e.batch): e for e in progress.throughput}
    key = (ctx.gpus, ctx.model, nodes, bucket)
    entry = table.get(key, SizeThroughput(ctx.gpus, model=ctx.model, nodes=nodes, batch=bucket))
    table[key] = dataclasses.replace(
        entry,
        samples=entry.samples + done,
        seconds=entry.seconds + seconds,
        reports=entry.reports + 1,
        steps=entry.steps + steps,
    )
    if len(table) > MAX_THROUGHPUT_ENTRIES:  # the least measured goes
        del table[min(table, key=lambda k: (table[k].seconds, k))]
    out["throughput"] = tuple(table[k] for k in sorted(table))
    return out


def _bucket(batch: float) -> float:
    """The quarter octave a mean batch is counted in (its representative batch)."""
    k = round(math.log2(max(batch, 1e-9)) * BATCH_BUCKETS_PER_OCTAVE)
    return float(2.0 ** (k / BATCH_BUCKETS_PER_OCTAVE))


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
            "batch": (float, 1, False),
            "min_batch": (float, 1, False),
            "max_batch": (float, 1, False),
            "max_local_batch": (float, 1, False),
            "gpus": (int, 1, False),
            "nodes": (int, 1, False),
        },
        apply=_apply_progress,
        extra_metrics=True,
        check=_check_progress,
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
    if kind.check is not None and not problems:
        problems.extend(kind.check(values, where))
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
        | ({"nodes": e.nodes, "steps": e.steps, "batch": e.batch} if e.steps else {})
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
            int(e["gpus"]),
            float(e["samples"]),
            float(e["seconds"]),
            int(e["reports"]),
            str(e.get("model", "")),
            int(e.get("nodes", 0)),
            float(e.get("steps", 0.0)),
            float(e.get("batch", 0.0)),
        )
        for e in data.get("throughput") or ()  # type: ignore[attr-defined]
    )
    anchor = data.get("anchor")
    values["anchor"] = (
        (int(anchor[0]), int(anchor[1]), float(anchor[2]), float(anchor[3])) if anchor else None  # type: ignore[index]
    )
    return JobProgress(**values)  # type: ignore[arg-type]
