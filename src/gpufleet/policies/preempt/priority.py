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

from collections import defaultdict
from typing import ClassVar

import numpy as np

from gpufleet.domain.jobs import Job
from gpufleet.domain.quotas import CPU, GPU, MEMORY
from gpufleet.scheduling.plugins import JobView, Trial, VictimChoice
from gpufleet.scheduling.state import CycleState, Holding
from gpufleet.scheduling.status import Code, Status, unschedulable, wait

NAME = "priority"
NODES_TRIED = 32


def _eligible(job: Job, victim: Job, state: CycleState, reclaiming: bool) -> str | None:
    """Why `victim` may be preempted for `job`, or None if it may not."""
    ledger = state.ledger
    if victim.queue == job.queue:
        if victim.priority < job.priority:
            return f"lower priority ({victim.priority} < {job.priority}) in queue {job.queue}"
        return None
    spec = ledger.queues.get(job.queue)
    victim_spec = ledger.queues.get(victim.queue)
    same_cohort = (
        spec is not None and victim_spec is not None and spec.cohort is not None and spec.cohort == victim_spec.cohort
    )
    if same_cohort and reclaiming and ledger.over_nominal(victim.queue):
        return f"queue {victim.queue} borrows above its nominal quota; queue {job.queue} reclaims it"
    if victim.priority < job.priority and not ledger.protected(victim.queue):
        return f"lower priority ({victim.priority} < {job.priority}) in queue {victim.queue}, which has no guarantee"
    return None


def _cost(holding: Holding, state: CycleState) -> tuple[float, ...]:
    running = holding.running
    assert running is not None
    return (
        float(holding.job.priority),
        running.lost_work_seconds(state.now),
        -running.started_at,
    )


class PriorityPreemption:
    name: ClassVar[str] = NAME

    def preempt(self, view: JobView, state: CycleState, blocked_by: Status, trial: Trial) -> VictimChoice:
        job = view.job
        request = job.request
        demand = {
            GPU: request.gpu_milli_total * job.gang_size,
            CPU: request.cpu_milli * job.gang_size,
            MEMORY: request.memory * job.gang_size,
        }
        reclaiming = state.ledger.within_nominal(job.queue, demand)
        reasons: dict[str, str] = {}
        candidates: list[Holding] = []
        for job_id in sorted(state.holdings):
            holding = state.holdings[job_id]
            if holding.running is None or job_id in state.evicting or not holding.job.preemptible:
                continue
            why = _eligible(job, holding.job, state, reclaiming)
            if why is not None:
                reasons[job_id] = why
                candidates.append(holding)
        if not candidates:
            return VictimChoice(
                (),
                Status(Code.UNSCHEDULABLE, (*blocked_by.reasons, "no job may be preempted for it"), blocked_by.plugin),
            )
        candidates.sort(key=lambda h: (*_cost(h, state), h.job.id))
        ids = [h.job.id for h in candidates]
        with state.without(ids):
            helps = trial.fits(job, state)
        if not helps:
            return VictimChoice(
                (),
                Status(
                    Code.UNSCHEDULABLE,
                    (*blocked_by.reasons, f"preempting all {len(ids)} eligible jobs would not make room"),
                    blocked_by.plugin,
                ),
            )
        chosen = None
        if job.gang_size == 1 and trial.admits(job, state).ok:
            chosen = self._on_one_node(job, state, trial, candidates)
        if chosen is None:
            chosen = self._greedy(job, state, trial, ids)
        with state.without(chosen):
            if not trial.fits(job, state):  # pragma: no cover - defensive: the search guarantees it
                return VictimChoice((), unschedulable(NAME, "preemption search found no valid victim set"))
        victims = tuple((v, reasons[v]) for v in chosen)
        status = wait(NAME, f"preempting {len(chosen)} job(s) to make room: {', '.join(chosen)}")
        return VictimChoice(victims, status)

    def _greedy(self, job: Job, state: CycleState, trial: Trial, ordered: list[str]) -> list[str]:
        removed: list[str] = []
        for job_id in ordered:
            state.remove(job_id)
            removed.append(job_id)
            if trial.fits(job, state):
                break
        return self._reprieve(job, state, trial, removed)

    def _reprieve(self, job: Job, state: CycleState, trial: Trial, removed: list[str]) -> list[str]:
        """Given `removed` (taken out of the view, cheapest first), put back every victim not needed."""
        kept = list(removed)
        for job_id in reversed(removed):
            state.restore(job_id)
            if trial.fits(job, state):
                kept.remove(job_id)
            else:
                state.remove(job_id)
        for job_id in reversed(kept):
            state.restore(job_id)
        return kept

    def _on_one_node(self, job: Job, state: CycleState, trial: Trial, candidates: list[Holding]) -> list[str] | None:
        index = state.table.index
        per_node: dict[int, list[Holding]] = defaultdict(list)
        for holding in candidates:
            for node in sorted({index[w.node] for w in holding.workers}):
                per_node[node].append(holding)
        ranked = sorted(
            per_node,
            key=lambda n: (max(h.job.priority for h in per_node[n]), sum(_cost(h, state)[1] for h in per_node[n]), n),
        )
        best: tuple[tuple[float, ...], list[str]] | None = None
        for node in ranked[:NODES_TRIED]:
            removed: list[str] = []
            for holding in per_node[node]:
                state.remove(holding.job.id)
                removed.append(holding.job.id)
                if trial.worker_fits(job, state, node) and trial.fits(job, state):
                    break
            else:
                for job_id in reversed(removed):
                    state.restore(job_id)
                continue
            kept = self._reprieve(job, state, trial, removed)
            costs = [_cost(state.holdings[v], state) for v in kept]
            key = (max(c[0] for c in costs), float(np.sum([c[1] for c in costs])), float(len(kept)), float(node))
            if best is None or key < best[0]:
                best = (key, kept)
        return best[1] if best else None
