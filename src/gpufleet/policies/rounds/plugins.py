"""The round allocator's plugins: they realise a round's plan (`plan.RoundPlan`) in the ordinary cycle.

- `RoundOrder` (order): at a round's start, jobs planned for the round first, in plan order, the others
  after, by priority; mid-round, least service first.
- `RoundAdmit` (admit): a planned job may use only the GPU model it is planned on. With `Planner.fill`, jobs
  not planned (and, mid-round, any job) may take GPUs that are free, so the cluster stays busy, but never
  preempt; without it (Gavel's own mechanism) jobs start only at a round's start, as planned.
- `RoundPreempt` (preempt): a planned job that does not fit stops running jobs on its model that the plan
  left out, lowest priority first, with the checkpoint signal and grace period of any preemption. GPUs change
  hands only at round boundaries (in the steps within `Planner.boundary_s` of a round's start: the control
  loop decides every waiting job then), and only jobs that started before the round began and have run
  `min_run_s` may be stopped, so a job started in a round keeps its GPUs to the round's end. If the jobs left
  out hold enough GPUs but on too many nodes (a gang of whole nodes among single-GPU jobs), the planned job
  clears whole nodes instead, stopping also jobs planned after it there (`_repack`).
- `RoundMigrate` (migrate): with `Planner.migrate`, at a round's start a running job the plan puts on another GPU
  model is stopped with the checkpoint signal, once per round at most, and starts again on its planned model.
- `ServiceLearner` (learner): records on which nodes each job received its GPU time, which the plan turns into
  time received per GPU model (the control loop feeds it; it reaches the cycle as data, `RunEstimate.service`).

The plan is computed once per cycle by a `Planner` shared by the three plugins of a profile.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import ClassVar

import numpy as np

from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.domain.throughput_table import model_key
from gpufleet.policies.rounds.plan import Planner, RoundPlan, gpu_models
from gpufleet.scheduling.plugin_api import (
    SUCCESS,
    ClusterView,
    Holding,
    JobView,
    RunEstimate,
    SortKey,
    Status,
    VictimChoice,
    WhatIf,
    wait,
)

NAME = "rounds"


def current_plan(planner: Planner, cluster: ClusterView) -> RoundPlan:
    return cluster.per_cycle(("rounds.plan", planner), lambda: planner.plan(cluster))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _waiting_reason(planner: Planner, plan: RoundPlan, job: Job, cluster: ClusterView) -> str:
    """`waiting_reason`, once per job and cycle (admission and preemption both give it)."""
    reasons: dict[JobId, str] = cluster.per_cycle(("rounds.reasons", planner), dict)
    reason = reasons.get(job.id)
    if reason is None:
        reason = reasons[job.id] = waiting_reason(plan, job, cluster.now)
    return reason


def waiting_reason(plan: RoundPlan, job: Job, now: float) -> str:
    """Why a job waits for a round, in people's words (what `explain` shows)."""
    entry = plan.jobs.get(job.id)
    next_in = _minutes(max(0.0, plan.next_round - now))
    if entry is None or not entry.share:
        return f"waiting for a round: the allocation gives it no GPU share now; next round in {next_in}"
    # The model it lags most on (the first of equals, as `max` gives), inline: this runs for every waiting job.
    age, received = entry.age, entry.received
    model, lag = "", -math.inf
    for name, share in entry.share.items():
        behind = share * age - received.get(name, 0.0)  # `entry.lag_s(name)`
        if not model or behind > lag:
            model, lag = name, behind
    gpus = job.gpu_milli_total / MILLI_PER_GPU or 1.0
    if lag > 0:
        where = f"behind its fair share of {model} time by {lag * gpus / 3600:.1f} GPU-hours"
    else:
        where = f"ahead of its fair share ({entry.share[model]:.0%} of {model} time) while others lag more"
    return f"waiting for a round: {where}; next round in {next_in}"


def _next_round_in(planner: Planner, now: float) -> str:
    return _minutes(planner.round_start(now) + planner.round_s - now)


class RoundOrder:
    name: ClassVar[str] = NAME

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        if not cluster.queued or not self.planner.at_boundary(cluster.now):
            # Outside a cycle (the loop keys a new job), or mid-round (free GPUs only): least service first.
            return (1, job.attained_gpu_seconds / max(1.0, job.gpu_milli_total / MILLI_PER_GPU), job.submitted_at)
        plan = current_plan(self.planner, cluster)
        rank = plan.rank.get(job.id)
        if rank is not None:
            return (0, float(rank), job.submitted_at)
        entry = plan.jobs.get(job.id)
        return (1, -entry.deficit if entry is not None else 0.0, job.submitted_at)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return ()


class RoundAdmit:
    name: ClassVar[str] = NAME

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def admit(self, view: JobView, cluster: ClusterView) -> Status:
        if not cluster.queued:
            return SUCCESS
        job = view.job
        planner = self.planner
        if not planner.at_boundary(cluster.now):
            if not planner.fill:
                return wait(NAME, f"waiting for a round: next round in {_next_round_in(planner, cluster.now)}")
            return self._if_free(view, cluster, None)
        plan = current_plan(planner, cluster)
        model = plan.assigned.get(job.id)
        if model is None:
            # Not planned this round: it may take GPUs nobody planned for, if there are any.
            return (
                self._if_free(view, cluster, plan)
                if planner.fill
                else wait(NAME, _waiting_reason(planner, plan, job, cluster))
            )
        view.model_lut &= self._only(cluster, model)
        return SUCCESS

    def _if_free(self, view: JobView, cluster: ClusterView, plan: RoundPlan | None) -> Status:
        job = view.job
        nodes = cluster.nodes
        free = cluster.current(("rounds.free_milli",), lambda: int(nodes.node_milli_free.sum()))
        if free >= job.gpu_milli_total:
            # Unplanned GPUs, but never on a model where the table says the job makes no progress.
            models, _ = self.planner.models(cluster)
            row = self.planner.row(models, job)
            for model, speed in zip(models, row, strict=True):
                if speed <= 0:
                    view.model_lut &= ~self._only(cluster, model)
            return SUCCESS
        if plan is None:
            return wait(
                NAME, f"waiting for a round: no free GPUs; next round in {_next_round_in(self.planner, cluster.now)}"
            )
        return wait(NAME, _waiting_reason(self.planner, plan, job, cluster))

    @staticmethod
    def _only(cluster: ClusterView, model: str) -> np.ndarray:
        """The model-id mask (+1 "no GPU" slot) of the GPU model `model` (compared by `model_key`)."""

        def compute() -> np.ndarray:
            models = cluster.nodes.models
            keep = np.zeros(len(models) + 1, dtype=np.bool_)
            for i, name in enumerate(models):
                keep[i] = model_key(name) == model
            return keep

        return cluster.memo(("rounds.only", model), compute)


class RoundPreempt:
    name: ClassVar[str] = NAME

    def __init__(self, planner: Planner, *, min_run_s: float = 0.0) -> None:
        self.planner = planner
        self.min_run_s = min_run_s

    def _stoppable(self, holding: Holding, cluster: ClusterView, plan: RoundPlan) -> bool:
        """Whether a running job may be stopped this round: preemptible, and its round is over."""
        running = holding.running
        if running is None or not holding.job.preemptible:
            return False
        return running.started_at < plan.round_start and cluster.now - running.started_at >= self.min_run_s

    def _eligible(self, holding: Holding, cluster: ClusterView, plan: RoundPlan) -> str | None:
        """The model a running job could be stopped on for a planned job (None: it keeps running)."""
        if not self._stoppable(holding, cluster, plan):
            return None
        job_id = holding.job.id
        entry = plan.jobs.get(job_id)
        if entry is None or entry.running_on is None or plan.assigned.get(job_id) == entry.running_on:
            return None  # the plan keeps it where it is
        return entry.running_on

    def _candidates(self, cluster: ClusterView, plan: RoundPlan) -> dict[str, list[tuple[float, int, JobId]]]:
        """Per model, the running jobs the plan leaves out there, lowest priority first (once per cycle)."""

        def compute() -> dict[str, list[tuple[float, int, JobId]]]:
            by_model: dict[str, list[tuple[float, int, JobId]]] = defaultdict(list)
            for job_id, holding in cluster.holdings.items():
                model = self._eligible(holding, cluster, plan)
                if model is not None:
                    priority = plan.jobs[job_id].priority(model)
                    by_model[model].append((priority, -holding.job.submit_seq, job_id))
            for ranked in by_model.values():
                ranked.sort()
            return by_model

        return cluster.per_cycle(("rounds.candidates", self), compute)

    def _first_not_stopping(self, ranked: list[tuple[float, int, JobId]], model: str, cluster: ClusterView) -> int:
        """The index in `ranked` (the model's candidates) of the first job not being stopped; the jobs before it
        are being stopped, and stay so for the rest of the cycle."""
        passed: dict[str, int] = cluster.per_cycle(("rounds.passed", self), dict)
        start, evicting = passed.get(model, 0), cluster.evicting
        while start < len(ranked) and ranked[start][2] in evicting:
            start += 1
        passed[model] = start
        return start

    def preempt(self, view: JobView, cluster: ClusterView, blocked_by: Status, what_if: WhatIf) -> VictimChoice:
        job = view.job
        if not self.planner.at_boundary(cluster.now):
            next_in = _next_round_in(self.planner, cluster.now)
            reason = f"waiting for a round: GPUs change hands then; next round in {next_in}"
            return VictimChoice((), _also(blocked_by, reason))
        plan = current_plan(self.planner, cluster)
        model = plan.assigned.get(job.id)
        if model is None:
            return VictimChoice((), _also(blocked_by, _waiting_reason(self.planner, plan, job, cluster)))
        evicting, removed, holdings = cluster.evicting, cluster.removed, cluster.holdings
        # Lazily: the search stops at the first set of victims that fits. The cycle's earlier victims gather at the
        # front (being the lowest ranked), and jobs being stopped stay so for the rest of the cycle: the front of
        # jobs being stopped is passed over once per cycle, not in every search.
        ranked = self._candidates(cluster, plan).get(model, [])
        candidates = (
            c
            for c in itertools.islice(ranked, self._first_not_stopping(ranked, model, cluster), None)
            if c[2] not in evicting and c[2] not in removed and holdings[c[2]].job.priority <= job.priority
        )
        chosen: list[JobId] = []
        fits = False
        for _, _, job_id in candidates:
            chosen.append(job_id)
            with what_if.without(chosen):
                if what_if.fits(job):
                    fits = True
                    break
        planned_after: frozenset[JobId] = frozenset()
        if not fits:
            # The jobs the plan left out do not free GPUs the job can use together (a gang of whole nodes, with
            # the GPUs the plan keeps scattered over every node): clear whole nodes, taking jobs planned after it.
            chosen, planned_after = (
                self._repack(job, model, cluster, plan, what_if)
                if self._enough_gpus(job, model, cluster, chosen)
                else ([], frozenset())
            )
            if not chosen:
                reason = f"planned on {model} this round, but its GPUs are held by jobs whose round is not over"
                return VictimChoice((), _also(blocked_by, reason))
        # Reprieve: keep running every victim the job does not need, the jobs the plan keeps first.
        reprieve = [j for j in reversed(chosen) if j in planned_after] + [
            j for j in reversed(chosen[:-1]) if j not in planned_after
        ]
        for job_id in reprieve:
            trial = [j for j in chosen if j != job_id]
            with what_if.without(trial):
                if what_if.fits(job):
                    chosen = trial
        victims = tuple(
            (
                job_id,
                f"the round's plan puts {job.id} first and it needs whole {model} nodes (it lags its share more)"
                if job_id in planned_after
                else f"the round's plan gives its {model} GPUs to {job.id} (it has had more of its share)",
            )
            for job_id in chosen
        )
        return VictimChoice(victims, wait(NAME, f"waiting for {len(victims)} job(s) to stop at the round's end"))

    @staticmethod
    def _enough_gpus(job: Job, model: str, cluster: ClusterView, left_out: list[JobId]) -> bool:
        """Whether the GPUs of `model` free now or held by the jobs the plan left out there add up to what `job`
        needs: then only their arrangement keeps it out, and clearing nodes is worth it. (Otherwise it waits for
        GPUs being freed: jobs being stopped, jobs whose round is not over.)"""
        table = cluster.nodes
        available = int((table.node_milli_free[_model_rows(cluster, model)] // MILLI_PER_GPU).sum())
        for job_id in left_out:
            available += sum(len(worker.gpus) for worker in cluster.holdings[job_id].workers)
        return available * MILLI_PER_GPU >= job.gpu_milli_total

    def _repack(
        self, job: Job, model: str, cluster: ClusterView, plan: RoundPlan, what_if: WhatIf
    ) -> tuple[list[JobId], frozenset[JobId]]:
        """Victims on `model` that make room for `job` node by node: jobs the plan left out there, and jobs it
        planned there after `job` (they lose their place this round; the plan ranked `job` first). Nodes go in
        order of the fewest GPUs of such planned jobs, then the most GPUs they would free; the first prefix of
        nodes whose jobs make `job` fit gives the victims (the reprieve then keeps those not needed). Without
        this, a gang of whole nodes waits while the GPUs the plan keeps for single-GPU jobs are spread over every
        node of its model: it starved for hundreds of hours on Gavel's multi-GPU trace at 2.2 jobs/h."""
        rank = plan.rank.get(job.id)
        if rank is None:
            return [], frozenset()
        table, evicting, removed = cluster.nodes, cluster.evicting, cluster.removed
        on_node: dict[int, list[JobId]] = defaultdict(list)
        later: set[JobId] = set()
        displaced: dict[int, int] = defaultdict(int)  # node row -> GPUs of planned jobs a clear would stop there
        freed: dict[int, int] = defaultdict(int)  # node row -> GPUs a clear would free there
        for job_id, holding in sorted(cluster.holdings.items()):
            if job_id in evicting or job_id in removed or holding.job.priority > job.priority:
                continue
            if self._eligible(holding, cluster, plan) == model:
                kept = False
            elif self._kept_after(holding, cluster, plan, model, rank):
                kept = True
            else:
                continue
            for worker in holding.workers:
                row = table.index.get(worker.node)
                if row is None:
                    continue
                on_node[row].append(job_id)
                freed[row] += len(worker.gpus)
                if kept:
                    later.add(job_id)
                    displaced[row] += len(worker.gpus)

        def node_order(row: int) -> tuple[int, int, int]:
            return (displaced[row], -(freed[row] + int(table.node_milli_free[row]) // MILLI_PER_GPU), row)

        chosen: list[JobId] = []
        of_model = frozenset(_model_rows(cluster, model).tolist())
        for row in sorted((r for r in on_node if r in of_model), key=node_order):
            chosen.extend(j for j in on_node[row] if j not in chosen)
            with what_if.without(chosen):
                if what_if.fits(job):
                    return chosen, frozenset(later)
        return [], frozenset()

    def _kept_after(self, holding: Holding, cluster: ClusterView, plan: RoundPlan, model: str, rank: int) -> bool:
        """Whether a running job is planned to keep its `model` GPUs this round, ranked after `rank`, and may be
        stopped (its round is over)."""
        if not self._stoppable(holding, cluster, plan):
            return False
        job_id = holding.job.id
        entry = plan.jobs.get(job_id)
        return (
            entry is not None
            and entry.running_on == model
            and plan.assigned.get(job_id) == model
            and plan.rank.get(job_id, -1) > rank
        )


class RoundMigrate:
    """At a round's start, stop each running job the plan moves to another GPU model (`RoundPlan.moves`), so it
    starts again there, as Gavel's mechanism does, even when no waiting job asks for its GPUs. Only jobs that
    `RoundPreempt` could stop (started before the round began, `min_run_s` run) are moved: a job moves at most
    once per round. The control loop asks at every round's start, even when nobody waits; then no preemption
    makes room on the target, so a job moves only to GPUs of its target model idle now."""

    name: ClassVar[str] = NAME

    def __init__(self, planner: Planner, *, min_run_s: float = 0.0) -> None:
        self.planner = planner
        self.min_run_s = min_run_s

    def migrations(self, cluster: ClusterView) -> list[tuple[JobId, str]]:
        if not self.planner.at_boundary(cluster.now):
            return []
        plan = current_plan(self.planner, cluster)
        moved: list[tuple[JobId, str]] = []
        # With nobody waiting, no preemption makes room on the target: a job moves only to GPUs idle now.
        idle = None if cluster.queued else _idle_gpus(cluster)
        for job_id, target in sorted(plan.moves.items()):
            holding = cluster.holdings.get(job_id)
            if holding is None or job_id in cluster.evicting:
                continue
            running = holding.running
            if running is None or not holding.job.preemptible:
                continue
            if running.started_at >= plan.round_start or cluster.now - running.started_at < self.min_run_s:
                continue
            if idle is not None:
                gpus = max(1, round(holding.job.gpu_milli_total / MILLI_PER_GPU))
                if idle.get(target, 0) < gpus:
                    continue
                idle[target] -= gpus
            source = plan.jobs[job_id].running_on
            moved.append((job_id, f"the round's plan moves it from {source} to {target} (its share of {target})"))
        return moved


def _model_rows(cluster: ClusterView, model: str) -> np.ndarray:
    """The node rows whose GPUs are of `model` (`model_key`; depends on the inventory only)."""

    def compute() -> np.ndarray:
        return np.array([row for row, gpus in enumerate(gpu_models(cluster)) if gpus and gpus[0] == model], np.int64)

    return cluster.memo(("rounds.model_rows", model), compute)


def _idle_gpus(cluster: ClusterView) -> dict[str, int]:
    """Whole GPUs free now per GPU model (`model_key`)."""
    table = cluster.nodes
    idle: dict[str, int] = defaultdict(int)
    for row, gpus in enumerate(gpu_models(cluster)):
        free = int(table.node_milli_free[row]) // MILLI_PER_GPU
        if gpus and free:
            idle[gpus[0]] += free
    return idle


def _also(blocked_by: Status, reason: str) -> Status:
    """What blocked the job (its code, plugin and wake hint), and the round's reason after it."""
    return Status(blocked_by.code, (*blocked_by.reasons, reason), blocked_by.plugin, blocked_by.wake_on)


class ServiceLearner:
    """Records, per job, the GPU-seconds it received on each node; estimates carry them (`service`)."""

    name: ClassVar[str] = NAME

    def __init__(self) -> None:
        self._runs: dict[JobId, RunningJob] = {}
        self._service: dict[JobId, dict[str, float]] = defaultdict(dict)

    def started(self, run: RunningJob) -> None:
        self._runs[run.id] = run

    def ended(self, job_id: JobId, now: float, *, finished: bool) -> None:
        run = self._runs.pop(job_id, None)
        if finished:
            self._service.pop(job_id, None)
            return
        if run is None:
            return
        seconds = max(0.0, now - run.started_at)
        record = self._service[job_id]
        for worker in run.workers:
            gpus = sum(share.milli for share in worker.gpus) / MILLI_PER_GPU
            if gpus:
                record[worker.node] = record.get(worker.node, 0.0) + gpus * seconds

    def estimate(self, job: Job, now: float, earlier: RunEstimate | None) -> RunEstimate:
        service = tuple(sorted(self._service.get(job.id, {}).items()))
        return RunEstimate(job.submitted_at, 0.0, 0.0, service)
