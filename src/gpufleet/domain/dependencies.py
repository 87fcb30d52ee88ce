"""Job dependencies and job arrays, in Slurm's words: what a job waits for before it may be scheduled.

`afterok:ID[:ID…][,afterany:ID…]` as `sbatch --dependency` takes it: every listed condition must hold (`,`);
`singleton` lets at most one job of the same name and submitter run at a time. An array (`0-99:2%8`) is
many jobs of one spec, one per index, at most `%N` of them running at once. The scheduling core never
reads any of this: the control layer keeps a job from the scheduler until it may run.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.lifecycle import JobState

MAX_ARRAY_TASKS = 100_000  # tasks one submit may create
MAX_ARRAY_INDEX = 10_000_000


class DepKind(enum.StrEnum):
    AFTER = "after"  # the parent started (or ended without starting)
    AFTEROK = "afterok"  # the parent succeeded
    AFTERNOTOK = "afternotok"  # the parent failed or was cancelled
    AFTERANY = "afterany"  # the parent ended, however
    SINGLETON = "singleton"  # no other job of the same name and submitter runs


class Verdict(enum.Enum):
    MET = "met"
    WAIT = "wait"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: DepKind
    job_id: str = ""  # empty for `singleton`

    def __str__(self) -> str:
        return self.kind.value if self.kind is DepKind.SINGLETON else f"{self.kind.value}:{self.job_id}"


@dataclass(frozen=True, slots=True)
class ArrayTask:
    """One task of an array: `array_id` is the array's id (its tasks' ids are `ARRAYID_TASK`); `throttle` is
    how many of the array's tasks may run at once (None: no limit)."""

    array_id: str
    task: int
    throttle: int | None = None


def judge(kind: DepKind, state: JobState, started: bool) -> Verdict:
    """Whether a dependency of `kind` on a parent in `state` (that `started` once or not) holds, may still
    hold, or never can. Monotone: once MET or NEVER, it stays so whatever the parent does next."""
    if kind is DepKind.AFTER:
        return Verdict.MET if started or state.terminal else Verdict.WAIT
    if not state.terminal:
        return Verdict.WAIT
    if kind is DepKind.AFTEROK:
        return Verdict.MET if state is JobState.SUCCEEDED else Verdict.NEVER
    if kind is DepKind.AFTERNOTOK:
        return Verdict.NEVER if state is JobState.SUCCEEDED else Verdict.MET
    return Verdict.MET


_KINDS = ", ".join(k.value for k in DepKind)


def _problem(text: str, why: str) -> SpecError:
    return SpecError(
        "job spec",
        (
            FieldProblem(
                "depends_on",
                f"{text!r} {why}",
                f"write TYPE:ID[:ID…] joined by commas, TYPE one of {_KINDS} (e.g. afterok:j-1a2b3c4d:j-5e6f7a8b)",
            ),
        ),
    )


def parse_dependencies(text: str | list[str]) -> tuple[Dependency, ...]:
    """`afterok:A:B,afterany:C` (or a list of such parts) as dependencies, in order, duplicates dropped."""
    parts = [p.strip() for item in ([text] if isinstance(text, str) else text) for p in item.split(",")]
    found: list[Dependency] = []
    for part in parts:
        if not part:
            continue
        if "?" in part:
            raise _problem(part, "uses `?` (any one of): only all-of (`,`) is supported")
        kind_text, *ids = part.split(":")
        try:
            kind = DepKind(kind_text.strip().lower())
        except ValueError:
            raise _problem(part, f"has an unknown type {kind_text!r}") from None
        if kind is DepKind.SINGLETON:
            if ids:
                raise _problem(part, "names jobs; singleton takes none")
            found.append(Dependency(kind))
            continue
        if not ids or not all(i.strip() for i in ids):
            raise _problem(part, "names no job id")
        found.extend(Dependency(kind, i.strip()) for i in ids)
    return tuple(dict.fromkeys(found))


_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def _array_problem(text: str, why: str) -> SpecError:
    return SpecError(
        "job spec",
        (
            FieldProblem(
                "array",
                f"{text!r} {why}",
                "write indexes as Slurm does: 0-99, 0-99:2 (a step), 1,3,5 (a list), and %N for at most N at once "
                "(e.g. 0-99%8)",
            ),
        ),
    )


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """`0-99:2%8` as (sorted distinct indexes, throttle or None)."""
    body, _, throttle_text = text.strip().partition("%")
    throttle: int | None = None
    if throttle_text:
        if not throttle_text.strip().isdigit() or int(throttle_text) < 1:
            raise _array_problem(text, "has a throttle that is not a whole number >= 1")
        throttle = int(throttle_text)
    indexes: set[int] = set()
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise _array_problem(text, f"has a part {part.strip()!r} that is not N, N-M or N-M:S")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise _array_problem(text, f"has a range {part.strip()!r} that ends before it starts or a step below 1")
        if last > MAX_ARRAY_INDEX:
            raise _array_problem(text, f"has an index above {MAX_ARRAY_INDEX}")
        if (last - first) // step + 1 + len(indexes) > MAX_ARRAY_TASKS:
            raise _array_problem(text, f"makes more than {MAX_ARRAY_TASKS} tasks")
        indexes.update(range(first, last + 1, step))
    return tuple(sorted(indexes)), throttle


def task_id(array_id: str, task: int) -> str:
    return f"{array_id}_{task}"


def split_task_id(job_id: str) -> tuple[str, int | None]:
    """`j-1a2b3c4d_7` as (`j-1a2b3c4d`, 7); an id that names no task as (id, None)."""
    head, sep, tail = job_id.rpartition("_")
    if sep and head and tail.isdigit():
        return head, int(tail)
    return job_id, None
