"""Pollux's six applications as measured (OSDI'21 artifact, `pollux-osdi21/app-traces/`): how fast each runs
at a number of GPUs and a batch size, and how much a sample is worth at that batch size.

- **Throughput.** `placements.csv` gives seconds per step per placement (digits: GPUs per node) and per-GPU
  batch; `scalability.csv` the same for larger allocations by (nodes, GPUs). A job of G GPUs on nodes of 4 is
  placed as our gangs are (`split_gang`: 6 -> two nodes of 3, "33"); its step time at per-GPU batch b is
  interpolated linearly between measured batches (sizes with no measured placement: between the nearest
  measured sizes). A running elastic job is charged for the placement it holds (`step_time_at`: its GPUs
  per node, read as the published simulator reads them).
- **Statistical efficiency.** Per epoch, the gradient's squared norm and variance measured at each validated
  total batch (in B0's units); at total batch B (scale s = B / B0) one step is worth
  `gain = (var + sqr) / (var / s + sqr)` B0-steps (between 1 and s), with the statistics read at B itself,
  interpolated between the validated batches around it, as the published simulator reads them: large batches
  pay off early in training, when the gradient is noisy, less later.
- **Gradient accumulation.** Beyond the largest per-GPU batch measured (yolov3: 8), a step is k passes of
  local / k, the gradients synchronised on the last pass only.
- **Work.** A job ends after its application's epochs (the epochs every validated batch ran; bert 2, cifar10
  100, ncf 10, imagenet 90, deepspeech2 80, yolov3 50, as the published simulator did, with no target metric);
  an epoch ends at the least `progress` (B0-steps) any validated batch needed for it.

So `seconds(G, B)` is the run time of a whole job at a fixed size and batch (what Tiresias with TunedJobs
runs), and `goodput(G, B, progress)` its rate of progress at a point of training (what an elastic policy
weighs). Facts and measurements are Pollux's; the code is ours.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpufleet.domain.jobs import Job
from gpufleet.sim.workload import Workload, WorkloadError
from gpufleet.sim.workloads._common import RequestCache, split_gang
from gpufleet.sim.workloads._csv import CsvTable

APP_TRACES = "app-traces"
# The published simulator capped yolov3's per-GPU batch at 8 (memory).
MAX_LOCAL_BATCH: Mapping[str, int] = {"yolov3": 8}


@dataclass(frozen=True, slots=True)
class Epochs:
    """Where each epoch ends (B0-steps: the least any validated batch needed) and the gradient statistics
    measured over it, at B0 (`grad_sqr`, `grad_var`) and at every validated batch (`by_batch`: batch ->
    (squared norms, variances) per epoch, in B0's units as Pollux's gradient noise scale keeps them)."""

    ends: tuple[float, ...]
    grad_sqr: tuple[float, ...]
    grad_var: tuple[float, ...]
    by_batch: Mapping[float, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)

    def stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(squared norm, variance) of the gradient in `epoch` at total batch `batch`: interpolated linearly
        between the validated batches around it (the nearest one outside their range), as the published
        simulator reads them."""
        if not self.by_batch:
            return self.grad_sqr[epoch], self.grad_var[epoch]
        batches = sorted(self.by_batch)
        i = bisect.bisect_left(batches, batch)
        if (i < len(batches) and batches[i] == batch) or i == 0 or i >= len(batches):
            sqrs, vars_ = self.by_batch[batches[min(i, len(batches) - 1)]]
            return sqrs[epoch], vars_[epoch]
        lo, hi = batches[i - 1], batches[i]
        w = (batch - lo) / (hi - lo)
        (s0, v0), (s1, v1) = self.by_batch[lo], self.by_batch[hi]
        return s0[epoch] + w * (s1[epoch] - s0[epoch]), v0[epoch] + w * (v1[epoch] - v0[epoch])

    def index(self, progress: float) -> int:
        """The epoch `progress` is in (the last one once past the end)."""
        return min(bisect.bisect_right(self.ends, progress), len(self.ends) - 1)


@dataclass(frozen=True, slots=True)
class Application:
    name: str
    base_batch: int  # B0: the smallest validated total batch
    epochs: Epochs
    # placement string -> (per-GPU batches, step seconds), batches ascending
    steps: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]]
    max_local_batch: int | None = None
    # placement string -> seconds of each step spent synchronising gradients, at the batches of `steps`
    syncs: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    max_batch: float = 0.0  # the largest validated total batch (0: B0): what an adaptive job goes up to
    _best: dict[tuple[tuple[int, ...], int], tuple[float, float]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def total_progress(self) -> float:
        return self.epochs.ends[-1]

    def step_time(self, gpus: int, batch: float, gpus_per_node: int = 4) -> float:
        """Seconds per step of total batch `batch` on `gpus` GPUs placed as our gangs are."""
        workers, per_node = split_gang(gpus, gpus_per_node)
        key = str(per_node) * workers if workers <= 4 else f"n{workers}r{gpus}"
        if key not in self.steps:
            raise WorkloadError(
                f"application {self.name!r} has no step time measured for {gpus} GPUs ({workers} nodes)",
                "run it at a size its placements.csv or scalability.csv covers",
            )
        return self._step(key, batch / gpus)

    def step_time_at(self, layout: tuple[int, ...], batch: float) -> float:
        """Seconds per step of total batch `batch` with `layout[i]` GPUs on the i-th node it runs on: the
        measured placement when there is one (up to four nodes, read as the published simulator reads them:
        the node order's smallest rotation; beyond, by nodes and GPUs), else `step_time_any` at its GPU
        count (placed as our gangs are)."""
        counts = tuple(c for c in layout if c > 0)
        gpus = sum(counts)
        if len(counts) <= 4 and all(c <= 9 for c in counts):
            key = "".join(map(str, min(counts[i:] + counts[:i] for i in range(len(counts)))))
        else:
            key = f"n{len(counts)}r{gpus}"
        if key in self.steps:
            return self._step(key, batch / gpus)
        return self.step_time_any(gpus, batch)

    def _step(self, key: str, local: float) -> float:
        """Seconds per step at measured placement `key` and per-GPU batch `local`."""
        batches, times = self.steps[key]
        cap = min(self.max_local_batch or batches[-1], batches[-1])
        if local > cap:
            # Gradient accumulation: k passes of local / k each, gradients synchronised on the last one only.
            passes = math.ceil(local / cap - 1e-9)
            micro = local / passes
            step = _interpolate(batches, times, micro)
            sync = _interpolate(batches, self.syncs[key], micro) if key in self.syncs else 0.0
            return (passes - 1) * (step - sync) + step
        return _interpolate(batches, times, max(local, batches[0]))

    def gain(self, batch: float, progress: float) -> float:
        """How many B0-steps one step of total batch `batch` is worth at `progress`."""
        scale = max(1.0, batch / self.base_batch)
        sqr, var = self.epochs.stats(batch, self.epochs.index(progress))
        if sqr <= 0:
            return scale
        return (var + sqr) / (var / scale + sqr)

    def step_time_any(self, gpus: int, batch: float, gpus_per_node: int = 4) -> float:
        """`step_time` at any size: between sizes without a measured placement (5, 7, 10, ... GPUs), linear in
        the GPU count between the nearest measured sizes at the same per-GPU batch (Pollux's simulator fitted
        those from its performance model instead)."""
        try:
            return self.step_time(gpus, batch, gpus_per_node)
        except WorkloadError:
            pass
        local = batch / gpus
        lower = next((g for g in range(gpus - 1, 0, -1) if self._measured(g, gpus_per_node)), None)
        upper = next((g for g in range(gpus + 1, 4 * gpus + 1) if self._measured(g, gpus_per_node)), None)
        if lower is None or upper is None:
            raise WorkloadError(
                f"application {self.name!r} has no step time near {gpus} GPUs", "run it at a measured size"
            )
        low, high = self.step_time(lower, local * lower), self.step_time(upper, local * upper)
        return low + (high - low) * (gpus - lower) / (upper - lower)

    def _measured(self, gpus: int, gpus_per_node: int) -> bool:
        workers, per_node = split_gang(gpus, gpus_per_node)
        return (str(per_node) * workers if workers <= 4 else f"n{workers}r{gpus}") in self.steps

    def progress_after(
        self, gpus: int, batch: float, progress: float, seconds: float, layout: tuple[int, ...] = ()
    ) -> float:
        """Progress (B0-steps) after computing `seconds` at a fixed size and batch from `progress` (placed as
        `layout` when given, else as our gangs are)."""
        step = self.step_time_at(layout, batch) if layout else self.step_time_any(gpus, batch)
        left = seconds
        for i, end in enumerate(self.epochs.ends):
            if end <= progress:
                continue
            rate = self.gain(batch, end - 1e-9 if i else 0.0) / step  # B0-steps per second in this epoch
            need = (end - progress) / rate
            if need >= left:
                return progress + left * rate
            left -= need
            progress = end
        return self.total_progress

    @property
    def largest_local(self) -> float:
        """The largest per-GPU batch an adaptive job chooses (`best`): the largest measured on one GPU, within
        `max_local_batch`."""
        one = self.steps.get("1")
        locals_ = one[0] if one is not None else (float(self.base_batch),)
        if self.max_local_batch is not None:
            locals_ = tuple(b for b in locals_ if b <= self.max_local_batch) or locals_[:1]
        return float(max(locals_))

    def best(self, layout: tuple[int, ...], epoch: int) -> tuple[float, float]:
        """(total batch, B0-steps per second) of an adaptive job placed as `layout` (GPUs per node) in `epoch`:
        the batch between B0 and the largest validated one, at a per-GPU batch measured on one GPU (or B0 or the
        largest itself), that makes the most progress per second there, as Pollux's jobs choose theirs."""
        hit = self._best.get((layout, epoch))
        gpus = sum(layout)
        if hit is not None:
            return hit
        low, high = float(self.base_batch), float(max(self.max_batch, self.base_batch))
        one = self.steps.get("1")
        locals_ = one[0] if one is not None else ()
        if self.max_local_batch is not None:
            locals_ = tuple(b for b in locals_ if b <= self.max_local_batch) or locals_[:1]
        candidates = sorted({b * gpus for b in locals_ if low <= b * gpus <= high} | {low, high})
        best = (low, 0.0)
        for batch in candidates:
            sqr, var = self.epochs.stats(batch, epoch)
            scale = batch / self.base_batch
            gain = scale if sqr <= 0 else (var + sqr) / (var / scale + sqr)
            rate = gain / self.step_time_at(layout, batch)
            if rate > best[1]:
                best = (batch, rate)
        self._best[(layout, epoch)] = best
        return best

    def adaptive_seconds(self, layout: tuple[int, ...], progress: float) -> float:
        """Run time from `progress` to the end placed as `layout` with the batch chosen per epoch (`best`)."""
        total, start = 0.0, progress
        for i, end in enumerate(self.epochs.ends):
            if end > start:
                total += (end - start) / self.best(layout, i)[1]
                start = end
        return total

    def adaptive_progress_after(self, layout: tuple[int, ...], progress: float, seconds: float) -> float:
        """Progress after computing `seconds` placed as `layout` from `progress`, batch chosen per epoch."""
        left = seconds
        for i, end in enumerate(self.epochs.ends):
            if end <= progress:
                continue
            rate = self.best(layout, i)[1]
            need = (end - progress) / rate
            if need >= left:
                return progress + left * rate
            left -= need
            progress = end
        return self.total_progress

    def goodput(self, gpus: int, batch: float, progress: float) -> float:
        """B0-steps per second at this size, batch and point of training."""
        return self.gain(batch, progress) / self.step_time(gpus, batch)

    def seconds(self, gpus: int, batch: float, progress: float = 0.0, layout: tuple[int, ...] = ()) -> float:
        """Run time from `progress` to the end at a fixed size and batch (placed as `layout` when given)."""
        step = self.step_time_at(layout, batch) if layout else self.step_time_any(gpus, batch)
        total, start = 0.0, progress
        for i, end in enumerate(self.epochs.ends):
            if end <= start:
                continue
            total += (end - start) * step / self.gain(batch, end - 1e-9 if i else 0.0)
            start = end
        return total


def _interpolate(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    if i == 0:
        return ys[0]
    if i >= len(xs):
        return ys[-1]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def load_application(folder: Path, name: str) -> Application:
    """One application's measurements from `folder` (= app-traces/<name>)."""
    if not folder.is_dir():
        raise WorkloadError("does not exist", f"put Pollux's {APP_TRACES}/{name}/ there", path=folder)
    validations = sorted(
        (int(f.stem.split("-", 1)[1]), f) for f in folder.glob("validation-*.csv") if f.stem.split("-", 1)[1].isdigit()
    )
    if not validations:
        raise WorkloadError("has no validation-<batch>.csv", "give the application's gradient statistics", path=folder)
    base_batch = validations[0][0]
    runs: dict[float, tuple[list[float], list[float], list[float]]] = {}
    for batch, file in validations:
        ends, sqrs, vars_ = runs.setdefault(float(batch), ([], [], []))
        for row in CsvTable(file, "Pollux validation CSV", ("progress", "grad_sqr", "grad_var")):
            ends.append(row.number("progress", positive=True))
            sqrs.append(row.number("grad_sqr", minimum=0))
            vars_.append(row.number("grad_var", minimum=0))
        if not ends or any(b <= a for a, b in itertools.pairwise(ends)):
            raise WorkloadError("epochs' progress is empty or not increasing", "give one row per epoch", path=file)
    count = min(len(run[0]) for run in runs.values())  # epochs every validated batch ran
    ends = [min(run[0][i] for run in runs.values()) for i in range(count)]
    by_batch = {batch: (tuple(run[1][:count]), tuple(run[2][:count])) for batch, run in runs.items()}
    sqrs, vars_ = list(by_batch[float(base_batch)][0]), list(by_batch[float(base_batch)][1])
    table: dict[str, dict[float, float]] = {}
    sync: dict[str, dict[float, float]] = {}
    for row in CsvTable(
        folder / "placements.csv", "Pollux placements CSV", ("placement", "local_bsz", "step_time", "sync_time")
    ):
        local = row.number("local_bsz", positive=True)
        table.setdefault(row.text("placement"), {})[local] = row.number("step_time", positive=True)
        sync.setdefault(row.text("placement"), {})[local] = row.number("sync_time", minimum=0)
    scalability = CsvTable(
        folder / "scalability.csv",
        "Pollux scalability CSV",
        ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"),
    )
    for row in scalability:
        key = f"n{row.integer('num_nodes', minimum=1)}r{row.integer('num_replicas', minimum=1)}"
        local = row.number("local_bsz", positive=True)
        table.setdefault(key, {})[local] = row.number("step_time", positive=True)
        sync.setdefault(key, {})[local] = row.number("sync_time", minimum=0)
    steps = {key: (tuple(sorted(points)), tuple(points[b] for b in sorted(points))) for key, points in table.items()}
    syncs = {key: tuple(sync[key][b] for b in sorted(points)) for key, points in table.items()}
    return Application(
        name,
        base_batch,
        Epochs(tuple(ends), tuple(sqrs), tuple(vars_), by_batch),
        steps,
        MAX_LOCAL_BATCH.get(name),
        syncs=syncs,
        max_batch=float(validations[-1][0]),
    )


def load_applications(pollux_folder: Path, names: tuple[str, ...]) -> dict[str, Application]:
    root = Path(pollux_folder) / APP_TRACES
    if not root.is_dir():
        raise WorkloadError(
            "has no app-traces folder (Pollux's per-application measurements)",
            "put the petuum/adaptdl osdi21-artifact simulator/traces/<app>/ folders under app-traces/",
            path=pollux_folder,
        )
    return {name: load_application(root / name, name) for name in names}


def measured_durations(
    workload_file: Path, apps: Mapping[str, Application], gpus_per_node: int = 4
) -> dict[str, float]:
    """Each job's run time at its workload's fixed size (`num_replicas`) and total batch (`batch_size`), from
    its application's measurements: what a non-adaptive scheduler runs (Pollux's TunedJobs)."""
    table = CsvTable(workload_file, "Pollux workload CSV", ("name", "application", "num_replicas", "batch_size"))
    out: dict[str, float] = {}
    for row in table:
        app = apps.get(row.text("application"))
        if app is None:
            known = ", ".join(sorted(apps))
            raise row.error("application", f"is {row.text('application')!r}", f"use one of {known}")
        gpus = row.integer("num_replicas", minimum=1)
        batch = row.number("batch_size", positive=True)
        try:
            out[row.text("name")] = app.seconds(gpus, batch)
        except WorkloadError as error:
            raise row.error("num_replicas", error.message, error.fix) from None
    return out


ADAPTIVE_NOTE = "batch chosen per epoch for the most progress per second, as Pollux's adaptive jobs"


class PolluxWork:
    """Pollux's applications as the simulated backend's `WorkModel`: a job's work is its application's
    progress in B0-steps. At g GPUs an adaptive job (`adaptive`, as Pollux's jobs are) trains in each epoch at
    the batch that makes the most progress per second there (`Application.best`); otherwise it keeps its
    per-GPU batch (the workload's `batch_size / num_replicas`, the total batch g times it). It reports its
    throughput and its gradient statistics at its current batch (the variance measured at B0 scaled by
    B0 / batch), as a training job computing them would."""

    def __init__(self, apps: Mapping[str, Application], local_batch: Mapping[str, float], adaptive: bool) -> None:
        self.apps = apps
        self.local_batch = local_batch
        self.adaptive = adaptive

    def covers(self, job: Job) -> bool:
        return job.id in self.local_batch and job.job_type in self.apps

    def total(self, job: Job) -> float:
        return self.apps[job.job_type].total_progress

    def _batch(self, job: Job, layout: tuple[int, ...], done: float) -> float:
        if self.adaptive:
            app = self.apps[job.job_type]
            return app.best(layout, app.epochs.index(done))[0]
        return self.local_batch[job.id] * sum(layout)

    def seconds(self, job: Job, layout: tuple[int, ...], done: float) -> float:
        app = self.apps[job.job_type]
        if self.adaptive:
            return app.adaptive_seconds(layout, done)
        return app.seconds(sum(layout), self._batch(job, layout, done), done, layout)

    def done_after(self, job: Job, layout: tuple[int, ...], done: float, seconds: float) -> float:
        app = self.apps[job.job_type]
        if self.adaptive:
            return app.adaptive_progress_after(layout, done, seconds)
        return app.progress_after(sum(layout), self._batch(job, layout, done), done, seconds, layout)

    def samples_per_s(self, job: Job, layout: tuple[int, ...], done: float) -> float:
        batch = self._batch(job, layout, done)
        return batch / self.apps[job.job_type].step_time_at(layout, batch)

    def gradient(self, job: Job, layout: tuple[int, ...], done: float) -> tuple[float, float]:
        app = self.apps[job.job_type]
        batch = self._batch(job, layout, done)
        sqr, var = app.epochs.stats(batch, app.epochs.index(done))
        return sqr, var / max(1.0, batch / app.base_batch)

    def counts(self, job: Job, layout: tuple[int, ...], start: float, end: float) -> tuple[float, float]:
        """(samples, steps) from progress `start` to `end` at `layout`: in each epoch, its progress over what
        one step is worth there (B0-steps) is its steps, each of the epoch's batch."""
        app = self.apps[job.job_type]
        samples = steps = 0.0
        low = start
        for i, epoch_end in enumerate(app.epochs.ends):
            if epoch_end <= low:
                continue
            high = min(end, epoch_end)
            if high <= low:
                break
            batch = self._batch(job, layout, low)
            n = (high - low) / app.gain(batch, epoch_end - 1e-9 if i else 0.0)
            steps += n
            samples += n * batch
            low = high
        return samples, steps

    def batch(self, job: Job, layout: tuple[int, ...], done: float) -> tuple[float, float, float, float]:
        app = self.apps[job.job_type]
        now = self._batch(job, layout, done)
        if not self.adaptive:
            return now, now, now, now / max(1, sum(layout))
        return now, float(app.base_batch), float(max(app.max_batch, app.base_batch)), app.largest_local


def elastic_workload(
    workload: Workload, apps: Mapping[str, Application], workload_file: Path, max_gpus: int, adaptive: bool = True
) -> Workload:
    """The Pollux workload with every job elastic, as Pollux runs them: workers of one GPU, from 1 up to
    `max_gpus` (at most the cluster), each at its per-GPU batch (`batch_size / num_replicas`), its work and
    rate from its application (`PolluxWork`). Durations stay the fixed-size run times (what metrics compare
    with)."""
    table = CsvTable(workload_file, "Pollux workload CSV", ("name", "num_replicas", "batch_size"))
    local = {
        row.text("name"): row.number("batch_size", positive=True) / row.integer("num_replicas", minimum=1)
        for row in table
    }
    cluster = sum(len(node.gpus) for node in workload.nodes)
    most = max(1, min(max_gpus, cluster))
    single = RequestCache()
    jobs = tuple(
        replace(
            tj,
            job=replace(tj.job, request=single.get(gpus=1), workers=most, min_workers=1 if most > 1 else None),
        )
        for tj in workload.jobs
    )
    note = (
        f"Elastic: each job runs 1..{most} one-GPU workers, resized by the policy; its rate at each size and point "
        "of training from its application ("
        + (ADAPTIVE_NOTE if adaptive else "per-GPU batch kept")
        + ", statistical efficiency per epoch), 30 s per resize."
    )
    missing = sorted(tj.job.id for tj in workload.jobs if tj.job.id not in local)
    if missing:
        raise WorkloadError(
            f"jobs {', '.join(missing[:3])} have no batch_size", "give every job one", path=workload_file
        )
    return replace(
        workload,
        name=f"{workload.name}-elastic",
        jobs=jobs,
        assumptions=(*workload.assumptions, note),
        work=PolluxWork(apps, local, adaptive),
    )
