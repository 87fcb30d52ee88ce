"""Spec validation: every bad field raises SpecError naming the field and how to fix it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpufleet.domain import (
    ClusterSnapshot,
    FieldProblem,
    Gpu,
    GpufleetError,
    Job,
    Node,
    QueueSpec,
    Quota,
    SpecError,
    WorkerRequest,
    make_node,
    parse_models,
)
from tests.kit import make_job, queue

CASES: list[tuple[str, Callable[[], object], str, str]] = [
    # id, build, field, a fragment of the fix
    ("negative-gpus", lambda: make_job("j").gpus(-1).build(), "gpus", "ask for 0 or more GPUs"),
    ("fraction-zero", lambda: make_job("j").gpu_milli(0).build(), "gpu_fraction", "give a fraction in (0, 1]"),
    ("fraction-above-one", lambda: make_job("j").gpu_milli(1500).build(), "gpu_fraction", "in (0, 1]"),
    (
        "fraction-with-two-gpus",
        lambda: make_job("j").gpus(2).gpu_milli(500).build(),
        "gpu_fraction",
        "a fraction applies to exactly one GPU",
    ),
    ("fraction-with-no-gpus", lambda: make_job("j").gpus(0).gpu_milli(500).build(), "gpu_fraction", "set gpus=1"),
    ("negative-gpu-memory", lambda: make_job("j").gpu_memory(-1).build(), "gpu_memory", "give 0 or more bytes"),
    ("gpu-memory-no-gpus", lambda: make_job("j").cpu_only().gpu_memory(1).build(), "gpu_memory", "ask for GPUs"),
    ("negative-cpu", lambda: make_job("j").cpu(-1).build(), "cpu", "give 0 or more"),
    ("negative-memory", lambda: make_job("j").memory(-1).build(), "memory", "give 0 or more"),
    ("models-no-gpus", lambda: make_job("j").cpu_only().models("H100").build(), "gpu_models", "ask for GPUs"),
    ("model-with-pipe", lambda: make_job("j").models("A100|H100").build(), "gpu_models", "e.g. A100-80GB|H100"),
    ("model-blank", lambda: make_job("j").models(" H100").build(), "gpu_models", "e.g. A100-80GB|H100"),
    ("empty-job-id", lambda: make_job("").build(), "id", "give the job an id"),
    ("empty-queue", lambda: make_job("j").queue("").build(), "queue", "name the team queue"),
    ("blank-queue", lambda: make_job("j").queue("  ").build(), "queue", "name the team queue"),
    ("zero-workers", lambda: make_job("j").workers(0).build(), "workers", "ask for 1 or more workers"),
    ("min-workers-zero", lambda: make_job("j").workers(3).min_workers(0).build(), "min_workers", "1 <= min_workers"),
    ("min-above-max", lambda: make_job("j").workers(2).min_workers(3).build(), "min_workers", "<= workers"),
    (
        "fractional-gang",
        lambda: make_job("j").fraction(0.5).workers(2).build(),
        "workers",
        "use whole GPUs for multi-worker jobs",
    ),
    ("duration-zero", lambda: make_job("j").duration(0).build(), "expected_duration", "give seconds > 0"),
    ("checkpoint-negative", lambda: make_job("j").checkpoint_every(-5).build(), "checkpoint_interval", "seconds > 0"),
    ("attained-negative", lambda: make_job("j").attained(-1).build(), "attained_gpu_seconds", "give >= 0"),
    ("queue-empty-name", lambda: queue("").build(), "name", "name the queue"),
    ("queue-weight-zero", lambda: queue("q").weight(0).build(), "weight", "give a weight > 0"),
    ("queue-weight-nan", lambda: queue("q").weight(float("nan")).build(), "weight", "give a weight > 0"),
    ("queue-blank-cohort", lambda: queue("q").cohort(" ").build(), "cohort", "name the cohort"),
    ("queue-unknown-resource", lambda: queue("q").quota("tpu", Quota(1)).build(), "quotas.tpu", "use gpu, gpu:<MODEL>"),
    ("queue-model-key-empty", lambda: queue("q").quota("gpu:", Quota(1)).build(), "quotas.gpu:", "gpu:<MODEL>"),
    ("queue-negative-nominal", lambda: queue("q").gpus(-1).build(), "quotas.gpu.nominal", "give 0 or more"),
    (
        "queue-negative-borrowing",
        lambda: queue("q").gpus(1, borrowing_limit=-1).build(),
        "quotas.gpu.borrowing_limit",
        "give 0 or more",
    ),
    (
        "queue-lend-above-nominal",
        lambda: queue("q").gpus(4, lending_limit=5).build(),
        "quotas.gpu.lending_limit",
        "lend at most the nominal quota",
    ),
    (
        "queue-borrow-on-unlimited",
        lambda: queue("q").quota("gpu", Quota(None, 1000)).build(),
        "quotas.gpu.borrowing_limit",
        "set a nominal quota",
    ),
    ("node-empty-name", lambda: Node(""), "name", "unique name"),
    ("node-negative-cpu", lambda: Node("n", cpu_milli=-1), "capacity", "give CPU and memory >= 0"),
    (
        "node-gpu-indices",
        lambda: Node("n", (Gpu(1, "u", "H100", 1),)),
        "gpus",
        "number GPUs 0..n-1 in order",
    ),
    ("node-gpu-model-empty", lambda: Node("n", (Gpu(0, "u", "", 1),)), "gpus[0].model", "name the model"),
    ("node-gpu-memory-zero", lambda: Node("n", (Gpu(0, "u", "H100", 0),)), "gpus[0].memory", "memory in bytes"),
    (
        "snapshot-node-twice",
        lambda: ClusterSnapshot((make_node("n", "H100", 1, 1), make_node("n", "H100", 1, 1))),
        "nodes",
        "unique name",
    ),
    (
        "snapshot-queue-twice",
        lambda: ClusterSnapshot((), queues=(QueueSpec("q"), QueueSpec("q"))),
        "queues",
        "unique name",
    ),
]


@pytest.mark.parametrize(("build", "field", "fix"), [pytest.param(b, f, x, id=i) for i, b, f, x in CASES])
def test_invalid_specs_raise_spec_error_naming_the_field(build: Callable[[], object], field: str, fix: str) -> None:
    with pytest.raises(SpecError) as caught:
        build()
    error = caught.value
    assert isinstance(error, GpufleetError)
    problems = [p for p in error.fields if p.field == field]
    assert problems, f"{field} not in {[p.field for p in error.fields]}"
    assert fix in problems[0].fix
    assert f"{field}: " in str(error)
    assert "to fix: " in str(error)


def test_every_bad_field_is_listed_not_only_the_first() -> None:
    with pytest.raises(SpecError) as caught:
        WorkerRequest(gpus=-1, cpu_milli=-1, memory=-1, gpu_memory=-1)
    assert [p.field for p in caught.value.fields] == ["gpus", "gpu_memory", "cpu", "memory"]


def test_the_error_names_what_was_invalid() -> None:
    with pytest.raises(SpecError, match=r"^invalid job 'j': workers: is 0; to fix: ask for 1 or more workers$"):
        make_job("j").workers(0).build()
    with pytest.raises(SpecError) as caught:
        ClusterSnapshot(
            (),
            running=(),
            queues=(QueueSpec("q"), QueueSpec("q")),
        )
    assert caught.value.what == "cluster snapshot"


def test_a_running_job_twice_in_a_snapshot_is_refused() -> None:
    from gpufleet.domain import RunningJob

    job = make_job("j").build()
    with pytest.raises(SpecError, match="a job id runs twice"):
        ClusterSnapshot((), running=(RunningJob(job, ()), RunningJob(job, ())))


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: make_job("j").gpus(0).build(), id="cpu-only"),
        pytest.param(lambda: make_job("j").fraction(0.001).build(), id="smallest-fraction"),
        pytest.param(lambda: make_job("j").gpu_milli(1000).gpus(1).build(), id="whole-gpu"),
        pytest.param(lambda: make_job("j").workers(4).min_workers(4).build(), id="min-equals-max"),
        pytest.param(lambda: queue("q").gpus(0, borrowing_limit=0, lending_limit=0).build(), id="zero-quota"),
        pytest.param(lambda: queue("q").model_gpus("A100-80GB", 8).build(), id="per-model-quota"),
        pytest.param(lambda: Node("cpu-only", cpu_milli=1), id="node-without-gpus"),
    ],
)
def test_valid_edge_specs_are_accepted(build: Callable[[], object]) -> None:
    build()


def test_field_problem_reads_well() -> None:
    assert str(FieldProblem("gpus", "is -1", "ask for 0 or more GPUs")) == "gpus: is -1; to fix: ask for 0 or more GPUs"


@pytest.mark.parametrize(
    ("text", "models"),
    [
        pytest.param("", frozenset(), id="empty-any"),
        pytest.param("A100-80GB|H100", frozenset({"A100-80GB", "H100"}), id="two"),
        pytest.param(" H100 | | L4 ", frozenset({"H100", "L4"}), id="blanks-dropped"),
    ],
)
def test_parse_models(text: str, models: frozenset[str]) -> None:
    assert parse_models(text) == models


def test_gang_size_and_totals() -> None:
    job: Job = make_job("j").gpus(2).elastic(2, 5).build()
    assert (job.gang_size, job.gpu_milli_total) == (2, 10_000)
    assert make_job("f").fraction(0.25).build().gpu_milli_total == 250
