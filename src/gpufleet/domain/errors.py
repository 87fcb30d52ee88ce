"""The one error tree of gpufleet.

Every error a user can cause says what was wrong and how to fix it. Expected scheduling
outcomes (a job that does not fit) are not errors: they are `Status` values in the core.

    GpufleetError
    ├── SpecError            a spec (job, queue, node, cluster) is invalid; carries per-field problems
    ├── InvalidTransitionError    a job state change that the state machine does not allow
    ├── UnknownNameError          a name (policy, queue, trace, model) that is not registered
    ├── LimitError                a limit an admin set is reached (pending jobs of a queue); retry later
    └── WorkloadError             input data (a trace file, a throughput table) that cannot be used; says where
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike


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


class LimitError(GpufleetError):
    """A limit an administrator set is reached (e.g. a queue's cap on pending jobs): nothing was stored, and
    the same request may succeed later."""


class WorkloadError(GpufleetError):
    """A workload input that cannot be used: a missing file, a missing column, a bad value, a bad table row.

    The message starts with where the problem is (`path`, `line`, `column`, each when known) and the fix
    says what to change, so that the CLI can print it as is instead of a stack trace.
    """

    def __init__(
        self,
        message: str,
        fix: str = "",
        *,
        path: str | PathLike[str] | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.column = column
        where = [part for part in (self.path, f"line {line}" if line is not None else None) if part]
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message, fix)


def check(problems: list[FieldProblem], what: str) -> None:
    """Raise one SpecError listing every problem, if there are any."""
    if problems:
        raise SpecError(what, tuple(problems))
