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
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.jobs import Job
from gpufleet.policies.order.las import DEFAULT_THRESHOLDS, LeastAttainedService
from gpufleet.policies.preempt.priority import Eligibility, PriorityPreemption
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


# A ranking is recomputed this long before any of its runs could change band (or reach its minimum run): far
# more than the rounding of the times involved, so a kept ranking is always the one computed afresh.
_MARGIN_S = 1e-3
# A group member as a ranking sees it: job id, when its run started (None: placed this cycle), its GPU-seconds
# attained before the run, its GPUs (milli).
Run = tuple[str, float | None, float, int]


@dataclass(frozen=True, slots=True)
class _Ranking:
    """A group's ranking (`LasPreemption._ranked`), for the runs it was made from, made at
    `since` and valid before `until`."""

    runs: tuple[Run, ...]
    since: float
    until: float
    ranked: list[tuple[int, str]]


class LasPreemption(PriorityPreemption):
    name: ClassVar[str] = NAME

    def __init__(self, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS, *, min_run_s: float = 0.0) -> None:
        if not (min_run_s >= 0 and math.isfinite(min_run_s)):
            check([FieldProblem("min_run_s", f"is {min_run_s}", "give seconds >= 0 (0: no minimum)")], "las preemption")
        self.bands = LeastAttainedService(thresholds)
        self.min_run_s = min_run_s
        self._rankings: dict[tuple[str, int], _Ranking] = {}

    def band(self, holding: Holding, cluster: ClusterView) -> int:
        """The holding job's LAS band now (it holds for the cycle: its time and running jobs)."""
        running = holding.running
        key = (holding.job.id, running.started_at if running is not None else None)
        bands: dict[tuple[str, float | None], int] = cluster.per_cycle(("preempt.las.band", self), dict)
        band = bands.get(key)
        if band is None:
            band = bands[key] = self.bands.band_of(attained_now(holding, cluster))
        return band

    def _ranked(self, group: tuple[str, int], members: Sequence[str], cluster: ClusterView) -> list[tuple[int, str]]:
        """(band, job id) of a preemptible group's jobs that have run their minimum, highest band first.
        Groups, bands and run times hold for the cycle (placements of the cycle join no group), so each
        group is ranked once per cycle instead of once per victim search; and across cycles, while the group
        has the same runs, until one of them could reach its next band or its minimum run (`_Ranking`)."""
        ranked_by_group: dict[tuple[str, int], list[tuple[int, str]]] = cluster.per_cycle(
            ("preempt.las.ranked", self), dict
        )
        ranked = ranked_by_group.get(group)
        if ranked is None:
            holdings = cluster.holdings
            runs = tuple(
                (
                    job_id,
                    running.started_at if running is not None else None,
                    holding.job.attained_gpu_seconds,
                    holding.job.gpu_milli_total,
                )
                for job_id in members
                if (holding := holdings.get(job_id)) is not None
                for running in (holding.running,)
            )
            kept = self._rankings.get(group)
            if kept is not None and kept.runs == runs and kept.since <= cluster.now < kept.until:
                ranked = kept.ranked
            else:
                ranked, until = self._rank(runs, cluster)
                self._rankings[group] = _Ranking(runs, cluster.now, until, ranked)
            ranked_by_group[group] = ranked
        return ranked

    def _rank(self, runs: tuple[Run, ...], cluster: ClusterView) -> tuple[list[tuple[int, str]], float]:
        """The ranking of a group's runs now, and until when it holds: the earliest time, less a margin far above
        rounding, at which a run could reach its next band or its minimum run."""
        ranked: list[tuple[int, str]] = []
        holdings = cluster.holdings
        now = cluster.now
        min_run = self.min_run_s
        thresholds = self.bands.thresholds
        until = math.inf
        for job_id, started_at, _, _ in runs:
            holding = holdings[job_id]
            if min_run and (started_at is None or now - started_at < min_run):
                if started_at is not None:
                    until = min(until, started_at + min_run - _MARGIN_S)
                continue  # just (re)started: let it run a while before it can be stopped for service
            band = self.band(holding, cluster)
            ranked.append((band, job_id))
            if started_at is not None and band < len(thresholds):
                gpus = holding.job.gpu_milli_total / 1000.0
                if gpus > 0:
                    reach = started_at + (thresholds[band] - holding.job.attained_gpu_seconds) / gpus
                    until = min(until, reach - _MARGIN_S)
        ranked.sort(key=lambda item: -item[0])
        return ranked, until

    def candidates_of(
        self, job: Job, cluster: ClusterView, eligibility: Eligibility
    ) -> tuple[list[Holding], dict[str, str]]:
        candidates, reasons = super().candidates_of(job, cluster, eligibility)
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

    def candidates_key(self, job: Job, cluster: ClusterView, eligibility: Eligibility) -> tuple[object, ...]:
        # Jobs of its own queue it may stop for service: those of its priority or lower, in higher bands than its own.
        mine = self.bands.band_of(job.attained_gpu_seconds)
        return (*super().candidates_key(job, cluster, eligibility), job.queue, job.priority, mine)

    def cost(self, holding: Holding, cluster: ClusterView) -> tuple[float, ...]:
        base = super().cost(holding, cluster)
        return (base[0], -float(self.band(holding, cluster)), *base[1:])
