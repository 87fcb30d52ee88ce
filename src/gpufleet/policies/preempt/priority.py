"""Preemption by priority and by quota reclaim, with the fewest and cheapest victims.

Who may be a victim (never a non-preemptible job, never one already stopping):
- a job of lower priority in the same queue;
- a job of another queue in the same cohort that borrows (uses more than its nominal quota), when the
  preemptor's queue stays within its own nominal quota: it is reclaiming what it lent;
- a job of lower priority in a queue that is not protected by a nominal quota it stays within;
- any job of another queue that spent its budget with the action `deprioritise` (`QueueSpec.deprioritised`):
  such jobs are the first victims, and such a queue's own jobs preempt nobody.

How: first check on a what-if view that stopping every candidate would make the job fit; if not,
nobody is evicted. For a single-worker job, find the node where the cheapest set of victims makes
room (victims ranked by priority, then work lost since their last checkpoint, then youngest
first), so room is made on one node, not scattered over the cluster. Gangs and quota-bound jobs
take victims greedily in that order. Every set is then pruned (reprieve: put back each victim that
is not needed) and checked once more on the view.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from itertools import compress
from operator import itemgetter
from typing import ClassVar

import numpy as np

from gpufleet.domain.jobs import Job, JobId
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
    WorkerArrays,
    rows_count,
    unschedulable,
    wait,
)

NAME = "priority"
NODES_TRIED = 32
# From this many victims taken out or put back at once, the search's bound is shifted over arrays (what they hold
# as the view's arrays) instead of victim by victim.
ROOM_ARRAYS_FROM = 8


def _eligible(
    job: Job, queue: str, priority: int, cluster: ClusterView, reclaiming: bool, needs: frozenset[str]
) -> str | None:
    """Why a job of (`queue`, `priority`) may be preempted for `job`, or None if it may not."""
    ledger = cluster.quotas
    victim_queue = ledger.queues.get(queue)
    if victim_queue is not None and victim_queue.deprioritised and queue != job.queue:
        return f"queue {queue} spent its budget: its jobs run only on idle capacity"
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


# Each preemptible group whose jobs may be stopped for a job: (group, why, whether they free quota it is short of).
Eligibility = tuple[tuple[tuple[str, int], str, bool], ...]

# Added to the priority of a job whose queue spent its budget (action deprioritise): such jobs go first.
DEPRIORITISED_RANK = -1e12


def _cost(holding: Holding, cluster: ClusterView) -> tuple[float, ...]:
    running = holding.running
    assert running is not None
    spec = cluster.quotas.queues.get(holding.job.queue)
    first = DEPRIORITISED_RANK if spec is not None and spec.deprioritised else 0.0
    return (
        first + float(holding.job.priority),
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


def _capable_gpus(job: Job, cluster: ClusterView) -> BoolArray:
    """GPUs of a model the job may use with enough GPU memory (depends on capacity only)."""
    request = job.request
    table = cluster.nodes

    def compute() -> BoolArray:
        lut = table.spec_lut(request.models)
        return np.asarray(lut[table.gpu_model] & table.gpu_exists & (table.gpu_mem_total >= request.gpu_memory))

    return cluster.memo(("preempt.capable_gpus", request.models, request.gpu_memory), compute)


def _potential_workers(job: Job, cluster: ClusterView, held: _HeldSums) -> IntArray:
    """Per node: how many workers of the job would fit if every candidate on it were stopped (`held`: what the
    candidates hold, summed per node and GPU)."""
    table = cluster.nodes
    request = job.request
    cpu = table.cpu_free + held.cpu
    mem = table.mem_free + held.mem
    workers = np.where(_capable_nodes(job, cluster), 1 << 20, 0).astype(np.int64)
    if request.cpu_milli:
        workers = np.minimum(workers, cpu // request.cpu_milli)
    if request.memory:
        workers = np.minimum(workers, mem // request.memory)
    if request.gpus:
        milli = table.gpu_milli_free + held.milli
        usable = _capable_gpus(job, cluster)
        if request.fractional:
            gpu_mem = table.gpu_mem_free + held.gpu_mem
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
        return self.candidates_of(job, cluster, self.eligibility(job, cluster, demand, quota_ok))

    def eligibility(self, job: Job, cluster: ClusterView, demand: dict[str, int], quota_ok: bool) -> Eligibility:
        """Each preemptible group whose jobs may be stopped for `job` (in group order), why they may, and whether
        they free quota the job is short of (then every member is worth stopping, wherever it runs)."""
        ledger = cluster.quotas
        reclaiming = ledger.within_nominal(job.queue, demand)
        needs = frozenset(key for key, amount in demand.items() if amount)
        spec = ledger.queues.get(job.queue)
        cohort = spec.cohort if spec is not None else None
        eligible: list[tuple[tuple[str, int], str, bool]] = []
        for group in sorted(cluster.preemptible_groups):
            queue, priority = group
            why = self.eligible(job, queue, priority, cluster, reclaiming, needs)
            if why is None:
                continue
            frees_quota = not quota_ok and (
                queue == job.queue or (cohort is not None and _cohort(ledger.queues.get(queue)) == cohort)
            )
            eligible.append((group, why, frees_quota))
        return tuple(eligible)

    def candidates_of(
        self, job: Job, cluster: ClusterView, eligibility: Eligibility
    ) -> tuple[list[Holding], dict[str, str]]:
        """`candidates`, from the groups' `eligibility`."""
        groups = cluster.preemptible_groups
        capable = _capable_nodes(job, cluster)
        evicting = cluster.evicting
        indexed: dict[tuple[str, int], _Group] = cluster.per_cycle(("preempt.groups", NAME), dict)
        reasons: dict[str, str] = {}
        candidates: list[Holding] = []
        for group, why, frees_quota in eligibility:
            entry = indexed.get(group)
            if entry is None:
                entry = indexed[group] = _Group(groups[group], cluster)
            useful = entry.useful(capable, frees_quota)
            ids = entry.ids
            if evicting:
                useful = [k for k in useful if ids[k] not in evicting]
            holdings = entry.holdings
            candidates.extend([holdings[k] for k in useful])
            reasons.update(dict.fromkeys([ids[k] for k in useful], why))
        return candidates, reasons

    def candidates_key(self, job: Job, cluster: ClusterView, eligibility: Eligibility) -> tuple[object, ...]:
        """What `candidates_of` depends on besides the jobs stopping and what holds for the cycle (groups,
        running jobs, time): jobs with equal keys have the same candidates within a cycle."""
        whole_groups = all(frees_quota for _, _, frees_quota in eligibility)
        return (None if whole_groups else job.request, eligibility)

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
        spec = cluster.quotas.queues.get(job.queue)
        if spec is not None and spec.deprioritised:
            return _refusal(
                blocked_by, f"queue {job.queue} spent its budget: its jobs run only on idle capacity and preempt none"
            )
        quota_ok = what_if.admits(job).ok
        found = self._candidate_set(job, cluster, what_if, self.eligibility(job, cluster, demand, quota_ok))
        if not found.count:
            return _refusal(blocked_by, "no job that may be preempted for it holds what it needs")
        # What stopping every candidate frees does not depend on their order: a search that cannot succeed is
        # refused before the candidates are costed and sorted.
        potential = _potential_workers(job, cluster, found.held)
        eligible = found.count
        if int(np.minimum(potential, job.gang_size).sum()) < job.gang_size:
            return _refusal(blocked_by, f"preempting all {eligible} eligible jobs would not make room")
        candidates, ordered = found.in_rank_order(self, cluster)
        costs = self._cycle_ranks(cluster).costs
        reasons = found.reasons
        chosen: list[str] | None = None
        search = _Search(job, cluster, what_if)
        if job.gang_size == 1 and quota_ok:
            chosen = self._on_one_node(job, cluster, search, candidates, potential > 0, costs)
        if chosen is None:
            chosen = self._greedy(search, ordered)
            if chosen is None:
                return _refusal(blocked_by, f"preempting all {eligible} eligible jobs would not make room")
        with what_if.without(chosen):
            if not what_if.fits(job):  # pragma: no cover - defensive: the search guarantees it
                return VictimChoice((), unschedulable(NAME, "preemption search found no valid victim set"))
        victims = tuple((v, reasons[v]) for v in chosen)
        status = wait(NAME, f"preempting {len(chosen)} job(s) to make room: {', '.join(chosen)}")
        return VictimChoice(victims, status)

    def _candidate_set(self, job: Job, cluster: ClusterView, what_if: WhatIf, eligibility: Eligibility) -> _Candidates:
        """The candidates for `job` (`candidates_of`), kept for the cycle by `candidates_key`: a cycle's searches
        for jobs of one class (a queue's next jobs, each preempting for itself) find the same candidates less those
        stopping since, which are dropped from the kept set instead of building, summing and sorting it again."""
        kept: dict[tuple[object, ...], _Candidates] = cluster.per_cycle(("preempt.candidates", self), dict)
        key = self.candidates_key(job, cluster, eligibility)
        found = kept.get(key)
        if found is None:
            holdings, reasons = self.candidates_of(job, cluster, eligibility)
            found = kept[key] = _Candidates(holdings, reasons, what_if, cluster)
        else:
            found.drop_stopping(cluster.evicting, what_if)
        return found

    def _cycle_ranks(self, cluster: ClusterView) -> _Ranks:
        ranks: _Ranks = cluster.per_cycle(("preempt.ranks", self), _Ranks)
        return ranks

    def _ranks(self, candidates: list[Holding], ids: list[JobId], cluster: ClusterView) -> _Ranks:
        """The cycle's victim ranks, with `candidates` (whose ids are `ids`) ranked: a victim's cost depends on the
        victim and the time only, so each is costed once per cycle, when a search first meets it."""
        ranks = self._cycle_ranks(cluster)
        rank = ranks.rank
        if not all(map(rank.__contains__, ids)):
            ranks.add([h for h in candidates if h.job.id not in rank], self.cost, cluster)
        return ranks

    def _greedy(self, search: _Search, ordered: list[str]) -> list[str] | None:
        """The shortest prefix of `ordered` (cheapest first) whose removal makes the job fit, then reprieved;
        None (the view as it was) when removing all of them would not make it fit.

        Taking victims out never makes the bound (`_Room`) smaller, nor, with monotone admission, turns an
        admitted job away: every prefix shorter than the first that the bound allows and admission admits fails
        the fit test, so those prefixes are skipped without asking it (the bound alone first, then admission
        over growing steps and halving back: `_first_admitted`); from there on each victim is asked as before."""
        taken = 0
        count = len(ordered)
        while taken < count:
            search.take(ordered[taken])
            taken += 1
            if search.room.could_fit():
                break
        if search.monotone and taken < count and search.room.could_fit() and not search.admits():
            taken = self._first_admitted(search, ordered, taken)
        if not search.fits():
            # A search that cannot succeed would test every prefix: whether all of them make room is asked
            # once, here, where the first prefix the bound and admission allow has failed (most searches
            # succeed there and never ask).
            if not search.fits_without(ordered[taken:]):
                search.put_back_many(ordered[:taken][::-1])
                return None
            while taken < count:
                search.take(ordered[taken])
                taken += 1
                if search.fits():
                    break
        removed = ordered[:taken]
        # With more than one taken, the job was seen not to fit without the last: it is needed, no need to ask
        # again. (With one, nothing was asked with none taken.)
        return self._reprieve(search, removed, last_needed=len(removed) > 1)

    @staticmethod
    def _first_admitted(search: _Search, ordered: list[str], refused: int) -> int:
        """The shortest prefix of `ordered` longer than `refused` (the prefix taken out now, which admission
        refuses) that admission admits, taken out on return; all of `ordered` if none is. Admission is monotone:
        the prefixes are tried at growing steps, then halved back between the last refused and the first
        admitted."""
        count = len(ordered)
        low, step = refused, 1
        high = min(count, low + step)
        search.take_many(ordered[low:high])
        while not search.admits():
            if high == count:
                return count
            low, step = high, 2 * step
            high = min(count, low + step)
            search.take_many(ordered[low:high])
        # Refused with `low` taken, admitted with `high`: `high` are taken out now.
        at = high
        while high - low > 1:
            middle = (low + high) // 2
            if middle < at:
                search.put_back_many(ordered[middle:at])
            else:
                search.take_many(ordered[at:middle])
            at = middle
            if search.admits():
                high = middle
            else:
                low = middle
        if at < high:
            search.take_many(ordered[at:high])
        return high

    def _reprieve(
        self, search: _Search, removed: list[str], last_needed: bool = False, on: int | None = None
    ) -> list[str]:
        """Given `removed` (taken out of the view, cheapest first), put back every victim not needed.
        `last_needed`: the job was seen not to fit with all but the last of them taken out, the view the first
        put-back makes (a fits test is a pure function of the view: asking again gives the same answer).
        `on`: the victims all run on this node and the job fits no other node (only this one changes), so it
        fits exactly where it fits on this node: asked there, the node's bound answers most tests."""
        reprieved: set[str] = set()
        fits = search.fits if on is None else lambda: search.fits_on(on)
        order = list(reversed(removed[:-1] if last_needed else removed))
        i = 0
        while i < len(order):
            job_id = order[i]
            # The job fits the view here (all taken out, or what a put-back or a take-again left).
            if on is None and search.placement_unchanged_by(job_id):
                # Putting back only takes room, so a victim the bound says leaves the placement as it is stays so
                # while the ones before it are put back: with monotone admission, a run of them is tried at once.
                end = i + 1
                if search.monotone:
                    while end < len(order) and search.placement_unchanged_by(order[end]):
                        end += 1
                reprieved.update(self._put_back_admitted(search, order[i:end]))
                i = end
                continue
            search.restore(job_id)
            if fits():
                reprieved.add(job_id)
            else:
                search.remove(job_id)
            i += 1
        kept = [job_id for job_id in removed if job_id not in reprieved]
        search.put_back_many(kept[::-1])
        return kept

    def _put_back_admitted(self, search: _Search, run: list[str]) -> list[str]:
        """Put back each victim of `run` in turn, keeping it back when the job is still admitted (its placement
        being unchanged by each); returns those kept back. With monotone admission, admitted with all of them
        back means admitted with each prefix of them back, which is what putting them back one by one asks:
        the run is tried at once and halved only where admission refuses."""
        if len(run) == 1:
            search.restore(run[0])
            if search.admits():
                return run
            search.remove(run[0])
            return []
        search.put_back_many(run)
        if search.admits():
            return run
        search.take_many(run)
        half = len(run) // 2
        return self._put_back_admitted(search, run[:half]) + self._put_back_admitted(search, run[half:])

    def _on_one_node(
        self,
        job: Job,
        cluster: ClusterView,
        search: _Search,
        candidates: list[Holding],
        potential: BoolArray,
        costs: dict[str, tuple[float, ...]],
    ) -> list[str] | None:
        """The cheapest victim set that makes room on a single node, among the nodes that could host it."""
        index = cluster.nodes.index
        hosts = set(np.flatnonzero(potential).tolist())
        per_node: dict[int, list[Holding]] = defaultdict(list)
        # Per node, as the candidates are met (in their order): the highest first cost and the sum of the second
        # costs, the same values and additions as max() and sum() over the node's list.
        highest: dict[int, float] = {}
        summed: dict[int, float] = {}
        # A running job's nodes hold for the cycle: found once per cycle, not once per search.
        nodes_of: dict[JobId, tuple[int, ...]] = cluster.per_cycle(("preempt.nodes_of", NAME), dict)
        for holding in candidates:
            job_id = holding.job.id
            nodes = nodes_of.get(job_id)
            if nodes is None:
                workers = holding.workers
                nodes = nodes_of[job_id] = (
                    (index[workers[0].node],) if len(workers) == 1 else tuple(sorted({index[w.node] for w in workers}))
                )
            cost = costs[job_id]
            first, second = cost[0], cost[1]
            for node in nodes:
                if node not in hosts:
                    continue
                per_node[node].append(holding)
                if node not in highest or first > highest[node]:
                    highest[node] = first
                summed[node] = summed.get(node, 0) + second
        # The NODES_TRIED first by (highest first cost, sum of second costs, node): what sorting them all gives.
        ranked = heapq.nsmallest(NODES_TRIED, per_node, key=lambda n: (highest[n], summed[n], n))
        best: tuple[tuple[float, ...], list[str]] | None = None
        for node in ranked:
            if best is not None and _lower_bound(node, per_node[node], costs) >= best[0]:
                continue  # no victim set on this node can beat the best one: same choice, no search
            removed: list[str] = []
            for holding in per_node[node]:
                search.remove(holding.job.id)
                removed.append(holding.job.id)
                if search.fits_on(node):
                    break
            else:
                for job_id in reversed(removed):
                    search.restore(job_id)
                continue
            # Without the last victim it was seen not to fit on the node, nor anywhere else (nothing else changed).
            kept = self._reprieve(search, removed, last_needed=len(removed) > 1, on=node)
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


class _Ranks:
    """Victims' order in one cycle as integer ranks: jobs costed once (`costs`) and numbered by (cost, id), a total
    order, so a search sorts its candidates by an integer each instead of comparing tuples of its own."""

    __slots__ = ("costs", "keys", "rank")

    def __init__(self) -> None:
        self.costs: dict[JobId, tuple[float, ...]] = {}
        self.keys: list[tuple[object, ...]] = []  # (cost, id) of every ranked job, sorted
        self.rank: dict[JobId, int] = {}

    def add(
        self, holdings: list[Holding], cost: Callable[[Holding, ClusterView], tuple[float, ...]], cluster: ClusterView
    ) -> None:
        """Cost and rank these jobs (those not ranked yet); every job is numbered again."""
        costs = self.costs
        added: list[tuple[object, ...]] = []
        for holding in holdings:
            job_id = holding.job.id
            if job_id not in costs:
                costs[job_id] = value = cost(holding, cluster)
                added.append((*value, job_id))
        if not added:
            return
        keys = self.keys
        keys.extend(added)
        keys.sort()
        self.rank = dict(zip(map(itemgetter(-1), keys), range(len(keys)), strict=True))

    def sort(self, holdings: list[Holding], ids: list[JobId]) -> list[Holding]:
        """`holdings` (whose ids are `ids`, all ranked) in rank order."""
        if len(holdings) < 2:
            return list(holdings)
        ranks = np.fromiter(map(self.rank.__getitem__, ids), dtype=np.int64, count=len(ids))
        return [holdings[k] for k in np.argsort(ranks).tolist()]


class _HeldSums:
    """What a set of running jobs holds, summed per node (CPU, memory) and per GPU (milli, GPU memory)."""

    __slots__ = ("cpu", "gpu_mem", "mem", "milli")

    def __init__(self, cluster: ClusterView) -> None:
        table = cluster.nodes
        self.cpu = np.zeros_like(table.cpu_free)
        self.mem = np.zeros_like(table.mem_free)
        self.milli = np.zeros_like(table.gpu_milli_free)
        self.gpu_mem = np.zeros_like(table.gpu_mem_free)

    def add(self, held: WorkerArrays, sign: int) -> None:
        _add_held(self, held, sign)


def _add_held(into: _HeldSums | _Room, held: WorkerArrays, sign: int) -> None:
    """Add (+1) or take away (-1) what `held` holds to `into`'s per-node and per-GPU arrays. Integer sums: in any
    order, the same as one holding after another."""
    np.add.at(into.cpu, held.node, sign * held.cpu)
    np.add.at(into.mem, held.node, sign * held.memory)
    if len(held.share_node):
        at = (held.share_node, held.share_gpu)
        np.add.at(into.milli, at, sign * held.share_milli)
        np.add.at(into.gpu_mem, at, sign * held.share_memory)


class _Candidates:
    """One key's candidates (`PriorityPreemption.candidates_key`) in a cycle: the holdings, why each may be
    stopped, what they hold summed (`_HeldSums`), and, once a search got that far, the holdings in rank order.
    Jobs stopping since it was built are dropped (`drop_stopping`): stopping jobs are never candidates, and
    nothing else about a candidate changes within a cycle."""

    __slots__ = ("dropped", "held", "holdings", "ranked", "ranked_ids", "reasons")

    def __init__(self, holdings: list[Holding], reasons: dict[str, str], what_if: WhatIf, cluster: ClusterView) -> None:
        self.holdings = holdings  # as met, dropped ones too
        self.reasons = reasons  # likewise
        self.dropped: set[JobId] = set()
        self.ranked: list[Holding] | None = None  # not dropped, in rank order
        self.ranked_ids: list[JobId] = []
        self.held = _HeldSums(cluster)
        if holdings:
            self.held.add(what_if.held([h.job.id for h in holdings]), +1)

    @property
    def count(self) -> int:
        """How many candidates are left (not dropped)."""
        return len(self.holdings) - len(self.dropped)

    def drop_stopping(self, stopping: AbstractSet[JobId], what_if: WhatIf) -> None:
        """Drop the candidates that are stopping now (victims chosen since)."""
        reasons = self.reasons
        dropped = self.dropped
        gone = sorted(job_id for job_id in stopping if job_id in reasons and job_id not in dropped)
        if not gone:
            return
        dropped.update(gone)
        self.held.add(what_if.held(gone), -1)
        if self.ranked is not None:
            kept = [job_id not in dropped for job_id in self.ranked_ids]
            self.ranked = list(compress(self.ranked, kept))
            self.ranked_ids = list(compress(self.ranked_ids, kept))

    def in_rank_order(self, policy: PriorityPreemption, cluster: ClusterView) -> tuple[list[Holding], list[JobId]]:
        """The holdings not dropped in the cycle's rank order, and their ids (ranked on the first search that
        asks)."""
        if self.ranked is None:
            dropped = self.dropped
            holdings = [h for h in self.holdings if h.job.id not in dropped] if dropped else self.holdings
            ids = [h.job.id for h in holdings]
            self.ranked = policy._ranks(holdings, ids, cluster).sort(holdings, ids)
            self.ranked_ids = [h.job.id for h in self.ranked]
        return self.ranked, self.ranked_ids


class _Group:
    """One preemptible group's jobs, with where their workers run as arrays, built once per cycle (groups and
    running jobs hold for the cycle), so which of them free a node a job could use is one vectorised test
    instead of a walk over every worker of every member per victim search."""

    __slots__ = ("everyone", "holdings", "ids", "node", "owner")

    def __init__(self, members: Sequence[str], cluster: ClusterView) -> None:
        holdings = cluster.holdings
        index = cluster.nodes.index
        self.holdings: list[Holding] = []
        nodes: list[int] = []
        owners: list[int] = []
        for job_id in members:
            holding = holdings.get(job_id)
            if holding is None:
                continue
            k = len(self.holdings)
            self.holdings.append(holding)
            for worker in holding.workers:
                nodes.append(index[worker.node])
                owners.append(k)
        self.node = np.asarray(nodes, dtype=np.int64)
        self.owner = np.asarray(owners, dtype=np.int64)
        self.everyone = list(range(len(self.holdings)))
        self.ids = [h.job.id for h in self.holdings]

    def useful(self, capable: BoolArray, frees_quota: bool) -> list[int]:
        """Members (by position, in job-id order) that free quota, or hold a worker on a `capable` node."""
        if frees_quota:
            return self.everyone
        hit = np.zeros(len(self.holdings), dtype=np.bool_)
        hit[self.owner[capable[self.node]]] = True
        positions: list[int] = np.flatnonzero(hit).tolist()
        return positions


class _Room:
    """Per node, an upper bound on how many workers of the job fit on the view as a search changes it (free
    resources of the view, plus what the search took out). A worker never fits where the bound is 0 and a
    gang never fits where the bounds, each capped at the gang size, sum to less than it; so a search asks
    the what-if view (a placement, or the filters' evaluation) only where the answer can be yes, and
    decides exactly as if it asked everywhere.

    The bound counts, per node, CPU and memory over the request, and GPUs that are usable for the request
    (model, GPU memory) and free enough: whole ones for whole GPUs; for a share, how many shares each GPU
    still has room for. Nodes that could never hold a worker count 0."""

    def __init__(self, job: Job, cluster: ClusterView) -> None:
        table = cluster.nodes
        request = job.request
        self.index = table.index
        self.gang = job.gang_size
        self.request = request
        self.capable = _capable_nodes(job, cluster)
        self.usable = _capable_gpus(job, cluster)
        self.cpu = table.cpu_free.copy()
        self.mem = table.mem_free.copy()
        self.milli = table.gpu_milli_free.copy()
        self.gpu_mem = table.gpu_mem_free.copy()
        workers = np.where(self.capable, self.gang, 0).astype(np.int64)
        if request.cpu_milli:
            workers = np.minimum(workers, self.cpu // request.cpu_milli)
        if request.memory:
            workers = np.minimum(workers, self.mem // request.memory)
        if request.gpus:
            workers = np.minimum(workers, self._gpu_workers(self.usable, self.milli, self.gpu_mem).sum(axis=-1))
        self.workers: list[int] = np.clip(workers, 0, self.gang).tolist()
        self.total: int = sum(self.workers)

    def _gpu_workers(self, usable: BoolArray, milli: IntArray, gpu_mem: IntArray) -> IntArray:
        """Per GPU (any shape): workers of the request it could take now (for whole GPUs, in GPUs over the
        request's count: summed over a node and floored, per node)."""
        request = self.request
        if request.fractional:
            shares = milli // request.gpu_milli
            if request.gpu_memory:
                shares = np.minimum(shares, gpu_mem // request.gpu_memory)
            return np.where(usable, shares, 0)
        return np.where(usable & (milli == MILLI_PER_GPU), 1, 0)

    def _node(self, node: int) -> int:
        if not self.capable[node]:
            return 0
        request = self.request
        workers = self.gang
        if request.cpu_milli:
            workers = min(workers, int(self.cpu[node]) // request.cpu_milli)
        if request.memory:
            workers = min(workers, int(self.mem[node]) // request.memory)
        if request.gpus:
            gpus = int(self._gpu_workers(self.usable[node], self.milli[node], self.gpu_mem[node]).sum())
            workers = min(workers, gpus if request.fractional else gpus // request.gpus)
        return max(0, workers)

    def shift(self, holding: Holding, sign: int) -> None:
        """What `holding` holds becomes free (+1) or taken again (-1), as the what-if view does."""
        index = self.index
        touched: set[int] = set()
        for worker in holding.workers:
            node = index[worker.node]
            touched.add(node)
            self.cpu[node] += sign * worker.cpu_milli
            self.mem[node] += sign * worker.memory
            for share in worker.gpus:
                self.milli[node, share.index] += sign * share.milli
                self.gpu_mem[node, share.index] += sign * share.memory
        for node in touched:
            now = self._node(node)
            self.total += now - self.workers[node]
            self.workers[node] = now

    def shift_many(self, held: WorkerArrays, sign: int) -> None:
        """`shift` for many holdings at once (what they hold as arrays): integer sums, then each node they touch
        recounted once, over arrays; the same bound as shifting them one by one."""
        _add_held(self, held, sign)
        touched = np.unique(held.node)
        if not len(touched):
            return
        now: list[int] = self._nodes(touched).tolist()
        workers = self.workers
        total = self.total
        for node, count in zip(touched.tolist(), now, strict=True):
            total += count - workers[node]
            workers[node] = count
        self.total = total

    def _nodes(self, rows: IntArray) -> IntArray:
        """`_node` for these nodes, over arrays."""
        request = self.request
        workers = np.where(self.capable[rows], self.gang, 0).astype(np.int64)
        if request.cpu_milli:
            workers = np.minimum(workers, self.cpu[rows] // request.cpu_milli)
        if request.memory:
            workers = np.minimum(workers, self.mem[rows] // request.memory)
        if request.gpus:
            gpus = self._gpu_workers(self.usable[rows], self.milli[rows], self.gpu_mem[rows]).sum(axis=-1)
            workers = np.minimum(workers, gpus if request.fractional else gpus // request.gpus)
        return np.maximum(workers, 0)

    def could_fit(self) -> bool:
        return self.total >= self.gang

    def holds_none_on(self, holding: Holding) -> bool:
        """Whether no worker of the job fits on any node `holding` runs on (its bound is 0 on each)."""
        index = self.index
        workers = self.workers
        return all(workers[index[worker.node]] == 0 for worker in holding.workers)

    def could_fit_on(self, node: int) -> bool:
        return self.workers[node] > 0


class _Search:
    """A victim search's moves on the what-if view, with the bound (`_Room`) kept in step, so that fit tests
    that cannot succeed are answered without a trial placement."""

    def __init__(self, job: Job, cluster: ClusterView, what_if: WhatIf) -> None:
        self.job = job
        self.holdings = cluster.holdings
        self.what_if = what_if
        self.room = _Room(job, cluster)
        self.table = cluster.nodes
        # For a single worker: a node it was seen to fit on, and the table's clock then. While that node is
        # unchanged (its version not past that clock) the worker still fits there, so the job fits the view
        # exactly when it is admitted: the search asks admission alone, not the filters over the view.
        self.witness: int | None = None
        self.witness_clock = -1
        # Victims taken out of the bound but not yet of the view (`take`): the view catches up before a test.
        self._pending: list[str] = []
        # Admission monotone in free resources and quota usage: put-backs and take-outs may be tested in runs.
        self.monotone = what_if.admission_monotone

    def _sync(self) -> None:
        """Take the victims taken in the bound only (`take`) out of the view too."""
        pending = self._pending
        if pending:
            self._pending = []
            if len(pending) == 1:
                self.what_if.remove(pending[0])
            else:
                self.what_if.remove_many(pending)

    def take(self, job_id: str) -> None:
        """Take a victim out: in the bound now, in the view when a test needs the view (a fit test the bound
        answers needs neither). Many taken out at once are one shift of the table and the ledger."""
        self.room.shift(self.holdings[job_id], +1)
        self._pending.append(job_id)

    def take_many(self, job_ids: list[str]) -> None:
        if len(job_ids) < ROOM_ARRAYS_FROM:
            for job_id in job_ids:
                self.take(job_id)
            return
        self.room.shift_many(self.what_if.held(job_ids), +1)
        self._pending.extend(job_ids)

    def remove(self, job_id: str) -> None:
        self._sync()
        self.what_if.remove(job_id)
        self.room.shift(self.holdings[job_id], +1)

    def restore(self, job_id: str) -> None:
        self._sync()
        self.what_if.restore(job_id)
        self.room.shift(self.holdings[job_id], -1)

    def put_back_many(self, job_ids: list[str]) -> None:
        """`restore` each of these (taken out of the view), in one shift."""
        self._sync()
        if not job_ids:
            return
        self.what_if.restore_many(job_ids)
        if len(job_ids) >= ROOM_ARRAYS_FROM:
            self.room.shift_many(self.what_if.held(job_ids), -1)
            return
        holdings = self.holdings
        for job_id in job_ids:
            self.room.shift(holdings[job_id], -1)

    def fits(self) -> bool:
        """Whether the job fits the view now (admission and placement)."""
        if not self.room.could_fit():
            return False
        self._sync()
        job = self.job
        what_if = self.what_if
        if job.gang_size > 1:
            return what_if.fits(job)
        witness = self.witness
        if witness is not None and int(self.table.version[witness]) <= self.witness_clock:
            return what_if.admits(job).ok
        if not what_if.fits(job):
            return False
        self.witness = what_if.passing_node(job)
        self.witness_clock = self.table.clock
        return True

    def fits_without(self, rest: list[str]) -> bool:
        """Whether the job fits the view with `rest` (not taken out yet) taken out too; on return `rest` is back
        in the view and the bound, and the victims taken before stay taken (in the view too). Asked of the view
        itself, not through the witness (see `fits`)."""
        if not rest:
            return False
        self.take_many(rest)
        self._sync()
        fits = self.room.could_fit() and self.what_if.fits(self.job)
        self.put_back_many(rest[::-1])
        return fits

    def admits(self) -> bool:
        self._sync()
        return self.what_if.admits(self.job).ok

    def placement_unchanged_by(self, job_id: str) -> bool:
        """Whether putting `job_id` back leaves the placement part of the fit test as it is, for a gang: its
        nodes take no worker of the job now (bound 0) nor after (putting back only takes room), so they pass
        no filter before or after (filters are per node), and a gang without a communication limit is placed
        exactly when the passing nodes, each filled worker by worker in its own way, hold it all, whichever
        the scores take first; those nodes are unchanged. Then the job fits the view after it exactly when it
        fitted before and is admitted after: a search that saw it fit asks admission alone."""
        job = self.job
        if job.gang_size == 1 or (job.comm is not None and job.comm.max_overhead is not None):
            return False
        return self.room.holds_none_on(self.holdings[job_id])

    def fits_on(self, node: int) -> bool:
        """Whether one worker passes the filters on `node` and the job fits the view now (a single worker that
        passes somewhere fits exactly when it is admitted)."""
        if not self.room.could_fit_on(node):
            return False
        self._sync()
        if not self.what_if.worker_fits(self.job, node):
            return False
        return self.what_if.admits(self.job).ok if self.job.gang_size == 1 else self.what_if.fits(self.job)
