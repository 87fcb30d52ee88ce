"""Gavel's isolated reference: each job's completion time when every active job gets 1/n of the cluster.

Gavel's finish-time fairness (rho) of a job is its JCT under a policy over its JCT in a run of Gavel's
`isolated` policy on the same trace (Narayanan et al., OSDI 2020, section 4.2; its evaluation divides the two
runs' JCTs job by job: `scheduler/notebooks/figures/evaluation/plotting_utils.py`, `plot_jct_cdf`). That
policy (`scheduler/policies/isolated.py`) gives each of the n active jobs `x[j, m] = N[m] / (n * g[j])` of GPU
model m (N[m] GPUs of the model, g[j] the job's GPUs), every row then divided by the largest row sum.

`isolated_jcts` runs that allocation the way Gavel's simulator does (`scheduler/scheduler.py`, `simulate`),
since Gavel's published rho divides by that run's JCTs:

- rounds of 360 s; a job that finishes within a round leaves its GPUs idle until the round ends, and jobs that
  arrive during a round join at its end (their JCT still counts from arrival); an empty cluster waits for the
  next arrival;
- the allocation is recomputed only when jobs came or went and at least 1920 s passed since the last time
  (Gavel's `minimum_time_between_allocation_resets`); a job that arrived since has no allocation and does
  not run until then;
- each round, per GPU model, jobs are ranked by allocation over their share of the model's time since the
  last recomputation (ties: the larger deficit, accumulated time owed minus time received), the models are
  taken in an order shuffled each round, and each model takes the highest-ranked jobs not yet placed that fit.

Work is counted in reference-seconds, not in Gavel's whole steps. `fluid_isolated_jcts` follows the same
allocation exactly instead (every job progresses at its share between events, each row capped at 1).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from gpufleet.domain.throughput_table import job_scale
from gpufleet.sim.workload import Workload, WorkloadError

FloatArray = npt.NDArray[np.float64]


def _speeds(workload: Workload, models: list[str]) -> tuple[FloatArray, FloatArray]:
    """(speed[J, M] relative to the reference model, gpus[J]) of the jobs with a run time, in workload order."""
    table = workload.throughput
    timed = [tj for tj in workload.jobs if tj.duration is not None]
    speed = np.ones((len(timed), len(models)), dtype=np.float64)
    gpus = np.ones(len(timed), dtype=np.float64)
    cache: dict[tuple[str, int, bool], list[float]] = {}
    for i, tj in enumerate(timed):
        count, consolidated = job_scale(tj.job)
        gpus[i] = max(1, count)
        if table is None or table.reference is None:
            continue
        key = (tj.job.job_type, count, consolidated)
        if key not in cache:
            row = []
            for model in models:
                try:
                    row.append(table.relative_speed(tj.job.job_type, model, count, consolidated=consolidated))
                except WorkloadError:
                    row.append(1.0)
            cache[key] = row
        speed[i] = cache[key]
    return speed, gpus


def _capacity(workload: Workload) -> tuple[list[str], FloatArray]:
    """(GPU models in name order, GPUs of each)."""
    counts: dict[str, int] = {}
    for node in workload.nodes:
        for gpu in node.gpus:
            counts[gpu.model] = counts.get(gpu.model, 0) + 1
    models = sorted(counts)
    return models, np.array([counts[m] for m in models], dtype=np.float64)


def fluid_isolated_jcts(workload: Workload) -> dict[str, float]:
    """JCT (seconds) of every job with a run time under Gavel's isolated allocation followed exactly (a fluid run,
    each row capped at 1; see the module docstring)."""
    models, capacity = _capacity(workload)
    timed = [tj for tj in workload.jobs if tj.duration is not None]
    if not timed or capacity.sum() <= 0:
        return {}
    speed, gpus = _speeds(workload, models)
    work = np.array([tj.duration for tj in timed], dtype=np.float64)  # reference-seconds left
    arrival = np.array([tj.arrival for tj in timed], dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    runnable = speed > 0
    jct: dict[str, float] = {}
    active: list[int] = []
    now = float(arrival[order[0]])
    pending_arrivals: list[tuple[float, int]] = [(float(arrival[j]), int(j)) for j in order]
    heapq.heapify(pending_arrivals)
    while active or pending_arrivals:
        if active:
            index = np.array(active, dtype=np.int64)
            share = capacity[None, :] / (len(index) * gpus[index, None])
            share = np.where(runnable[index], share, 0.0)
            share /= np.maximum(1.0, share.sum(axis=1))[:, None]
            rate = (share * speed[index]).sum(axis=1)
            with np.errstate(divide="ignore"):
                finish_in = np.where(rate > 0, work[index] / np.where(rate > 0, rate, 1.0), np.inf)
            first = int(np.argmin(finish_in))
            step = float(finish_in[first])
        else:
            index = np.zeros(0, dtype=np.int64)
            rate = np.zeros(0, dtype=np.float64)
            step = np.inf
        arrives_at = pending_arrivals[0][0] if pending_arrivals else np.inf
        if not np.isfinite(step) and not np.isfinite(arrives_at):
            break  # jobs that can run nowhere: they never finish
        if arrives_at <= now + step:
            work[index] -= rate * (arrives_at - now)
            now = arrives_at
            while pending_arrivals and pending_arrivals[0][0] <= now:
                active.append(heapq.heappop(pending_arrivals)[1])
            continue
        now += step
        work[index] -= rate * step
        done = {int(j) for j in index[work[index] <= 1e-6]} | {int(index[first])}
        for j in done:
            jct[timed[j].id] = now - float(arrival[j])
        active = [j for j in active if j not in done]
    return jct


# Gavel's simulations run 360 s rounds (`time_per_iteration`) and recompute allocations at most every 1920 s
# (`minimum_time_between_allocation_resets`, its scheduler's default).
GAVEL_ROUND_S = 360.0
GAVEL_RESET_INTERVAL_S = 1920.0
_UNSET = -1.0


def isolated_jcts(workload: Workload, *, until_done: Collection[str] | None = None, seed: int = 0) -> dict[str, float]:
    """JCT (seconds) of the jobs with a run time under Gavel's isolated policy as Gavel's simulator runs it (see
    the module docstring); with `until_done`, the run stops once those jobs are done (as Gavel's does). `seed`
    seeds the shuffle of the GPU models each round (Gavel's `seed + 5` stream)."""
    models, capacity = _capacity(workload)
    timed = [tj for tj in workload.jobs if tj.duration is not None]
    if not timed or capacity.sum() <= 0:
        return {}
    speed, gpus = _speeds(workload, models)
    ids = [tj.id for tj in timed]
    work = np.array([tj.duration for tj in timed], dtype=np.float64)  # reference-seconds left
    arrival = np.array([tj.arrival for tj in timed], dtype=np.float64)
    order = [int(j) for j in np.argsort(arrival, kind="stable")]
    waiting = set(until_done) if until_done is not None else None
    n_models = len(models)
    half_round = GAVEL_ROUND_S / 2.0
    # Per job and model: time received since the last recomputation (Gavel starts it at half a round), the
    # deficit and the allocation (none until the job's first recomputation).
    received = np.full((len(timed), n_models), half_round)
    deficit = np.zeros((len(timed), n_models))
    allocation = np.zeros((len(timed), n_models))
    has_allocation = np.zeros(len(timed), dtype=bool)
    model_time = np.zeros(n_models)
    shuffler = random.Random(seed + 5)
    active: list[int] = []
    next_arrival = 0
    now = float(arrival[order[0]])
    last_reset = _UNSET
    changed = False
    jct: dict[str, float] = {}
    while active or next_arrival < len(order):
        if waiting is not None and not waiting:
            break
        while next_arrival < len(order) and arrival[order[next_arrival]] <= now:
            j = order[next_arrival]
            active.append(j)
            received[j] = half_round
            next_arrival += 1
            changed = True
        if not active:
            now = float(arrival[order[next_arrival]])
            continue
        index = np.array(active, dtype=np.int64)
        # (The tolerance: a run that waited for the recomputation lands on its time up to rounding.)
        if changed and (last_reset == _UNSET or now - last_reset >= GAVEL_RESET_INTERVAL_S - 1e-6):
            elapsed = now - last_reset if last_reset != _UNSET else 0.0
            deficit[index] += allocation[index] * elapsed - (received[index] - half_round)
            received[index] = half_round
            model_time[:] = half_round * len(index)
            share = capacity[None, :] / (len(index) * gpus[index, None])
            allocation[index] = share / share.sum(axis=1).max()
            has_allocation[index] = True
            last_reset, changed = now, False
        # Gavel's priority: allocation over the share of the model's time received since the recomputation (a
        # model nobody has used yet: allocation x 1e9); the ranking also needs the deficit and add order.
        used = model_time[None, :] > 0
        fraction = np.where(used, received[index] / np.where(used, model_time[None, :], 1.0), 0.0)
        scaled = allocation[index] / np.where(fraction > 0, fraction, 1.0)
        priority = np.where(fraction > 0, scaled, allocation[index] * 1e9)
        runs_on = (speed[index] > 0) & has_allocation[index, None] & (allocation[index] > 0)
        placed = np.full(len(index), -1, dtype=np.int64)
        model_order = list(range(n_models))
        shuffler.shuffle(model_order)
        for m in model_order:
            left = capacity[m]
            ranked = np.lexsort((np.arange(len(index)), -allocation[index, m], -deficit[index, m], -priority[:, m]))
            for k in ranked:
                if left < 1:
                    break
                if placed[k] >= 0 or not runs_on[k, m] or gpus[index[k]] > left:
                    continue
                placed[k] = m
                left -= gpus[index[k]]
        running = np.flatnonzero(placed >= 0)
        if running.size == 0:
            # Nothing may run until the next arrival or the next recomputation.
            later = [float(arrival[order[next_arrival]])] if next_arrival < len(order) else []
            if changed:
                later.append(last_reset + GAVEL_RESET_INTERVAL_S)
            if not later:
                break  # jobs that can run nowhere: they never finish
            now = max(now, min(later))
            continue
        jobs = index[running]
        on = placed[running]
        rate = speed[jobs, on]
        ran = np.minimum(GAVEL_ROUND_S, work[jobs] / rate)
        work[jobs] -= rate * ran
        received[jobs, on] += ran
        np.add.at(model_time, on, ran)
        done = jobs[work[jobs] <= 1e-6]
        for j, took in zip(jobs, ran, strict=True):
            if work[j] <= 1e-6:
                jct[ids[j]] = now + float(took) - float(arrival[j])
                if waiting is not None:
                    waiting.discard(ids[j])
        if done.size:
            gone = {int(j) for j in done}
            active = [j for j in active if j not in gone]
            changed = True
        now += float(ran.max())
    return jct


__all__ = ["GAVEL_RESET_INTERVAL_S", "GAVEL_ROUND_S", "fluid_isolated_jcts", "isolated_jcts"]
