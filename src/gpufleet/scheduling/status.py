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


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reasons: tuple[str, ...] = ()
    plugin: str = ""

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
