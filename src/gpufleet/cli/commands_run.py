"""`gpufleet submit` (a spec from a file or stdin) and `gpufleet run` (a command, Slurm's `srun`/`--wrap`).

Both build the spec in layers (file, flags, `--set`, command: `spec_args`), validate it as the API does, and send
it with an idempotency key, retried while the control plane cannot be reached. `run` waits by default and writes
the job's output as it comes; both end, when they wait, with the job's own exit code (`Job.exit_status`). Both
go through the SDK (`gpufleet.Client`), as a script would.
"""

from __future__ import annotations

import inspect
import os
from typing import Annotated, Any

import typer

from gpufleet.cli import spec_args as sa
from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client, _print_json
from gpufleet.cli.safe_text import plain
from gpufleet.client import Client, Job
from gpufleet.domain.errors import GpufleetError

EXIT_HELP = (
    "It exits with the job's own exit code: 0 when it succeeded, its code when it failed, 128+N when it was "
    "killed by signal N (143: SIGTERM), 1 when it ended without a code of its own (cancelled before it started, "
    "lost). Errors of the command itself (a bad spec, an unreachable control plane) exit 2."
)
ArrayOpt = Annotated[
    str | None,
    typer.Option(
        "--array",
        "-a",
        help="A job array, as Slurm's: 0-99, 0-99:2, 1,3,5, and %N for at most N tasks at once (0-99%8). Each "
        "task gets GPUFLEET_ARRAY_JOB_ID and GPUFLEET_ARRAY_TASK_ID.",
    ),
]
DependencyOpt = Annotated[
    str | None,
    typer.Option(
        "--dependency",
        "-d",
        help="Start only after other jobs, as Slurm's: afterok:ID[:ID…][,afterany:ID…] with after, afterok, "
        "afternotok, afterany, or singleton. An array's id means all its tasks.",
    ),
]
RetryOpt = Annotated[
    float, typer.Option(min=0, help="Seconds to keep retrying when the control plane is unreachable or busy.")
]


def _flags(
    *,
    gpus: float | None,
    workers: int | None,
    min_workers: int | None,
    name: str | None,
    queue: str | None,
    cpu: float | None,
    memory: str | None,
    gpu_memory: str | None,
    gpu_models: str | None,
    priority: int | None,
    max_runtime: str | None,
    retries: int | None,
    array: str | None = None,
    dependency: str | None = None,
) -> dict[str, Any]:
    return {
        "gpus": gpus,
        "workers": workers,
        "min_workers": min_workers,
        "name": name,
        "queue": queue,
        "cpu": cpu,
        "memory": memory,
        "gpu_memory": gpu_memory,
        "gpu_models": gpu_models,
        "priority": priority,
        "max_runtime": max_runtime,
        "retries": retries,
        "array": array,
        "depends_on": dependency,
    }


def _with_workdir(data: dict[str, Any], workdir: str | None) -> dict[str, Any]:
    if workdir is not None:
        data["workdir"] = "" if workdir == "-" else workdir
    elif not data.get("workdir"):
        data["workdir"] = os.getcwd()
    return data


def _send(client: Client, spec: Any, retry_for: float) -> Job:
    job = client.submit(
        spec.model_dump(mode="json", exclude_none=True),
        retry_for=retry_for,
        on_retry=lambda note: typer.echo(f"note: {plain(note)} (--retry-for 0: fail at once)", err=True),
    )
    for warning in job.warnings:
        typer.echo(f"warning: {plain(warning)}", err=True)
    return job


def submit(
    ctx: typer.Context,
    spec_file: Annotated[
        str | None, typer.Argument(metavar="[JOB.yaml|-]", help="The job spec; `-` reads it from stdin.")
    ] = None,
    gpus: sa.GpusOpt = None,
    workers: sa.WorkersOpt = None,
    min_workers: sa.MinWorkersOpt = None,
    name: sa.NameOpt = None,
    queue: sa.QueueOpt = None,
    cpu: sa.CpuOpt = None,
    memory: sa.MemoryOpt = None,
    gpu_memory: sa.GpuMemoryOpt = None,
    gpu_models: sa.GpuModelsOpt = None,
    priority: sa.PriorityOpt = None,
    max_runtime: sa.MaxRuntimeOpt = None,
    retries: sa.RetriesOpt = None,
    env: sa.EnvOpt = None,
    workdir: sa.WorkdirOpt = None,
    set_: sa.SetOpt = None,
    array: ArrayOpt = None,
    dependency: DependencyOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it ends; exit with its exit code.")] = False,
    retry_for: RetryOpt = 30.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job from a YAML spec (a file, or stdin with `-`), changed by flags and `--set KEY=VALUE`.

    It runs in the directory you submit from unless the spec or --workdir says otherwise (on every node of a
    cluster: keep it on a file system they share). Each submit carries an idempotency key, and is retried
    (for up to --retry-for seconds) when the control plane cannot be reached, restarts, or asks to slow down:
    a retry never makes a second job. With --wait, it prints how the job ended."""
    if ctx.args:
        raise GpufleetError(
            f"submit takes one spec file, not a command ({' '.join(ctx.args)})",
            "run a command with `gpufleet run [--no-wait] -- CMD ARGS…`",
        )
    if spec_file is None and not set_:
        raise GpufleetError("no job spec given", "give JOB.yaml, `-` for stdin, or run a command with `gpufleet run`")
    with _client(url, token) as client:
        base = sa.read_spec_source(spec_file) if spec_file is not None else {}
        flags = _flags(
            gpus=gpus, workers=workers, min_workers=min_workers, name=name, queue=queue, cpu=cpu, memory=memory,
            gpu_memory=gpu_memory, gpu_models=gpu_models, priority=priority, max_runtime=max_runtime,
            retries=retries, array=array, dependency=dependency,
        )  # fmt: skip
        data = _with_workdir(sa.build_spec_data(base, flags=flags, env=env or (), sets=set_ or ()), workdir)
        where = "job spec" if spec_file in (None, sa.STDIN) else f"job spec {spec_file}"
        job = _send(client, sa.validated(data, where), retry_for)
        if job.array_id:
            if not as_json:
                typer.echo(_array_words(job))
            if wait:
                raise GpufleetError("--wait waits for one job, not an array", "follow an array with `gpufleet jobs`")
        elif not as_json:
            typer.echo(f"submitted {plain(job.id)} to queue {plain(job.queue)}")
        if wait:
            job = client.wait(job.id)
    if as_json:
        _print_json(dict(job.raw))
    elif wait:
        typer.echo(plain(_ended_words(job)))
    if wait:
        raise typer.Exit(job.exit_status)


submit.__doc__ = f"{inspect.cleandoc(submit.__doc__ or '')}\n\n{EXIT_HELP}"


def run(
    command: Annotated[list[str], typer.Argument(metavar="-- CMD [ARGS]…", help="The command and its arguments.")],
    gpus: sa.GpusOpt = None,
    workers: sa.WorkersOpt = None,
    min_workers: sa.MinWorkersOpt = None,
    name: sa.NameOpt = None,
    queue: sa.QueueOpt = None,
    cpu: sa.CpuOpt = None,
    memory: sa.MemoryOpt = None,
    gpu_memory: sa.GpuMemoryOpt = None,
    gpu_models: sa.GpuModelsOpt = None,
    priority: sa.PriorityOpt = None,
    max_runtime: sa.MaxRuntimeOpt = None,
    retries: sa.RetriesOpt = None,
    env: sa.EnvOpt = None,
    workdir: sa.WorkdirOpt = None,
    set_: sa.SetOpt = None,
    array: ArrayOpt = None,
    dependency: DependencyOpt = None,
    spec_file: Annotated[
        str | None, typer.Option("--spec", "-f", help="Start from this spec file (`-`: stdin); flags change it.")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait, writing worker 0's output, and exit with its exit code.")
    ] = True,
    worker: Annotated[int, typer.Option(min=0, help="Whose output to write while waiting (rank).")] = 0,
    retry_for: RetryOpt = 30.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a command as a job: `gpufleet run --gpus 2 -- python train.py --lr 3e-4`.

    Options go before the command (or before `--`); everything after is the command. It waits by default,
    writing the job's output (worker 0's stdout and stderr) to stdout as it comes, and notes to stderr;
    Ctrl-C cancels the job. --no-wait prints the job's id and returns."""
    with _client(url, token) as client:
        base = sa.read_spec_source(spec_file) if spec_file is not None else {}
        flags = _flags(
            gpus=gpus, workers=workers, min_workers=min_workers, name=name, queue=queue, cpu=cpu, memory=memory,
            gpu_memory=gpu_memory, gpu_models=gpu_models, priority=priority, max_runtime=max_runtime,
            retries=retries, array=array, dependency=dependency,
        )  # fmt: skip
        data = sa.build_spec_data(base, flags=flags, env=env or (), sets=set_ or (), command=command)
        job = _send(client, sa.validated(_with_workdir(data, workdir)), retry_for)
        job_id = job.id
        if job.array_id:  # an array is not streamed: each task's output is its own (`gpufleet logs ID_N`)
            _print_json(dict(job.raw)) if as_json else typer.echo(_array_words(job))
            return
        if not wait:
            _print_json(dict(job.raw)) if as_json else typer.echo(plain(job_id))
            return
        typer.echo(plain(f"submitted {job_id} to queue {job.queue}"), err=True)
        try:
            for text in client.follow(
                job_id, worker=worker, note=lambda note: typer.echo(f"note: {plain(note)}", err=True)
            ):
                typer.echo(text, nl=False)
            job = client.job(job_id)
        except KeyboardInterrupt:
            client.cancel(job_id)
            typer.echo(plain(f"interrupted: cancel of {job_id} requested"), err=True)
            raise typer.Exit(130) from None
    if as_json:
        _print_json(dict(job.raw))
    else:
        typer.echo(plain(_ended_words(job)), err=True)
    raise typer.Exit(job.exit_status)


run.__doc__ = f"{inspect.cleandoc(run.__doc__ or '')}\n\n{EXIT_HELP}"


def _array_words(job: Job) -> str:
    return plain(f"submitted array {job.array_id} ({job.array_tasks or 1} tasks) to queue {job.queue}")


def _ended_words(job: Job) -> str:
    code = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    return f"{job.id} {job.state}{code}: {job.reason}"


def register_run_commands(app: typer.Typer) -> None:
    """Add `submit` and `run` to the `gpufleet` app."""
    app.command(context_settings={"allow_extra_args": True})(submit)
    app.command(context_settings={"allow_interspersed_args": False})(run)
