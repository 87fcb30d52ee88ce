"""Changes to the cluster during a simulated run: nodes failing and coming back, nodes added, quotas changed.

    NodeDown(at, node, reason)   the node becomes unhealthy; every job with a worker on it is lost (work since its
                                 last checkpoint is gone) and goes back to its queue, to be retried elsewhere
    NodeUp(at, node)             the node is healthy again
    QuotaChange(at, queue)       the queue's spec (a `QueueSpec` of the same name) replaces the old one
    AddNodes(at, nodes)          new nodes join the cluster
    FailureModel(mtbf_hours, repair_hours, seed)
                                 random failures: each node fails after an exponential time (mean `mtbf_hours`)
                                 and is repaired after another (mean `repair_hours`), then fails again, ...

A workload carries its explicit events (`Workload.events`); the failure model is a simulation setting. Times are
seconds on the workload's clock (the trace's arrival times). This module imports nothing of ours but the domain.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet.domain import Node, QueueSpec
from gpufleet.domain.errors import WorkloadError

__all__ = [
    "AddNodes",
    "ClusterEvent",
    "FailureModel",
    "NodeDown",
    "NodeUp",
    "QuotaChange",
    "describe",
    "event_problems",
]


@dataclass(frozen=True, slots=True)
class NodeDown:
    at: float
    node: str
    reason: str = "node failure"


@dataclass(frozen=True, slots=True)
class NodeUp:
    at: float
    node: str


@dataclass(frozen=True, slots=True)
class QuotaChange:
    at: float
    queue: QueueSpec


@dataclass(frozen=True, slots=True)
class AddNodes:
    at: float
    nodes: tuple[Node, ...]


ClusterEvent = NodeDown | NodeUp | QuotaChange | AddNodes


def describe(event: ClusterEvent) -> str:
    """One line for reports and logs, e.g. `at 3600 s: node-12 down (node failure)`."""
    at = f"at {event.at:g} s"
    if isinstance(event, NodeDown):
        return f"{at}: {event.node} down ({event.reason})"
    if isinstance(event, NodeUp):
        return f"{at}: {event.node} up"
    if isinstance(event, QuotaChange):
        return f"{at}: queue {event.queue.name} quota set to {quota_text(event.queue)}"
    gpus = sum(len(n.gpus) for n in event.nodes)
    return f"{at}: {len(event.nodes)} node(s) added ({gpus} GPUs: {', '.join(n.name for n in event.nodes)})"


def quota_text(queue: QueueSpec) -> str:
    """`gpu=16, gpu:A100-80GB=8 (borrowing 4)`: GPU quotas in whole GPUs (milli-GPU / 1000)."""
    parts = []
    for key, quota in sorted(queue.quotas.items()):
        scale = 1000 if key == "gpu" or key.startswith("gpu:") else 1
        nominal = "unlimited" if quota.nominal is None else f"{quota.nominal / scale:g}"
        extra = []
        if quota.borrowing_limit is not None:
            extra.append(f"borrowing {quota.borrowing_limit / scale:g}")
        if quota.lending_limit is not None:
            extra.append(f"lending {quota.lending_limit / scale:g}")
        parts.append(f"{key}={nominal}" + (f" ({', '.join(extra)})" if extra else ""))
    return ", ".join(parts) or "no quota (unlimited)"


def event_problems(events: Sequence[ClusterEvent], nodes: Collection[str], queues: Collection[str]) -> list[str]:
    """What is wrong with `events` for a cluster of `nodes` and `queues` (empty: nothing). A node is known once
    the cluster has it: from the start, or from an `AddNodes` at or before the event's time."""
    problems: list[str] = []
    added: dict[str, float] = {}
    known = set(nodes)
    for event in events:
        if isinstance(event, AddNodes):
            for node in event.nodes:
                if node.name in known or node.name in added:
                    problems.append(f"event {describe(event)!r} adds node {node.name!r}, which already exists")
                added.setdefault(node.name, event.at)
    for event in events:
        if not (isinstance(event.at, int | float) and math.isfinite(event.at) and event.at >= 0):
            problems.append(f"a {type(event).__name__} event is at time {event.at}")
            continue
        if isinstance(event, NodeDown | NodeUp):
            since = added.get(event.node)
            if event.node not in known and since is None:
                problems.append(f"event {describe(event)!r} names node {event.node!r}, which the cluster does not have")
            elif since is not None and event.at < since:
                problems.append(f"event {describe(event)!r} comes before node {event.node!r} is added at {since:g} s")
        elif isinstance(event, QuotaChange) and event.queue.name not in queues:
            problems.append(f"event {describe(event)!r} names queue {event.queue.name!r}, which is not defined")
        elif isinstance(event, AddNodes) and not event.nodes:
            problems.append(f"an AddNodes event at {event.at:g} s adds no node")
    return problems


@dataclass(frozen=True, slots=True)
class FailureModel:
    """Random node failures: per node, exponential times to failure (mean `mtbf_hours`) and to repair (mean
    `repair_hours`), alternating. Each node draws from its own generator, seeded by `seed` and the node's name,
    so a node fails at the same times whatever else the cluster holds (a what-if that adds nodes does not move
    the failures of the others) and whichever policy runs."""

    mtbf_hours: float
    repair_hours: float
    seed: int = 0
    pool: str | None = None  # only nodes of this pool fail (spot interruptions: "spot"); None: every node

    def __post_init__(self) -> None:
        for name, value in (("mtbf_hours", self.mtbf_hours), ("repair_hours", self.repair_hours)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise WorkloadError(f"failure model {name} is {value}", f"give {name} > 0, e.g. 1000 and 4")

    def describe(self) -> str:
        return (
            f"Random node failures: exponential time to failure with mean {self.mtbf_hours:g} h per node, "
            f"exponential repair time with mean {self.repair_hours:g} h (seed {self.seed})."
        )

    def clock(self, node: str) -> NodeFailureClock:
        return NodeFailureClock(self, node)


class NodeFailureClock:
    """The failure times of one node: `next_failure(after)` and `next_repair(after)`, drawn in turn."""

    def __init__(self, model: FailureModel, node: str) -> None:
        self.model = model
        self.node = node
        # default_rng over (seed, a stable hash of the name): independent streams, the same on every run.
        self._rng = np.random.default_rng((model.seed, zlib.crc32(node.encode("utf-8"))))
        self._mtbf_s = model.mtbf_hours * 3600.0
        self._repair_s = model.repair_hours * 3600.0

    def next_failure(self, after: float) -> float:
        return after + float(self._rng.exponential(self._mtbf_s))

    def next_repair(self, after: float) -> float:
        return after + float(self._rng.exponential(self._repair_s))
