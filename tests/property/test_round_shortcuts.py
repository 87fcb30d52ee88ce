"""The round allocator's shortcuts decide as the full path does: on random fleets and job mixes (the allocator
benchmark's generator, small), a cycle of `gavel`, `gavel-mmf` and `max-min` gives the very same result with
each shortcut replaced by the code it shortcuts:

- `Planner._assign` passes over a job none of whose models has room for it (within budget) without ranking its
  choices; the reference ranks them and tries each.
- `RoundPreempt` starts each victim search after the cycle's front of jobs being stopped; the reference scans
  every candidate.
- `waiting_reason` finds the model a job lags most on in one loop; the reference asks `max` with `lag_s`."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.bench import allocator
from gpufleet.domain import ClusterSnapshot, Job, WorkerRequest
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.policies.catalog import PolicyData, profile
from gpufleet.policies.rounds import plugins
from gpufleet.policies.rounds.plan import GOLDEN, JobPlan, Planner, RoundPlan
from gpufleet.policies.rounds.plugins import RoundPreempt
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.plugin_api import GENERIC_TARGET, ClusterView
from gpufleet.scheduling.plugin_api import Profile as ProfileType


class FullAssign(Planner):
    """`_assign` as it was before its shortcut: every job's choices ranked and tried in turn."""

    def _assign(self, result: RoundPlan, free: dict[str, int], stopping: frozenset[str], now: float) -> None:
        movers = self._movers(result)
        isolated_rate = self._isolated_rate(result, sum(free.values()))
        order = sorted(
            (*self._floor_key(plan, isolated_rate), -self._rank_value(plan, movers), plan.job.submit_seq, job_id)
            for job_id, plan in result.jobs.items()
            if job_id not in stopping and plan.share
        )
        wanted: dict[tuple[str, str], float] = defaultdict(float)
        for plan in result.jobs.values():
            gpus = max(1, round(plan.job.gpu_milli_total / MILLI_PER_GPU))
            for model, share in plan.share.items():
                wanted[(plan.job.queue, model)] += gpus * share
        round_index = int(np.floor(now / self.round_s))
        budget = {
            key: int(np.floor(amount + ((round_index * GOLDEN + i * 0.5) % 1.0)))
            for i, (key, amount) in enumerate(sorted(wanted.items()))
        }
        left: list[str] = []
        unassigned = sum(free.values())
        for within_budget in (True, False):
            for job_id in [key[-1] for key in order] if within_budget else left:
                if unassigned <= 0:
                    break
                plan = result.jobs[job_id]
                gpus = max(1, round(plan.job.gpu_milli_total / MILLI_PER_GPU))
                for model in self._choices(plan, movers):
                    key = (plan.job.queue, model)
                    if free.get(model, 0) < gpus or (within_budget and budget.get(key, 0) < gpus):
                        continue
                    free[model] -= gpus
                    unassigned -= gpus
                    budget[key] = budget.get(key, 0) - gpus
                    result.rank[job_id] = len(result.assigned)
                    result.assigned[job_id] = model
                    if plan.job.queue in movers and plan.running_on is not None and model != plan.running_on:
                        result.moves[job_id] = model
                    break
                else:
                    if within_budget:
                        left.append(job_id)


class FullScan(RoundPreempt):
    """Every victim search scans the model's candidates from the first."""

    def _first_not_stopping(self, ranked: list[tuple[float, int, str]], model: str, cluster: ClusterView) -> int:
        return 0


def full_reason(plan: RoundPlan, job: Job, now: float) -> str:
    """`waiting_reason` with the model a job lags most on found by `max`."""
    entry = plan.jobs.get(job.id)
    next_in = plugins._minutes(max(0.0, plan.next_round - now))
    if entry is None or not entry.share:
        return f"waiting for a round: the allocation gives it no GPU share now; next round in {next_in}"
    model = max(entry.share, key=entry.lag_s)
    lag = entry.lag_s(model)
    gpus = job.gpu_milli_total / MILLI_PER_GPU or 1.0
    if lag > 0:
        where = f"behind its fair share of {model} time by {lag * gpus / 3600:.1f} GPU-hours"
    else:
        where = f"ahead of its fair share ({entry.share[model]:.0%} of {model} time) while others lag more"
    return f"waiting for a round: {where}; next round in {next_in}"


def without_shortcuts(prof: ProfileType) -> ProfileType:
    """The profile with its round plugins' shortcuts replaced by the full path (one planner, shared)."""
    preempt = prof.preempt
    assert isinstance(preempt, RoundPreempt)
    planner = preempt.planner
    planner.__class__ = FullAssign  # the same planner object: every plugin of the profile shares it
    return dataclasses.replace(prof, preempt=FullScan(planner, min_run_s=preempt.min_run_s))


def one_queue(snapshot: ClusterSnapshot, pending: list[Job]) -> tuple[ClusterSnapshot, list[Job]]:
    """Every job in the first queue (running jobs may then move: `Planner.migrate`)."""
    queue = snapshot.queues[0].name
    running = tuple(dataclasses.replace(r, job=dataclasses.replace(r.job, queue=queue)) for r in snapshot.running)
    return dataclasses.replace(snapshot, running=running), [dataclasses.replace(j, queue=queue) for j in pending]


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.integers(5, 120),
    gpus_per_model=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 10_000),
    single_queue=st.booleans(),
    name=st.sampled_from(["gavel", "gavel-mmf", "max-min"]),
)
def test_round_shortcuts_decide_as_the_full_path(
    jobs: int, gpus_per_model: int, seed: int, single_queue: bool, name: str
) -> None:
    snapshot, pending, table = allocator.build(jobs, gpus_per_model, seed)
    if single_queue:
        snapshot, pending = one_queue(snapshot, pending)
    data = PolicyData(target=GENERIC_TARGET, throughput=table)
    fast = run_cycle(snapshot, pending, profile(name, data))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plugins, "waiting_reason", full_reason)
        full = run_cycle(snapshot, pending, without_shortcuts(profile(name, data)))
    assert fast.to_json() == full.to_json()


def test_the_reference_path_is_the_one_taken() -> None:
    """The comparison above is not between two copies of the fast path: the reference planner ranks the choices
    of jobs that cannot be planned, which the shortcut skips."""
    snapshot, pending, table = allocator.build(200, 8, 0)
    data = PolicyData(target=GENERIC_TARGET, throughput=table)
    calls = {"fast": 0, "full": 0}
    for label, prof in (("fast", profile("gavel", data)), ("full", without_shortcuts(profile("gavel", data)))):
        preempt = prof.preempt
        assert isinstance(preempt, RoundPreempt)
        planner = preempt.planner
        planner._choices = counting(planner._choices, calls, label)  # type: ignore[method-assign]
        run_cycle(snapshot, pending, prof)
    assert calls["full"] > calls["fast"] > 0


def counting(
    choices: Callable[[JobPlan, frozenset[str]], list[str]], calls: dict[str, int], label: str
) -> Callable[[JobPlan, frozenset[str]], list[str]]:
    def counted(plan: JobPlan, movers: frozenset[str]) -> list[str]:
        calls[label] += 1
        return choices(plan, movers)

    return counted


@given(
    shares=st.dictionaries(st.sampled_from(["A100", "V100", "T4"]), st.sampled_from([0.25, 0.5, 1.0]), max_size=3),
    received=st.dictionaries(st.sampled_from(["A100", "V100", "T4"]), st.sampled_from([0.0, 900.0, 1800.0])),
    age=st.sampled_from([0.0, 1800.0, 3600.0]),
    gpus=st.sampled_from([1, 2, 8]),
)
def test_the_reason_names_the_model_max_names(
    shares: dict[str, float], received: dict[str, float], age: float, gpus: int
) -> None:
    """Ties are frequent here (equal shares, equal seconds): the first of equals is named, as `max` names it."""
    job = Job(id="j", queue="q", request=WorkerRequest(gpus=gpus), submit_seq=0, submitted_at=0.0)
    plan = RoundPlan(0.0, 360.0, 1.0)
    plan.jobs[job.id] = JobPlan(job, None, shares, received, age, 1.0, 1.0, {}, gpus)
    assert plugins.waiting_reason(plan, job, 10.0) == full_reason(plan, job, 10.0)
