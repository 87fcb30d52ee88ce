"""The plugin API: everything a policy plugin sees of the scheduling core, and the only module of
`gpufleet.scheduling` that `gpufleet.policies` may import (an import-linter contract enforces it).

As the Kubernetes scheduler framework gives its plugins a snapshot of node info and a per-cycle store, a
plugin here gets, per call, the job it decides on (`JobView`) and a read-only view of the cycle
(`ClusterView`): the node table (`NodeInfo`, arrays that refuse writes), quotas as queries (`Quotas`), what
running jobs hold (`Holding`), what learners predicted for pending jobs (`RunEstimate`), and caches it may
fill for the cycle (`memo`, `current`, `per_cycle`). Never the working state itself.

The one capability that changes the view is preemption's `WhatIf`: take running jobs out, try the job,
put them back exactly. A preemption plugin gets it as an argument; nothing else does.

Extension points, each with one uniform signature (the core never asks a plugin's name):

- OrderPlugin: which job goes next (a sort key within a queue, and a rank between queue heads).
- AdmitPlugin: may this job be considered now (quota, gang feasibility); may narrow the GPU models.
- FilterPlugin: narrows the per-GPU mask of usable GPUs and says per node whether it passes, and why not.
- ScorePlugin: scores passing nodes 0..100; the profile weighs them.
- SelectPlugin: picks the GPUs inside the chosen node.
- PreemptPlugin: finds victims on a what-if view for a job that does not fit.
- Learner: learns from finished jobs, outside the cycle (the control loop feeds it); what it learned reaches
  the cycle as data, never by the cycle calling it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Final, Protocol, TypeVar

import numpy as np

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.throughput_table import ThroughputTable
from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload, TaskLike
from gpufleet.scheduling.fragmentation_few import FewNodes
from gpufleet.scheduling.ledger import QuotaVerdict, Usage
from gpufleet.scheduling.plugin_registry import Registry
from gpufleet.scheduling.status import SUCCESS, Code, Status, Wake, unresolvable, unschedulable, wait
from gpufleet.scheduling.table import (
    ALL_ROWS,
    BoolArray,
    FloatArray,
    IntArray,
    NodeInfo,
    Rows,
    WorkerArrays,
    rows_any,
    rows_count,
)

if TYPE_CHECKING:
    from gpufleet.scheduling.state import CycleState

__all__ = [
    "ALL_ROWS",
    "GENERIC_TARGET",
    "SUCCESS",
    "AdmitPlugin",
    "BoolArray",
    "ClusterView",
    "Code",
    "CycleStore",
    "ElasticJob",
    "EvaluationView",
    "FewNodes",
    "FilterPlugin",
    "FilterResult",
    "FloatArray",
    "GangContext",
    "Holding",
    "IntArray",
    "JobView",
    "Learner",
    "MigratePlugin",
    "NodeInfo",
    "OrderPlugin",
    "PreemptPlugin",
    "Profile",
    "QuotaVerdict",
    "Quotas",
    "Registry",
    "ResizeInput",
    "ResizePlugin",
    "Rows",
    "RunEstimate",
    "ScorePlugin",
    "SelectPlugin",
    "SortKey",
    "Status",
    "TargetWorkload",
    "TaskLike",
    "VictimChoice",
    "Wake",
    "WhatIf",
    "WorkerArrays",
    "rows_any",
    "rows_count",
    "unresolvable",
    "unschedulable",
    "wait",
]

T = TypeVar("T")
SortKey = tuple[float | int | str, ...]


# --- what plugins are given -----------------------------------------------------------------------------


@dataclass(slots=True)
class JobView:
    """A job as the plugins see it in one attempt: the job, and the GPU models it may use now."""

    job: Job
    model_lut: BoolArray  # over model ids (+1 "no GPU" slot): models allowed by spec and by admission


@dataclass(slots=True)
class GangContext:
    """Where the earlier workers of the same job went in this attempt (for topology scores)."""

    nodes: list[int] = field(default_factory=list)

    def node_array(self) -> IntArray:
        return np.asarray(self.nodes, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Holding:
    """A job that holds resources in this cycle: running before it, or placed by it."""

    job: Job
    workers: tuple[WorkerPlacement, ...]
    usage: tuple[tuple[str, int], ...]
    running: RunningJob | None  # None for a placement made in this cycle


@dataclass(frozen=True, slots=True)
class RunEstimate:
    """What a learner predicted for a job when it became pending, kept while it waits: its run time (`seconds`),
    the `submitted_at` it was made for, and the GPU-seconds the job had attained then that earn it no credit
    (those of a job sent to the back of its queue)."""

    submitted_at: float
    seconds: float
    uncredited: float = 0.0
    # GPU-seconds the job received in its earlier runs, by node name (for policies that share GPU models
    # over time, e.g. the round allocator; empty for learners that do not record it).
    service: tuple[tuple[str, float], ...] = ()


class Quotas(Protocol):
    """Quota queries (`QuotaLedger`'s, without the ways to change it)."""

    @property
    def queues(self) -> Mapping[str, QueueSpec]: ...

    @property
    def per_model(self) -> frozenset[str]:
        """Queues with a quota per GPU model (their admission narrows the models a job may use)."""
        ...

    def used(self, queue: str, key: str) -> int: ...

    def fits(self, queue: str, key: str, amount: int) -> QuotaVerdict: ...

    def within_nominal(self, queue: str, usage: Usage) -> bool: ...

    def over_nominal(self, queue: str, keys: frozenset[str] | None = None) -> bool: ...

    def protected(self, queue: str) -> bool: ...


class _QuotaQueries:
    """`Quotas` at run time: the ledger's query methods, bound once (no call costs more than the ledger's own),
    and its queues behind a read-only mapping. The ledger's `add` and `raise_to` are not reachable."""

    __slots__ = ("fits", "over_nominal", "per_model", "protected", "queues", "used", "within_nominal")

    def __init__(self, ledger: Quotas) -> None:
        self.queues: Mapping[str, QueueSpec] = MappingProxyType(ledger.queues)
        self.per_model = ledger.per_model
        self.used = ledger.used
        self.fits = ledger.fits
        self.within_nominal = ledger.within_nominal
        self.over_nominal = ledger.over_nominal
        self.protected = ledger.protected


class CycleStore(Protocol):
    """A cache of the cycle: the value kept under `key`, computed by `compute` the first time it is asked."""

    def __call__(self, key: tuple[object, ...], compute: Callable[[], T]) -> T: ...


class EvaluationView(Protocol):
    """What the filters found for the job's request class over all nodes (read it, never write it)."""

    @property
    def usable(self) -> BoolArray:
        """`[N, G]`: GPUs a worker could take."""
        ...

    @property
    def passed(self) -> BoolArray:
        """`[N]`: nodes that pass every filter."""
        ...

    @property
    def largest_group(self) -> IntArray:
        """`[N]`: the most usable GPUs inside one NVLink group of each node."""
        ...


class ClusterView:
    """One cycle as plugins see it, read-only.

    `nodes` (arrays refuse writes), `quotas` (queries only), `holdings`, `estimates` and `capacity` (read-only
    mappings), `evicting` and `removed` (sets typed read-only), the cycle's `now` and `seed`. A what-if of a
    preemption search shows here as it goes (its jobs are in `removed`, their resources free in `nodes`).

    The per-cycle store: `memo` (values that depend on node capacity only; kept for as long as the inventory
    is), `current` (values of the free resources; valid while no node changed), `per_cycle` (values that hold
    for the cycle's time and running jobs). Keys start with the plugin's name.
    """

    __slots__ = (
        "__weakref__",  # its state refers to it weakly (`CycleState.view`)
        "_capacity",
        "_estimates",
        "_holdings",
        "_state",
        "current",
        "memo",
        "nodes",
        "per_cycle",
        "quotas",
        "seed",
    )

    def __init__(self, state: CycleState) -> None:
        self._state = state
        # A state's table and seed never change (a copy gets its own view): plain attributes, read per call.
        self.nodes: Final[NodeInfo] = state.table
        self.seed: Final[int] = state.seed
        self.quotas: Final[Quotas] = _QuotaQueries(state.ledger)
        self._holdings: Mapping[JobId, Holding] = MappingProxyType(state.holdings)
        self._estimates: Mapping[JobId, RunEstimate] = MappingProxyType(state.estimates)
        self._capacity: Mapping[str, int] = MappingProxyType(state.capacity)
        self.memo: Final[CycleStore] = state.memo
        self.current: Final[CycleStore] = state.current
        self.per_cycle: Final[CycleStore] = state.per_cycle

    @property
    def now(self) -> float:
        return self._state.now

    @property
    def capacity(self) -> Mapping[str, int]:
        """The cluster's GPU (milli), CPU (milli) and memory (bytes) capacity."""
        return self._capacity

    @property
    def holdings(self) -> Mapping[JobId, Holding]:
        """Every job that holds resources: running before the cycle, or placed in it."""
        return self._holdings

    @property
    def estimates(self) -> Mapping[JobId, RunEstimate]:
        """What the profile's learner predicted for pending jobs (see `Learner`); empty without one."""
        return self._estimates

    @property
    def throughput(self) -> ThroughputTable | None:
        """The cycle's measured throughput table, which plugins built with one read instead of theirs (the live
        control plane's table learned from progress reports); None: use the one built with."""
        return self._state.throughput

    @property
    def pending(self) -> Sequence[Job]:
        """The jobs this cycle decides (empty outside a cycle, e.g. when the loop keys a new job)."""
        return self._state.pending

    @property
    def queued(self) -> Sequence[Job]:
        """Every job waiting (the control loop's whole queue, of which it decides some: `pending`); the jobs
        decided when the cycle runs on its own."""
        queued = self._state.queued
        return queued if queued is not None else self._state.pending

    @property
    def evicting(self) -> AbstractSet[JobId]:
        """Running jobs being stopped (for a preemptor, a cancel, a timeout)."""
        return self._state.evicting

    @property
    def removed(self) -> AbstractSet[JobId]:
        """Running jobs taken out of the view by the what-if under way."""
        return self._state.removed

    @property
    def preemptible_groups(self) -> Mapping[tuple[str, int], Sequence[JobId]]:
        """Running, preemptible jobs not being stopped, by (queue, priority), each group in job-id order."""
        return MappingProxyType(self._state.preemptible_by_group)


# --- extension points -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Per node pass masks, each with the reason a node failing it is shown with."""

    checks: tuple[tuple[str, BoolArray], ...]


class OrderPlugin(Protocol):
    name: ClassVar[str]

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        """Order of jobs (lower first), within a queue and between queue heads. The core appends
        (submit_seq, id), so every order is total."""
        ...

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        """Rank of a queue before its head's `job_key` (lower goes first); () for a global order.
        May depend on that queue's usage only: the core asks again whenever it changes."""
        ...


class AdmitPlugin(Protocol):
    """An admission check. A plugin may declare `monotone: ClassVar[bool] = True` when its verdict can only
    turn from refusal to success as free resources grow and quota usage shrinks (node by node, GPU by GPU,
    queue by queue): victim searches then test several victims taken out or put back at once
    (`WhatIf.admission_monotone`). Without it, they test them one by one. A plugin that checks a queue's quota
    declares `checks_quota: ClassVar[bool] = True`: a job it refuses waits for its own queue's usage to fall, which
    no reserved start (`Profile.reserve_after_s`) can give it."""

    name: ClassVar[str]

    def admit(self, view: JobView, cluster: ClusterView) -> Status:
        """SUCCESS to go on; may narrow `view.model_lut`. Otherwise why the job cannot go now."""
        ...


class FilterPlugin(Protocol):
    name: ClassVar[str]

    def filter(self, view: JobView, cluster: ClusterView, usable: BoolArray, rows: Rows) -> FilterResult:
        """Look at the nodes `rows` only: narrow `usable` ([len(rows), G], in place) to the GPUs this
        worker could take there, and return per-row checks. Must not depend on other nodes."""
        ...


class ScorePlugin(Protocol):
    """Optionally, a class attribute `node_local = True` says that, for a job of one worker placed without
    gang context, a node's score depends only on the job's request and allowed GPU models and on that
    node's rows of the table and of the evaluation (not on the job's identity, other nodes or the candidate
    set). When every score of a profile says so, the core keeps each request class's scores and recomputes
    only the nodes that changed, as for the filters. Without it a plugin scores every candidate each time."""

    name: ClassVar[str]

    def score(
        self,
        view: JobView,
        cluster: ClusterView,
        evaluation: EvaluationView,
        candidates: IntArray,
        gang: GangContext,
    ) -> FloatArray:
        """Scores in [0, 100] for the candidate nodes (indices into the table), higher is better.
        `evaluation` holds the filters' results for this job over all nodes."""
        ...


class SelectPlugin(Protocol):
    name: ClassVar[str]

    def select(self, view: JobView, nodes: NodeInfo, node: int, usable: BoolArray) -> tuple[int, ...]:
        """GPU indices on `node` for one worker, from `usable[node]`. Must return exactly as many as asked."""
        ...


@dataclass(frozen=True, slots=True)
class VictimChoice:
    """What a preemption plugin decided: the victims, or why none (then status says so)."""

    victims: tuple[tuple[str, str], ...]  # (victim job id, why it may be preempted)
    status: Status


class WhatIf(Protocol):
    """Preemption's one capability to change the view: take running jobs out (their resources and quota
    become free), try the job there, and put them back exactly. Everything taken out must be put back
    before `preempt` returns."""

    def remove(self, job_id: JobId) -> None:
        """Take a running job out of the view until `restore`."""
        ...

    def restore(self, job_id: JobId) -> None: ...

    def remove_many(self, job_ids: list[JobId]) -> None:
        """`remove` each of these jobs (the view is the same as after removing them one by one)."""
        ...

    def restore_many(self, job_ids: list[JobId]) -> None:
        """`restore` each of these jobs (the view is the same as after restoring them one by one)."""
        ...

    @property
    def admission_monotone(self) -> bool:
        """Whether every admission plugin of the profile is `monotone` (see `AdmitPlugin`): then a job
        admitted on a view is admitted on every view with more free resources and less quota usage, which a
        search may use to test many put-backs at once."""
        ...

    def without(self, job_ids: list[JobId]) -> AbstractContextManager[None]:
        """A what-if with these jobs taken out; everything is restored on exit."""
        ...

    def held(self, job_ids: list[JobId]) -> WorkerArrays:
        """What these jobs hold, as arrays (one owner number per job, in the order given)."""
        ...

    def admits(self, job: Job) -> Status:
        """Whether the admission plugins (quota, gang) would let the job go on the current view."""
        ...

    def fits(self, job: Job) -> bool:
        """Whether the job would be admitted and placed on the current view (nothing is kept)."""
        ...

    def worker_fits(self, job: Job, node: int) -> bool:
        """Whether one worker of the job fits on `node` of the current view, ignoring quota."""
        ...

    def passing_node(self, job: Job) -> int | None:
        """A node one worker of the job fits on in the current view, ignoring quota (the first), or None.
        Filters look at one node each: it stays one while the table's `version` of it does not change."""
        ...


class PreemptPlugin(Protocol):
    name: ClassVar[str]

    def preempt(self, view: JobView, cluster: ClusterView, blocked_by: Status, what_if: WhatIf) -> VictimChoice:
        """Victims whose removal makes the job fit, checked on a what-if view, or none and why."""
        ...


class MigratePlugin(Protocol):
    """Running jobs to move: asked once per cycle, after every pending job was decided. A job it names is stopped
    with the checkpoint signal (a `Migration`) and goes back to its queue, to start again where its policy plans
    it; jobs already being stopped are ignored. Profiles without one never move a job on their own."""

    name: ClassVar[str]

    def migrations(self, cluster: ClusterView) -> Sequence[tuple[JobId, str]]:
        """The running jobs to stop now, each with the reason (in job-id order, for determinism)."""
        ...


class Learner(Protocol):
    """Learns from what jobs did, outside the cycle. The control loop (live and simulated alike) tells it when a
    job starts holding resources and when it stops, and whether it ran to its own end (`finished`) or was
    stopped, preempted or lost; when a job becomes pending it asks for the job's `RunEstimate`, which every
    cycle then reads as data (`ClusterView.estimates`). The cycle never calls a learner."""

    name: ClassVar[str]

    def started(self, run: RunningJob) -> None:
        """A job began holding resources (launched, or found running when the loop started)."""
        ...

    def ended(self, job_id: JobId, now: float, *, finished: bool) -> None:
        """A job released its resources at `now`: `finished` if it exited on its own, not stopped or lost."""
        ...

    def estimate(self, job: Job, now: float, earlier: RunEstimate | None) -> RunEstimate:
        """The estimate of a job that becomes pending now; `earlier`: the one it had while it waited before."""
        ...


@dataclass(frozen=True, slots=True)
class ElasticJob:
    """A running elastic job as a resize policy sees it. Sizes are GPUs, in steps of `step` (a worker's GPUs).
    `goodput[g]`: its expected rate of progress at g GPUs (any unit, the same for every size of this job:
    throughput x statistical efficiency), for every allowed size from `min_gpus` to `max_gpus`.
    `remaining_s`: how long it is expected to run at its current size (None: unknown). `attained_gpu_s`: the
    GPU-seconds it has received so far, over all its runs."""

    id: JobId
    queue: str
    gpus: int
    min_gpus: int
    max_gpus: int
    step: int
    goodput: Mapping[int, float]
    last_resized_at: float | None = None
    remaining_s: float | None = None
    attained_gpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ResizeInput:
    """What a resize policy decides from: the running elastic jobs, the GPUs free now, the GPUs each queue may
    still take within its quota (`headroom`; a queue not listed: unlimited), and the jobs waiting, in the
    order the cycle would place them, as (queue, GPUs they need at least)."""

    now: float
    free_gpus: int
    jobs: tuple[ElasticJob, ...]
    headroom: Mapping[str, int]
    waiting: tuple[tuple[str, int], ...] = ()


class ResizePlugin(Protocol):
    """Chooses new sizes for running elastic jobs: grow into idle GPUs, shrink toward `min_gpus` to admit
    waiting jobs. Returns only the jobs whose size changes. A pure function of its input."""

    name: ClassVar[str]

    def resize(self, given: ResizeInput) -> Mapping[JobId, int]: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """A scheduling policy: one plugin (or weighted list) per extension point.

    `strict_fifo`: a queue whose head cannot be placed holds the jobs behind it (no backfill),
    as Slurm without backfill and Kueue's StrictFIFO do. Otherwise jobs behind it may go first.
    `preemption_searches_per_queue`: how many of a queue's jobs may search for victims in one cycle
    (Kueue considers only each queue's head); the others wait for a later cycle.
    `learner`: learns run times from finished jobs for the order (QSSF); fed by the control loop.
    `round_s`: the profile allocates in rounds of this length (the round allocator): the control loop decides
    every pending job at each round boundary (multiples of `round_s` on its clock), not only those an event
    woke. None: event-driven only.
    `job_specific`: its admission or preemption depends on the job itself, not only on its queue, request and
    priority (a round plan names jobs): the cycle then decides every job in full instead of reusing the
    outcome of an earlier job of the same class.
    `resize`: resizes running elastic jobs (grow into idle GPUs, shrink to admit waiting jobs); the control loop
    asks it every `resize_every_s` while elastic jobs run. None: running jobs keep their size.
    `reserve_after_s`: a job that has waited this long is decided before the others and, if it cannot start, gets a
    reserved start (EASY backfill, `scheduling/reservation.py`): the earliest time its room frees by the running jobs'
    run time limits, which only jobs ending before then may use meanwhile. None: no reservations (a large gang may
    wait for ever behind a stream of small jobs).
    """

    name: str
    order: OrderPlugin
    admit: tuple[AdmitPlugin, ...]
    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, float], ...]
    select: SelectPlugin
    preempt: PreemptPlugin | None = None
    migrate: MigratePlugin | None = None
    strict_fifo: bool = False
    elastic_grow: bool = True
    preemption_searches_per_queue: int = 4
    learner: Learner | None = None
    round_s: float | None = None
    job_specific: bool = False
    resize: ResizePlugin | None = None
    resize_every_s: float = 60.0
    reserve_after_s: float | None = None

    @property
    def local_scores(self) -> bool:
        """Whether every score is node-local (`ScorePlugin.node_local`): scores may be kept per request class."""
        return all(getattr(plugin, "node_local", False) for plugin, _ in self.scores)

    def describe(self) -> str:
        parts = [f"order={self.order.name}"]
        parts.append("admit=" + "+".join(a.name for a in self.admit))
        parts.append("filter=" + "+".join(f.name for f in self.filters))
        parts.append("score=" + "+".join(f"{s.name}*{w:g}" for s, w in self.scores))
        parts.append(f"select={self.select.name}")
        parts.append(f"preempt={self.preempt.name if self.preempt else 'none'}")
        if self.migrate is not None:
            parts.append(f"migrate={self.migrate.name}")
        if self.learner is not None:
            parts.append(f"learner={self.learner.name}")
        if self.resize is not None:
            parts.append(f"resize={self.resize.name}")
        if self.reserve_after_s is not None:
            parts.append(f"reserve-after={self.reserve_after_s:g}s")
        return ", ".join(parts)
