"""best_fit: FGD's BestFit baseline, absolute CPU and GPU left over the fleet-wide normalisers."""

from __future__ import annotations

import pytest

from gpufleet.domain import ClusterSnapshot, GiB, Job, WorkerRequest, make_node
from gpufleet.policies.score.best_fit import BestFit
from tests.kit import score_nodes

# A 2-GPU node with 32 cores and an 8-GPU node with 128 cores, both empty.
SMALL = make_node("small", "T4", 2, 16 * GiB, cpu_milli=32_000)
LARGE = make_node("large", "T4", 8, 16 * GiB, cpu_milli=128_000)
EMPTY = ClusterSnapshot((SMALL, LARGE))


def job(gpus: int, cpu_milli: int) -> Job:
    return Job("j", "default", WorkerRequest(gpus=gpus, cpu_milli=cpu_milli))


@pytest.mark.parametrize(
    ("request_job", "expected"),
    [
        # cost = 0.5 * (cpu_free - cpu) / 128 cores + 0.5 * (gpu_free - gpu) / 8 GPUs; score = 100 * (1 - cost)
        pytest.param(
            job(1, 8_000),
            {"small": 100 * (1 - (0.5 * 24 / 128 + 0.5 * 1 / 8)), "large": 100 * (1 - (0.5 * 120 / 128 + 0.5 * 7 / 8))},
            id="one-gpu",
        ),
        pytest.param(
            job(2, 0),
            {"small": 100 * (1 - 0.5 * 32 / 128), "large": 100 * (1 - (0.5 + 0.5 * 6 / 8))},
            id="fills-the-small-node",
        ),
    ],
)
def test_best_fit_scores_by_absolute_room_left(request_job: Job, expected: dict[str, float]) -> None:
    scores = score_nodes(BestFit(), EMPTY, request_job)
    assert scores == pytest.approx(expected)
    assert scores["small"] > scores["large"]  # a per-node ratio would call both nodes equally good fits


def test_gpu_only_weights_ignore_cpu() -> None:
    scores = score_nodes(BestFit(cpu_weight=0.0, gpu_weight=1.0), EMPTY, job(1, 8_000))
    assert scores == pytest.approx({"small": 100 * (1 - 1 / 8), "large": 100 * (1 - 7 / 8)})
