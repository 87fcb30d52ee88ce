"""The one error tree of gpufleet.

Every error a user can cause says what was wrong and how to fix it. Expected scheduling
outcomes (a job that does not fit) are not errors: they are `Status` values in the core.

    GpufleetError
    ├── SpecError            a spec (job, queue, node, cluster) is invalid; carries per-field problems
    ├── InvalidTransitionError    a job state change that the state machine does not allow
    └── UnknownNameError          a name (policy, queue, trace, model) that is not registered
"""

from __future__ import annotations

from dataclasses import dataclass


class GpufleetError(Exception):
    """Root of every error gpufleet raises on purpose."""

    def __init__(self, message: str, fix: str = "") -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}; to fix: {fix}" if fix else message)


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One invalid field: where it is, what is wrong, and what to do."""

    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}; to fix: {self.fix}"


class SpecError(GpufleetError):
    """A spec that cannot be accepted. `fields` names every bad field, not only the first."""

    def __init__(self, what: str, fields: tuple[FieldProblem, ...]) -> None:
        self.what = what
        self.fields = fields
        listed = "; ".join(str(f) for f in fields)
        super().__init__(f"invalid {what}: {listed}")


class InvalidTransitionError(GpufleetError):
    """A job state transition that is not in the transition table."""


class UnknownNameError(GpufleetError):
    """A name that nothing is registered under."""


def check(problems: list[FieldProblem], what: str) -> None:
    """Raise one SpecError listing every problem, if there are any."""
    if problems:
        raise SpecError(what, tuple(problems))
