"""The job spec: people's units to base units, every bad field named with a fix, YAML errors that say where."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.comm import CommNeeds
from gpufleet.domain.errors import SpecError, WorkloadError
from gpufleet.domain.resources import GiB
from gpufleet.server.spec import (
    RESERVED_ENV,
    JobSpec,
    format_size,
    load_spec_file,
    parse_duration,
    parse_size,
    parse_spec,
)


def problems(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(data).to_job("j-1", "team-a")
    return {f.field: f"{f.problem} | {f.fix}" for f in caught.value.fields}


def test_full_spec_converts_every_field_to_base_units() -> None:
    spec = parse_spec(
        {
            "name": "train",
            "queue": "team-a",
            "command": ["python", "train.py"],
            "workdir": "/src",
            "env": {"OMP_NUM_THREADS": 4, "MODE": "fast"},
            "gpus": 2,
            "gpu_memory": "20GiB",
            "gpu_models": "A100-80GB|H100",
            "cpu": 8.5,
            "memory": "64GB",
            "workers": 4,
            "min_workers": 2,
            "priority": 10,
            "preemptible": False,
            "checkpoint_signal": "usr1",
            "grace_period": "5m",
            "max_runtime": "2h",
            "retries": 3,
            "checkpoint_interval": "10m",
            "expected_duration": "1h30m",
            "job_type": " resnet50-bs64 ",
        }
    )
    job = spec.to_job("j-1", spec.queue or "", submitted_at=5.0)
    assert job.job_type == "resnet50-bs64"
    assert job.request.gpus == 2
    assert job.request.gpu_milli == 1000
    assert job.request.gpu_memory == 20 * GiB
    assert job.request.models == frozenset({"A100-80GB", "H100"})
    assert job.request.cpu_milli == 8500
    assert job.request.memory == 64 * 10**9
    assert (job.workers, job.min_workers, job.priority, job.preemptible) == (4, 2, 10, False)
    assert (job.checkpoint_interval, job.expected_duration, job.submitted_at) == (600.0, 5400.0, 5.0)
    assert job.run is not None
    assert job.run.command == ("python", "train.py")
    assert not job.run.shell
    assert job.run.env == (("MODE", "fast"), ("OMP_NUM_THREADS", "4"))
    assert (job.run.checkpoint_signal, job.run.grace_s, job.run.max_runtime_s, job.run.retries) == (
        "SIGUSR1",
        300.0,
        7200.0,
        3,
    )


def test_fraction_of_a_gpu_and_shell_command() -> None:
    job = parse_spec({"command": "python a.py && echo done", "gpus": 0.5, "gpu_memory": 10 * GiB}).to_job("j", "q")
    assert (job.request.gpus, job.request.gpu_milli, job.request.gpu_memory) == (1, 500, 10 * GiB)
    assert job.run is not None
    assert job.run.shell
    assert job.run.command == ("python a.py && echo done",)


def test_defaults() -> None:
    job = parse_spec({"command": ["true"]}).to_job("j", "q")
    assert job.request.gpus == 0
    assert job.workers == 1
    assert job.preemptible
    assert job.run is not None
    assert (job.run.checkpoint_signal, job.run.grace_s, job.run.retries) == ("SIGTERM", 30.0, 0)


@pytest.mark.parametrize("name", [*RESERVED_ENV, "GPUFLEET_JOB_ID", "GPUFLEET_ANYTHING"])
def test_reserved_env_is_refused_with_the_reason(name: str) -> None:
    found = problems({"command": ["x"], "env": {name: "1"}})
    assert name in found["env"]
    assert "allocator" in found["env"]
    if name == "MASTER_PORT":
        assert "read MASTER_PORT from the environment instead" in found["env"]


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"command": []}, "command", "empty"),
        ({"command": ""}, "command", "empty"),
        ({"command": ["x"], "gpus": 1.5}, "gpus", "whole number"),
        ({"command": ["x"], "gpus": -1}, "gpus", "greater than or equal"),
        ({"command": ["x"], "gpu_memory": "20XB"}, "gpu_memory", "unit"),
        ({"command": ["x"], "gpu_memory": "lots"}, "gpu_memory", "not a size"),
        ({"command": ["x"], "gpu_memory": "8GiB"}, "gpu_memory", "without GPUs"),
        ({"command": ["x"], "gpu_models": "A100"}, "gpu_models", "without GPUs"),
        ({"command": ["x"], "gpus": 1, "gpu_models": ["A100", ""]}, "gpu_models", "not a model name"),
        ({"command": ["x"], "cpu": -2}, "cpu", "greater than or equal"),
        ({"command": ["x"], "memory": "-5GiB"}, "memory", "not a size"),
        ({"command": ["x"], "workers": 0}, "workers", "greater than or equal"),
        ({"command": ["x"], "workers": 2, "min_workers": 3}, "min_workers", "above workers"),
        ({"command": ["x"], "gpus": 0.5, "workers": 2}, "workers", "fractional"),
        ({"command": ["x"], "priority": "high"}, "priority", "integer"),
        ({"command": ["x"], "preemptible": "maybe"}, "preemptible", "boolean"),
        ({"command": ["x"], "checkpoint_signal": "SIGSTOP"}, "checkpoint_signal", "SIGSTOP"),
        ({"command": ["x"], "grace_period": "soon"}, "grace_period", "not a duration"),
        ({"command": ["x"], "max_runtime": 0}, "max_runtime", "leave unset"),
        ({"command": ["x"], "retries": -1}, "retries", "greater than or equal"),
        ({"command": ["x"], "checkpoint_interval": "0s"}, "checkpoint_interval", "not positive"),
        ({"command": ["x"], "expected_duration": "1y"}, "expected_duration", "not a duration"),
        ({"command": ["x"], "env": {"1BAD": "x"}}, "env", "not a variable name"),
        ({"command": ["x"], "env": {"OK": [1]}}, "env", "not a string"),
        ({"command": ["x"], "name": "a" * 300}, "name", "at most 200"),
        ({"command": ["x\x00"]}, "(spec)", "NUL"),
        ({"command": ["x"], "workdir": 5}, "workdir", "string"),
    ],
)
def test_every_bad_field_is_named_with_a_fix(data: dict[str, object], field: str, words: str) -> None:
    found = problems(data)
    assert field in found, found
    problem, fix = found[field].split(" | ")
    assert words.lower() in found[field].lower()
    assert fix.strip()


def test_several_bad_fields_are_all_reported() -> None:
    found = problems({"command": [], "gpus": 2.5, "gpuss": 2, "retries": -3})
    assert {"command", "gpus", "gpuss", "retries"} <= set(found)
    assert "did you mean 'gpus'" in found["gpuss"]
    found = problems({"comand": ["x"]})
    assert "did you mean 'command'" in found["comand"]
    assert "missing" in found["command"]


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="write a mapping"):
        parse_spec(["command", "x"])


def test_units() -> None:
    assert parse_size("20GiB") == 20 * GiB
    assert parse_size("20GB") == 20 * 10**9
    assert parse_size("512Mi") == 512 * 1024**2
    assert parse_size(1024) == 1024
    assert parse_size("1.5 TiB") == int(1.5 * 1024**4)
    assert parse_duration("30s") == 30
    assert parse_duration("5m") == 300
    assert parse_duration("1h30m") == 5400
    assert parse_duration("500ms") == 0.5
    assert parse_duration(12) == 12
    assert parse_duration("12") == 12
    for bad in ("5 minutes", "m5", "", "1h 1x"):
        with pytest.raises(ValueError, match="to fix"):
            parse_duration(bad)


@given(st.integers(min_value=1, max_value=2**50))
def test_format_size_round_trips_within_rounding(nbytes: int) -> None:
    shown = format_size(nbytes)
    assert abs(parse_size(shown) - nbytes) <= max(1, nbytes * 1e-3)


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: t\ncommand: [python, -c, 'print(1)']\ngpus: 1\nenv:\n  SEED: 7\n")
    spec = load_spec_file(path)
    assert isinstance(spec, JobSpec)
    assert spec.command == ["python", "-c", "print(1)"]
    assert spec.env == {"SEED": "7"}


def test_yaml_errors_say_where(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no such job spec file") as missing:
        load_spec_file(tmp_path / "nope.yaml")
    assert "to fix" in str(missing.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\ncommand: [python\ngpus: 1\n")
    with pytest.raises(WorkloadError, match=r"bad.yaml, line \d+: not valid YAML"):
        load_spec_file(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(WorkloadError, match="empty"):
        load_spec_file(empty)
    typo = tmp_path / "typo.yaml"
    typo.write_text("command: [x]\ngpu: 2\n")
    with pytest.raises(SpecError, match=r"typo.yaml.*gpu: is not a known field; to fix: did you mean 'gpus'"):
        load_spec_file(typo)


def test_an_emulated_activity_that_is_not_one_of_the_known_ones_is_refused() -> None:
    job = parse_spec({"command": ["true"], "env": {"EMULATED_GPU_ACTIVITY": "idle"}}).to_job("j-1", "team-a")
    assert job.run is not None
    assert ("EMULATED_GPU_ACTIVITY", "idle") in job.run.env
    found = problems({"command": ["true"], "env": {"EMULATED_GPU_ACTIVITY": "sleepy"}})
    assert "use one of idle, light, busy" in found["env"]


def test_communication_needs_from_params_and_dtype_or_grad_bytes() -> None:
    job = parse_spec(
        {"command": "x", "gpus": 8, "workers": 2, "params": "7B", "dtype": "bf16", "step_time": "500ms",
         "max_comm_overhead": "20%"}
    ).to_job("j-1", "team-a")  # fmt: skip
    assert job.comm is not None
    assert (job.comm.grad_bytes, job.comm.step_time_s, job.comm.max_overhead) == (14_000_000_000, 0.5, 0.2)
    fp32 = parse_spec({"command": "x", "params": 1e9, "step_time": 1}).to_job("j-1", "team-a")
    assert fp32.comm is not None
    assert (fp32.comm.grad_bytes, fp32.comm.max_overhead) == (4_000_000_000, None)
    sized = parse_spec({"command": "x", "grad_bytes": "2GiB", "step_time": 2, "max_comm_overhead": 0.1})
    assert sized.to_job("j-1", "team-a").comm == CommNeeds(2 * GiB, 2.0, 0.1)
    assert parse_spec({"command": "x"}).to_job("j-1", "team-a").comm is None


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"grad_bytes": "1GB"}, "step_time", "give grad_bytes (or params) and step_time together"),
        ({"step_time": 1, "max_comm_overhead": 0.2}, "grad_bytes", "is missing (with step_time, max_comm_overhead)"),
        ({"params": "7B", "grad_bytes": "1GB", "step_time": 1}, "params", "give one of grad_bytes and params"),
        ({"dtype": "fp16"}, "dtype", "give params with it"),
        ({"params": "seven", "step_time": 1}, "params", "e.g. 7B, 350M or 7e9"),
        ({"params": 0, "step_time": 1}, "params", "give the parameter count"),
        ({"params": 10**400, "step_time": 1}, "params", "give the parameter count"),
        ({"grad_bytes": "1GB", "step_time": 1, "max_comm_overhead": 10**400}, "max_comm_overhead", "in (0, 1)"),
        ({"grad_bytes": "1GB", "step_time": 1, "max_comm_overhead": 1.5}, "max_comm_overhead", "in (0, 1)"),
        ({"grad_bytes": "1GB", "step_time": 1, "max_comm_overhead": "120%"}, "max_comm_overhead", "in (0, 1)"),
        ({"grad_bytes": "1GB", "step_time": 0}, "step_time", "seconds > 0"),
        ({"grad_bytes": "1GB", "step_time": 1, "max_comm_overhead": True}, "max_comm_overhead", "as a number"),
    ],
)
def test_bad_communication_fields_are_named_with_a_fix(data: dict[str, object], field: str, words: str) -> None:
    found = problems({"command": "x", **data})
    assert field in found, found
    assert words in found[field]
