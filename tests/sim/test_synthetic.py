"""The seeded synthetic workload generator."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.domain import GPU, GiB
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads import SyntheticSpec, generate_synthetic


def test_same_seed_same_workload_other_seed_differs() -> None:
    assert generate_synthetic(seed=7) == generate_synthetic(seed=7)
    assert generate_synthetic(seed=7).jobs != generate_synthetic(seed=8).jobs
    assert generate_synthetic(seed=7).nodes == generate_synthetic(seed=8).nodes


def test_default_cluster_queues_and_cohort() -> None:
    w = generate_synthetic(seed=0)
    assert (len(w.nodes), w.gpu_count) == (32, 256)
    assert w.gpus_by_model() == {"A100-80GB": 128, "H100-80GB": 128}
    assert {q.cohort for q in w.queues} == {"all-teams"}
    assert sum(q.quotas[GPU].nominal or 0 for q in w.queues) == w.gpu_capacity_milli
    assert [q.quotas[GPU].nominal for q in w.queues] == [128_000, 77_000, 51_000]
    assert {n.rack for n in w.nodes} == {"rack-0", "rack-1", "rack-2", "rack-3"}


def test_size_mix_covers_every_class() -> None:
    w = generate_synthetic(seed=1, jobs=2000)
    kinds = Counter(
        "fractional" if tj.job.request.fractional else ("gang" if tj.job.workers > 1 else str(tj.job.request.gpus))
        for tj in w.jobs
    )
    assert set(kinds) == {"fractional", "1", "2", "4", "8", "gang"}
    assert kinds["1"] / 2000 == pytest.approx(0.40, abs=0.04)
    gangs = [tj.job for tj in w.jobs if tj.job.workers > 1]
    assert {j.workers for j in gangs} == {2, 4}
    assert {j.request.gpus for j in gangs} == {8}
    fractional = [tj.job.request for tj in w.jobs if tj.job.request.fractional]
    assert {r.gpu_milli for r in fractional} == {250, 500, 750}
    assert {r.gpu_memory for r in fractional} == {20 * GiB, 40 * GiB, 60 * GiB}


def test_arrivals_and_log_normal_durations() -> None:
    w = generate_synthetic(seed=2, jobs=3000, arrival_rate_per_hour=120.0, duration_median_s=600.0)
    arrivals = [tj.arrival for tj in w.jobs]
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] / 3000 == pytest.approx(30.0, rel=0.1)  # 120/h -> 30 s apart on average
    durations = sorted(tj.duration or 0.0 for tj in w.jobs)
    assert durations[1500] == pytest.approx(600.0, rel=0.1)


def test_model_constraints_and_parameters() -> None:
    spec = SyntheticSpec(nodes=10, gpus_per_node=4, model_mix={"T4": 3, "L4": 1}, constrained_fraction=1.0)
    w = generate_synthetic(spec, seed=3, jobs=100, borrowing=False)
    # 10 nodes split 3:1 = 7.5 / 2.5: the tie on the remainder goes to the first name, L4 -> 3 L4 + 7 T4 nodes
    assert w.gpus_by_model() == {"L4": 12, "T4": 28}
    assert all(len(tj.job.request.models) == 1 for tj in w.jobs)
    assert all(q.quotas[GPU].borrowing_limit == 0 for q in w.queues)
    assert all(tj.job.request.gpus <= 4 for tj in w.jobs)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"nodes": 0}, "nodes"),
        ({"size_mix": {"16": 1.0}}, "size_mix"),
        ({"size_mix": {"1": 0.0}}, "all weights are 0"),
        ({"model_mix": {"B200": 1.0}}, "gpu_memory"),
        ({"fractions_milli": (1000,)}, "fractions_milli"),
        ({"gang_workers": (64,)}, "gang_workers"),
        ({"duration_sigma": -1.0}, "duration_sigma"),
        ({"constrained_fraction": 2.0}, "constrained_fraction"),
        ({"colour": "blue"}, "not a parameter"),
    ],
)
def test_bad_parameters_are_named(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(WorkloadError, match=match) as err:
        generate_synthetic(seed=0, **overrides)
    assert err.value.fix


def test_unknown_model_with_given_memory_is_fine() -> None:
    w = generate_synthetic(seed=0, model_mix={"B200": 1.0}, gpu_memory={"B200": 180 * GiB}, nodes=4, jobs=5)
    assert {g.memory for n in w.nodes for g in n.gpus} == {180 * GiB}


@pytest.mark.parametrize(("name", "value"), [("nodes", "32"), ("borrowing", 1), ("gang_workers", [2]), ("queues", 3)])
def test_wrong_types_are_named_not_a_stack_trace(name: str, value: object) -> None:
    with pytest.raises(WorkloadError, match=f"parameter {name}") as err:
        generate_synthetic(seed=0, **{name: value})
    assert "like the default" in err.value.fix
