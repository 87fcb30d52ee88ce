"""A real PyTorch data-parallel job (gloo on the CPU, the example users copy: examples/elastic_ddp.py) run by
the local executor as its workers, resized twice (2 -> 4 -> 1 workers) while it trains, ends with the same
model as the same job never resized."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.domain import GpuShare, WorkerPlacement
from gpufleet.ports import Launch, ObservationKind
from tests.local.conftest import Harness, ended, has, only, wait_for, wait_until

K = ObservationKind
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_ddp.py"
TIMEOUT_S = 240.0  # a loaded machine: every worker imports torch


def at(launch: Launch, gpus: range) -> Launch:
    return replace(launch, workers=tuple(WorkerPlacement(launch.workers[0].node, (GpuShare(i),)) for i in gpus))


def last_step(log: Path, after: str = "") -> int:
    """The last `step N` rank 0 printed (after the line `after`, when given); 0 if none yet."""
    text = log.read_text() if log.exists() else ""
    if after:
        text = text.partition(after)[2]
    steps = re.findall(r"^step (\d+) ", text, re.MULTILINE)
    return int(steps[-1]) if steps else 0


@pytest.mark.slow
def test_a_ddp_job_resized_twice_ends_with_the_model_of_an_unresized_run(harness: Harness) -> None:
    import torch  # here, not at the top: collecting the other tests should not import torch

    started = time.monotonic()
    backend = harness.backend()
    run = harness.run("--steps", "300", "--global-batch", "16", "--step-sleep", "0.02")
    run = replace(run, command=(sys.executable, str(EXAMPLE), *run.command[2:]))
    elastic = harness.launch("elastic", run, gpus=((0,), (1,)))
    reference = harness.launch("reference", run, gpus=((6,), (7,)))
    backend.launch(elastic)
    backend.launch(reference)
    seen = wait_for(backend, lambda s: has("elastic", K.STARTED)(s) and has("reference", K.STARTED)(s), TIMEOUT_S)
    log = harness.state / "logs" / "elastic" / "attempt-1" / "worker-0.log"

    wait_until(lambda: last_step(log) >= 50, TIMEOUT_S, "the job to train a while")
    backend.resize(at(elastic, range(4)), grace_s=60.0, resize_count=1)  # 2 -> 4
    seen = wait_for(backend, has("elastic", K.RESIZED), TIMEOUT_S, seen)
    marker = "[gpufleet: resize 1: worker 0 of 4 starts here]"
    wait_until(lambda: last_step(log, marker) > 0, TIMEOUT_S, "the resized job to train a while")
    backend.resize(at(elastic, range(2, 3)), grace_s=60.0, resize_count=2)  # 4 -> 1
    seen = wait_for(backend, lambda s: ended("elastic")(s) and ended("reference")(s), TIMEOUT_S, seen)
    assert only(seen, "elastic", K.EXITED).exit_code == 0, seen
    assert only(seen, "reference", K.EXITED).exit_code == 0, seen
    assert sum(o.kind is K.RESIZED for o in seen) == 2

    # It really was resized mid-training: each new set of workers resumed from a checkpoint it was given.
    resumed = re.findall(r"^rank 0 of (\d+): from step (\d+) \(resize (\d+)\)$", log.read_text(), re.MULTILINE)
    assert [(world, resize) for world, _, resize in resumed] == [("2", "0"), ("4", "1"), ("1", "2")]
    steps = [int(step) for _, step, _ in resumed]
    assert steps[0] == 0
    assert 50 <= steps[1] < steps[2] < 300, steps

    trained = torch.load(harness.state / "jobs" / "elastic" / "model.pt", weights_only=True)
    unresized = torch.load(harness.state / "jobs" / "reference" / "model.pt", weights_only=True)
    assert trained.keys() == unresized.keys()
    diff = max(float((trained[k] - unresized[k]).abs().max()) for k in trained)
    moved = max(float(unresized[k].abs().max()) for k in unresized)
    assert moved > 0.1  # it trained to something (not a model of zeros)
    assert diff <= 1e-9, f"max parameter difference {diff}"
    print(json.dumps({"max_param_diff": diff, "resumed_at_steps": steps[1:], "wall_s": time.monotonic() - started}))
