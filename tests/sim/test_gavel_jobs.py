"""Gavel's own job lists replayed job for job (`gavel-jobs:FILE`, `--reproduce gavel-jobs`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.sim.reproduce_gavel_jobs import reproduce_gavel_jobs
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads import gavel
from gpufleet.sim.workloads.sources import load_workload
from tests.kit.traces import traces_root

HEADER = "job_id,arrival_time_s,job_type,scale_factor,total_steps,duration_s,priority_weight,SLO,v100_steps_per_s\n"
RESNET = "ResNet-18 (batch size 64)"


def _table() -> Path:
    return traces_root() / gavel.FOLDER / gavel.THROUGHPUT_FILE


def _job_list(folder: Path, rows: list[tuple[int, float, str, int, float]], name: str = "list.csv") -> Path:
    """A job list in Gavel's layout, with the throughput table beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / gavel.THROUGHPUT_FILE).write_text(_table().read_text())
    lines = [f'{n},{t},"{kind}",{sf},{d * 10.0},{d},1.0,,10.0\n' for n, t, kind, sf, d in rows]
    path = folder / name
    path.write_text(HEADER + "".join(lines))
    return path


def test_a_list_keeps_gavels_numbers_arrivals_and_durations(tmp_path: Path) -> None:
    path = _job_list(tmp_path, [(7, 0.0, RESNET, 1, 600.0), (8, 30.5, RESNET, 8, 1200.0)])
    workload = load_workload(f"gavel-jobs:{path}")
    assert [(tj.id, tj.job.submitted_at, tj.duration) for tj in workload.jobs] == [
        ("gavel-00007", 0.0, 600.0),
        ("gavel-00008", 30.5, 1200.0),
    ]
    # 8 GPUs on nodes of 4: a gang of two workers of 4, as the generated workload splits it
    assert (workload.jobs[1].job.workers, workload.jobs[1].job.request.gpus) == (2, 4)
    assert sum(len(n.gpus) for n in workload.nodes) == 108
    # the header alone says what the file is
    assert load_workload(path) == workload


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ([(1, 0.0, RESNET, 1, 60.0), (1, 5.0, RESNET, 1, 60.0)], "job 1 is listed twice"),
        ([(1, 0.0, "No Such Model", 1, 60.0)], "has no V100 throughput at scale factor 1"),
        ([(1, 0.0, RESNET, 1, 0.0)], "duration_s"),
    ],
)
def test_a_bad_list_names_its_line_and_fix(tmp_path: Path, rows: list, problem: str) -> None:  # type: ignore[type-arg]
    path = _job_list(tmp_path, rows)
    with pytest.raises(WorkloadError, match=problem) as raised:
        gavel.load_gavel_jobs(path)
    assert "list.csv" in str(raised.value)


def test_a_list_without_a_throughput_table_says_how_to_give_one(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "list.csv"
    path.parent.mkdir()
    path.write_text(HEADER + f'1,0.0,"{RESNET}",1,600.0,60.0,1.0,,10.0\n')
    with pytest.raises(WorkloadError, match="throughputs=FILE"):
        gavel.load_gavel_jobs(path)
    assert len(gavel.load_gavel_jobs(path, throughputs=_table()).jobs) == 1


def test_the_real_lists_replay_every_job_gavel_generated() -> None:
    folder = traces_root() / gavel.FOLDER / "generated"
    workload = gavel.load_gavel_jobs(folder / "gavel_single_5.6_seed0.csv")
    assert len(workload.jobs) == 6683
    first = workload.jobs[0]
    assert (first.id, first.job.job_type, first.duration) == ("gavel-00000", RESNET, pytest.approx(68344.35010595087))
    multi = gavel.load_gavel_jobs(folder / "gavel_multi_2.4_seed0.csv")
    assert {tj.job.workers * tj.job.request.gpus for tj in multi.jobs} == {1, 2, 4, 8}


def test_reproduce_puts_gavels_own_figure_beside_ours_on_the_same_jobs(tmp_path: Path) -> None:
    rows = [(n, 60.0 * n, RESNET, 1, 900.0 + 60.0 * (n % 5)) for n in range(12)]
    _job_list(tmp_path, rows, "gavel_single_5.6_seed9.csv")
    (tmp_path / "gavel_own_results.csv").write_text(
        "file,trace,input_job_rate_jobs_per_hr,seed,policy,avg_jct_hours,avg_jct_s,utilization\n"
        "gavel_single_5.6_seed9.csv,continuous-single,5.6,9,max_min_fairness_perf,0.5,1800,0.5\n"
    )
    comparison = reproduce_gavel_jobs(traces_root(), lists=tmp_path, window=(4, 10))
    table = [dict(zip(comparison.columns, row, strict=True)) for row in comparison.rows]
    assert [r["policy"] for r in table] == ["gavel-mmf", "gavel"]
    mmf, ours = table
    assert mmf["same_as_gavel_policy"] == "max_min_fairness_perf"
    assert mmf["measured_jobs_finished"] == 6
    # 12 one-GPU jobs on 108 GPUs never wait: each runs its V100 duration or longer on a slower model
    assert mmf["avg_jct_hours"] >= 900 / 3600
    # the hours are printed to 0.01 h, the error from the unrounded JCT
    assert mmf["error_vs_gavel_pct"] == pytest.approx(100 * (mmf["avg_jct_hours"] - 0.5) / 0.5, abs=1.0)
    assert ours["error_vs_gavel_pct"] is None
    assert ours["jct_vs_gavel_policy_here"] is not None
    with pytest.raises(WorkloadError, match="lists no job gavel-00012"):
        reproduce_gavel_jobs(traces_root(), lists=tmp_path, window=(4, 13))


def test_the_command_line_refuses_a_folder_without_gavels_results(tmp_path: Path) -> None:
    args = ["sim", "--reproduce", "gavel-jobs", "--traces", str(traces_root()), "--set", f"lists={tmp_path}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "no gavel_own_results.csv in the folder" in result.output
    assert "to fix" in result.output
