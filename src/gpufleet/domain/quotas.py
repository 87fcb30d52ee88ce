"""Queues (one per team), cohorts that share idle quota, and quotas per resource and per GPU model.

Quota semantics follow Kueue's ClusterQueue/cohort model:

- `nominal`: what the queue is guaranteed (None: unlimited).
- `borrowing_limit`: how much above nominal it may use from its cohort's idle quota (None: no limit
  beyond what the cohort has idle; 0: no borrowing).
- `lending_limit`: how much of its unused nominal it lends to the cohort (None: all of it). The rest
  (nominal - lending_limit) stays reserved for the queue alone.

Resource keys: `gpu` (milli-GPU, any model), `gpu:<MODEL>` (milli-GPU of one model), `cpu`
(milli-cores), `memory` (bytes). A queue that names per-model GPU quotas may only use those models.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.domain.errors import FieldProblem, check

GPU = "gpu"
CPU = "cpu"
MEMORY = "memory"
GPU_MODEL_PREFIX = "gpu:"


def gpu_model_key(model: str) -> str:
    return GPU_MODEL_PREFIX + model


@dataclass(frozen=True, slots=True)
class Quota:
    nominal: int | None = None
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def guaranteed(self) -> int:
        """The part of nominal that is never lent."""
        if self.nominal is None:
            return 0
        if self.lending_limit is None:
            return 0
        return max(0, self.nominal - self.lending_limit)

    @property
    def lendable(self) -> int:
        if self.nominal is None:
            return 0
        return self.nominal - self.guaranteed


# The smallest per-queue memory default or disk quota: below it no program starts (or no file system fits).
MIN_HOST_LIMIT = 1 << 20

# A POSIX portable user name (as useradd accepts by default): what `run_as` may name.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A team's queue. `weight` scales its fair share; `cohort` names the group it borrows within.

    Limits an admin sets on what the queue's users may ask, checked when a job is submitted (the scheduling
    core does not read them): `max_pending` (None: no cap) pending jobs at once, and `max_grace_s` (None: the
    control plane's default) the longest grace period between a job's checkpoint signal and SIGKILL, so that
    no job can hold its GPUs for long after it was told to stop.

    `run_as` is the OS user the queue's jobs run as, when an administrator mapped one; None lets the
    executor pick the queue's own unprivileged user. The scheduler never reads it.

    What the node that runs a worker enforces, never read by the scheduler either (bytes; None: the node's
    default): `memory_per_gpu`, the memory limit of a worker whose job gave no `memory`, per GPU it holds (half
    of it for half a GPU); `memory_no_gpu`, that limit for a worker holding no GPU; `disk`, how much the queue's
    jobs together may keep in their working folders on a node."""

    name: str
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    cohort: str | None = None
    weight: float = 1.0
    run_as: str | None = None
    max_pending: int | None = None
    max_grace_s: float | None = None
    memory_per_gpu: int | None = None
    memory_no_gpu: int | None = None
    disk: int | None = None
    # Not set by an admin but from the queue's budget: spent, with the action `deprioritise`. Its jobs then run
    # only on idle capacity: they do not borrow above nominal, do not preempt, and are the first victims.
    deprioritised: bool = False

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not self.name or not self.name.strip():
            problems.append(FieldProblem("name", "is empty", "name the queue, e.g. team-a"))
        if not self.weight > 0:
            problems.append(FieldProblem("weight", f"is {self.weight}", "give a weight > 0"))
        if self.max_pending is not None and self.max_pending < 0:
            problems.append(FieldProblem("max_pending", f"is {self.max_pending}", "give 0 or more, or no cap"))
        if self.max_grace_s is not None and not 0 <= self.max_grace_s < math.inf:
            problems.append(FieldProblem("max_grace", f"is {self.max_grace_s}", "give a duration >= 0"))
        for what, amount in (
            ("memory_per_gpu", self.memory_per_gpu),
            ("memory_no_gpu", self.memory_no_gpu),
            ("disk", self.disk),
        ):
            if amount is not None and amount < MIN_HOST_LIMIT:
                problems.append(
                    FieldProblem(what, f"is {amount} bytes", "give at least 1MiB, or leave it unset for the default")
                )
        if self.cohort is not None and not self.cohort.strip():
            problems.append(FieldProblem("cohort", "is empty", "name the cohort or leave it unset"))
        if self.run_as is not None and not USER_NAME.fullmatch(self.run_as):
            problems.append(
                FieldProblem(
                    "run_as",
                    f"{self.run_as!r} is not a user name",
                    "give an existing OS user: lower-case letters, digits, '_' or '-', up to 32 characters",
                )
            )
        for key, quota in self.quotas.items():
            if key not in (GPU, CPU, MEMORY) and not (key.startswith(GPU_MODEL_PREFIX) and len(key) > 4):
                problems.append(
                    FieldProblem(f"quotas.{key}", "is not a resource", "use gpu, gpu:<MODEL>, cpu or memory")
                )
            for what, value in (
                ("nominal", quota.nominal),
                ("borrowing_limit", quota.borrowing_limit),
                ("lending_limit", quota.lending_limit),
            ):
                if value is not None and value < 0:
                    problems.append(FieldProblem(f"quotas.{key}.{what}", f"is {value}", "give 0 or more"))
            if quota.lending_limit is not None and quota.nominal is not None and (quota.lending_limit > quota.nominal):
                problems.append(
                    FieldProblem(f"quotas.{key}.lending_limit", "is above nominal", "lend at most the nominal quota")
                )
            if quota.nominal is None and quota.borrowing_limit is not None:
                problems.append(
                    FieldProblem(
                        f"quotas.{key}.borrowing_limit",
                        "is set on an unlimited quota",
                        "set a nominal quota, or drop the borrowing limit",
                    )
                )
        check(problems, f"queue {self.name!r}")

    @property
    def model_quotas(self) -> frozenset[str]:
        """GPU models this queue has a per-model quota for (empty: any model, within `gpu`)."""
        return frozenset(k[len(GPU_MODEL_PREFIX) :] for k in self.quotas if k.startswith(GPU_MODEL_PREFIX))


DEFAULT_QUEUE = "default"
