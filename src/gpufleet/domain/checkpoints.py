"""How often a job should checkpoint, and what the control plane counts as work lost when an attempt ends.

**The interval.** A job that saves a checkpoint every `t` seconds, each save taking `C` seconds, on hardware
that fails on average every `M` seconds, loses about `C/t` of its time to saving and `t/(2M)` to work redone
after a failure. Their sum is least at

    t* = sqrt(2 C M)

(J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9):530-531, 1974;
the first-order term of J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22(3):303-312, 2006). It holds for `C` much smaller than `M`; when `C >= 2M` Daly's answer is `M`.

`C` is the job's own: the duration of its last reported checkpoint (`gpufleet.runtime.checkpoint_saved`).
`M` is that of what the job runs on. A job stops when any node it holds is lost, so its failure rate is the
sum over its nodes of:
- each GPU's failure rate, `DEFAULT_GPU_FAILURES_PER_HOUR` (1 per 50,700 GPU-hours: 419 unexpected
  interruptions in 54 days of a 16,384-H100 job; Meta, "The Llama 3 Herd of Models", 2024, Sec. 3.3.4);
- for a spot node, its pool's interruption rate per node-hour: as the pool's circuit breaker measured it over
  its sliding window (`ObservedPool`) once it has seen `MIN_OBSERVED_NODE_HOURS`, else
  `DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR` (0.3: the 1-node AWS V100 spot preemption rate of the NSDI'24
  "Can't Be Late" traces, 0.23-0.34 per hour by zone; Wu et al., NSDI 2024).
Failures of on-demand and reserved nodes are not measured yet: they use the published GPU rate.

**Lost work.** An attempt that ends by preemption, loss of a node or failure loses the work done since its
last checkpoint (or its start): `AttemptLoss`, priced like the cost report from the attempt's charges.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.spot import pool_of

HOUR = 3600.0
LLAMA3_SOURCE = "Llama 3 Herd of Models (Meta 2024): 1 per 50,700 GPU-h"
NSDI24_SOURCE = "NSDI'24 spot traces: 0.3/node-h"
DEFAULT_GPU_FAILURES_PER_HOUR = 1.0 / 50_700.0
DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR = 0.3
# A pool's measured rate is used once its window holds this many node-hours; a rate from less (one event,
# or none, in a few node-minutes) says little.
MIN_OBSERVED_NODE_HOURS = 4.0
INTERVAL_ENV = "GPUFLEET_CHECKPOINT_INTERVAL_S"


def optimal_interval(cost_s: float, mtbf_s: float) -> float:
    """Seconds between checkpoints that lose the least time: sqrt(2 C M) (Young 1974; Daly 2006's first
    order), or `M` when `C >= 2M` (Daly 2006). ValueError unless both are positive and finite."""
    problems = [
        FieldProblem(name, f"is {value}", "give seconds > 0")
        for name, value in (("cost_s", cost_s), ("mtbf_s", mtbf_s))
        if not (math.isfinite(value) and value > 0)
    ]
    check(problems, "checkpoint interval")
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2.0 * cost_s * mtbf_s)


@dataclass(frozen=True, slots=True)
class ObservedPool:
    """What a spot pool's breaker measured over its window: interruptions per node-hour, over how many."""

    rate_per_node_hour: float
    node_hours: float


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """The interval given to one attempt of a job, and what it was computed from."""

    interval_s: float
    cost_s: float  # C: the job's last reported checkpoint duration
    mtbf_s: float  # M: the mean time between failures of the nodes it was placed on
    mtbf_source: str  # where M came from, in words

    def to_dict(self) -> dict[str, float | str]:
        return {
            "interval_s": self.interval_s,
            "cost_s": self.cost_s,
            "mtbf_s": self.mtbf_s,
            "mtbf_source": self.mtbf_source,
        }

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> CheckpointPlan:
        return CheckpointPlan(
            float(data["interval_s"]),  # type: ignore[arg-type]
            float(data["cost_s"]),  # type: ignore[arg-type]
            float(data["mtbf_s"]),  # type: ignore[arg-type]
            str(data["mtbf_source"]),
        )


def failures_per_hour(
    workers: Iterable[WorkerPlacement], nodes: Mapping[str, Node], observed: Mapping[str, ObservedPool]
) -> tuple[float, str]:
    """The failure rate (per hour) of a job placed on `workers`, and where it came from in words. `observed`:
    spot pool name (`spot.pool_of`) -> what its breaker measured."""
    rate = 0.0
    gpus = 0
    spot: dict[str, int] = {}  # spot pool -> nodes of the job in it
    for name in dict.fromkeys(w.node for w in workers):
        node = nodes.get(name)
        count = len(node.gpus) if node is not None else sum(len(w.gpus) for w in workers if w.node == name)
        gpus += max(count, 1)
        pool = pool_of(node) if node is not None else None
        if pool is not None:
            spot[pool] = spot.get(pool, 0) + 1
    rate += gpus * DEFAULT_GPU_FAILURES_PER_HOUR
    parts = [f"{gpus} GPU{'s' if gpus != 1 else ''} x {LLAMA3_SOURCE}"]
    for pool, count in sorted(spot.items()):
        seen = observed.get(pool)
        if seen is not None and seen.node_hours >= MIN_OBSERVED_NODE_HOURS:
            rate += count * seen.rate_per_node_hour
            parts.append(
                f"{count} node{'s' if count != 1 else ''} of spot pool {pool} x observed "
                f"{seen.rate_per_node_hour:.3g}/node-h over {seen.node_hours:.1f} node-h"
            )
        else:
            rate += count * DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR
            parts.append(
                f"{count} node{'s' if count != 1 else ''} of spot pool {pool} x default {NSDI24_SOURCE} "
                "(not yet observed)"
            )
    return rate, "; ".join(parts)


def plan_checkpoints(
    cost_s: float | None,
    workers: Iterable[WorkerPlacement],
    nodes: Mapping[str, Node],
    observed: Mapping[str, ObservedPool],
) -> CheckpointPlan | None:
    """The plan for an attempt placed on `workers`; None while the job has reported no checkpoint (no C)."""
    if cost_s is None or not (math.isfinite(cost_s) and cost_s > 0):
        return None
    rate, source = failures_per_hour(list(workers), nodes, observed)
    if rate <= 0:
        return None
    mtbf_s = HOUR / rate
    return CheckpointPlan(optimal_interval(cost_s, mtbf_s), cost_s, mtbf_s, source)


class LossCause(enum.StrEnum):
    """How an attempt that lost work ended."""

    PREEMPTED = "preempted"  # stopped to make room (or requeued off its node) and put back in its queue
    LOST = "lost"  # a node it ran on was lost (a spot interruption, a failure), or its processes vanished
    FAILED = "failed"  # a worker exited non-zero


@dataclass(frozen=True, slots=True)
class AttemptLoss:
    """The work one attempt lost when it ended: `lost_s` seconds of `gpus` GPUs, since `saved_at` (its last
    checkpoint in the attempt, the last save its declared interval implies, or its start)."""

    attempt: int
    cause: LossCause
    started_at: float
    ended_at: float
    lost_s: float
    gpus: float

    @property
    def gpu_hours(self) -> float:
        return self.lost_s * self.gpus / HOUR

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "attempt": self.attempt,
            "cause": self.cause.value,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "lost_s": self.lost_s,
            "gpus": self.gpus,
        }

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> AttemptLoss:
        return AttemptLoss(
            int(data["attempt"]),  # type: ignore[call-overload]
            LossCause(str(data["cause"])),
            float(data["started_at"]),  # type: ignore[arg-type]
            float(data["ended_at"]),  # type: ignore[arg-type]
            float(data["lost_s"]),  # type: ignore[arg-type]
            float(data["gpus"]),  # type: ignore[arg-type]
        )
