"""The curves behind the report's plots, as plain lists: report.py draws its PNGs from them and results.json
carries them (`plots`), so anything that reads results.json (the dashboard's Simulator page) draws the same
curves. FGD's allocation steps and per-queue queueing delays are in the metrics already."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.sim.metrics import job_completion_times

if TYPE_CHECKING:
    from gpufleet.sim.experiment import Experiment

CDF_POINTS = 1000  # a CDF drawn from this many quantiles is indistinguishable from one drawn from every job
ALLOCATION_POINTS = 2000


def jct_cdf(experiment: Experiment) -> dict[str, dict[str, list[float]]]:
    """Per policy: completion times of finished jobs (sorted, seconds) and the fraction of finished jobs at
    or under each; at most `CDF_POINTS` points, always the first and the last job."""
    out: dict[str, dict[str, list[float]]] = {}
    for result in experiment.results:
        values = np.sort(job_completion_times(result.run, experiment.job_ids))
        if not values.size:
            continue
        ranks = np.unique(np.round(np.linspace(0, values.size - 1, min(values.size, CDF_POINTS))).astype(np.int64))
        out[result.policy] = {
            "jct_s": [round(float(v), 3) for v in values[ranks]],
            "fraction": [round(float(r + 1) / values.size, 6) for r in ranks],
        }
    return out


def gpu_allocation(experiment: Experiment) -> dict[str, dict[str, list[float]]]:
    """Per policy: GPU allocation (% of capacity) over simulated time (hours), a step function sampled at
    most `ALLOCATION_POINTS` times."""
    capacity = experiment.workload.gpu_capacity_milli
    if not capacity or experiment.fgd_protocol:
        return {}
    out: dict[str, dict[str, list[float]]] = {}
    for result in experiment.results:
        samples = result.run.samples
        if not samples:
            continue
        kept = samples[:: max(1, len(samples) // ALLOCATION_POINTS)]
        out[result.policy] = {
            "hours": [round(s.at / 3600.0, 6) for s in kept],
            "pct": [round(100.0 * s.allocated_milli / (s.capacity_milli or capacity), 4) for s in kept],
        }
    return out


def plot_series(experiment: Experiment) -> dict[str, Any]:
    return {"jct_cdf": jct_cdf(experiment), "gpu_allocation": gpu_allocation(experiment)}
