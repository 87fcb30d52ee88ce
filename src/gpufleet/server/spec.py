"""The job spec users write: YAML for the CLI, the same schema as JSON for the API.

People's units in, base units out: `gpus: 0.5` becomes a 500 milli-GPU share, `memory: 64GiB` bytes,
`grace_period: 5m` seconds. `JobSpec.to_job` builds the domain `Job` (with its `RunSpec`); every
problem, from pydantic or from the domain's own checks, comes back as one `SpecError` that names each
bad field with a fix.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gpufleet.domain.comm import DTYPE_BYTES, CommNeeds
from gpufleet.domain.dependencies import Dependency, parse_array, parse_dependencies
from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.jobs import SIGNALS, Job, JobId, RunSpec
from gpufleet.domain.resources import MILLI_PER_GPU, WorkerRequest, parse_models
from gpufleet.server.limits import (
    MAX_ARGUMENT,
    MAX_ARGUMENTS,
    MAX_BYTES_PER_WORKER,
    MAX_COMMAND,
    MAX_CPU_PER_WORKER,
    MAX_DURATION_S,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_EXPECTED_DURATION_S,
    MAX_GPU_MODELS,
    MAX_GPUS_PER_WORKER,
    MAX_GRACE_S,
    MAX_GRAD_BYTES,
    MAX_NAME,
    MAX_PARAMS,
    MAX_PATH,
    MAX_WORKERS,
)
from gpufleet.server.yaml_file import SPEC_EXAMPLE, read_yaml_mapping

# ---------------------------------------------------------------------------------------------- units

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")

# Why each reserved variable is refused: the allocator sets them per worker.
RESERVED_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "gpufleet sets it to the GPUs the job was given; ask for GPUs with `gpus` instead",
    "NVIDIA_VISIBLE_DEVICES": "gpufleet chooses the GPUs; ask for GPUs with `gpus` instead",
    "MASTER_PORT": "gpufleet gives each job a free port; read MASTER_PORT from the environment instead",
    "MASTER_ADDR": "gpufleet sets it to the first worker's host; read MASTER_ADDR from the environment instead",
    "RANK": "gpufleet sets it per worker; read RANK from the environment instead",
    "WORLD_SIZE": "gpufleet sets it from `workers`; read WORLD_SIZE from the environment instead",
    "LOCAL_RANK": "gpufleet sets it per worker; read LOCAL_RANK from the environment instead",
}
RESERVED_ENV_PREFIX = "GPUFLEET_"
# On an emulated inventory, what a job says it does with its GPUs (drives the emulated utilisation).
EMULATED_ACTIVITY_ENV = "EMULATED_GPU_ACTIVITY"
EMULATED_ACTIVITIES = ("idle", "light", "busy")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _BadValueError(ValueError):
    """A value error that carries its fix; `problems_from_validation` splits it back out."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}{_FIX_SEP}{fix}")


_FIX_SEP = "; to fix: "


def parse_size(value: object, what: str = "size", most: int = MAX_BYTES_PER_WORKER) -> int:
    """`"20GiB"`, `"20GB"`, `"512Mi"`, `1073741824` -> bytes. GB/MB are powers of 1000, GiB/MiB of 1024.
    At most `most` bytes."""
    if isinstance(value, bool):
        raise _BadValueError(f"is {value!r}", f"give the {what} as bytes or with a unit, e.g. 20GiB")
    if isinstance(value, int):
        if not 0 <= value <= most:
            raise _BadValueError(f"is {_short(value)} bytes", f"give a {what} from 0 to {format_size(most)}")
        return value
    elif isinstance(value, float):
        number, unit = value, ""
    elif isinstance(value, str) and (match := _SIZE_RE.match(value)):
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise _BadValueError(f"{value!r} is not a size", f"give the {what} as bytes or with a unit, e.g. 20GiB or 64GB")
    if unit not in _SIZE_UNITS:
        raise _BadValueError(
            f"unit {unit!r} is not known", "use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB"
        )
    if not math.isfinite(number) or number < 0 or number * _SIZE_UNITS[unit] > most:
        raise _BadValueError(f"is {_short(value)}", f"give a {what} from 0 to {format_size(most)}")
    return round(number * _SIZE_UNITS[unit])


def _short(value: object) -> str:
    """A value for an error message, cut short (a 400-digit number is not worth quoting whole)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def parse_duration(value: object, most: float = MAX_DURATION_S) -> float:
    """`"30s"`, `"5m"`, `"1h30m"`, `"500ms"`, `90` -> seconds, at most `most`."""
    if isinstance(value, bool):
        raise _BadValueError(f"is {value!r}", "give seconds, or a duration such as 30s, 5m, 2h")
    if isinstance(value, int) and abs(value) > most:
        raise _BadValueError(f"is {_short(value)} s", f"give at most {format_duration(most)}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        if len(value) > 64:
            raise _BadValueError(f"is {_short(value)}", "give a duration such as 30s, 5m, 2h, 1h30m")
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART_RE.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise _BadValueError(
                    f"{value!r} is not a duration", "give seconds, or a duration such as 30s, 5m, 2h, 1h30m"
                ) from None
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    else:
        raise _BadValueError(f"{value!r} is not a duration", "give seconds, or a duration such as 30s, 5m, 2h")
    if not math.isfinite(seconds) or seconds < 0:
        raise _BadValueError(f"is {_short(value)}", "give a duration >= 0")
    if seconds > most:
        raise _BadValueError(f"is {_short(value)}", f"give at most {format_duration(most)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds in the largest unit that divides them: 3600 -> '1h', 90 -> '90s'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def has_nul(value: object) -> bool:
    """Whether a NUL character hides anywhere in a parsed YAML/JSON value."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_nul(v) for v in value)
    return False


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def has_control(text: str) -> bool:
    """Whether a label holds a control character (terminal escapes, bidirectional overrides)."""
    return _CONTROL.search(text) is not None


def format_size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps it readable: 21474836480 -> '20GiB'."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor:
            return f"{nbytes / factor:.4g}{unit}"
    return f"{nbytes}B"


# ------------------------------------------------------------------------------------------- the spec


class JobSpec(BaseModel):
    """A job as a user writes it. Sizes take units (20GiB, 64GB), durations too (30s, 5m, 2h)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field("", max_length=MAX_NAME, description="A label for people; need not be unique.")
    job_type: str = Field(
        "",
        max_length=MAX_NAME,
        description="What the job runs, e.g. resnet50-bs64: jobs of one type share their measured speed on each "
        "GPU model (`gpufleet throughput import`, or learned from their progress reports).",
    )
    queue: str | None = Field(None, max_length=63, description="Team queue; default: the token's queue.")
    command: list[str] | str = Field(description="An argv list, or one string run by /bin/sh -c.")
    workdir: str = Field("", max_length=MAX_PATH, description="Working directory of every worker.")
    image: str = Field(
        "",
        max_length=MAX_PATH,
        pattern=r"^[^\s]*$",
        description="The OCI image every worker runs in, e.g. ghcr.io/acme/train:1.4 (on a Kubernetes-backed "
        "control plane, where it is required).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    gpus: float = Field(
        0, ge=0, le=MAX_GPUS_PER_WORKER, description="Whole GPUs per worker, or a fraction of one GPU such as 0.5."
    )
    gpu_memory: int | str | None = Field(None, description="GPU memory needed on each GPU: 20GiB, 20GB or bytes.")
    gpu_models: list[str] | str | None = Field(None, description='Allowed GPU models: a list or "A100-80GB|H100".')
    cpu: float = Field(0, ge=0, le=MAX_CPU_PER_WORKER, description="CPU cores per worker.")
    memory: int | str | None = Field(None, description="Memory per worker: 64GiB, 64GB or bytes.")
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="Workers started together (a gang).")
    min_workers: int | None = Field(
        None, ge=1, le=MAX_WORKERS, description="Elastic jobs: the smallest gang that may start."
    )
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="Higher runs first and may preempt lower.")
    preemptible: bool = True
    checkpoint_signal: str = Field(
        "SIGTERM", max_length=16, description="Sent before stopping it; then `grace_period`."
    )
    grace_period: float | str = Field(
        30.0,
        description="Time between the signal and SIGKILL: 30s, 5m or seconds; at most the queue's maximum (1h "
        "unless an admin set another).",
    )
    max_runtime: float | str | None = Field(None, description="Longest run of one attempt; then it fails.")
    retries: int = Field(0, ge=0, le=1000, description="Times a failed attempt is started again.")
    checkpoint_interval: float | str | None = Field(None, description="How often the job saves its work.")
    spot: Literal["never", "allowed", "preferred"] = Field(
        "never", description="Spot capacity (cheaper, may be taken back): never, allowed, or preferred."
    )
    expected_duration: float | str | None = Field(None, description="A run-time estimate for ordering policies.")
    grad_bytes: int | str | None = Field(
        None, description="Data-parallel jobs: gradient bytes all-reduced each step (14GB or bytes); or `params`."
    )
    params: float | str | None = Field(
        None, description="Data-parallel jobs: parameters (7B, 350M or a number), with `dtype`, for grad_bytes."
    )
    dtype: Literal["fp32", "fp16", "bf16", "fp8"] | None = Field(
        None, description="The gradients' type with `params`: fp32 (default), fp16, bf16 or fp8."
    )
    step_time: float | str | None = Field(
        None, description="One step's compute time without gradient synchronisation: 350ms, 2s or seconds."
    )
    max_comm_overhead: float | str | None = Field(
        None,
        description="Largest share of each step in all-reduce a placement may cost (0.2 or 20%); else the job waits.",
    )
    depends_on: list[str] | str | None = Field(
        None,
        description="What must happen first, as Slurm's --dependency: afterok:ID[:ID…][,afterany:ID…] with after, "
        "afterok, afternotok, afterany (an array's id means all its tasks, ARRAYID_N one task), or singleton "
        "(one job of this name and submitter at a time); every part must hold.",
    )
    array: str | None = Field(
        None,
        max_length=10_000,
        description="Run one task per index, as Slurm's --array: 0-99, 0-99:2, 1,3,5; %N runs at most N at once "
        "(0-99%8). Each task gets GPUFLEET_ARRAY_JOB_ID and GPUFLEET_ARRAY_TASK_ID.",
    )

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, str):
            if not value.strip():
                raise _BadValueError("is empty", "give the program and its arguments, e.g. [python, train.py]")
            parts = [value]
        elif not value or not all(part for part in value):
            raise _BadValueError(
                "is empty or has an empty part", "give the program and its arguments, e.g. [python, train.py]"
            )
        else:
            parts = value
        keep = "put long inputs in a file the job reads, and pass its path"
        if len(parts) > MAX_ARGUMENTS:
            raise _BadValueError(f"has {len(parts)} arguments", f"give at most {MAX_ARGUMENTS}; {keep}")
        longest = max(len(part) for part in parts)
        if longest > MAX_ARGUMENT:
            raise _BadValueError(
                f"has an argument of {longest} characters", f"keep each under {MAX_ARGUMENT // 1024} KiB; {keep}"
            )
        total = sum(len(part) for part in parts)
        if total > MAX_COMMAND:
            raise _BadValueError(f"is {total} characters long", f"keep it under {MAX_COMMAND // 1024} KiB; {keep}")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            return value  # pydantic says it is not a map
        if len(value) > MAX_ENV_VARS:
            raise _BadValueError(
                f"has {len(value)} variables", f"give at most {MAX_ENV_VARS}; put bulk settings in a file the job reads"
            )
        size = sum(len(str(k)) + len(str(v)) for k, v in value.items())
        if size > MAX_ENV:
            raise _BadValueError(
                f"is {size} characters long", f"keep it under {MAX_ENV // 1024} KiB; put bulk settings in a file"
            )
        cleaned: dict[str, str] = {}
        problems: list[str] = []
        fixes: list[str] = []
        for name, item in value.items():
            key = str(name)
            if not _ENV_NAME_RE.match(key):
                problems.append(f"{key!r} is not a variable name")
                fixes.append("use letters, digits and _, not starting with a digit")
                continue
            why = RESERVED_ENV.get(key)
            if why is None and key.startswith(RESERVED_ENV_PREFIX):
                why = (
                    f"gpufleet sets {RESERVED_ENV_PREFIX}* variables for each worker; read them instead of setting them"
                )
            if why is not None:
                problems.append(f"sets {key}, which the allocator owns")
                fixes.append(f"remove {key}: {why}")
                continue
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                problems.append(f"{key}={item!r} is not a string or number")
                fixes.append(f"quote the value of {key}")
                continue
            if len(str(item)) > MAX_ENV_VALUE:
                problems.append(f"{key} is {len(str(item))} characters long")
                fixes.append(f"keep each value under {MAX_ENV_VALUE // 1024} KiB")
                continue
            if key == EMULATED_ACTIVITY_ENV and str(item) not in EMULATED_ACTIVITIES:
                problems.append(f"{key}={item!r} is not an activity")
                fixes.append(f"use one of {', '.join(EMULATED_ACTIVITIES)} (it only matters on emulated GPUs)")
                continue
            cleaned[key] = str(item)
        if problems:
            raise _BadValueError("; ".join(problems), "; ".join(fixes))
        return cleaned

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: float) -> float:
        if not math.isfinite(value):
            raise _BadValueError(f"is {value}", "give whole GPUs (e.g. 2) or a fraction of one GPU (e.g. 0.5)")
        if value > 1 and value != int(value):
            raise _BadValueError(
                f"is {value:g}", "a fraction applies to one GPU: give a whole number, or a value in (0, 1)"
            )
        if 0 < value < 1 and round(value * MILLI_PER_GPU) < 1:
            raise _BadValueError(f"is {value:g}", "give at least 0.001 of a GPU")
        return value

    @field_validator("gpu_memory", "memory")
    @classmethod
    def _size(cls, value: int | str | None) -> int | None:
        return None if value is None else parse_size(value)

    @field_validator("gpu_models")
    @classmethod
    def _models(cls, value: list[str] | str | None) -> list[str] | None:
        if value is None:
            return None
        example = 'give model names, e.g. ["A100-80GB", "H100"], or leave gpu_models out for any model'
        models = sorted(parse_models(value)) if isinstance(value, str) else [m.strip() for m in value]
        if not models:
            raise _BadValueError("names no model", example)
        if len(models) > MAX_GPU_MODELS:
            raise _BadValueError(f"names {len(models)} models", f"name at most {MAX_GPU_MODELS}")
        for model in models:
            if not model or "|" in model or len(model) > 100 or has_control(model):
                raise _BadValueError(f"{_short(model)} is not a model name", example)
        return models

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: float) -> float:
        if not math.isfinite(value):
            raise _BadValueError(f"is {value}", "give CPU cores, e.g. 8 or 0.5")
        return value

    @field_validator("checkpoint_signal")
    @classmethod
    def _signal(cls, value: str) -> str:
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if name not in SIGNALS:
            raise _BadValueError(f"is {value!r}", f"use one of {', '.join(SIGNALS)}")
        return name

    @field_validator("grace_period")
    @classmethod
    def _grace(cls, value: float | str) -> float:
        return parse_duration(value, MAX_GRACE_S)

    @field_validator("max_runtime", "checkpoint_interval")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | None:
        return None if value is None else parse_duration(value, MAX_DURATION_S)

    @field_validator("expected_duration")
    @classmethod
    def _estimate(cls, value: float | str | None) -> float | None:
        return None if value is None else parse_duration(value, MAX_EXPECTED_DURATION_S)

    @field_validator("grad_bytes")
    @classmethod
    def _grad_bytes(cls, value: int | str | None) -> int | None:
        return None if value is None else parse_size(value, "gradient size", MAX_GRAD_BYTES)

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, value: object) -> float | None:
        return None if value is None else parse_count(value)

    @field_validator("step_time")
    @classmethod
    def _step_time(cls, value: float | str | None) -> float | None:
        return None if value is None else parse_duration(value, MAX_DURATION_S)

    @field_validator("max_comm_overhead", mode="before")
    @classmethod
    def _share(cls, value: object) -> float | None:
        return None if value is None else parse_share(value)

    @field_validator("name")
    @classmethod
    def _label(cls, value: str) -> str:
        if has_control(value):
            raise _BadValueError("contains control characters", "use printable characters only")
        return value

    @field_validator("min_workers")
    @classmethod
    def _min_workers(cls, value: int | None, info: ValidationInfo) -> int | None:
        workers = info.data.get("workers")
        if value is not None and isinstance(workers, int) and value > workers:
            raise _BadValueError(f"is {value}, above workers={workers}", "give 1 <= min_workers <= workers")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: object) -> object:
        # A NUL byte cannot be in an argv, an environment or most databases' text: refuse it up front.
        if isinstance(data, Mapping):
            for key, value in data.items():
                if has_nul(value) or has_nul(key):
                    raise _BadValueError(f"{key} contains a NUL character", f"remove it from {key}")
        return data

    @field_validator(
        "gpus", "cpu", "workers", "min_workers", "priority", "retries", "memory", "gpu_memory", "grace_period",
        "max_runtime", "checkpoint_interval", "expected_duration", "grad_bytes", "params", "step_time",
        "max_comm_overhead", mode="before",
    )  # fmt: skip
    @classmethod
    def _not_a_boolean(cls, value: object, info: ValidationInfo) -> object:
        # JSON's true would otherwise be read as 1 (a job asking `gpus: true` got one GPU).
        if isinstance(value, bool):
            raise _BadValueError(f"is {str(value).lower()}", f"give {info.field_name} as a number")
        return value

    # ------------------------------------------------------------------------------ to the domain

    def to_job(self, job_id: JobId, queue: str, submitted_at: float = 0.0) -> Job:
        """The domain job; the domain's own checks come back as a SpecError in this spec's field names."""
        gpus, milli = (1, round(self.gpus * MILLI_PER_GPU)) if 0 < self.gpus < 1 else (int(self.gpus), MILLI_PER_GPU)
        problems: list[FieldProblem] = []
        try:
            request = WorkerRequest(
                gpus=gpus,
                gpu_milli=milli,
                gpu_memory=int(self.gpu_memory or 0),
                cpu_milli=round(self.cpu * 1000),
                memory=int(self.memory or 0),
                models=frozenset(self.gpu_models or ()),
                spot=self.spot,
                checkpoints=self.checkpoint_interval is not None,
            )
        except SpecError as error:
            problems.extend(_rename(error.fields))
            request = WorkerRequest()
        command = (self.command,) if isinstance(self.command, str) else tuple(self.command)
        try:
            run: RunSpec | None = RunSpec(
                command=command,
                shell=isinstance(self.command, str),
                workdir=self.workdir,
                env=tuple(sorted(self.env.items())),
                checkpoint_signal=self.checkpoint_signal,
                grace_s=float(self.grace_period),
                max_runtime_s=None if self.max_runtime is None else float(self.max_runtime),
                retries=self.retries,
                image=self.image,
            )
        except SpecError as error:
            problems.extend(_rename(error.fields))
            run = None
        comm = self._comm(problems)
        depends_on: tuple[Dependency, ...] = ()
        try:
            depends_on = parse_dependencies(self.depends_on or [])
            self.array_indexes()
        except SpecError as error:
            problems.extend(error.fields)
        if not problems:
            try:
                return Job(
                    id=job_id,
                    queue=queue,
                    request=request,
                    workers=self.workers,
                    min_workers=self.min_workers,
                    priority=self.priority,
                    preemptible=self.preemptible,
                    submitted_at=submitted_at,
                    expected_duration=None if self.expected_duration is None else float(self.expected_duration),
                    checkpoint_interval=None if self.checkpoint_interval is None else float(self.checkpoint_interval),
                    name=self.name,
                    job_type=self.job_type.strip(),
                    run=run,
                    comm=comm,
                    depends_on=depends_on,
                )
            except SpecError as error:
                problems.extend(_rename(error.fields))
        raise SpecError("job spec", tuple(problems))

    def array_indexes(self) -> tuple[tuple[int, ...], int | None] | None:
        """The array's task indexes and throttle; None for a job of its own."""
        return None if self.array is None else parse_array(self.array)

    def _comm(self, problems: list[FieldProblem]) -> CommNeeds | None:
        """What the job synchronises each step, from `grad_bytes` (or `params` x `dtype`) and `step_time`; the
        fields that do not go together are added to `problems`."""
        size = self.grad_bytes
        given = [f for f in ("grad_bytes", "params", "step_time", "max_comm_overhead") if getattr(self, f) is not None]
        if self.dtype is not None and self.params is None:
            problems.append(FieldProblem("dtype", "is set without params", "give params with it, or remove dtype"))
        if size is not None and self.params is not None:
            problems.append(FieldProblem("params", "is set with grad_bytes", "give one of grad_bytes and params"))
            return None
        if self.params is not None:
            size = round(float(self.params) * DTYPE_BYTES[self.dtype or "fp32"])
        if not given:
            return None
        if size is None or self.step_time is None:
            missing = "step_time" if size is not None else "grad_bytes"
            problems.append(
                FieldProblem(
                    missing,
                    f"is missing (with {', '.join(given)})",
                    "give grad_bytes (or params) and step_time together, or none of the communication fields",
                )
            )
            return None
        try:
            limit = None if self.max_comm_overhead is None else float(self.max_comm_overhead)
            return CommNeeds(int(size), float(self.step_time), limit)
        except SpecError as error:
            problems.extend(_rename(error.fields))
            return None


def parse_count(value: object) -> float:
    """`"7B"`, `"350M"`, `"1.5k"`, `7e9` -> a count > 0 (parameters of a model)."""
    units = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    number: float | None = None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str) and (match := _SIZE_RE.match(value)) and match.group(2).lower() in units:
            number = float(match.group(1)) * units[match.group(2).lower()]
    except OverflowError:  # an integer too large for a float
        number = None
    if number is None or not math.isfinite(number) or not 1 <= number <= MAX_PARAMS:
        raise _BadValueError(f"is {_short(value)}", "give the parameter count, e.g. 7B, 350M or 7e9")
    return number


def parse_share(value: object) -> float:
    """`0.2`, `"20%"` -> 0.2, a fraction in (0, 1)."""
    number: float | None = None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            text = value.strip()
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except (ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number) or not 0 < number < 1:
        raise _BadValueError(f"is {_short(value)}", "give a share of step time in (0, 1), e.g. 0.2 or 20%")
    return number


# Domain field names that differ from the spec's.
_DOMAIN_TO_SPEC = {"gpu_fraction": "gpus", "grace_s": "grace_period", "max_runtime_s": "max_runtime"}


def _rename(problems: Iterable[FieldProblem]) -> list[FieldProblem]:
    return [FieldProblem(_DOMAIN_TO_SPEC.get(p.field, p.field), p.problem, p.fix) for p in problems]


# ------------------------------------------------------------------------------- pydantic -> ours


def problems_from_errors(
    errors: Sequence[Mapping[str, Any]], known_fields: Iterable[str] = (), *, strip: int = 0
) -> tuple[FieldProblem, ...]:
    """Pydantic's error list as our field problems, each with a fix; `strip` drops leading location parts
    (FastAPI prefixes `body`). An unknown field gets the closest known name as its fix."""
    known = sorted(known_fields)
    problems: list[FieldProblem] = []
    for error in errors:
        loc = [str(part) for part in tuple(error.get("loc", ()))[strip:]]
        field = ".".join(loc) or "(spec)"
        kind = str(error.get("type", ""))
        message = str(error.get("msg", "is invalid"))
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if kind == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1] if loc else "", known, n=1)
            fix = f"did you mean {close[0]!r}? Otherwise remove it" if close else "remove it"
            if known:
                fix += f" (fields: {', '.join(known)})"
            problems.append(FieldProblem(field, "is not a known field", fix))
        elif kind == "missing":
            problems.append(FieldProblem(field, "is missing", "add it"))
        elif _FIX_SEP in message:
            problem, fix = message.split(_FIX_SEP, 1)
            problems.append(FieldProblem(field, problem, fix))
        else:
            shown = error.get("input")
            got = f" (got {shown!r})" if shown is not None and not isinstance(shown, (dict, list)) else ""
            problems.append(FieldProblem(field, message[:1].lower() + message[1:] + got, _fix_for(kind)))
    # One problem per field and text (a union reports each branch; one line each is enough).
    unique: dict[tuple[str, str], FieldProblem] = {}
    for item in problems:
        unique.setdefault((item.field, item.problem), item)
    return tuple(unique.values())


def _fix_for(kind: str) -> str:
    if kind.startswith(("int_", "float_")) or kind in ("greater_than_equal", "less_than_equal"):
        return "give a number in the allowed range"
    if kind.startswith("string_"):
        return "give a shorter text" if kind == "string_too_long" else "give a text"
    if kind.startswith("bool"):
        return "give true or false"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "give a mapping of names to values"
    if kind == "list_type":
        return "give a list"
    if kind == "json_invalid":
        return "send valid JSON"
    return "see the field's description in the API schema (/docs)"


def spec_error(error: ValidationError, what: str = "job spec") -> SpecError:
    return SpecError(what, problems_from_errors(error.errors(), JobSpec.model_fields))


def parse_spec(data: object) -> JobSpec:
    """A `JobSpec` from parsed YAML/JSON; SpecError naming every bad field."""
    if not isinstance(data, Mapping):
        raise SpecError(
            "job spec",
            (FieldProblem("(spec)", f"is a {type(data).__name__}", "write a mapping: name: …, command: …, gpus: …"),),
        )
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as error:
        raise spec_error(error) from None


def load_spec_file(path: str | Path) -> JobSpec:
    """Read a YAML job spec; a missing file or bad YAML is a WorkloadError that says where."""
    file = Path(path)
    data = read_yaml_mapping(file, "job spec", SPEC_EXAMPLE)
    try:
        return parse_spec(data)
    except SpecError as error:
        raise SpecError(f"job spec {file}", error.fields) from None
