"""Preemption by least attained service (Tiresias, Gu et al., NSDI 2019), on top of priority preemption.

A pending job may also stop preemptible jobs of its own queue that have received more service: jobs in
a higher discretised LAS band (GPU-seconds attained, including the current run). Victims are taken from
the highest band first, then the least work lost. With checkpoints on the stop signal, a victim loses no
work, only the restart; the bands (not raw attained service) keep jobs from trading places on every
small difference. Everything priority preemption allows is allowed too.

`min_run_s` (default 0, as Tiresias): a job is stopped for service only once its current run has lasted
that long, so a restarted job is not stopped again before it has made progress (`default` uses 15 minutes;
on Philly at load x8 that was as good as no minimum, with a third fewer preemptions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.jobs import Job
from gpufleet.policies.order.las import DEFAULT_THRESHOLDS, LeastAttainedService
from gpufleet.policies.preempt.priority import PriorityPreemption
from gpufleet.scheduling.plugin_api import ClusterView, Holding

NAME = "las"


def attained_now(holding: Holding, cluster: ClusterView) -> float:
    """GPU-seconds a holding job has received, its current run included."""
    running = holding.running
    gpus = holding.job.gpu_milli_total / 1000.0
    earlier = holding.job.attained_gpu_seconds
    if running is None:
        return earlier
    return earlier + gpus * max(0.0, cluster.now - running.started_at)


class LasPreemption(PriorityPreemption):
    name: ClassVar[str] = NAME

    def __init__(self, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS, *, min_run_s: float = 0.0) -> None:
        if not (min_run_s >= 0 and math.isfinite(min_run_s)):
            check([FieldProblem("min_run_s", f"is {min_run_s}", "give seconds >= 0 (0: no minimum)")], "las preemption")
        self.bands = LeastAttainedService(thresholds)
        self.min_run_s = min_run_s

    def band(self, holding: Holding, cluster: ClusterView) -> int:
        """The holding job's LAS band now (it holds for the cycle: its time and running jobs)."""
        return self.bands.band_of(attained_now(holding, cluster))

    def _ranked(self, group: tuple[str, int], members: Sequence[str], cluster: ClusterView) -> list[tuple[int, str]]:
        """(band, job id) of a preemptible group's jobs that have run their minimum, highest band first.
        Groups, bands and run times hold for the cycle (placements of the cycle join no group), so each
        group is ranked once per cycle instead of once per victim search."""
        ranked_by_group: dict[tuple[str, int], list[tuple[int, str]]] = cluster.per_cycle(
            ("preempt.las.ranked", self), dict
        )
        ranked = ranked_by_group.get(group)
        if ranked is None:
            ranked = []
            holdings = cluster.holdings
            min_run = self.min_run_s
            for job_id in members:
                holding = holdings.get(job_id)
                if holding is None:
                    continue
                running = holding.running
                if min_run and (running is None or cluster.now - running.started_at < min_run):
                    continue  # just (re)started: let it run a while before it can be stopped for service
                ranked.append((self.band(holding, cluster), job_id))
            ranked.sort(key=lambda item: -item[0])
            ranked_by_group[group] = ranked
        return ranked

    def candidates(
        self, job: Job, cluster: ClusterView, demand: dict[str, int], quota_ok: bool
    ) -> tuple[list[Holding], dict[str, str]]:
        candidates, reasons = super().candidates(job, cluster, demand, quota_ok)
        mine = self.bands.band_of(job.attained_gpu_seconds)
        for group, members in sorted(cluster.preemptible_groups.items()):
            queue, priority = group
            if queue != job.queue or priority > job.priority:
                continue
            for band, job_id in self._ranked(group, members, cluster):
                if band <= mine:
                    break
                holding = cluster.holdings.get(job_id)
                if holding is None or job_id in cluster.evicting or job_id in reasons:
                    continue
                reasons[job_id] = f"attained more service (LAS band {band} > {mine})"
                candidates.append(holding)
        return candidates, reasons

    def cost(self, holding: Holding, cluster: ClusterView) -> tuple[float, ...]:
        base = super().cost(holding, cluster)
        return (base[0], -float(self.band(holding, cluster)), *base[1:])
