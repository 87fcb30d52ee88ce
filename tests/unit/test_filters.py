"""Filter plugins, one table per module: which nodes pass, and the reason each failing node gets."""

from __future__ import annotations

import pytest

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.filter.fits import (
    REASON_CPU,
    REASON_FEW_GPUS,
    REASON_GPU_MEMORY,
    REASON_MEMORY,
    REASON_NO_SHARE,
    Fits,
)
from gpufleet.policies.filter.gpu_model import REASON_MODEL_OVER_QUOTA, REASON_WRONG_MODEL, GpuModel
from gpufleet.policies.filter.health import REASON_UNSCHEDULABLE, NodeHealth
from tests.kit import cluster, filter_verdicts, make_job, running_on, usable_gpus

# ---- node_health ----------------------------------------------------------------------------------


def test_health_passes_only_schedulable_nodes() -> None:
    snapshot = (
        cluster()
        .nodes(1, "A100-80GB")
        .nodes(1, "A100-80GB", cordoned=True)
        .nodes(1, "A100-80GB", healthy=False)
        .nodes(1, "A100-80GB", cordoned=True, healthy=False)
        .snapshot()
    )
    assert filter_verdicts(NodeHealth(), snapshot, make_job("j").gpus(1).build()) == {
        "node-00": None,
        "node-01": REASON_UNSCHEDULABLE,
        "node-02": REASON_UNSCHEDULABLE,
        "node-03": REASON_UNSCHEDULABLE,
    }


def test_health_applies_to_cpu_only_jobs_too() -> None:
    snapshot = cluster().cpu_nodes(1).nodes(1, "T4", cordoned=True).snapshot()
    verdicts = filter_verdicts(NodeHealth(), snapshot, make_job("j").cpu_only().cpu(1).build())
    assert verdicts == {"cpu-00": None, "node-00": REASON_UNSCHEDULABLE}


# ---- gpu_model ------------------------------------------------------------------------------------

MIXED = cluster().nodes(1, "A100-80GB", prefix="a100").nodes(1, "H100", prefix="h100").cpu_nodes(1).snapshot()


@pytest.mark.parametrize(
    ("job", "allowed_by_quota", "expected"),
    [
        pytest.param(
            make_job("j").gpus(1).build(),
            None,
            {"a100-00": None, "h100-00": None, "cpu-00": REASON_WRONG_MODEL},
            id="any-model-needs-a-gpu",
        ),
        pytest.param(
            make_job("j").gpus(1).models("H100").build(),
            None,
            {"a100-00": REASON_WRONG_MODEL, "h100-00": None, "cpu-00": REASON_WRONG_MODEL},
            id="one-model",
        ),
        pytest.param(
            make_job("j").gpus(1).models("H100", "A100-80GB").build(),
            None,
            {"a100-00": None, "h100-00": None, "cpu-00": REASON_WRONG_MODEL},
            id="either-model",
        ),
        pytest.param(
            make_job("j").gpus(1).models("V100").build(),
            None,
            {"a100-00": REASON_WRONG_MODEL, "h100-00": REASON_WRONG_MODEL, "cpu-00": REASON_WRONG_MODEL},
            id="absent-model",
        ),
        pytest.param(
            make_job("j").cpu_only().cpu(2).build(),
            None,
            {"a100-00": None, "h100-00": None, "cpu-00": None},
            id="cpu-only-job-ignores-models",
        ),
        pytest.param(
            make_job("j").gpus(1).build(),
            ["A100-80GB"],
            {"a100-00": None, "h100-00": REASON_MODEL_OVER_QUOTA, "cpu-00": REASON_WRONG_MODEL},
            id="narrowed-by-quota",
        ),
        pytest.param(
            make_job("j").gpus(1).models("H100").build(),
            [],
            {"a100-00": REASON_WRONG_MODEL, "h100-00": REASON_MODEL_OVER_QUOTA, "cpu-00": REASON_WRONG_MODEL},
            id="spec-model-but-no-quota-left",
        ),
    ],
)
def test_gpu_model(job: Job, allowed_by_quota: list[str] | None, expected: dict[str, str | None]) -> None:
    assert filter_verdicts(GpuModel(), MIXED, job, allowed_by_quota) == expected


# ---- fits -----------------------------------------------------------------------------------------

EIGHT = cluster().nodes(1, "A100-80GB", gpus=8, cpu=16, memory=64)
EIGHT_NODE = EIGHT.build()[0]
SMALL = cluster().nodes(1, "A100-40GB", gpus=2, cpu=16, memory=64)
SMALL_NODE = SMALL.build()[0]


def eight_with(*held: tuple[Job, list[int]]) -> ClusterSnapshot:
    return EIGHT.snapshot(running=[running_on(job, [(EIGHT_NODE, gpus)]) for job, gpus in held])


def small_with(*held: tuple[Job, list[int]]) -> ClusterSnapshot:
    return SMALL.snapshot(running=[running_on(job, [(SMALL_NODE, gpus)]) for job, gpus in held])


FIVE_WHOLE = make_job("held").gpus(5).build()
TENTH = make_job("tenth").fraction(0.1).build()
QUARTER_30G = make_job("quarter").fraction(0.25).gpu_memory(30).build()
SIX_TENTHS = make_job("six-a").fraction(0.6).build()
SIX_TENTHS_B = make_job("six-b").fraction(0.6).build()
ONE_WHOLE = make_job("one").gpus(1).build()
CPU_HOG = make_job("cpu-hog").cpu_only().cpu(14).memory(60).build()


@pytest.mark.parametrize(
    ("snapshot", "job", "expected"),
    [
        pytest.param(eight_with(), make_job("j").gpus(8).build(), None, id="whole-node"),
        pytest.param(eight_with((FIVE_WHOLE, [0, 1, 2, 3, 4])), make_job("j").gpus(3).build(), None, id="exact-rest"),
        pytest.param(
            eight_with((FIVE_WHOLE, [0, 1, 2, 3, 4])), make_job("j").gpus(4).build(), REASON_FEW_GPUS, id="one-short"
        ),
        pytest.param(
            eight_with((TENTH, [0])), make_job("j").gpus(8).build(), REASON_FEW_GPUS, id="shared-gpu-is-not-whole"
        ),
        pytest.param(eight_with(), make_job("j").gpus(1).gpu_memory(80).build(), None, id="gpu-memory-exact"),
        pytest.param(
            small_with(), make_job("j").gpus(1).gpu_memory(48).build(), REASON_GPU_MEMORY, id="gpu-memory-too-small"
        ),
        pytest.param(
            small_with((SIX_TENTHS, [0]), (ONE_WHOLE, [1])),
            make_job("j").fraction(0.4).build(),
            None,
            id="fraction-fills-shared-gpu",
        ),
        pytest.param(
            small_with((SIX_TENTHS, [0]), (SIX_TENTHS_B, [1])),
            make_job("j").fraction(0.5).build(),
            REASON_NO_SHARE,
            id="fraction-no-share-large-enough",
        ),
        pytest.param(
            small_with((QUARTER_30G, [0]), (ONE_WHOLE, [1])),
            make_job("j").fraction(0.5).gpu_memory(12).build(),
            REASON_NO_SHARE,
            id="fraction-gpu-memory-taken",
        ),
        pytest.param(
            small_with((QUARTER_30G, [0]), (ONE_WHOLE, [1])),
            make_job("j").fraction(0.5).gpu_memory(10).build(),
            None,
            id="fraction-gpu-memory-left",
        ),
        pytest.param(
            small_with(),
            make_job("j").fraction(0.5).gpu_memory(41).build(),
            REASON_GPU_MEMORY,
            id="fraction-gpu-memory-over-capacity",
        ),
        pytest.param(eight_with((CPU_HOG, [])), make_job("j").gpus(1).cpu(2).memory(4).build(), None, id="cpu-exact"),
        pytest.param(eight_with((CPU_HOG, [])), make_job("j").gpus(1).cpu(3).build(), REASON_CPU, id="cpu-short"),
        pytest.param(eight_with((CPU_HOG, [])), make_job("j").gpus(1).memory(5).build(), REASON_MEMORY, id="mem-short"),
        pytest.param(
            eight_with((CPU_HOG, [])), make_job("j").cpu_only().memory(5).build(), REASON_MEMORY, id="cpu-only-job"
        ),
    ],
)
def test_fits(snapshot: ClusterSnapshot, job: Job, expected: str | None) -> None:
    (verdict,) = filter_verdicts(Fits(), snapshot, job).values()
    assert verdict == expected


@pytest.mark.parametrize(
    ("snapshot", "job", "expected"),
    [
        pytest.param(eight_with((FIVE_WHOLE, [0, 2, 4, 6, 7])), make_job("j").gpus(2).build(), (1, 3, 5), id="whole"),
        pytest.param(
            small_with((SIX_TENTHS, [0])), make_job("j").fraction(0.4).build(), (0, 1), id="fraction-shared-or-free"
        ),
        pytest.param(small_with((SIX_TENTHS, [0])), make_job("j").gpus(1).build(), (1,), id="whole-skips-shared"),
        pytest.param(
            small_with((QUARTER_30G, [0])), make_job("j").fraction(0.5).gpu_memory(11).build(), (1,), id="gpu-mem-free"
        ),
    ],
)
def test_fits_narrows_usable_gpus(snapshot: ClusterSnapshot, job: Job, expected: tuple[int, ...]) -> None:
    """The filters leave exactly the GPUs a worker could take (GPU selection picks among these)."""
    (usable,) = usable_gpus(snapshot, job).values()
    assert usable == expected
