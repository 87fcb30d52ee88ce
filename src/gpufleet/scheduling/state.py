"""The mutable working state of one cycle, built from an immutable snapshot.

It holds the node table and quota ledger, allocates as the cycle decides, and offers the what-if
view that preemption uses: remove jobs, try, and put everything back exactly. Plugins never see it:
they get its read-only `ClusterView` (`gpufleet.scheduling.plugin_api`).
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.snapshot import ClusterSnapshot
from gpufleet.domain.throughput_table import ThroughputTable
from gpufleet.scheduling.classes import FilterClass
from gpufleet.scheduling.ledger import QuotaLedger, job_usage
from gpufleet.scheduling.plugin_api import ClusterView, Holding, RunEstimate
from gpufleet.scheduling.running_layout import RunningArrays, RunningFacts, RunningLayout, RunningUsage, worker_arrays
from gpufleet.scheduling.table import BoolArray, FloatArray, IntArray, NodeTable, WorkerArrays

T = TypeVar("T")


class InventoryCache:
    """What states built from one node inventory share: its pristine table, the capacity memo, and what
    was derived from each running job of the last snapshot. The caller owns it (a control loop, a benchmark)
    and passes it to every `CycleState` it builds; each builds its own table otherwise.

    A control loop's cycles usually see the same inventory (the same tuple of frozen nodes) and mostly
    the same running jobs (the same frozen objects) again and again; deriving the table and the
    holdings anew costs about as much as a small cycle. Keyed by identity: an object that is still
    alive (this cache holds it) always has the same content, so a hit gives exactly what deriving
    again would. Holds one inventory: another one replaces it."""

    def __init__(self) -> None:
        self._nodes: tuple[Node, ...] | None = None
        self._table: NodeTable | None = None
        self.memo: dict[tuple[object, ...], object] = {}
        self.running: dict[int, RunningFacts] = {}

    def table(self, nodes: tuple[Node, ...]) -> NodeTable:
        """A fresh table (all free) of this inventory, from the cache when it is the one held."""
        if self._table is not None and self._nodes is nodes:
            return self._table.copy()
        fresh = NodeTable(nodes)
        if type(nodes) is not tuple:  # a mutable sequence may change under the same identity: not kept
            return fresh
        self._nodes = nodes
        self._table = fresh.copy()
        self.memo = {}
        self.running = {}
        return fresh


@dataclass(slots=True)
class Evaluation:
    """Filter results of one request class over all nodes, valid for node versions up to `clock`.

    `usable[N, G]`: GPUs a worker could take; `passed[N]`: nodes that pass every filter;
    `largest_group[N]`: the most usable GPUs inside one NVLink group of each node.
    `scores[N]`: the profile's weighted score of each node for one worker of the class (-inf where the node
    does not pass), where the profile's scores are all node-local (`ScorePlugin.node_local`), valid for
    node versions up to `scores_clock`.
    """

    usable: BoolArray
    passed: BoolArray
    largest_group: IntArray
    clock: int
    scores: FloatArray | None = None
    scores_clock: int = -1

    def copy(self) -> Evaluation:
        scores = None if self.scores is None else self.scores.copy()
        return Evaluation(
            self.usable.copy(), self.passed.copy(), self.largest_group.copy(), self.clock, scores, self.scores_clock
        )


# From this many jobs on, a what-if takes the running jobs' arrays instead of going job by job.
SHIFT_ARRAYS_FROM = 16


def _running_id(running: RunningJob) -> JobId:
    return running.job.id


class CycleState:
    """Built from a snapshot for one cycle (`run_cycle`), or copied from a state a control loop keeps up to
    date (`copy`; then `add_running`, `remove_running` and `set_evicting` keep that one equal to a state built
    from the matching snapshot).

    `estimates`: what the profile's learner predicted for pending jobs, read by the cycle as data.
    `throughput`: a throughput table the caller measured (the live control plane learns one from progress
    reports), read by the cycle as data in place of the one the profile was built with; None: the profile's.
    `inventory`: shared with other states of the same node inventory (see `InventoryCache`)."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        inventory: InventoryCache | None = None,
        estimates: Mapping[JobId, RunEstimate] | None = None,
        throughput: ThroughputTable | None = None,
    ) -> None:
        inventory = inventory if inventory is not None else InventoryCache()
        self.snapshot = snapshot
        self.now = snapshot.now
        self.seed = snapshot.seed
        self.estimates: Mapping[JobId, RunEstimate] = estimates if estimates is not None else {}
        self.throughput = throughput
        self.pending: Sequence[Job] = ()  # the jobs a cycle decides on this state (set by `decide`)
        self.queued: Sequence[Job] | None = None  # every waiting job, when the caller knows more than `pending`
        self.table = inventory.table(snapshot.nodes)
        self._memo = inventory.memo
        self.ledger = QuotaLedger(snapshot.queues)
        self.holdings: dict[JobId, Holding] = {}
        self.removed: set[JobId] = set()
        self.evicting_for: dict[JobId, list[JobId]] = defaultdict(list)
        self.evicting: set[JobId] = set()
        # Running, preemptible jobs by (queue, priority): who may be preempted is decided per group.
        self.preemptible_by_group: dict[tuple[str, int], list[JobId]] = defaultdict(list)
        self._groups_shared = False
        # Filter results per filter class: this state's own, and those of the state it was copied from
        # (read through `evaluation`, copied when first used).
        self.evaluations: dict[FilterClass, Evaluation] = {}
        self._inherited: Mapping[FilterClass, Evaluation] = {}
        self._current: dict[tuple[object, ...], tuple[int, object]] = {}
        self._per_cycle: dict[tuple[object, ...], object] = {}
        self._last_pick: tuple[object, tuple[JobId, ...], BoolArray | None] | None = None
        self._last_subset: tuple[BoolArray, WorkerArrays] | None = None
        self.capacity = {
            "gpu": int(self.table.gpu_milli_total.sum()),
            "cpu": int(self.table.cpu_total.sum()),
            "memory": int(self.table.mem_total.sum()),
        }
        facts = self._take_running(sorted(snapshot.running, key=_running_id), inventory)
        self._hold_all(facts)
        self._view: weakref.ref[ClusterView] | None = None

    def _hold_all(self, facts: list[RunningFacts]) -> None:
        """Record what the snapshot's running jobs hold: holdings, quota usage, who is stopping, who may be."""
        per_queue: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        holdings = self.holdings
        for fact in facts:
            running = fact.running
            job = running.job
            holding = fact.holding
            holdings[job.id] = holding
            row = per_queue[job.queue]
            for key, amount in holding.usage:
                row[key] += amount
            if running.evicting_for is not None:
                self.evicting.add(job.id)
                self.evicting_for[running.evicting_for].append(job.id)
            elif job.preemptible:
                self.preemptible_by_group[(job.queue, job.priority)].append(job.id)
        for queue in sorted(per_queue):
            self.ledger.add(queue, per_queue[queue])

    def _facts(self, running: RunningJob, holding: Holding | None = None) -> RunningFacts:
        """Check that a running job's workers exist in the inventory and derive what it holds (`holding`: its
        holding, when the caller made it)."""
        index = self.table.index
        gpu_count = self.table.gpu_count_list
        nodes: list[int] = []
        cpus: list[int] = []
        mems: list[int] = []
        share_nodes: list[int] = []
        share_gpus: list[int] = []
        share_milli: list[int] = []
        share_mems: list[int] = []
        for worker in running.workers:
            node = index.get(worker.node)
            if node is None:
                raise GpufleetError(
                    f"job {running.id!r} runs on node {worker.node!r}, which is not in the snapshot",
                    "include every node that has running jobs, or mark the job lost first",
                )
            count = gpu_count[node]
            nodes.append(node)
            cpus.append(worker.cpu_milli)
            mems.append(worker.memory)
            for share in worker.gpus:
                if share.index >= count:
                    raise GpufleetError(
                        f"job {running.id!r} holds a GPU index that node {worker.node!r} does not have",
                        "the store and the node inventory disagree; re-register the node",
                    )
                share_nodes.append(node)
                share_gpus.append(share.index)
                share_milli.append(share.milli)
                share_mems.append(share.memory)
        if holding is None:
            usage = self.usage_of(running.workers)
            holding = Holding(running.job, running.workers, tuple(sorted(usage.items())), running)
        workers = np.array([nodes, cpus, mems], dtype=np.int64).T.reshape(len(nodes), 3)
        shares = np.array([share_nodes, share_gpus, share_milli, share_mems], dtype=np.int64).T.reshape(-1, 4)
        return RunningFacts(running, holding, workers, shares)

    def _take_running(self, ordered: list[RunningJob], inventory: InventoryCache) -> list[RunningFacts]:
        """Apply what running jobs hold to the table, refusing a snapshot that overcommits a node.
        Nothing is applied before every job is checked."""
        table = self.table
        known = inventory.running
        facts: list[RunningFacts] = []
        for running in ordered:
            fact = known.get(id(running))
            if fact is None or fact.running is not running:
                fact = self._facts(running)
            facts.append(fact)
        inventory.running = {id(f.running): f for f in facts}
        arrays = worker_arrays(facts)
        table.apply_flat(arrays, -1)
        # Kept for victim searches and what-ifs, and kept up to date as running jobs start and end.
        self._layout = RunningLayout(facts, arrays)
        self._layout_owned = True  # copies share it until they change their running jobs (`_own_layout`)
        if (
            (table.gpu_milli_free < 0).any()
            or (table.gpu_mem_free < 0).any()
            or (table.cpu_free < 0).any()
            or (table.mem_free < 0).any()
        ):
            check = NodeTable(self.snapshot.nodes)
            for running in ordered:
                for worker in running.workers:
                    if not check.worker_fits_capacity(worker):
                        raise GpufleetError(
                            f"job {running.id!r} overcommits node {worker.node!r} in the snapshot",
                            "the store holds overlapping allocations; repair them before scheduling",
                        )
                    check.apply(worker, -1)
        return facts

    def copy(self, now: float) -> CycleState:
        """An independent working copy for one cycle at time `now`. Its preemptible groups are this state's until
        it changes them (cycles only read them): decide on a copy before this state changes again. It starts
        with no filter results of its own and reads this state's (see `evaluation`)."""
        other = copy.copy(self)
        other.now = now
        other.table = self.table.copy()
        other.ledger = self.ledger.copy()
        other.holdings = dict(self.holdings)
        other.removed = set(self.removed)
        other.evicting_for = defaultdict(list, {j: list(v) for j, v in self.evicting_for.items()})
        other.evicting = set(self.evicting)
        other._groups_shared = True  # shared until the copy changes them (`_own_groups`)
        other._layout_owned = False  # shared until the copy changes its running jobs (`_own_layout`)
        other._memo = self._memo  # capacity-only values: shared, filled by any copy
        other.evaluations = {}
        other._inherited = self.evaluations
        other._current = {}
        other._per_cycle = {}
        other._view = None
        return other

    @property
    def view(self) -> ClusterView:
        """The cycle as plugins see it (read-only). The view refers to this state; this state refers to its view
        weakly, so that a state is never a reference cycle: a retired state is freed by its reference count, not
        only by a walk of the cyclic collector (which the control loop spares its long-lived objects:
        `gpufleet.control.collector`). While someone holds the view, this gives that same view."""
        view = self._view() if self._view is not None else None
        if view is None:
            view = ClusterView(self)
            self._view = weakref.ref(view)
        return view

    def evaluation(self, key: FilterClass) -> Evaluation | None:
        """This cycle's evaluation of a filter class; for a copy, a copy of the original's if it has one (its
        clock says which nodes changed since, so the caller refreshes just those)."""
        entry = self.evaluations.get(key)
        if entry is None:
            inherited = self._inherited.get(key)
            if inherited is not None:
                entry = self.evaluations[key] = inherited.copy()
        return entry

    def add_running(self, running: RunningJob) -> None:
        """A job now holds resources (launched, or adopted after restart)."""
        usage = self.usage_of(running.workers)
        holding = Holding(running.job, running.workers, tuple(sorted(usage.items())), running)
        fact = self._facts(running, holding)
        self.table.apply_many(list(running.workers), -1)
        self.holdings[running.id] = holding
        self._own_layout().add(fact)
        self.ledger.add(running.job.queue, usage)
        if running.evicting_for is not None:
            self.set_evicting(running.id, running.evicting_for)
        elif running.job.preemptible:
            self._own_groups()
            bisect.insort(self.preemptible_by_group[(running.job.queue, running.job.priority)], running.id)

    def remove_running(self, job_id: JobId) -> None:
        """A job released what it held (finished, stopped, lost)."""
        holding = self.holdings[job_id]
        self.release(job_id)
        self._own_groups()
        self._leave_group(holding.job)
        if job_id in self.evicting:
            self.evicting.discard(job_id)
            # A preemptor whose last victim stopped drops out: copies copy this map every cycle.
            for for_job in [f for f, victims in self.evicting_for.items() if job_id in victims]:
                victims = self.evicting_for[for_job]
                victims.remove(job_id)
                if not victims:
                    del self.evicting_for[for_job]

    def _leave_group(self, job: Job) -> None:
        """Take `job` out of its preemptible group (kept in job-id order: found by bisection, not a scan of
        thousands of ids for each of the hundreds of jobs that end in a step)."""
        group = self.preemptible_by_group.get((job.queue, job.priority))
        if group:
            at = bisect.bisect_left(group, job.id)
            if at < len(group) and group[at] == job.id:
                del group[at]

    def _own_layout(self) -> RunningLayout:
        """The running jobs' layout, copied from the original's before this copy changes it."""
        if not self._layout_owned:
            self._layout = self._layout.copy()
            self._layout_owned = True
        return self._layout

    def _own_groups(self) -> None:
        """Copy the preemptible groups shared with the original before changing them."""
        if self._groups_shared:
            self.preemptible_by_group = defaultdict(list, {g: list(v) for g, v in self.preemptible_by_group.items()})
            self._groups_shared = False

    def set_checkpoint(self, job_id: JobId, at: float) -> None:
        """A running job reported a checkpoint saved at `at`: stopping it now loses only the work since."""
        holding = self.holdings[job_id]
        if holding.running is None:
            return
        running = dataclasses.replace(holding.running, last_checkpoint_at=at)
        self.holdings[job_id] = dataclasses.replace(holding, running=running)  # holds the same: laid out as it was

    def set_evicting(self, job_id: JobId, for_job: JobId) -> None:
        """A running job is being stopped (for `for_job`; "" for a cancel, requeue or timeout)."""
        holding = self.holdings[job_id]
        self._own_groups()
        self._leave_group(holding.job)
        self.evicting.add(job_id)
        if job_id not in self.evicting_for[for_job]:
            self.evicting_for[for_job].append(job_id)

    def current(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """Cache for values that depend on free resources (not on quota): valid while the table is
        unchanged. The table's clock only moves forward, so an equal clock means an equal table."""
        clock = self.table.clock
        hit = self._current.get(key)
        if hit is not None and hit[0] == clock:
            return hit[1]  # type: ignore[return-value]
        value = compute()
        self._current[key] = (clock, value)
        return value

    def per_cycle(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """Cache for values that hold for this cycle's time and running jobs (e.g. what stopping a
        running job would cost), whatever is placed or tried on the view."""
        if key not in self._per_cycle:
            self._per_cycle[key] = compute()
        return self._per_cycle[key]  # type: ignore[return-value]

    def memo(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """Cache for values that depend only on node capacity (never on free resources): shared by every
        state of the inventory."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[return-value]

    def usage_of(self, workers: tuple[WorkerPlacement, ...]) -> dict[str, int]:
        milli = 0
        cpu = 0
        mem = 0
        per_model: dict[str, int] = {}
        table = self.table
        index = table.index
        for worker in workers:
            cpu += worker.cpu_milli
            mem += worker.memory
            node = index[worker.node]
            uniform = table.node_model[node]
            if uniform is not None:  # one model on the node: no per-GPU look-up
                worker_milli = 0
                for share in worker.gpus:
                    worker_milli += share.milli
                milli += worker_milli
                if worker_milli:
                    per_model[uniform] = per_model.get(uniform, 0) + worker_milli
                continue
            names = table.gpu_model_names[node]
            for share in worker.gpus:
                milli += share.milli
                model = names[share.index]
                per_model[model] = per_model.get(model, 0) + share.milli
        return job_usage(milli, cpu, mem, per_model)

    def _hold(self, job: Job, workers: tuple[WorkerPlacement, ...], running: RunningJob | None) -> None:
        usage = self.usage_of(workers)
        self.holdings[job.id] = Holding(job, workers, tuple(sorted(usage.items())), running)
        self.ledger.add(job.queue, usage)

    def allocate(self, job: Job, workers: tuple[WorkerPlacement, ...]) -> None:
        """Record a placement decided in this cycle (its workers are already applied to the table)."""
        self._hold(job, workers, None)

    def extend(self, job_id: JobId, worker: WorkerPlacement) -> None:
        """Add one more worker (already applied to the table) to a job placed in this cycle."""
        holding = self.holdings[job_id]
        added = self.usage_of((worker,))
        usage = dict(holding.usage)
        for key, amount in added.items():
            usage[key] = usage.get(key, 0) + amount
        self.holdings[job_id] = Holding(
            holding.job, (*holding.workers, worker), tuple(sorted(usage.items())), holding.running
        )
        self.ledger.add(holding.job.queue, added)

    def release(self, job_id: JobId) -> None:
        holding = self.holdings.pop(job_id)
        if holding.running is not None:
            self._own_layout().drop(job_id)
        for worker in holding.workers:
            self.table.apply(worker, +1)
        self.ledger.add(holding.job.queue, dict(holding.usage), sign=-1)

    # what-if view -------------------------------------------------------------------------------

    def remove(self, job_id: JobId) -> None:
        """Take a running job out of the view (its resources become free) until `restore`."""
        self._shift([job_id], +1)
        self.removed.add(job_id)

    def restore(self, job_id: JobId) -> None:
        self._shift([job_id], -1)
        self.removed.discard(job_id)

    def remove_many(self, job_ids: list[JobId]) -> None:
        """`remove` for each of these jobs, in one shift of the table and the ledger (integer sums: the same
        free resources and usage as one by one)."""
        if job_ids:
            self._shift(job_ids, +1)
            self.removed.update(job_ids)

    def restore_many(self, job_ids: list[JobId]) -> None:
        """`restore` for each of these jobs, in one shift."""
        if job_ids:
            self._shift(job_ids, -1)
            self.removed.difference_update(job_ids)

    def running_arrays(self) -> RunningArrays:
        """What the running jobs (not placements of this cycle) hold, as arrays with one owner number
        per job: what-if views and victim searches over many jobs update the table in a few vectorised
        steps instead of one Python step per GPU share. Immutable: copies share it. Kept across cycles
        (`RunningLayout`): jobs that started since are appended, those that ended are no longer numbered."""
        return self._layout.current()

    def arrays_of(self, job_ids: list[JobId]) -> WorkerArrays | None:
        """What these running jobs hold, as arrays; None if one of them is not a running job (or repeats)."""
        picked = self._pick(job_ids)
        return None if picked is None else self._subset(picked)

    def held(self, job_ids: list[JobId]) -> WorkerArrays:
        """What these jobs hold, as arrays: running jobs' rows from `running_arrays`, others laid out afresh."""
        arrays = self.arrays_of(job_ids)
        if arrays is None:
            arrays = WorkerArrays.of(self.table, [w for j in job_ids for w in self.holdings[j].workers])
        return arrays

    def _pick(self, job_ids: list[JobId]) -> BoolArray | None:
        """A mask over the running jobs' owner numbers; None if one is not a running job (or repeats).

        A victim search asks for the same candidates up to three times in a row (what they hold, then a
        what-if view without them, entered and left): the last answer is kept while the running jobs' arrays
        are the same object (they are rebuilt, never changed, when running jobs change)."""
        arrays = self.running_arrays()
        key = tuple(job_ids)
        last = self._last_pick
        if last is not None and last[0] is arrays and last[1] == key:
            return last[2]
        get = arrays.position.get
        found = [get(job_id) for job_id in key]
        picked: BoolArray | None = None
        if None not in found:
            mask = np.zeros(arrays.owners, dtype=np.bool_)
            mask[cast(list[int], found)] = True
            if int(np.count_nonzero(mask)) == len(key):
                mask.flags.writeable = False  # shared by every caller that asks for the same jobs
                picked = mask
        self._last_pick = (arrays, key, picked)
        return picked

    def _subset(self, picked: BoolArray) -> WorkerArrays:
        """The running jobs' rows of a mask `_pick` gave (the last one kept: a search asks again)."""
        last = self._last_subset
        if last is not None and last[0] is picked:
            return last[1]
        rows = self.running_arrays().arrays.subset(picked)
        self._last_subset = (picked, rows)
        return rows

    def _running_usage(self) -> RunningUsage:
        """Quota usage of the running jobs by owner number (see `RunningUsage`)."""
        return self._layout.usage()

    def _shift(self, job_ids: list[JobId], sign: int) -> None:
        """Give back (+1) or take again (-1) what these jobs hold, in the table and the ledger."""
        if len(job_ids) == 1:  # the common case in victim searches: no grouping by queue needed
            holding = self.holdings[job_ids[0]]
            self.table.apply_many(holding.workers, sign)
            self.ledger.add(holding.job.queue, dict(holding.usage), sign=-sign)
            return
        picked = self._pick(job_ids) if len(job_ids) >= SHIFT_ARRAYS_FROM else None
        if picked is not None:
            # Many running jobs (a what-if over every candidate victim): vectorised, table and ledger.
            self.table.apply_flat(self._subset(picked), sign)
            keys, usage, queues, queue_of = self._running_usage()
            # Per queue, the picked jobs' usage summed in one pass (integer sums: the order does not matter).
            picked_queue = queue_of[picked]
            sums = np.zeros((len(queues), len(keys)), dtype=np.int64)
            np.add.at(sums, picked_queue, usage[picked])
            present = np.bincount(picked_queue, minlength=len(queues)).tolist()
            queue_sums: list[list[int]] = sums.tolist()
            for q, queue in enumerate(queues):  # queue names are sorted
                if not present[q]:
                    continue
                sums_row = queue_sums[q]
                self.ledger.add(
                    queue, {key: amount for key, amount in zip(keys, sums_row, strict=True) if amount}, -sign
                )
            return
        per_queue: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        workers: list[WorkerPlacement] = []
        for job_id in job_ids:
            holding = self.holdings[job_id]
            workers.extend(holding.workers)
            row = per_queue[holding.job.queue]
            for key, amount in holding.usage:
                row[key] += amount
        self.table.apply_many(workers, sign)
        for queue in sorted(per_queue):
            self.ledger.add(queue, per_queue[queue], sign=-sign)

    @contextmanager
    def without(self, job_ids: list[JobId]) -> Iterator[None]:
        """A what-if view with these jobs removed; everything is restored on exit."""
        self._shift(job_ids, +1)
        self.removed.update(job_ids)
        try:
            yield
        finally:
            self._shift(job_ids, -1)
            self.removed.difference_update(job_ids)
