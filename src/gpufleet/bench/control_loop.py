"""`gpufleet bench loop`: the live control loop in a steady state, not a one-shot fill.

What runs is what `gpufleet up` runs: the real `Reconciler` with the `default` profile (or another) on a
`SqlStore` over a real SQLite file (WAL, as the control plane opens it). Only the executor is not real: an
in-process fake backend (the simulator's `SimulatedBackend`: a job "runs" for its drawn duration, no
process is started) on a simulated clock, so the benchmark measures the loop and the store, not
subprocesses. Jobs arrive through `submit_many` (as the API's group commit writes them), between steps.

The fleet and the job mix are `gpufleet bench scheduler`'s (H100/A100/V100/T4 nodes of 8 GPUs in two NVLink
groups, 8 team queues with quotas in one cohort; fractional, 1-8 GPU and gang jobs, priorities 0-2, some
bound to GPU models). First the fleet is filled and `pending` jobs are left waiting (not measured). Then
every step is one second of simulated time: `rate` jobs arrive (default: one per 5 nodes, 1,000 at 5,000
nodes) and, on average, as many finish: a job's duration is drawn when it first starts, 1 s plus an
exponential whose mean is the number of jobs running then divided by the rate (a few seconds), so the fleet
stays full and the backlog stays near `pending`.
Higher-priority arrivals preempt, teams over their quota are reclaimed from. With `array_size`, the jobs come
as job arrays of that many tasks (each array's tasks ask what its first job of the mix asks, as one command
over many indexes does), so that the loop's time with 10,000 pending array tasks can be set beside its time with
10,000 plain jobs.

Reported, over the measured steps (wall-clock, this machine): `decisions_per_s` (placements and preemptions the
loop made, per second of loop time; `decisions_per_cpu_s`: per second of the process's CPU time in the steps,
every thread's: the store's checkpoint thread too), `cycle_p50_s`/`cycle_p99_s` (one `Reconciler.step()`: observe,
intake, decide, write, launch), the store's write time per step (`store_write_*`, inside the step), the core's
share, and `realtime_factor` (simulated seconds per wall second: >= 1 means the loop keeps up with that arrival
and departure rate in real time). `cycle_cpu_*` is the process's CPU time per step: on a machine shared with other
work it says what the step costs when wall time is inflated by waiting for a core; `store_write_cpu_*` likewise
for the store's write (`store_write_cpu_share`: its part of the steps' CPU time). The loop pauses Python's cyclic
collector during a step, so its collections of what the loop keeps run when something allocates between steps
(live: the API; here: the arrivals): `collector_cpu_s_per_step` is the collector's CPU time in and between the
measured steps, `collector_between_steps_cpu_s_per_step` the part not in any step's time, and
`decisions_per_cpu_s_with_collector` counts that part in. `decisions_digest` hashes where every running job runs
and which jobs are stopping after every step (fill and warm-up included): two versions of the code that decide the
same give the same digest for the same arguments. `host_yardstick_before`/`_after`: the host's speed right before
and right after the measured steps (`gpufleet.bench.yardstick`: a fixed workload in none of gpufleet's code), so
that figures from different hosts or moments can be told apart from changes to the code."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import heapq
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.bench import yardstick
from gpufleet.bench.scheduler import MODELS, build_fleet, job_mix
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings, StepReport
from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.dependencies import ArrayTask
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import Transition
from gpufleet.domain.records import JobRecord
from gpufleet.policies.catalog import profile as named_profile
from gpufleet.ports import Observation
from gpufleet.sim.engine import SimClock
from gpufleet.sim.simulated_backend import BackendSettings, SimulatedBackend

STEP_S = 1.0  # simulated seconds per loop step
NODES_PER_ARRIVAL = 5  # default rate: a job a second per 5 nodes arrives (and, in steady state, finishes)
MIN_DURATION_S = 1.0
WARMUP_STEPS = 5  # steady steps run before measuring (the first departures, the first preemptions)
BACKEND = "in-process fake backend (gpufleet.sim SimulatedBackend: jobs run for their drawn duration, no processes)"


class TimedStore(SqlStore):
    """The SQL store, with the time spent in `write` (what the loop writes each step) added up: wall-clock, and
    the process's CPU time (what the write costs when a loaded machine inflates its wall time)."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        super().__init__(engine, url)
        self.write_seconds = 0.0
        self.write_cpu_seconds = 0.0

    def write(self, updates: Sequence[tuple[int, JobRecord]], transitions: Sequence[Transition]) -> None:
        started, cpu = time.perf_counter(), time.process_time()
        try:
            super().write(updates, transitions)
        finally:
            self.write_seconds += time.perf_counter() - started
            self.write_cpu_seconds += time.process_time() - cpu


class _CollectorTime:
    """The cyclic collector's CPU time while registered (`gc.callbacks`), split by whether a loop step was
    running."""

    def __init__(self) -> None:
        self.in_steps = 0.0
        self.between_steps = 0.0
        self.stepping = False
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        spent = time.process_time() - self._started
        if self.stepping:
            self.in_steps += spent
        else:
            self.between_steps += spent


@dataclass
class _Steps:
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)
    write_cpu: list[float] = field(default_factory=list)
    core: list[float] = field(default_factory=list)
    decided: list[int] = field(default_factory=list)
    placed: int = 0
    preempted: int = 0
    finished: int = 0
    submit_seconds: float = 0.0
    collector_in_steps: float = 0.0
    collector_between_steps: float = 0.0

    def add(self, report: StepReport, seconds: float, cpu: float, writes: float, write_cpu: float) -> None:
        self.seconds.append(seconds)
        self.cpu.append(cpu)
        self.writes.append(writes)
        self.write_cpu.append(write_cpu)
        self.core.append(report.core_seconds)
        self.decided.append(report.decided)
        self.placed += report.placed
        self.preempted += report.preempted
        self.finished += report.finished


class SteadyLoop:
    """The benchmark's world: the SQL store (nodes and queues set), a simulated clock, the fake backend and the
    real loop, with the job stream. `fill()` submits the first jobs and places what fits; `step()` advances
    one second, submits that second's arrivals (outside the loop's time, as the API would) and runs one loop
    step."""

    def __init__(
        self, store: TimedStore, nodes: int, rate: int, backlog: int, seed: int, policy: str, array_size: int = 0
    ) -> None:
        fleet = build_fleet(nodes, 0, seed)
        store.set_nodes(fleet.nodes)
        for queue in fleet.queues:
            store.set_queue(queue)
        self.store = store
        self.rate = rate
        self.array_size = array_size
        self.models = [m for m, _, _ in MODELS]
        mean_gpus = _mean_gpus(job_mix(np.random.default_rng(seed + 2), 2_000, self.models))
        # Jobs that fill the fleet plus the backlog, then `rate` per step.
        self.fill_jobs = int(nodes * 8 / mean_gpus * 1.1) + backlog
        self.running = nodes * 8 / mean_gpus  # jobs running, updated after every step
        self._rng = np.random.default_rng(seed + 1)
        self._durations = np.random.default_rng(seed + 3)
        self._submitted = 0
        self.durations = _DrawnAtStart(self._duration)
        self.clock = SimClock()
        self._due: list[tuple[float, int, Observation]] = []
        self._seq = 0
        # No restart penalty: a preempted job resumes where it stopped (the benchmark's jobs are short).
        settings = BackendSettings(restart_penalty_s=0.0)
        self.backend = SimulatedBackend(self.clock, self._schedule, self.durations, _full_speed, settings)
        self.submit_seconds = 0.0
        self.digest = hashlib.sha256()
        self.collector = _CollectorTime()
        self._arrive(self.fill_jobs)
        # As `gpufleet up` runs it: what survives a step is frozen out of the collector's walks.
        loop_settings = ReconcilerSettings(freeze_long_lived=True)
        self.loop = Reconciler(store, self.backend, self.clock, named_profile(policy), settings=loop_settings)

    def _schedule(self, at: float, observation: Observation) -> None:
        self._seq += 1
        heapq.heappush(self._due, (at, self._seq, observation))

    @property
    def mean_duration(self) -> float:
        """The mean duration that makes departures match arrivals with the jobs running now."""
        return max(2 * MIN_DURATION_S, self.running / self.rate)

    def _duration(self) -> float:
        return MIN_DURATION_S + float(self._durations.exponential(self.mean_duration - MIN_DURATION_S))

    def _arrive(self, count: int) -> None:
        jobs = job_mix(self._rng, count, self.models, first=self._submitted)
        if self.array_size:
            jobs = _as_arrays(jobs, self.array_size)
        self._submitted += count
        started = time.perf_counter()
        self.store.submit_many(jobs, self.clock.now())
        self.submit_seconds += time.perf_counter() - started

    def fill(self) -> tuple[StepReport, float, float]:
        """The first step: every job submitted so far is decided (most fill the fleet, the rest wait)."""
        return self._step()

    def step(self) -> tuple[StepReport, float, float]:
        """One second later: its arrivals, then one loop step. (report, wall seconds, CPU seconds)."""
        self.clock.t += STEP_S
        self._arrive(self.rate)
        return self._step()

    def _step(self) -> tuple[StepReport, float, float]:
        while self._due and self._due[0][0] <= self.clock.now():
            self.backend.deliver(heapq.heappop(self._due)[2])
        self.collector.stepping = True
        started, cpu = time.perf_counter(), time.process_time()
        report = self.loop.step()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        self.collector.stepping = False
        self.running = len(self.loop.base.holdings)
        self._digest_decisions()
        return report, wall, cpu

    def _digest_decisions(self) -> None:
        """Add where every running job runs now, and which are stopping, to the digest (outside the timing)."""
        base = self.loop.base
        holdings = base.holdings
        digest = self.digest
        for job_id in sorted(holdings):
            digest.update(f"{job_id}={holdings[job_id].workers!r};".encode())
        digest.update(f"stopping={sorted(base.evicting)!r}|".encode())


class _DrawnAtStart(dict[JobId, float | None]):
    """Each job's duration, drawn the first time the backend asks (when the job first starts)."""

    def __init__(self, draw: Callable[[], float]) -> None:
        super().__init__()
        self._draw = draw

    def get(self, key: JobId, default: float | None = None) -> float | None:  # type: ignore[override]
        if key not in self:
            self[key] = self._draw()
        return self[key]


def _as_arrays(jobs: Sequence[Job], size: int) -> list[Job]:
    """The jobs as arrays of `size` tasks: each array's tasks are its first job, numbered (ids ARRAYID_N)."""
    tasks = []
    for start in range(0, len(jobs), size):
        head = jobs[start]
        array_id = f"{head.id}-array"
        for index in range(min(size, len(jobs) - start)):
            task = dataclasses.replace(head, id=f"{array_id}_{index}", array=ArrayTask(array_id, index))
            tasks.append(task.numbered(jobs[start + index].submit_seq))
    return tasks


def _full_speed(job: Job, workers: tuple[WorkerPlacement, ...]) -> float:
    return 1.0


def _mean_gpus(jobs: Sequence[Job]) -> float:
    return float(np.mean([j.gpu_milli_total / 1000.0 for j in jobs])) if jobs else 1.0


def run(
    nodes: int = 1_000,
    pending: int | None = None,
    steps: int = 30,
    rate: int | None = None,
    seed: int = 0,
    policy: str = "default",
    db_dir: Path | None = None,
    array_size: int = 0,
) -> dict[str, object]:
    """Fill `nodes` x 8 GPUs, leave `pending` (default 10 per node) waiting, then measure `steps` steady steps
    with `rate` arrivals each (default: one per 5 nodes); with `array_size`, jobs come as arrays of that many
    tasks."""
    backlog = 10 * nodes if pending is None else pending
    rate = max(1, nodes // NODES_PER_ARRIVAL) if rate is None else rate
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-loop-", dir=db_dir))
    try:
        store = TimedStore.open(default_sqlite_url(root))
        assert isinstance(store, TimedStore)  # `open` builds the class it is called on
        try:
            setup_started = time.perf_counter()
            world = SteadyLoop(store, nodes, rate, backlog, seed, policy, array_size)
            fill_report, fill_seconds, _ = world.fill()
            for _ in range(WARMUP_STEPS):
                world.step()
            setup_seconds = time.perf_counter() - setup_started
            pending_before = len(world.loop.pending)
            world.submit_seconds = 0.0
            measured = _Steps()
            yardstick_before = yardstick.measure()
            gc.callbacks.append(world.collector)
            try:
                for _ in range(steps):
                    writes_before, write_cpu_before = store.write_seconds, store.write_cpu_seconds
                    report, seconds, cpu = world.step()
                    writes, write_cpu = store.write_seconds - writes_before, store.write_cpu_seconds - write_cpu_before
                    measured.add(report, seconds, cpu, writes, write_cpu)
            finally:
                gc.callbacks.remove(world.collector)
            yardstick_after = yardstick.measure()
            measured.submit_seconds = world.submit_seconds
            measured.collector_in_steps = world.collector.in_steps
            measured.collector_between_steps = world.collector.between_steps
            figures = _figures(
                measured, steps, rate, pending_before, len(world.loop.pending), fill_report, fill_seconds
            )
            return figures | {
                "setup_seconds": round(setup_seconds, 2),
                "mean_duration_s": round(world.mean_duration, 1),
                "running_jobs": len(world.loop.base.holdings),
                "nodes": nodes,
                "gpus": nodes * 8,
                "pending_target": backlog,
                "seed": seed,
                "policy": policy,
                "array_size": array_size,
                "decisions_digest": world.digest.hexdigest()[:16],
                "host_yardstick_before": yardstick_before,
                "host_yardstick_after": yardstick_after,
            }
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _figures(
    m: _Steps,
    steps: int,
    rate: int,
    pending_before: int,
    pending_after: int,
    fill_report: StepReport,
    fill_seconds: float,
) -> dict[str, object]:
    wall = sum(m.seconds)
    cycle = np.array(m.seconds)
    writes = np.array(m.writes)
    decisions = m.placed + m.preempted
    all_in = sum(m.cpu) + m.collector_between_steps
    return {
        "benchmark": "loop",
        "store": "sqlite (WAL, a file)",
        "backend": BACKEND,
        "step_simulated_s": STEP_S,
        "arrivals_per_step": rate,
        "steps": steps,
        "decisions": decisions,
        "placed": m.placed,
        "preempted": m.preempted,
        "finished": m.finished,
        "jobs_offered_per_step": round(float(np.mean(m.decided)), 1),
        "decisions_per_s": round(decisions / wall, 1) if wall else 0.0,
        "decisions_per_cpu_s": round(decisions / sum(m.cpu), 1) if sum(m.cpu) else 0.0,
        "decisions_per_cpu_s_with_collector": round(decisions / all_in, 1) if all_in else 0.0,
        "collector_cpu_s_per_step": round((m.collector_in_steps + m.collector_between_steps) / steps, 4),
        "collector_between_steps_cpu_s_per_step": round(m.collector_between_steps / steps, 4),
        "cycle_p50_s": round(float(np.percentile(cycle, 50)), 4),
        "cycle_p99_s": round(float(np.percentile(cycle, 99)), 4),
        "cycle_max_s": round(float(cycle.max()), 4),
        "cycle_cpu_p50_s": round(float(np.percentile(m.cpu, 50)), 4),
        "cycle_cpu_p99_s": round(float(np.percentile(m.cpu, 99)), 4),
        "core_share": round(sum(m.core) / wall, 3) if wall else 0.0,
        "store_write_p50_s": round(float(np.percentile(writes, 50)), 4),
        "store_write_p99_s": round(float(np.percentile(writes, 99)), 4),
        "store_write_share": round(float(writes.sum()) / wall, 3) if wall else 0.0,
        "store_write_cpu_p50_s": round(float(np.percentile(m.write_cpu, 50)), 4),
        "store_write_cpu_p99_s": round(float(np.percentile(m.write_cpu, 99)), 4),
        "store_write_cpu_share": round(sum(m.write_cpu) / sum(m.cpu), 3) if sum(m.cpu) else 0.0,
        "submit_s_per_step": round(m.submit_seconds / steps, 4),
        "realtime_factor": round(steps * STEP_S / wall, 2) if wall else 0.0,
        "pending_before": pending_before,
        "pending_after": pending_after,
        "fill_placed": fill_report.placed,
        "fill_step_seconds": round(fill_seconds, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
