"""Run one workload under several scheduling profiles and collect their metrics: what `gpufleet sim` does.

Every policy gets the same workload (same jobs, same arrivals) and a fresh simulation; a `Recorder` observes
the node table for per-model GPU-hours and fragmentation. A workload whose jobs all lack a run time is the
FGD protocol (pods never leave, so no profile preempts there): allocation and fragmentation are then measured at
each 5 % step of arrived load instead of over time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.domain.errors import UnknownNameError
from gpufleet.policies.catalog import PROFILES, PolicyData, profile
from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload
from gpufleet.scheduling.plugin_api import Profile
from gpufleet.sim.engine import SimRun, SimSettings, Simulation
from gpufleet.sim.metrics import PolicyMetrics, Recorder, Recording, compute_metrics
from gpufleet.sim.plot_series import plot_series
from gpufleet.sim.prices import PriceTable
from gpufleet.sim.workload import Workload, WorkloadError

# progress(policy, jobs arrived, jobs in the workload)
Progress = Callable[[str, int, int], None]


def policy_data(workload: Workload) -> PolicyData:
    """What data-driven plugins are built with for this workload: FGD's target workload is the workload's own
    requests (as the paper builds it from the trace), Gavel's throughput table is the workload's."""
    requests = [tj.job.request for tj in workload.jobs]
    target = TargetWorkload.from_requests(requests) if requests else GENERIC_TARGET
    return PolicyData(target=target, throughput=workload.throughput)


def check_policies(names: Sequence[str]) -> tuple[str, ...]:
    """The policy names, all checked before anything runs (an unknown name is an error, not a skipped run)."""
    if not names:
        raise UnknownNameError("no policy given", f"give one or more of: {', '.join(sorted(PROFILES))}")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UnknownNameError(f"policy {name!r} is listed twice", "list each policy once")
        profile(name)  # an unknown name, or a modifier it cannot take, is refused with the fix
        seen.add(name)
    return tuple(names)


def is_fgd_protocol(workload: Workload) -> bool:
    """Pods that never leave (no job has a run time): measure at arrived-load steps, as the FGD paper does."""
    return bool(workload.jobs) and all(tj.duration is None for tj in workload.jobs)


def for_protocol(prof: Profile, fgd_protocol: bool) -> Profile:
    """The profile as the protocol runs it: in the FGD protocol pods never leave, so nothing is preempted (a
    profile's preemption, e.g. `default`'s LAS bands, would stop the pods placed first)."""
    return replace(prof, preempt=None) if fgd_protocol and prof.preempt is not None else prof


def scale_load(workload: Workload, factor: float) -> Workload:
    """The workload with arrival times divided by `factor` (measured from the first arrival): `factor` 2 packs
    the same jobs into half the time, so twice the load. Run times do not change."""
    if not factor > 0:
        raise WorkloadError(f"load scale is {factor}", "give a factor > 0, e.g. 4 (arrivals 4x closer together)")
    if factor == 1 or not workload.jobs:
        return workload
    t0 = workload.jobs[0].arrival
    jobs = tuple(replace(tj, job=replace(tj.job, submitted_at=t0 + (tj.arrival - t0) / factor)) for tj in workload.jobs)
    note = f"Load scale {factor:g}: arrival times compressed {factor:g}x (from the first arrival); run times as given."
    return replace(workload, jobs=jobs, assumptions=(*workload.assumptions, note))


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    run: SimRun
    recording: Recording
    metrics: PolicyMetrics


@dataclass(frozen=True)
class Experiment:
    """One workload, several policies: the runs and their metrics, plus what the report must cite."""

    workload: Workload
    results: tuple[PolicyResult, ...]
    fgd_protocol: bool
    prices: PriceTable | None = None
    notes: tuple[str, ...] = ()
    job_ids: frozenset[str] | None = None
    what_if: tuple[str, ...] = ()  # the cluster changes asked for (added nodes, quotas, events, failures)

    def result(self, policy: str) -> PolicyResult:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(policy)

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(r.policy for r in self.results)

    def workload_info(self) -> dict[str, Any]:
        w = self.workload
        return {
            "name": w.name,
            "citation": w.citation,
            "license": w.license,
            "assumptions": list(w.assumptions),
            "nodes": len(w.nodes),
            "gpus": w.gpu_count,
            "gpus_by_model": w.gpus_by_model(),
            "queues": len(w.queues),
            "jobs": len(w.jobs),
            "cluster_events": len(w.events),
            "fgd_protocol": self.fgd_protocol,
        }

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workload": self.workload_info(),
            "policies": {r.policy: r.metrics.as_dict() for r in self.results},
            "prices": None
            if self.prices is None
            else {
                "source": self.prices.source,
                "basis": self.prices.basis,
                "usd_per_gpu_hour": dict(self.prices.per_gpu_hour),
            },
            "notes": list(self.notes),
            "what_if": list(self.what_if),
            "plots": plot_series(self),
        }
        return out


@dataclass(frozen=True)
class Comparison:
    """Our figures beside published ones: a titled table (`columns`, `rows` of values in that order), the
    experiments it came from, and notes on how the setups differ. Every row value is a number, text or None."""

    name: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    experiments: tuple[Experiment, ...]
    source: str
    notes: tuple[str, ...] = ()
    series: dict[str, Any] = field(default_factory=dict)  # extra data for plots and JSON (e.g. FGD curves)

    def as_dict(self) -> dict[str, Any]:
        return {
            "reproduce": self.name,
            "title": self.title,
            "published_source": self.source,
            "comparison": [dict(zip(self.columns, row, strict=True)) for row in self.rows],
            "notes": list(self.notes),
            "series": self.series,
            "experiments": [e.as_dict() for e in self.experiments],
        }


def run_policy(
    workload: Workload,
    prof: Profile,
    *,
    fgd_protocol: bool | None = None,
    prices: PriceTable | None = None,
    job_ids: Collection[str] | None = None,
    settings: SimSettings | None = None,
    progress: Progress | None = None,
) -> PolicyResult:
    """Simulate `workload` under one profile, with a recorder, and compute its metrics."""
    fgd = is_fgd_protocol(workload) if fgd_protocol is None else fgd_protocol
    prof = for_protocol(prof, fgd)
    recorder = Recorder(workload, fgd_protocol=fgd)
    name = prof.name
    callback: Callable[[int, int], None] | None = None
    if progress is not None:
        report = progress

        def _callback(arrived: int, total: int) -> None:
            report(name, arrived, total)

        callback = _callback
    run = Simulation(workload, prof, settings, observer=recorder).run(callback)
    recording = recorder.recording()
    metrics = compute_metrics(run, recording, prices=prices, job_ids=job_ids, policy=name)
    return PolicyResult(name, run, recording, metrics)


def run_experiment(
    workload: Workload,
    policies: Sequence[str],
    *,
    prices: PriceTable | None = None,
    job_ids: Collection[str] | None = None,
    settings: SimSettings | None = None,
    progress: Progress | None = None,
    notes: Sequence[str] = (),
    workload_for: Callable[[str], Workload] | None = None,
    what_if: Sequence[str] = (),
    adjust_profile: Callable[[Profile], Profile] | None = None,
) -> Experiment:
    """Run every policy on the workload. `workload_for(policy)` may give a policy its own variant of the workload
    (e.g. with oracle durations); by default all share `workload`. `adjust_profile` changes each profile before
    it runs (a setting swept on the command line)."""
    names = check_policies(policies)
    if not workload.jobs:
        raise WorkloadError(f"workload {workload.name!r} has no jobs", "give a workload with at least one job")
    fgd = is_fgd_protocol(workload)
    results = []
    for name in names:
        variant = workload_for(name) if workload_for is not None else workload
        prof = profile(name, policy_data(variant))
        if adjust_profile is not None:
            prof = adjust_profile(prof)
        results.append(
            run_policy(
                variant, prof, fgd_protocol=fgd, prices=prices, job_ids=job_ids, settings=settings, progress=progress
            )
        )
    cut = [
        f"{r.policy} stopped at the simulation horizon ({r.run.horizon_s:,.0f} s) with "
        f"{r.metrics.jobs_unfinished:,} job(s) unfinished"
        for r in results
        if r.run.cut_short and r.run.horizon_s is not None
    ]
    return Experiment(
        workload,
        tuple(results),
        fgd,
        prices,
        (*notes, *cut),
        frozenset(job_ids) if job_ids is not None else None,
        tuple(what_if),
    )
