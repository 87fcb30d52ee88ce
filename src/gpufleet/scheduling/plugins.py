"""Extension points of the core. Each has one uniform signature; the core never asks a plugin's name.

- OrderPlugin: which job goes next (a sort key within a queue, and a rank between queue heads).
- AdmitPlugin: may this job be considered now (quota, gang feasibility); may narrow the GPU models.
- FilterPlugin: narrows the per-GPU mask of usable GPUs and says per node whether it passes, and why not.
- ScorePlugin: scores passing nodes 0..100; the profile weighs them.
- SelectPlugin: picks the GPUs inside the chosen node.
- PreemptPlugin: finds victims on a what-if view for a job that does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.status import Status
from gpufleet.scheduling.table import BoolArray, FloatArray, IntArray, NodeTable, Rows

if TYPE_CHECKING:
    from gpufleet.scheduling.state import CycleState, Evaluation

SortKey = tuple[float | int | str, ...]


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
class FilterResult:
    """Per node pass masks, each with the reason a node failing it is shown with."""

    checks: tuple[tuple[str, BoolArray], ...]


class OrderPlugin(Protocol):
    name: ClassVar[str]

    def job_key(self, job: Job, state: CycleState) -> SortKey:
        """Order of jobs (lower first), within a queue and between queue heads. The core appends
        (submit_seq, id), so every order is total."""
        ...

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        """Rank of a queue before its head's `job_key` (lower goes first); () for a global order.
        May depend on that queue's usage only: the core asks again whenever it changes."""
        ...


class AdmitPlugin(Protocol):
    name: ClassVar[str]

    def admit(self, view: JobView, state: CycleState) -> Status:
        """SUCCESS to go on; may narrow `view.model_lut`. Otherwise why the job cannot go now."""
        ...


class FilterPlugin(Protocol):
    name: ClassVar[str]

    def filter(self, view: JobView, state: CycleState, usable: BoolArray, rows: Rows) -> FilterResult:
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
        self, view: JobView, state: CycleState, evaluation: Evaluation, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        """Scores in [0, 100] for the candidate nodes (indices into the table), higher is better.
        `evaluation` holds the filters' results for this job over all nodes."""
        ...


class SelectPlugin(Protocol):
    name: ClassVar[str]

    def select(self, view: JobView, table: NodeTable, node: int, usable: BoolArray) -> tuple[int, ...]:
        """GPU indices on `node` for one worker, from `usable[node]`. Must return exactly as many as asked."""
        ...


@dataclass(frozen=True, slots=True)
class VictimChoice:
    """What a preemption plugin decided: the victims, or why none (then status says so)."""

    victims: tuple[tuple[str, str], ...]  # (victim job id, why it may be preempted)
    status: Status


class Trial(Protocol):
    def admits(self, job: Job, state: CycleState) -> Status:
        """Whether the admission plugins (quota, gang) would let the job go on the current view."""
        ...

    def fits(self, job: Job, state: CycleState) -> bool:
        """Whether the job would be admitted and placed on the current view (nothing is kept)."""
        ...

    def worker_fits(self, job: Job, state: CycleState, node: int) -> bool:
        """Whether one worker of the job fits on `node` of the current view, ignoring quota."""
        ...


class PreemptPlugin(Protocol):
    name: ClassVar[str]

    def preempt(self, view: JobView, state: CycleState, blocked_by: Status, trial: Trial) -> VictimChoice:
        """Victims whose removal makes the job fit, checked on a what-if view, or none and why."""
        ...


@dataclass(frozen=True, slots=True)
class Profile:
    """A scheduling policy: one plugin (or weighted list) per extension point.

    `strict_fifo`: a queue whose head cannot be placed holds the jobs behind it (no backfill),
    as Slurm without backfill and Kueue's StrictFIFO do. Otherwise jobs behind it may go first.
    `preemption_searches_per_queue`: how many of a queue's jobs may search for victims in one cycle
    (Kueue considers only each queue's head); the others wait for a later cycle.
    """

    name: str
    order: OrderPlugin
    admit: tuple[AdmitPlugin, ...]
    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, float], ...]
    select: SelectPlugin
    preempt: PreemptPlugin | None = None
    strict_fifo: bool = False
    elastic_grow: bool = True
    preemption_searches_per_queue: int = 4

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
        return ", ".join(parts)
