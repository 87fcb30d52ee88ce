"""Preemption by priority and by quota reclaim, with the fewest and cheapest victims.

Who may be a victim (never a non-preemptible job, never one already stopping):
- a job of lower priority in the same queue;
- a job of another queue in the same cohort that borrows (uses more than its nominal quota), when the
  preemptor's queue stays within its own nominal quota: it is reclaiming what it lent;
- a job of lower priority in a queue that is not protected by a nominal quota it stays within.

How: first check on a what-if view that stopping every candidate would make the job fit; if not,
nobody is evicted. For a single-worker job, find the node where the cheapest set of victims makes
room (victims ranked by priority, then work lost since their last checkpoint, then youngest
first), so room is made on one node, not scattered over the cluster. Gangs and quota-bound jobs
take victims greedily in that order. Every set is then pruned (reprieve: put back each victim that
is not needed) and checked once more on the view.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import ClassVar

import numpy as np

from gpufleet.domain.jobs import Job
from gpufleet.domain.quotas import CPU, GPU, MEMORY, QueueSpec
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.scheduling.plugin_api import (
    BoolArray,
    ClusterView,
    Code,
    Holding,
    IntArray,
    JobView,
    Status,
    VictimChoice,
    WhatIf,
    rows_count,
    unschedulable,
    wait,
)

NAME = "priority"
NODES_TRIED = 32


def _eligible(
    job: Job, queue: str, priority: int, cluster: ClusterView, reclaiming: bool, needs: frozenset[str]
) -> str | None:
    """Why a job of (`queue`, `priority`) may be preempted for `job`, or None if it may not."""
    ledger = cluster.quotas
    if queue == job.queue:
        if priority < job.priority:
            return f"lower priority ({priority} < {job.priority}) in queue {job.queue}"
        return None
    spec = ledger.queues.get(job.queue)
    victim_spec = ledger.queues.get(queue)
    same_cohort = (
        spec is not None and victim_spec is not None and spec.cohort is not None and spec.cohort == victim_spec.cohort
    )
    if same_cohort and reclaiming and ledger.over_nominal(queue, needs):
        return f"queue {queue} borrows above its nominal quota; queue {job.queue} reclaims it"
    if priority < job.priority and not ledger.protected(queue):
        return f"lower priority ({priority} < {job.priority}) in queue {queue}, which has no guarantee"
    return None


def _cost(holding: Holding, cluster: ClusterView) -> tuple[float, ...]:
    running = holding.running
    assert running is not None
    return (
        float(holding.job.priority),
        running.lost_work_seconds(cluster.now),
        -running.started_at,
    )


def _capable_nodes(job: Job, cluster: ClusterView) -> BoolArray:
    """Nodes that could hold one worker of the job if they were empty (depends on capacity only)."""
    request = job.request
    table = cluster.nodes

    def compute() -> BoolArray:
        lut = table.model_lut(request.models)
        capable = lut[table.gpu_model] & table.gpu_exists & (table.gpu_mem_total >= request.gpu_memory)
        fits = table.schedulable & (table.cpu_total >= request.cpu_milli) & (table.mem_total >= request.memory)
        if request.gpus:
            fits &= rows_count(capable) >= request.gpus
        return np.asarray(fits, dtype=np.bool_)

    return cluster.memo(("preempt.capable", request), compute)


def _potential_workers(job: Job, cluster: ClusterView, what_if: WhatIf, candidates: list[Holding]) -> IntArray:
    """Per node: how many workers of the job would fit if every candidate on it were stopped."""
    table = cluster.nodes
    request = job.request
    milli = table.gpu_milli_free.copy()
    gpu_mem = table.gpu_mem_free.copy()
    cpu = table.cpu_free.copy()
    mem = table.mem_free.copy()
    held = what_if.held([h.job.id for h in candidates])
    # Integer sums: adding all at once gives exactly what adding one by one does.
    np.add.at(cpu, held.node, held.cpu)
    np.add.at(mem, held.node, held.memory)
    at = (held.share_node, held.share_gpu)
    np.add.at(milli, at, held.share_milli)
    np.add.at(gpu_mem, at, held.share_memory)
    workers = np.where(_capable_nodes(job, cluster), 1 << 20, 0).astype(np.int64)
    if request.cpu_milli:
        workers = np.minimum(workers, cpu // request.cpu_milli)
    if request.memory:
        workers = np.minimum(workers, mem // request.memory)
    if request.gpus:
        usable = cluster.memo(
            ("preempt.capable_gpus", request.models, request.gpu_memory),
            lambda: (
                table.spec_lut(request.models)[table.gpu_model]
                & table.gpu_exists
                & (table.gpu_mem_total >= request.gpu_memory)
            ),
        )
        if request.fractional:
            free = usable & (milli >= request.gpu_milli) & (gpu_mem >= request.gpu_memory)
            workers = np.minimum(workers, rows_count(free))
        else:
            free = usable & (milli == MILLI_PER_GPU)
            workers = np.minimum(workers, rows_count(free) // request.gpus)
    return np.asarray(workers, dtype=np.int64)


def _refusal(blocked_by: Status, why: str) -> VictimChoice:
    return VictimChoice(
        (), Status(Code.UNSCHEDULABLE, (*blocked_by.reasons, why), blocked_by.plugin, blocked_by.wake_on)
    )


class PriorityPreemption:
    name: ClassVar[str] = NAME

    def candidates(
        self, job: Job, cluster: ClusterView, demand: dict[str, int], quota_ok: bool
    ) -> tuple[list[Holding], dict[str, str]]:
        """Running jobs that may be stopped for `job`, and why each may. Only those that free a node the
        job could use, or quota it is short of, are worth stopping."""
        ledger = cluster.quotas
        reclaiming = ledger.within_nominal(job.queue, demand)
        needs = frozenset(key for key, amount in demand.items() if amount)
        capable = _capable_nodes(job, cluster)
        index = cluster.nodes.index
        spec = ledger.queues.get(job.queue)
        cohort = spec.cohort if spec is not None else None
        reasons: dict[str, str] = {}
        candidates: list[Holding] = []
        for (queue, priority), members in sorted(cluster.preemptible_groups.items()):
            why = self.eligible(job, queue, priority, cluster, reclaiming, needs)
            if why is None:
                continue
            frees_quota = not quota_ok and (
                queue == job.queue or (cohort is not None and _cohort(ledger.queues.get(queue)) == cohort)
            )
            for job_id in members:
                holding = cluster.holdings.get(job_id)
                if holding is None or job_id in cluster.evicting:
                    continue
                if frees_quota or any(capable[index[w.node]] for w in holding.workers):
                    reasons[job_id] = why
                    candidates.append(holding)
        return candidates, reasons

    def eligible(
        self, job: Job, queue: str, priority: int, cluster: ClusterView, reclaiming: bool, needs: frozenset[str]
    ) -> str | None:
        """Why jobs of (`queue`, `priority`) may be stopped for `job`, or None."""
        return _eligible(job, queue, priority, cluster, reclaiming, needs)

    def cost(self, holding: Holding, cluster: ClusterView) -> tuple[float, ...]:
        """Victims are taken cheapest first: lower priority, less work lost, younger."""
        return _cost(holding, cluster)

    def preempt(self, view: JobView, cluster: ClusterView, blocked_by: Status, what_if: WhatIf) -> VictimChoice:
        job = view.job
        request = job.request
        demand = {
            GPU: request.gpu_milli_total * job.gang_size,
            CPU: request.cpu_milli * job.gang_size,
            MEMORY: request.memory * job.gang_size,
        }
        quota_ok = what_if.admits(job).ok
        candidates, reasons = self.candidates(job, cluster, demand, quota_ok)
        if not candidates:
            return _refusal(blocked_by, "no job that may be preempted for it holds what it needs")
        # A victim's cost depends on the victim and the time only, not on the view: once per cycle.
        known: dict[str, tuple[float, ...]] = cluster.per_cycle(("preempt.costs", self), dict)
        costs: dict[str, tuple[float, ...]] = {}
        for h in candidates:
            cost = known.get(h.job.id)
            if cost is None:
                cost = known[h.job.id] = self.cost(h, cluster)
            costs[h.job.id] = cost
        candidates.sort(key=lambda h: (*costs[h.job.id], h.job.id))
        chosen: list[str] | None = None
        potential = _potential_workers(job, cluster, what_if, candidates)
        if int(np.minimum(potential, job.gang_size).sum()) < job.gang_size:
            return _refusal(blocked_by, f"preempting all {len(candidates)} eligible jobs would not make room")
        if job.gang_size == 1 and quota_ok:
            chosen = self._on_one_node(job, cluster, what_if, candidates, potential > 0, costs)
        if chosen is None:
            ids = [h.job.id for h in candidates]
            with what_if.without(ids):
                helps = what_if.fits(job)
            if not helps:
                return _refusal(blocked_by, f"preempting all {len(ids)} eligible jobs would not make room")
            chosen = self._greedy(job, what_if, ids)
        with what_if.without(chosen):
            if not what_if.fits(job):  # pragma: no cover - defensive: the search guarantees it
                return VictimChoice((), unschedulable(NAME, "preemption search found no valid victim set"))
        victims = tuple((v, reasons[v]) for v in chosen)
        status = wait(NAME, f"preempting {len(chosen)} job(s) to make room: {', '.join(chosen)}")
        return VictimChoice(victims, status)

    def _greedy(self, job: Job, what_if: WhatIf, ordered: list[str]) -> list[str]:
        removed: list[str] = []
        for job_id in ordered:
            what_if.remove(job_id)
            removed.append(job_id)
            if what_if.fits(job):
                break
        return self._reprieve(job, what_if, removed)

    def _reprieve(self, job: Job, what_if: WhatIf, removed: list[str]) -> list[str]:
        """Given `removed` (taken out of the view, cheapest first), put back every victim not needed."""
        kept = list(removed)
        for job_id in reversed(removed):
            what_if.restore(job_id)
            if what_if.fits(job):
                kept.remove(job_id)
            else:
                what_if.remove(job_id)
        for job_id in reversed(kept):
            what_if.restore(job_id)
        return kept

    def _on_one_node(
        self,
        job: Job,
        cluster: ClusterView,
        what_if: WhatIf,
        candidates: list[Holding],
        potential: BoolArray,
        costs: dict[str, tuple[float, ...]],
    ) -> list[str] | None:
        """The cheapest victim set that makes room on a single node, among the nodes that could host it."""
        index = cluster.nodes.index
        per_node: dict[int, list[Holding]] = defaultdict(list)
        for holding in candidates:
            for node in sorted({index[w.node] for w in holding.workers}):
                if potential[node]:
                    per_node[node].append(holding)
        ranked = sorted(
            per_node,
            key=lambda n: (
                max(costs[h.job.id][0] for h in per_node[n]),
                sum(costs[h.job.id][1] for h in per_node[n]),
                n,
            ),
        )
        best: tuple[tuple[float, ...], list[str]] | None = None
        for node in ranked[:NODES_TRIED]:
            if best is not None and _lower_bound(node, per_node[node], costs) >= best[0]:
                continue  # no victim set on this node can beat the best one: same choice, no search
            removed: list[str] = []
            for holding in per_node[node]:
                what_if.remove(holding.job.id)
                removed.append(holding.job.id)
                if what_if.worker_fits(job, node) and what_if.fits(job):
                    break
            else:
                for job_id in reversed(removed):
                    what_if.restore(job_id)
                continue
            kept = self._reprieve(job, what_if, removed)
            if not kept:
                continue  # it would fit with nobody stopped here: not a victim set
            kept_costs = [costs[v] for v in kept]
            key = (
                max(c[0] for c in kept_costs),
                float(np.sum([c[1] for c in kept_costs])),
                float(len(kept)),
                float(node),
            )
            if best is None or key < best[0]:
                best = (key, kept)
        return best[1] if best else None


def _lower_bound(
    node: int, holdings: list[Holding], costs: dict[str, tuple[float, ...]]
) -> tuple[float, float, float, float]:
    """No victim set on `node` (a non-empty subset of `holdings`) has a smaller choice key than this:
    its highest first cost is at least the lowest there; when no second cost is negative, its sum
    is at least the smallest one (floating-point sums of non-negative numbers never shrink)."""
    firsts = [costs[h.job.id][0] for h in holdings]
    seconds = [costs[h.job.id][1] for h in holdings]
    least = min(seconds)
    return (min(firsts), least if least >= 0 else -math.inf, 1.0, float(node))


def _cohort(spec: QueueSpec | None) -> str | None:
    return spec.cohort if spec is not None else None
