"""The openb loader against the numbers its README states."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufleet.domain import GiB, MiB
from gpufleet.sim.workload import Workload, WorkloadError
from gpufleet.sim.workloads import load_openb, load_openb_nodes
from gpufleet.sim.workloads.openb import OPENB_GPU_MEMORY, UNKNOWN_GPU_MEMORY


def test_node_list_has_1523_nodes_310_of_them_cpu_only(openb_default: Workload) -> None:
    assert len(openb_default.nodes) == 1523
    assert sum(1 for n in openb_default.nodes if not n.gpus) == 310


def test_gpu_totals_per_model_match_the_readme(openb_default: Workload) -> None:
    assert openb_default.gpus_by_model() == {
        "G2": 4392,
        "T4": 842,
        "G3": 312,
        "P100": 265,
        "V100M32": 204,
        "V100M16": 195,
        "A10": 2,
    }
    assert openb_default.gpu_count == 6212


def test_node_shapes_per_model_match_the_readme(openb_default: Workload) -> None:
    shapes = Counter((n.gpus[0].model, len(n.gpus)) for n in openb_default.nodes if n.gpus)
    assert shapes == {
        ("G2", 8): 549,
        ("T4", 2): 387,
        ("T4", 4): 17,
        ("G3", 8): 39,
        ("P100", 2): 131,
        ("P100", 1): 3,
        ("V100M32", 4): 9,
        ("V100M32", 8): 21,
        ("V100M16", 1): 19,
        ("V100M16", 4): 28,
        ("V100M16", 8): 8,
        ("A10", 1): 2,
    }


def test_gpu_nodes_only_is_the_fgd_cluster(openb_dir: Path) -> None:
    nodes = load_openb_nodes(openb_dir / "openb_node_list_all_node.csv", gpu_nodes_only=True)
    assert len(nodes) == 1213
    assert sum(len(n.gpus) for n in nodes) == 6212


def test_node_rows_spot_check(openb_default: Workload) -> None:
    by_name = {n.name: n for n in openb_default.nodes}
    cpu = by_name["openb-node-0000"]  # openb-node-0000,32000,262144,0,
    assert (cpu.cpu_milli, cpu.memory, cpu.gpus) == (32000, 262144 * MiB, ())
    g2 = by_name["openb-node-0310"]  # openb-node-0310,96000,393216,8,G2
    assert (g2.cpu_milli, g2.memory, len(g2.gpus)) == (96000, 393216 * MiB, 8)
    assert {g.model for g in g2.gpus} == {"G2"}
    assert g2.gpus[0].memory == UNKNOWN_GPU_MEMORY
    t4 = by_name["openb-node-1000"]  # openb-node-1000,104000,524288,2,T4
    assert [g.memory for g in t4.gpus] == [16 * GiB, 16 * GiB]


def test_memory_table_uses_real_sizes_and_can_be_overridden(openb_dir: Path) -> None:
    assert OPENB_GPU_MEMORY["V100M32"] == 32 * GiB
    assert OPENB_GPU_MEMORY["A10"] == 24 * GiB
    nodes = load_openb_nodes(openb_dir / "openb_node_list_all_node.csv", gpu_memory={"G2": 80 * GiB})
    assert {g.memory for n in nodes for g in n.gpus if g.model == "G2"} == {80 * GiB}


def test_default_pods_composition_matches_the_readme(openb_default: Workload) -> None:
    jobs = openb_default.jobs
    assert len(jobs) == 8152
    requests = [tj.job.request for tj in jobs]
    assert sum(1 for r in requests if r.gpus == 0) == 1088
    assert sum(1 for r in requests if r.gpus == 1) == 6989
    assert sum(1 for r in requests if r.fractional) == 3078
    assert Counter(r.gpus for r in requests if r.gpus > 1) == {2: 16, 4: 15, 8: 44}
    assert sum(tj.gpu_milli_total for tj in jobs) == 6_086_800  # 6086.8 GPUs
    fractions = Counter(r.gpu_milli for r in requests if r.fractional)
    assert [f for f, _ in fractions.most_common(4)] == [810, 470, 320, 650]
    assert all(not r.models for r in requests)


def test_pods_are_sorted_by_creation_time_then_row(openb_default: Workload) -> None:
    keys = [(tj.arrival, tj.seq) for tj in openb_default.jobs]
    assert keys == sorted(keys)
    assert {tj.job.queue for tj in openb_default.jobs} == {"default"}
    assert all(tj.duration is None for tj in openb_default.jobs)


def test_pod_rows_spot_check(openb_default: Workload) -> None:
    by_id = {tj.id: tj for tj in openb_default.jobs}
    frac = by_id["openb-pod-0001"]  # 6000,12288,1,460,,LS,Running,427061,...
    assert frac.job.request.fractional
    assert (frac.job.request.gpus, frac.job.request.gpu_milli) == (1, 460)
    assert (frac.job.request.cpu_milli, frac.job.request.memory) == (6000, 12288 * MiB)
    assert (frac.arrival, frac.seq) == (427061.0, 1)
    cpu_only = by_id["openb-pod-0005"]  # 20000,65536,0,0,...
    assert cpu_only.job.request.gpus == 0
    assert cpu_only.gpu_milli_total == 0
    eight = by_id["openb-pod-0017"]  # 88000,327680,8,1000,...
    assert (eight.job.request.gpus, eight.job.workers, eight.gpu_milli_total) == (8, 1, 8000)


def test_gpuspec33_model_constraints(openb_gpuspec33: Workload, openb_default: Workload) -> None:
    specs = Counter(tj.job.request.models for tj in openb_gpuspec33.jobs)
    assert sum(n for models, n in specs.items() if models) == 2388
    assert specs[frozenset({"T4"})] == 1291
    assert specs[frozenset({"G2"})] == 331
    assert specs[frozenset({"P100"})] == 279
    # "V100M16|V100M32" (141) and the trace's "V100M16|V100M32|V100M32" (22) are the same set
    assert specs[frozenset({"V100M16", "V100M32"})] == 141 + 22
    by_id = {tj.id: tj for tj in openb_gpuspec33.jobs}
    assert by_id["openb-pod-0449"].job.request.models == {"A10", "T4"}
    # identical to default in every other respect
    default = {tj.id: tj.job.request for tj in openb_default.jobs}
    for tj in openb_gpuspec33.jobs:
        other = default[tj.id]
        assert (tj.job.request.gpus, tj.job.request.gpu_milli, tj.job.request.cpu_milli) == (
            other.gpus,
            other.gpu_milli,
            other.cpu_milli,
        )


def test_lifetimes_give_run_time(openb_dir: Path) -> None:
    w = load_openb(openb_dir, lifetimes=True)
    by_id = {tj.id: tj for tj in w.jobs}
    # openb-pod-0017: scheduled 9437497, deleted 10769854
    assert by_id["openb-pod-0017"].duration == 10769854 - 9437497
    # openb-pod-0100 was never scheduled (Pending): time from creation to deletion
    assert by_id["openb-pod-0100"].duration == 10021325 - 10021257


def test_workload_carries_citation_license_and_assumptions(openb_default: Workload) -> None:
    assert "ATC 2023" in openb_default.citation
    assert "Apache-2.0" in openb_default.license
    assert any("G1/G2/G3" in a for a in openb_default.assumptions)


def test_pods_can_be_a_file_path(openb_dir: Path) -> None:
    w = load_openb(openb_dir / "openb_pod_list_gpuspec33.csv")
    assert w.name == "openb-gpuspec33"
    assert len(w.jobs) == 8152


def test_unknown_pod_list_name_is_an_error(openb_dir: Path) -> None:
    with pytest.raises(WorkloadError, match="gpuspec33"):
        load_openb(openb_dir, pods="nosuch")
