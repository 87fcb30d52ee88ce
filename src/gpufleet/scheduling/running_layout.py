"""What the running jobs hold, laid out as arrays with one owner number per job, kept across cycles.

Victim searches and what-ifs over many running jobs update the node table and the quota ledger from these
arrays in a few vectorised steps (`CycleState.running_arrays`, `CycleState._running_usage`). A control loop's
state keeps one `RunningLayout` in step with its running jobs instead of laying them all out again every cycle:
a job that starts is appended (its rows were laid out once, when it started), a job that ends is dropped from
the owner numbers and its rows stay, never picked, until the dead owners are too many, when the live ones are
laid out afresh (compaction). What a caller got (`RunningArrays`, `RunningUsage`) is never changed afterwards:
appending and compaction make new arrays, so the copies a cycle works on may share them.

Owner numbers only tag rows: every use sums integers over the picked rows, so which number a job has (and
dead rows left among them) changes no result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gpufleet.domain.jobs import JobId, RunningJob
from gpufleet.scheduling.plugin_api import Holding
from gpufleet.scheduling.table import IntArray, WorkerArrays

# Compaction: the dead owners' rows are dropped when they outnumber half the live ones (and this many).
COMPACT_FROM = 256


@dataclass(frozen=True, slots=True)
class RunningFacts:
    """What a running job holds, derived once: its holding, and its workers laid out for `WorkerArrays`."""

    running: RunningJob
    holding: Holding
    workers: IntArray  # [workers, 3]: node, CPU, memory
    shares: IntArray  # [GPU shares, 4]: node, GPU, milli, memory


class RunningArrays(NamedTuple):
    """The running jobs' rows: `position` maps each running job to its owner number, `arrays` holds the rows of
    `owners` owner numbers (dead ones among them: no job maps to them)."""

    position: dict[JobId, int]
    arrays: WorkerArrays
    owners: int


class RunningUsage(NamedTuple):
    """Quota usage by owner number: the usage keys (sorted), a [owners, keys] matrix, the queue names (sorted)
    and each owner's queue number."""

    keys: list[str]
    usage: IntArray
    queues: list[str]
    queue_of: IntArray


def worker_arrays(facts: Sequence[RunningFacts], first_owner: int = 0) -> WorkerArrays:
    """What running jobs hold, laid out as flat arrays; job `k` of `facts` is owner `first_owner + k`. Each job's
    rows are arrays made when it started: joining them is one concatenation per table, not a Python step per row."""
    owners = np.arange(first_owner, first_owner + len(facts), dtype=np.int64)
    workers = np.concatenate([f.workers for f in facts]) if facts else np.zeros((0, 3), dtype=np.int64)
    shares = np.concatenate([f.shares for f in facts]) if facts else np.zeros((0, 4), dtype=np.int64)
    worker_owner = np.repeat(owners, [len(f.workers) for f in facts])
    share_owner = np.repeat(owners, [len(f.shares) for f in facts])

    def column(rows: IntArray, k: int) -> IntArray:
        return np.ascontiguousarray(rows[:, k])

    return WorkerArrays(
        worker_owner,
        column(workers, 0),
        column(workers, 1),
        column(workers, 2),
        share_owner,
        column(shares, 0),
        column(shares, 1),
        column(shares, 2),
        column(shares, 3),
    )


def _joined(old: WorkerArrays, new: WorkerArrays) -> WorkerArrays:
    def join(a: IntArray, b: IntArray) -> IntArray:
        return np.concatenate((a, b)) if len(b) else a

    return WorkerArrays(
        join(old.owner, new.owner),
        join(old.node, new.node),
        join(old.cpu, new.cpu),
        join(old.memory, new.memory),
        join(old.share_owner, new.share_owner),
        join(old.share_node, new.share_node),
        join(old.share_gpu, new.share_gpu),
        join(old.share_milli, new.share_milli),
        join(old.share_memory, new.share_memory),
    )


def _usage_rows(facts: Sequence[RunningFacts], keys: list[str], queues: list[str]) -> tuple[IntArray, IntArray]:
    column = {key: i for i, key in enumerate(keys)}
    queue_number = {queue: i for i, queue in enumerate(queues)}
    rows: list[list[int]] = []
    for fact in facts:
        row = [0] * len(keys)
        for key, amount in fact.holding.usage:
            row[column[key]] = amount
        rows.append(row)
    usage = np.asarray(rows, dtype=np.int64).reshape(len(facts), len(keys))
    queue_of = np.asarray([queue_number[f.holding.job.queue] for f in facts], dtype=np.int64)
    return usage, queue_of


class RunningLayout:
    """The running jobs' rows and quota usage by owner number, kept up to date by `add` and `drop` and laid out
    when read (`current`, `usage`). `copy` gives an independent layout sharing what was laid out."""

    def __init__(self, facts: Sequence[RunningFacts], arrays: WorkerArrays | None = None) -> None:
        """`arrays`: `worker_arrays(facts)`, when the caller has it already."""
        self._facts: list[RunningFacts] = list(facts)  # by owner number, dead owners' included
        self._live: dict[JobId, int] = {f.running.job.id: k for k, f in enumerate(self._facts)}
        self._laid = worker_arrays(self._facts) if arrays is None else arrays
        self._laid_owners = len(self._facts)  # owners whose rows `_laid` holds
        self._current: RunningArrays | None = None
        self._usage: RunningUsage | None = None

    def copy(self) -> RunningLayout:
        other = RunningLayout.__new__(RunningLayout)
        other._facts = list(self._facts)
        other._live = dict(self._live)
        other._laid = self._laid
        other._laid_owners = self._laid_owners
        other._current = self._current
        other._usage = self._usage
        return other

    def __len__(self) -> int:
        """How many running jobs it holds."""
        return len(self._live)

    def add(self, fact: RunningFacts) -> None:
        """A job started (or is held again): it gets a new owner number."""
        job_id = fact.running.job.id
        if job_id in self._live:
            raise ValueError(f"job {job_id!r} is already laid out as running")
        self._live[job_id] = len(self._facts)
        self._facts.append(fact)
        self._current = None

    def drop(self, job_id: JobId) -> None:
        """A job no longer holds what it held: its owner number is dead (its rows stay until compaction)."""
        del self._live[job_id]
        self._current = None

    def current(self) -> RunningArrays:
        """The running jobs' rows as of now: the jobs added since the last call appended, compacted first if the
        dead owners are too many."""
        if self._current is None:
            dead = len(self._facts) - len(self._live)
            if dead >= COMPACT_FROM and 2 * dead > len(self._live):
                self._compact()
            elif self._laid_owners < len(self._facts):
                added = self._facts[self._laid_owners :]
                self._laid = _joined(self._laid, worker_arrays(added, self._laid_owners))
                self._laid_owners = len(self._facts)
            self._current = RunningArrays(dict(self._live), self._laid, len(self._facts))
        return self._current

    def usage(self) -> RunningUsage:
        """Quota usage by owner number, for the owners of `current()`: rows appended for jobs added since the
        last call; all of it laid out again when a usage key or a queue appears that it has no column for."""
        owners = self.current().owners
        kept = self._usage
        if kept is not None and len(kept.queue_of) == owners:
            return kept
        if kept is not None and len(kept.queue_of) < owners:
            added = self._facts[len(kept.queue_of) :]
            keys = set(kept.keys)
            queues = set(kept.queues)
            if all(f.holding.job.queue in queues and keys.issuperset(k for k, _ in f.holding.usage) for f in added):
                usage, queue_of = _usage_rows(added, kept.keys, kept.queues)
                self._usage = RunningUsage(
                    kept.keys,
                    np.concatenate((kept.usage, usage)),
                    kept.queues,
                    np.concatenate((kept.queue_of, queue_of)),
                )
                return self._usage
        facts = self._facts
        keys_all = sorted({key for f in facts for key, _ in f.holding.usage})
        queues_all = sorted({f.holding.job.queue for f in facts})
        usage, queue_of = _usage_rows(facts, keys_all, queues_all)
        self._usage = RunningUsage(keys_all, usage, queues_all, queue_of)
        return self._usage

    def _compact(self) -> None:
        """Lay out the live owners afresh, numbered in the order they were added."""
        live = sorted(self._live.values())
        facts = self._facts
        self._facts = [facts[k] for k in live]
        self._live = {f.running.job.id: k for k, f in enumerate(self._facts)}
        self._laid = worker_arrays(self._facts)
        self._laid_owners = len(self._facts)
        self._usage = None
