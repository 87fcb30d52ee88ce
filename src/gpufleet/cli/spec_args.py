"""A job spec from the command line: a YAML file or stdin (`-`), then flags, then `--set key=value`, then a
command given after `--`, each layer over the one before.

Everything ends in `parse_spec`, the validation the API runs on a submit: a flag or a `--set` the server would
refuse is refused here with the same field names and fixes. `--set` values are read as YAML scalars
(`gpus=2` is a number, `preemptible=false` a boolean, `env.SEED=7` an entry of `env`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TextIO

import typer
import yaml

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.server.yaml_file import SPEC_EXAMPLE, STDIN, read_yaml_mapping

__all__ = ["STDIN"]

# Flags shared by `submit` and `run`; each fills the spec field of the same name (dashes for underscores).
GpusOpt = Annotated[float | None, typer.Option("--gpus", help="GPUs per worker (whole, or a fraction such as 0.5).")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", "-N", help="Workers started together (a gang).")]
MinWorkersOpt = Annotated[int | None, typer.Option("--min-workers", help="Elastic: the smallest gang that may start.")]
NameOpt = Annotated[str | None, typer.Option("--name", "-J", help="A label for people.")]
QueueOpt = Annotated[str | None, typer.Option("--queue", "-q", help="Queue (default: the spec's, else the token's).")]
CpuOpt = Annotated[float | None, typer.Option("--cpu", help="CPU cores per worker.")]
MemoryOpt = Annotated[str | None, typer.Option("--memory", help="Memory per worker, e.g. 64GiB.")]
GpuMemoryOpt = Annotated[str | None, typer.Option("--gpu-memory", help="GPU memory needed on each GPU, e.g. 40GiB.")]
GpuModelsOpt = Annotated[str | None, typer.Option("--gpu-models", help='Allowed GPU models, e.g. "A100-80GB|H100".')]
PriorityOpt = Annotated[int | None, typer.Option("--priority", help="Higher runs first and may preempt lower.")]
MaxRuntimeOpt = Annotated[
    str | None, typer.Option("--max-runtime", "-t", help="Longest run of one attempt (e.g. 2h); then it fails.")
]
RetriesOpt = Annotated[int | None, typer.Option("--retries", help="Times a failed attempt is started again.")]
EnvOpt = Annotated[
    list[str] | None, typer.Option("--env", "-e", help="An environment variable, NAME=VALUE (repeatable).")
]
WorkdirOpt = Annotated[
    str | None,
    typer.Option(
        "--workdir",
        help="Working directory of every worker (default: the spec's, else the directory you submit from); "
        "`-`: the job's own private folder.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Any spec field, KEY=VALUE (repeatable; the value is read as YAML; dotted keys reach into "
        "mappings: env.SEED=7). Applied after the file and the flags.",
    ),
]


def read_spec_source(source: str, stdin: TextIO | None = None) -> dict[str, Any]:
    """The mapping a YAML spec file holds, or stdin's with `-`; a missing file or bad YAML is a WorkloadError
    that says where."""
    return read_yaml_mapping(source, "job spec", SPEC_EXAMPLE, stdin)


def apply_sets(data: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` items over `data`; a dotted key sets an entry of a mapping field (`env.SEED=7`)."""
    for item in sets:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise SpecError("--set", (FieldProblem(item, "is not KEY=VALUE", "e.g. --set gpus=2 or --set env.SEED=7"),))
        value = _scalar(raw)
        *path, last = key.split(".")
        target = data
        for part in path:
            inner = target.get(part)
            if inner is None:
                inner = target[part] = {}
            elif not isinstance(inner, dict):
                raise SpecError(
                    "--set", (FieldProblem(key, f"{part!r} is not a mapping", f"set {part} itself: --set {part}=…"),)
                )
            target = inner
        target[last] = value
    return data


def _scalar(raw: str) -> Any:
    """A `--set` value as YAML reads it (numbers, booleans, lists in [..]); anything YAML refuses stays text."""
    if not raw.strip():
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def env_items(items: Sequence[str]) -> dict[str, str]:
    """`--env NAME=VALUE` items; `--env NAME` passes the variable on from this shell."""
    import os

    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise SpecError(
                    "--env", (FieldProblem(item, "is not NAME=VALUE and not set here", "give --env NAME=VALUE"),)
                )
            value = os.environ[name]
        env[name] = value
    return env


def build_spec_data(
    base: dict[str, Any],
    *,
    flags: Mapping[str, Any],
    env: Sequence[str] = (),
    sets: Sequence[str] = (),
    command: Sequence[str] = (),
) -> dict[str, Any]:
    """The spec's fields: `base` (a file's, or none), then the flags given (None: not given), `--env`, `--set`,
    then the command."""
    data = dict(base)
    for field, value in flags.items():
        if value is not None:
            data[field] = value
    if env:
        data["env"] = {**(data.get("env") or {}), **env_items(env)}
    apply_sets(data, sets)
    if command:
        data["command"] = list(command)
    return data


def validated(data: dict[str, Any], where: str = "job spec") -> Any:
    """The `JobSpec` of `data`, checked as the API checks a submit (SpecError naming each bad field)."""
    from gpufleet.server.spec import parse_spec

    try:
        return parse_spec(data)
    except SpecError as error:
        raise SpecError(where, error.fields) from None
