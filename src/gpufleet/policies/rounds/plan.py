"""A round's plan, from the cycle's view: which jobs run on which GPU model next, and how far each lags its share.

Gavel's round-based mechanism (Narayanan et al., OSDI 2020, §5): the allocation (`lp.solve`) gives every active
job a target fraction of time `x[j, m]` on each GPU model, hence a target normalised throughput `r[j]` (1.0 =
what an equal share of the cluster gives it). Each round the jobs that lag their target most go first:

    served[j]  = sum over models of seconds it ran there x its normalised speed there
    deficit[j] = r[j] * (now - submitted_at) - served[j]

and jobs take models in order of deficit, each job once, on the model of its allocation where its time lags
its share most (`x[j, m] * age - seconds on m`) that still has GPUs for it, within its queue's budget of that
model for the round; a job that fits nowhere planned waits. Gavel ranks (job, model) pairs by share wanted
over share received per model; counting lag in normalised service instead corrects the rounding of every
earlier round, so what each job receives tracks the LP's allocation, which is what fairness is measured in.
A running job planned on another model than its own is stopped at the round's start when a planned job
needs its GPUs, or, with `migrate` (one queue only), in any case (`RoundPlan.moves`, realised by
`plugins.RoundMigrate`), and takes its planned model from the queue; with `migrate` it stays where it is unless
it lags elsewhere by more than `restart_s` more.

With `isolated_floor` f > 0, jobs whose normalised service is below f times what Gavel's isolated share (each
of the n active jobs 1/n of every model) would have given them over their time in the system go first, the
furthest behind first: finish-time fairness (rho, JCT over JCT under that share) is over 1 for exactly the
jobs that fall behind it.

The plan is a pure function of the view: the running jobs (`holdings`), the waiting jobs (`queued`), what
the learner recorded (`estimates[...].service`), the node table and the time. It is computed once per cycle
(`ClusterView.per_cycle`), at round starts only; the LP is cached by its input (the classes and their
counts), which changes only when jobs come, go or change weight band.

Active jobs are the running ones and every waiting one (`ClusterView.queued`; jobs being stopped count as
waiting). A job type the throughput table lacks, or a model it lacks, counts at the same speed on every
model (as the agnostic baseline counts every job); a job spread over nodes (unconsolidated) on a model measured
only on one node takes that measurement (`ThroughputTable.get`: filled with the other models' mean instead, the LP
gave ResNet-50 on 8 GPUs K80 time, where it does not run, and such jobs made no progress for hundreds of hours);
`agnostic=True` counts every job that way (Gavel's
`max_min_fairness`). Bands of service (`WeightBands`) weigh jobs inside a queue only: a queue's jobs share
its weight in proportion to their bands.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.domain.throughput_table import ThroughputTable, job_scale, model_key
from gpufleet.policies.rounds.lp import Allocation, Problem, solve
from gpufleet.scheduling.plugin_api import ClusterView, Holding

# Time in the system below which a job's received fraction is not meaningful (its priority is then its share).
MIN_AGE_S = 1.0
# Shares below this are rounding noise of the LP: the job is not planned on that model.
MIN_SHARE = 1e-6
GOLDEN = 0.6180339887498949  # the rounding offsets of queues' budgets advance by this every round


@dataclass(frozen=True, slots=True)
class WeightBands:
    """Weights by attained service (GPU-hours over the job's GPUs, i.e. hours of service): a job whose
    service is below `thresholds_h[i]` has weight `weights[i]`, above all of them `weights[-1]`. One band of
    weight 1 is plain max-min fairness (Gavel); falling weights favour jobs that have had little service,
    as least-attained-service schedulers do (Tiresias)."""

    thresholds_h: tuple[float, ...] = ()
    weights: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.thresholds_h) + 1 or not all(w > 0 for w in self.weights):
            raise ValueError("give one weight > 0 per band: len(weights) == len(thresholds_h) + 1")

    def weight(self, service_hours: float) -> float:
        for threshold, weight in zip(self.thresholds_h, self.weights, strict=False):
            if service_hours < threshold:
                return weight
        return self.weights[-1]


@dataclass(slots=True)
class JobPlan:
    """One active job in the round: its target share and received seconds per model, its priority on each."""

    job: Job
    running_on: str | None  # the model it runs on now (None: pending, or evicting)
    share: dict[str, float]
    received: dict[str, float]
    age: float
    weight: float
    normalised: float  # its normalised throughput under the allocation (1.0 = an equal share of the cluster)
    gain: dict[str, float] = field(default_factory=dict)  # normalised throughput per second on each model
    gpus: int = 1  # whole GPUs it runs on (at least 1)
    # `served` and `deficit`, once computed: a plan is read many times in its cycle (the order, the admission, the
    # victims) and its entries do not change after `Planner.plan` made them.
    _served: float | None = field(default=None, init=False, repr=False, compare=False)
    _deficit: float | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def served(self) -> float:
        """Normalised service received so far (seconds on each model times its normalised speed there)."""
        if self._served is None:
            gain = self.gain
            self._served = sum(seconds * gain.get(model, 0.0) for model, seconds in self.received.items())
        return self._served

    @property
    def deficit(self) -> float:
        """How far its normalised service lags what its allocation gives it over its time in the system."""
        if self._deficit is None:
            self._deficit = self.normalised * self.age - self.served
        return self._deficit

    def priority(self, model: str) -> float:
        """How much it lags its target (normalised seconds); 0 where its allocation gives it no time."""
        return self.deficit if self.share.get(model, 0.0) > MIN_SHARE else float("-inf")

    def lag_s(self, model: str) -> float:
        """Seconds of `model` it is behind its target (negative: ahead)."""
        return self.share.get(model, 0.0) * self.age - self.received.get(model, 0.0)


@dataclass(slots=True)
class RoundPlan:
    """`assigned`: job -> the model it runs on this round, in plan order (`rank`); `jobs`: every active job;
    `round_start`/`next_round`: the round's bounds on the cycle's clock; `level`: the LP's max-min level."""

    round_start: float
    next_round: float
    level: float
    jobs: dict[JobId, JobPlan] = field(default_factory=dict)
    assigned: dict[JobId, str] = field(default_factory=dict)
    rank: dict[JobId, int] = field(default_factory=dict)
    # With `Planner.migrate`: running jobs assigned another model than the one they run on, and that model.
    moves: dict[JobId, str] = field(default_factory=dict)


class Planner:
    """Builds round plans for a throughput table (None: agnostic), with its LP cache."""

    def __init__(
        self,
        table: ThroughputTable | None,
        *,
        round_s: float,
        agnostic: bool = False,
        bands: WeightBands | None = None,
        efficient: bool = True,
        queue_fair: bool = True,
        fill: bool = True,
        boundary_s: float = 5.0,
        restart_s: float = 0.0,
        migrate: bool = False,
        isolated_floor: float = 0.0,
    ) -> None:
        self.agnostic = agnostic
        self.table = None if agnostic else table
        self.migrate = migrate
        self.isolated_floor = isolated_floor
        self.round_s = round_s
        self.fill = fill
        self.boundary_s = boundary_s
        self.restart_s = restart_s
        self.bands = bands or WeightBands()
        self.efficient = efficient
        self.queue_fair = queue_fair
        self._types = frozenset(self.table.job_types) if self.table is not None else frozenset()
        self._rows: dict[tuple[tuple[str, ...], str, int, bool], tuple[float, ...]] = {}
        self._solved: dict[tuple[object, ...], Allocation] = {}
        self.last_problem: Problem | None = None  # the LP of the latest plan (for benchmarks and tests)

    def follow(self, measured: ThroughputTable | None) -> None:
        """Read the cycle's measured table (`ClusterView.throughput`) when it has one, dropping the rows derived
        from the previous table (the LP cache is keyed by the rows, so it follows by itself)."""
        if measured is None or measured is self.table or self.agnostic:
            return
        self.table = measured
        self._types = frozenset(measured.job_types)
        self._rows.clear()

    def round_start(self, now: float) -> float:
        return float(math.floor(now / self.round_s) * self.round_s)

    def at_boundary(self, now: float) -> bool:
        """Whether `now` opens a round (within `boundary_s` of its start): the control loop decides every waiting
        job then, and only then is a plan made and are GPUs taken from running jobs."""
        return now - self.round_start(now) <= self.boundary_s

    # --- pieces ------------------------------------------------------------------------------------------

    def models(self, cluster: ClusterView) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The cluster's GPU models (those with GPUs) and their GPU counts."""

        def compute() -> tuple[tuple[str, ...], tuple[int, ...]]:
            table = cluster.nodes
            counts = np.bincount(table.gpu_model[table.gpu_exists], minlength=len(table.models))
            kept = [(model_key(m), int(n)) for m, n in zip(table.models, counts, strict=False) if n]
            return tuple(m for m, _ in kept), tuple(n for _, n in kept)

        return cluster.memo(("rounds.models",), compute)

    def row(self, models: tuple[str, ...], job: Job) -> tuple[float, ...]:
        """The job's throughput on each model at its GPU count; equal speeds where the table cannot say."""
        gpus, consolidated = job_scale(job)
        key = (models, job.job_type, gpus, consolidated)
        cached = self._rows.get(key)
        if cached is None:
            if self.table is None or job.job_type not in self._types:
                cached = (1.0,) * len(models)
            else:
                speeds = [self.table.get(job.job_type, m, gpus, consolidated=consolidated) for m in models]
                known = [s for s in speeds if s is not None]
                fill = float(np.mean(known)) if known else 1.0
                cached = tuple(float(s) if s is not None else fill for s in speeds)
                if not any(cached):
                    cached = (1.0,) * len(models)
            self._rows[key] = cached
        return cached

    def received(self, cluster: ClusterView, job: Job, holding: Holding | None) -> dict[str, float]:
        """Seconds of service per model: earlier runs (the learner's record, by node) and the current run."""
        table = cluster.nodes
        gpus = job.gpu_milli_total / MILLI_PER_GPU or 1.0
        seconds: dict[str, float] = {}
        estimate = cluster.estimates.get(job.id)
        recorded = 0.0
        if estimate is not None:
            for node, gpu_seconds in estimate.service:
                row = table.index.get(node)
                if row is None:
                    continue
                model = _node_model(cluster, row)
                if model is not None:
                    seconds[model] = seconds.get(model, 0.0) + gpu_seconds / gpus
                    recorded += gpu_seconds
        if holding is not None and holding.running is not None:
            model = _job_model(cluster, holding)
            if model is not None:
                seconds[model] = seconds.get(model, 0.0) + max(0.0, cluster.now - holding.running.started_at)
        # Service the learner has no record of (e.g. earned before a restart of the control plane) is counted,
        # without a model, in `unplaced`: `plan` spreads it over the job's shares.
        unrecorded = max(0.0, job.attained_gpu_seconds - recorded) / gpus
        if unrecorded > 1.0:
            seconds[""] = unrecorded
        return seconds

    # --- the plan ----------------------------------------------------------------------------------------

    def plan(self, cluster: ClusterView) -> RoundPlan:
        self.follow(cluster.throughput)
        now = cluster.now
        start = np.floor(now / self.round_s) * self.round_s
        models, counts = self.models(cluster)
        result = RoundPlan(float(start), float(start + self.round_s), 0.0)
        active: list[tuple[Job, Holding | None]] = []
        stopping: list[Job] = []  # being stopped: active, but they run nowhere next (they wait, then compete)
        for job_id in sorted(cluster.holdings):
            holding = cluster.holdings[job_id]
            if holding.running is None:
                continue
            if job_id in cluster.evicting:
                stopping.append(holding.job)
            else:
                active.append((holding.job, holding))
        active.extend((job, None) for job in sorted((*cluster.queued, *stopping), key=lambda j: j.id))
        if not active or not models:
            return result
        queues = cluster.quotas.queues
        received_of = [self.received(cluster, job, holding) for job, holding in active]
        bands = [self.bands.weight(sum(r.values()) / 3600.0) for r in received_of]
        # A queue's jobs share its weight in proportion to their bands: bands order service inside a queue,
        # never between queues.
        band_sums: dict[str, float] = defaultdict(float)
        for (job, _), band in zip(active, bands, strict=True):
            band_sums[job.queue] += band
        # Classes: (queue, throughput row, GPUs, weight) -> jobs.
        classes: dict[tuple[str, tuple[float, ...], int, float], list[int]] = {}
        facts: list[tuple[dict[str, float], float, int]] = []
        for i, (job, _) in enumerate(active):
            received = received_of[i]
            weight = bands[i]
            if self.queue_fair:
                spec = queues.get(job.queue)
                weight *= (spec.weight if spec is not None else 1.0) / band_sums[job.queue]
            gpus = max(1, round(job.gpu_milli_total / MILLI_PER_GPU))
            facts.append((received, weight, gpus))
            queue = job.queue if self.queue_fair else ""
            classes.setdefault((queue, self.row(models, job), gpus, weight), []).append(i)
        keys = sorted(classes)
        names = sorted({k[0] for k in keys})
        group_weights = tuple((queues[q].weight if q in queues else 1.0) if self.queue_fair else 1.0 for q in names)
        allocation = self._solve(keys, [len(classes[k]) for k in keys], counts, names, group_weights)
        result.level = allocation.level
        total = sum(counts)
        gains = []
        for key in keys:
            row = key[1]
            entitled = sum(t * n for t, n in zip(row, counts, strict=True)) / total
            gains.append({m: t / entitled for m, t in zip(models, row, strict=True)} if entitled > 0 else {})
        shares, normalised_of = allocation.share.tolist(), allocation.normalised.tolist()  # Python floats: fast
        for c, key in enumerate(keys):
            # One share per class, read-only, shared by its jobs' plans.
            share = {m: s for m, s in zip(models, shares[c], strict=True) if s > MIN_SHARE}
            normalised = normalised_of[c]
            for i in classes[key]:
                job, held = active[i]
                received, weight, gpus = facts[i]
                unplaced = received.pop("", 0.0)
                if unplaced and share:
                    shared = sum(share.values())
                    for m, s in share.items():
                        received[m] = received.get(m, 0.0) + unplaced * s / shared
                result.jobs[job.id] = JobPlan(
                    job,
                    _job_model(cluster, held) if held is not None else None,
                    share,
                    received,
                    max(0.0, now - job.submitted_at),
                    weight,
                    normalised,
                    gains[c],
                    gpus,
                )
        self._assign(result, dict(zip(models, counts, strict=True)), frozenset(j.id for j in stopping), now)
        return result

    def _solve(
        self,
        keys: Sequence[tuple[str, tuple[float, ...], int, float]],
        sizes: list[int],
        capacity: tuple[int, ...],
        groups: list[str],
        group_weights: tuple[float, ...],
    ) -> Allocation:
        cache_key = (tuple(keys), tuple(sizes), capacity, group_weights)
        hit = self._solved.get(cache_key)
        if hit is None:
            group_of = {q: i for i, q in enumerate(groups)}
            problem = self.last_problem = Problem(
                throughput=np.array([k[1] for k in keys], dtype=np.float64),
                gpus=np.array([k[2] for k in keys], dtype=np.int64),
                count=np.array(sizes, dtype=np.int64),
                weight=np.array([k[3] for k in keys], dtype=np.float64),
                capacity=np.array(capacity, dtype=np.int64),
                group=np.array([group_of[k[0]] for k in keys], dtype=np.int64),
                group_weight=np.array(group_weights, dtype=np.float64),
            )
            hit = solve(problem, efficient=self.efficient)
            if len(self._solved) > 4096:
                self._solved.clear()
            self._solved[cache_key] = hit
        return hit

    def _rank_value(self, plan: JobPlan, movers: frozenset[str] = frozenset()) -> float:
        """How strongly a job claims the round: its lag in normalised seconds, plus, for a running job, the
        service a stop would cost it (`restart_s`). (Ranking by lag relative to the target instead, as Gavel's
        ratio does, put new jobs first and gave a longer average JCT: 20.17 h against 19.27 h at 4.8 jobs/h.)"""
        keep = self.restart_s * plan.normalised if plan.running_on is not None else 0.0
        if keep and plan.job.queue in movers and self._choices(plan, movers)[0] != plan.running_on:
            # It lags most elsewhere: it would move, and a move costs the restart anyway. Ranked as if waiting, it
            # gets the same place when it waits again after the move (the plan is made afresh then), so the move
            # is not undone by a job it had outranked only by the bonus.
            keep = 0.0
        return plan.deficit + keep

    def _isolated_rate(self, result: RoundPlan, gpus: int) -> float:
        """GPUs per active job now: Gavel's isolated allocation gives each of the n active jobs 1/n of every
        model (at most all of its time), so a job of g GPUs progresses at min(1, this / g) normalised."""
        return gpus / len(result.jobs) if result.jobs and self.isolated_floor > 0 else 0.0

    def _floor_key(self, plan: JobPlan, isolated_rate: float) -> tuple[int, float]:
        """With `isolated_floor` f > 0: a job whose normalised service is below f times what the isolated share
        would have given it over its time in the system (at today's number of active jobs) comes first, the
        furthest behind (by that ratio) first. Finish-time fairness (Gavel's rho: JCT over JCT under the
        isolated share) is over 1 for exactly the jobs that fall behind that share; bands of service favour
        short jobs, and without the floor the long ones starve at high load."""
        if isolated_rate <= 0:
            return (1, 0.0)
        expected = plan.age * min(1.0, isolated_rate / plan.gpus)
        if expected < MIN_AGE_S:
            return (1, 0.0)
        progress = plan.served / expected
        return (0, progress) if progress < self.isolated_floor else (1, 0.0)

    def _choices(self, plan: JobPlan, movers: frozenset[str]) -> list[str]:
        """The models of a job's allocation, the one it lags most on first (ties by name). With `migrate`, a
        running job's own model comes first unless it lags elsewhere by more than `restart_s` more: a move costs
        a restart, and without the margin jobs that run past their share (mid-round fill) would move every
        round."""
        choices = sorted(plan.share, key=lambda m: (-plan.lag_s(m), m))
        here = plan.running_on
        if (
            plan.job.queue in movers
            and here in plan.share
            and choices[0] != here
            and plan.lag_s(choices[0]) - plan.lag_s(here) <= self.restart_s
        ):
            choices.remove(here)
            choices.insert(0, here)
        return choices

    def _movers(self, result: RoundPlan) -> frozenset[str]:
        """The queues whose running jobs may move (`migrate`): only while one queue has active jobs. A move
        frees GPUs that the round's fill gives to whoever waits and lags most, and sends the job to GPUs that
        another queue's jobs may hold beyond its budget; with several queues that broke their equal shares (two
        teams on 8 x A100 + 8 x V100 + 8 x T4, tests/sim/test_rounds_fairness.py: 8.7-9.4 % apart with moves,
        3.4 % without), so there the plan's budgets are realised by preemption alone."""
        if not self.migrate:
            return frozenset()
        queues = frozenset(plan.job.queue for plan in result.jobs.values())
        return queues if len(queues) == 1 else frozenset()

    def _assign(self, result: RoundPlan, free: dict[str, int], stopping: frozenset[JobId], now: float) -> None:
        """Jobs by deficit (largest first), each on the model of its allocation it lags most on that still has
        its GPUs, within its queue's budget of that model this round. A running job planned on another model
        than its own is stopped at the round's start when a planned job needs its GPUs, and then takes its
        planned model from the queue.

        A queue's budget of a model is the GPUs its jobs' shares add up to (the LP's, which gives queues equal
        shares per weight), rounded with an offset that moves every round (a low-discrepancy sequence), so a
        queue gets its fractional GPUs in the right proportion of rounds; what the budgets leave free goes
        to whoever lags most."""
        # A running job that stops loses `restart_s` of service (the restart): it keeps its place unless another
        # job lags it by more than that.
        movers = self._movers(result)
        isolated_rate = self._isolated_rate(result, sum(free.values()))
        order = sorted(
            (
                *self._floor_key(plan, isolated_rate),
                -self._rank_value(plan, movers),
                plan.job.submit_seq,
                job_id,
            )
            for job_id, plan in result.jobs.items()
            if job_id not in stopping and plan.share
        )
        wanted: dict[tuple[str, str], float] = defaultdict(float)
        for plan in result.jobs.values():
            gpus, queue = plan.gpus, plan.job.queue
            for model, share in plan.share.items():
                wanted[(queue, model)] += gpus * share
        round_index = int(np.floor(now / self.round_s))
        budget = {
            key: int(np.floor(amount + ((round_index * GOLDEN + i * 0.5) % 1.0)))
            for i, (key, amount) in enumerate(sorted(wanted.items()))
        }
        left: list[str] = []
        unassigned = sum(free.values())  # GPUs not yet planned: once none are left, no later job fits
        for within_budget in (True, False):
            for job_id in [key[-1] for key in order] if within_budget else left:
                if unassigned <= 0:
                    break
                plan = result.jobs[job_id]
                gpus, queue = plan.gpus, plan.job.queue
                if not any(
                    free.get(m, 0) >= gpus and (not within_budget or budget.get((queue, m), 0) >= gpus)
                    for m in plan.share
                ):
                    # No model of its allocation has room for it (within budget): whatever the order of its
                    # choices, it is not planned in this pass.
                    if within_budget:
                        left.append(job_id)
                    continue
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


def gpu_models(cluster: ClusterView) -> tuple[tuple[str, ...], ...]:
    """Each node's GPUs' models (`model_key`), by node row and GPU index: node capacity only, so computed once per
    inventory (the plan asks for them for every active job, every cycle)."""

    def compute() -> tuple[tuple[str, ...], ...]:
        table = cluster.nodes
        keys = [model_key(name) for name in table.models]
        return tuple(
            tuple(keys[int(m)] for m in table.gpu_model[row][table.gpu_exists[row]]) for row in range(len(table.names))
        )

    return cluster.memo(("rounds.gpu_models",), compute)


def _node_model(cluster: ClusterView, row: int) -> str | None:
    gpus = gpu_models(cluster)[row]
    return gpus[0] if gpus else None


def _job_model(cluster: ClusterView, holding: Holding) -> str | None:
    """The GPU model a running job holds (its first GPU's; jobs are planned on one model)."""
    index = cluster.nodes.index
    for worker in holding.workers:
        row = index.get(worker.node)
        if row is None or not worker.gpus:
            continue
        return gpu_models(cluster)[row][worker.gpus[0].index]
    return None
