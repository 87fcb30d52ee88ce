"""What queue budgets do to a workload, simulated (`gpufleet sim --budget QUEUE=AMOUNT[:…]`).

The live control plane measures each budgeted queue's spend, finds where it stands (`domain.costs.budget_status`:
ok, notice at 80 %, exceeded at 100 %) and acts on an exceeded budget by the queue's action: `warn` (an event
only), `deprioritise` (the queue's `QueueSpec.deprioritised` is set, so the scheduling core runs its jobs only on
capacity nobody else wants and picks them first as victims) or `block` (new submissions refused; running jobs
go on). `BudgetMeter` does the same in the simulator, as an observer stepped after every simulation step: spend
is the GPUs each queue holds (per model and pool) x the price table (`domain.costs.PriceTable`, the table that
bills live jobs) over simulated time, the status and its effects come from the same domain code, and the
deprioritised flag reaches the same core as data. A `block` refuses the queue's arrivals from then on, as the
live API refuses its submissions.

**Two variants**, same jobs, same scheduling profile: `no budgets` and `budgets`. For each budgeted queue the
report gives what it spent, when it passed 80 % and 100 %, the submissions refused, and its jobs' mean JCT;
and for the whole run the cost and the mean JCT of the other queues (what a budget gives back to them).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.control.reconciler import Reconciler
from gpufleet.domain.costs import (
    Budget,
    BudgetAction,
    BudgetLevel,
    BudgetPeriod,
    BudgetStatus,
    BudgetUnit,
    Pool,
    PriceTable,
    budget_status,
    budget_window,
)
from gpufleet.domain.jobs import Job
from gpufleet.domain.lifecycle import JobState
from gpufleet.policies.catalog import profile
from gpufleet.sim.engine import SimRun, SimSettings, Simulation
from gpufleet.sim.experiment import policy_data
from gpufleet.sim.workload import Workload, WorkloadError

VARIANTS = ("no budgets", "budgets")
HOUR = 3600.0


def parse_budget(text: str) -> Budget:
    """`QUEUE=AMOUNT[:UNIT][:ACTION][:PERIOD]`, e.g. `team-a=500` (USD a calendar month, warn) or
    `team-b=200:gpu-hours:block:rolling-30d`; the optional parts in any order."""
    queue, sep, rest = text.partition("=")
    fix = "give QUEUE=AMOUNT[:usd|gpu-hours][:warn|deprioritise|block][:month|rolling-30d], e.g. team-a=500:block"
    if not sep or not queue.strip() or not rest:
        raise WorkloadError(f"--budget {text!r} is not QUEUE=AMOUNT", fix)
    amount_text, *options = rest.split(":")
    try:
        amount = float(amount_text)
    except ValueError:
        raise WorkloadError(f"--budget {text!r}: the amount {amount_text!r} is not a number", fix) from None
    chosen: dict[str, Any] = {}
    for option in options:
        for name, kind in (("unit", BudgetUnit), ("action", BudgetAction), ("period", BudgetPeriod)):
            if option in {member.value for member in kind}:
                if name in chosen:
                    raise WorkloadError(f"--budget {text!r} gives its {name} twice", fix)
                chosen[name] = kind(option)
                break
        else:
            raise WorkloadError(f"--budget {text!r}: {option!r} is no unit, action or period", fix)
    return Budget(queue.strip(), amount, **chosen)  # the domain checks the rest (e.g. amount > 0), with its fix


@dataclass
class _Spend:
    """A queue's cumulative spend at the end of each metered interval: (time, USD, GPU-hours)."""

    times: list[float] = field(default_factory=list)
    usd: list[float] = field(default_factory=list)
    gpu_hours: list[float] = field(default_factory=list)

    def add(self, at: float, usd: float, gpu_hours: float) -> None:
        self.times.append(at)
        self.usd.append((self.usd[-1] if self.usd else 0.0) + usd)
        self.gpu_hours.append((self.gpu_hours[-1] if self.gpu_hours else 0.0) + gpu_hours)

    def since(self, start: float) -> tuple[float, float]:
        """Spend after `start` (intervals that ended by `start` are left out)."""
        if not self.times:
            return 0.0, 0.0
        before = bisect.bisect_right(self.times, start) - 1
        usd0 = self.usd[before] if before >= 0 else 0.0
        hours0 = self.gpu_hours[before] if before >= 0 else 0.0
        return self.usd[-1] - usd0, self.gpu_hours[-1] - hours0


@dataclass(frozen=True, slots=True)
class BudgetEvent:
    at: float
    queue: str
    level: BudgetLevel
    detail: str


class BudgetMeter:
    """A simulation observer: each queue's spend between steps, its budget's status after each, and the
    status's effects on the simulation (deprioritised queues in the store, blocked queues' arrivals refused)."""

    def __init__(self, sim: Simulation, budgets: Sequence[Budget], prices: PriceTable) -> None:
        self.sim = sim
        self.budgets = {budget.queue: budget for budget in budgets}
        self.prices = prices
        self.spend: dict[str, _Spend] = {queue: _Spend() for queue in sorted({j.job.queue for j in sim.workload.jobs})}
        self.statuses: dict[str, BudgetStatus] = {}
        self.events: list[BudgetEvent] = []
        self.refused: dict[str, int] = {}
        self.unpriced_gpu_hours = 0.0
        self._last: float | None = None
        self._rates: dict[str, tuple[float, float]] = {}  # queue -> (USD per s, GPUs) held since the last call
        self._price_of: dict[tuple[str, str], float | None] = {}

    def __call__(self, now: float, reconciler: Reconciler) -> None:
        if self._last is not None and now > self._last:
            elapsed = now - self._last
            for queue, (usd_per_s, gpus) in self._rates.items():
                self.spend[queue].add(now, usd_per_s * elapsed, gpus * elapsed / HOUR)
        self._last = now
        self._rates = self._held(reconciler)
        self._step(now)

    def admits(self, job: Job, _now: float) -> bool:
        """Whether a submission of `job` is taken (False: its queue's budget is spent and blocks)."""
        status = self.statuses.get(job.queue)
        if status is not None and status.blocks_submissions:
            self.refused[job.queue] = self.refused.get(job.queue, 0) + 1
            return False
        return True

    def _held(self, reconciler: Reconciler) -> dict[str, tuple[float, float]]:
        rates: dict[str, tuple[float, float]] = {}
        for holding in reconciler.base.holdings.values():
            usd_per_s = gpus = 0.0
            for worker in holding.workers:
                node = self.sim.nodes[worker.node]
                for share in worker.gpus:
                    fraction = share.milli / 1000.0
                    price = self._price(node.gpus[share.index].model, node.pool)
                    gpus += fraction
                    if price is None:
                        continue
                    usd_per_s += fraction * price / HOUR
            queue = holding.job.queue
            was = rates.get(queue, (0.0, 0.0))
            rates[queue] = (was[0] + usd_per_s, was[1] + gpus)
        return rates

    def _price(self, model: str, pool: str) -> float | None:
        key = (model, pool)
        if key not in self._price_of:
            self._price_of[key] = self.prices.usd_per_gpu_hour(model, Pool(pool))
        return self._price_of[key]

    def _step(self, now: float) -> None:
        deprioritised_before = {q for q, s in self.statuses.items() if s.deprioritises}
        for queue, budget in self.budgets.items():
            start, _ = budget_window(budget.period, now)
            usd, gpu_hours = self.spend[queue].since(start) if queue in self.spend else (0.0, 0.0)
            status = budget_status(budget, usd, gpu_hours, now)
            level_before = self.statuses[queue].level if queue in self.statuses else BudgetLevel.OK
            if status.level is not level_before:
                self.events.append(BudgetEvent(now, queue, status.level, status.summary()))
            self.statuses[queue] = status
        deprioritised = {q for q, s in self.statuses.items() if s.deprioritises}
        if deprioritised != deprioritised_before:
            self.sim.queues = {
                name: dataclasses.replace(spec, deprioritised=name in deprioritised)
                for name, spec in self.sim.queues.items()
            }
            self.sim.store.set_cluster(queues=tuple(self.sim.queues.values()))


def _check_queues(workload: Workload, budgets: Sequence[Budget]) -> None:
    known = {queue.name for queue in workload.queues} | {job.job.queue for job in workload.jobs}
    unknown = sorted({b.queue for b in budgets} - known)
    if unknown:
        raise WorkloadError(
            f"--budget names {', '.join(map(repr, unknown))}, not a queue of {workload.name}",
            f"budget one of its queues: {', '.join(sorted(known))}",
        )


def _queue_jct_h(run: SimRun, queues: set[str] | None, excluded: frozenset[str] = frozenset()) -> float | None:
    times = [
        r.finished_at - r.submitted_at
        for r in run.store.all()
        if r.state is JobState.SUCCEEDED
        and r.finished_at is not None
        and (queues is None or r.job.queue in queues)
        and r.job.queue not in excluded
    ]
    return round(sum(times) / len(times) / HOUR, 3) if times else None


def run_budget_study(
    workload: Workload, budgets: Sequence[Budget], prices: PriceTable, policy: str = "default"
) -> dict[str, Any]:
    """The two variants (see the module doc), as one JSON-able report."""
    if not budgets:
        raise WorkloadError("no budget to study", "give at least one --budget QUEUE=AMOUNT")
    _check_queues(workload, budgets)
    horizon = max((t.job.submitted_at for t in workload.jobs), default=0.0) + 30 * 86400.0
    budgeted = {b.queue for b in budgets}
    rows: dict[str, Any] = {}
    for variant in VARIANTS:
        sim = Simulation(workload, profile(policy, policy_data(workload)), SimSettings(horizon_s=horizon))
        meter = BudgetMeter(sim, budgets if variant == "budgets" else (), prices)
        sim.observer = meter
        sim.admission = meter.admits
        run = sim.run()
        finished = sum(1 for r in run.store.all() if r.state is JobState.SUCCEEDED)
        per_queue = {}
        for queue in sorted(budgeted):
            spend = meter.spend.get(queue, _Spend())
            usd, hours = spend.since(float("-inf"))
            crossed = {e.level: e.at for e in meter.events if e.queue == queue}
            per_queue[queue] = {
                "spent_usd": round(usd, 2),
                "spent_gpu_hours": round(hours, 2),
                "notice_at_h": _hours(crossed.get(BudgetLevel.NOTICE), sim.start),
                "exceeded_at_h": _hours(crossed.get(BudgetLevel.EXCEEDED), sim.start),
                "refused_submissions": meter.refused.get(queue, 0),
                "jct_mean_h": _queue_jct_h(run, {queue}),
            }
        total_usd = sum(s.usd[-1] for s in meter.spend.values() if s.usd)
        rows[variant] = {
            "cost_usd": round(total_usd, 2),
            "jobs_finished": finished,
            "jobs_refused": sum(meter.refused.values()),
            "jct_mean_h": _queue_jct_h(run, None),
            "jct_mean_h_other_queues": _queue_jct_h(run, None, frozenset(budgeted)),
            "queues": per_queue,
            "events": [
                {"at_h": _hours(e.at, sim.start), "queue": e.queue, "level": e.level.value, "detail": e.detail}
                for e in meter.events
            ],
        }
    return {
        "workload": workload.name,
        "workload_citation": workload.citation,
        "policy": policy,
        "budgets": [
            {
                "queue": b.queue,
                "amount": b.amount,
                "unit": b.unit.value,
                "action": b.action.value,
                "period": b.period.value,
            }
            for b in budgets
        ],
        "variants": rows,
    }


def _hours(at: float | None, start: float) -> float | None:
    return None if at is None else round((at - start) / HOUR, 3)


__all__ = ["VARIANTS", "BudgetMeter", "parse_budget", "run_budget_study"]
