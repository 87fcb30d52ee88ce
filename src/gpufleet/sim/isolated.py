"""Gavel's isolated reference: each job's completion time when every active job gets 1/n of the cluster.

Gavel's finish-time fairness (rho) of a job is its JCT under a policy over its JCT in a run of Gavel's
`isolated` policy on the same trace (Narayanan et al., OSDI 2020, section 4.2; its evaluation divides the two
runs' JCTs job by job: `scheduler/notebooks/figures/evaluation/plotting_utils.py`, `plot_jct_cdf`). That
policy gives each of the n active jobs `x[j, m] = N[m] / (n * g[j])` of GPU model m (N[m] GPUs of the model,
g[j] the job's GPUs), with the job's time capped at 1 in all (rows scaled down to sum 1 when over), so the job
runs at `sum_m x[j, m] * speed[j, m]` of its reference speed.

Here that allocation is followed exactly (a fluid run: shares are not rounded to whole GPUs and rounds), event
by event: arrivals and completions change n, and between two events every active job progresses at its
rate. Gavel realises the same allocation in 360 s rounds, which differs by the rounding of each round.
"""

from __future__ import annotations

import heapq

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


def isolated_jcts(workload: Workload) -> dict[str, float]:
    """JCT (seconds) of every job with a run time under Gavel's isolated allocation (see the module docstring)."""
    counts: dict[str, int] = {}
    for node in workload.nodes:
        for gpu in node.gpus:
            counts[gpu.model] = counts.get(gpu.model, 0) + 1
    models = sorted(counts)
    capacity = np.array([counts[m] for m in models], dtype=np.float64)
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


__all__ = ["isolated_jcts"]
