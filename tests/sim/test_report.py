"""Report files: results.json / results.csv / report.md / PNG plots, each citing the workload."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpufleet.domain import GiB, Job, QueueSpec, WorkerRequest, make_node
from gpufleet.sim.experiment import Comparison, Experiment, run_experiment
from gpufleet.sim.prices import prices_from
from gpufleet.sim.report import write_report
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads import generate_synthetic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def experiment() -> Experiment:
    workload = generate_synthetic(seed=2, jobs=60, nodes=4)
    return run_experiment(workload, ["fifo", "las"], prices=prices_from({"A100-80GB": 1.85}))


def _png_ok(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


def test_report_files_are_written_and_cite_the_workload(experiment: Experiment, tmp_path: Path) -> None:
    written = write_report(tmp_path / "out", [experiment])
    out = tmp_path / "out"
    names = {p.name for p in written}
    assert {"results.json", "results.csv", "report.md", "jct_cdf.png", "queue_time.png", "gpu_allocation.png"} <= names
    for png in ("jct_cdf.png", "queue_time.png", "gpu_allocation.png"):
        assert _png_ok(out / png)

    data = json.loads((out / "results.json").read_text())
    assert data["workload"]["citation"] == experiment.workload.citation
    assert data["workload"]["license"] == experiment.workload.license
    assert data["workload"]["assumptions"] == list(experiment.workload.assumptions)
    assert set(data["policies"]) == {"fifo", "las"}
    for metrics in data["policies"].values():
        for key in (
            "avg_jct_s",
            "p50_jct_s",
            "p95_jct_s",
            "p99_jct_s",
            "avg_queueing_s",
            "p99_queueing_s",
            "avg_pending_s",
            "makespan_s",
            "gpu_alloc_pct",
            "gpu_hours_allocated",
            "cost_usd",
            "fragmentation_pct_of_capacity",
            "preemptions",
            "lost_work_s",
            "jain_slowdown",
            "jain_gpu_share",
            "avg_ftf_rho",
            "queues",
            "fgd_steps",
        ):
            assert key in metrics
        assert metrics["cost_usd"] is not None  # A100-80GB priced; H100-80GB listed as unpriced
        assert metrics["unpriced_models"] == ["H100-80GB"]
    assert data["prices"]["usd_per_gpu_hour"] == {"A100-80GB": 1.85}

    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["policy"] for r in rows] == ["fifo", "las"]
    assert float(rows[0]["avg_jct_s"]) == pytest.approx(data["policies"]["fifo"]["avg_jct_s"])

    report = (out / "report.md").read_text()
    assert experiment.workload.citation in report
    assert experiment.workload.license in report
    assert "![JCT CDF](jct_cdf.png)" in report


def test_fgd_protocol_plot_and_comparison_table(tmp_path: Path) -> None:
    pods = tuple(
        TraceJob(Job(f"p{i}", "q", WorkerRequest(gpus=1, gpu_milli=600), submit_seq=i, submitted_at=float(i)))
        for i in range(8)
    )
    workload = Workload(
        "fgd-tiny",
        "hand-made FGD-style workload",
        "test",
        (make_node("n0", "T4", 4, 16 * GiB),),
        (QueueSpec("q"),),
        pods,
    )
    experiment = run_experiment(workload, ["best-fit"])
    comparison = Comparison(
        "fgd",
        "tiny comparison",
        ("policy", "arrived_pct", "gpu_alloc_pct"),
        (("best-fit", 100, 60.0),),
        (experiment,),
        "a published source",
        ("a note",),
        {
            "fgd_published": {"X": {"arrived_pct": [0, 100], "gpu_alloc_pct": [0.0, 70.0]}},
            "policy_names": {"best-fit": "X"},
        },
    )
    written = write_report(tmp_path, [experiment], comparison)
    names = {p.name for p in written}
    assert {"fgd_allocation.png", "comparison.csv", "results.json", "report.md"} <= names
    assert "queue_time.png" not in names  # no queueing in the FGD protocol
    assert _png_ok(tmp_path / "fgd_allocation.png")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["comparison"] == [{"policy": "best-fit", "arrived_pct": 100, "gpu_alloc_pct": 60.0}]
    assert data["experiments"][0]["workload"]["citation"] == "hand-made FGD-style workload"
    assert [s["arrived_pct"] for s in data["experiments"][0]["policies"]["best-fit"]["fgd_steps"]][:3] == [0, 5, 10]
    report = (tmp_path / "report.md").read_text()
    assert "a published source" in report
    assert "hand-made FGD-style workload" in report


def test_output_path_that_is_a_file_is_an_error(experiment: Experiment, tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(WorkloadError, match="to fix"):
        write_report(target, [experiment])
