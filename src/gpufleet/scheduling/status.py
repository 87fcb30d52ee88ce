"""Expected outcomes of scheduling as values: what happened to a job, and why, in people's words."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Code(enum.StrEnum):
    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"  # does not fit now; freed resources or preemption may help
    UNRESOLVABLE = "unresolvable"  # can never fit as asked (too big, unknown model, over quota for good)
    WAIT = "wait"  # fits in principle but waits its turn (victims stopping, behind the queue's head)
    ERROR = "error"  # a bug or an inconsistent snapshot; the message says which


class Wake(enum.StrEnum):
    """What event could let a waiting job in (as Kubernetes' queueing hints): the control loop
    parks the job until then instead of retrying it every cycle."""

    RELEASE = "release"  # any job releasing resources, a node added or uncordoned
    QUOTA = "quota"  # its queue or cohort releasing quota
    CLUSTER_CHANGE = "cluster"  # nodes or quotas changing


_DEFAULT_WAKE = {
    Code.SUCCESS: Wake.RELEASE,
    Code.UNSCHEDULABLE: Wake.RELEASE,
    Code.WAIT: Wake.RELEASE,
    Code.UNRESOLVABLE: Wake.CLUSTER_CHANGE,
    Code.ERROR: Wake.CLUSTER_CHANGE,
}


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reasons: tuple[str, ...] = ()
    plugin: str = ""
    wake_on: Wake | None = None  # None: the default for the code

    @property
    def wake(self) -> Wake:
        return self.wake_on if self.wake_on is not None else _DEFAULT_WAKE[self.code]

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    def message(self) -> str:
        return "; ".join(self.reasons) if self.reasons else self.code.value


SUCCESS = Status(Code.SUCCESS)


def unschedulable(plugin: str, *reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reasons, plugin)


def unresolvable(plugin: str, *reasons: str) -> Status:
    return Status(Code.UNRESOLVABLE, reasons, plugin)


def wait(plugin: str, *reasons: str) -> Status:
    return Status(Code.WAIT, reasons, plugin)
