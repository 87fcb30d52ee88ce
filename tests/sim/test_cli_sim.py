"""`gpufleet sim` and `gpufleet bench sim` through the CLI: tables with the citation, JSON, files, error exits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cli.sim import parse_loads, parse_seeds
from gpufleet.policies.catalog import DEFAULT_LAS_MIN_RUN_S, profile
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.sim.reproduce import _with_las_min_run
from gpufleet.sim.workload import WorkloadError

SMALL = ["--set", "jobs=60", "--set", "nodes=4"]


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("GPUFLEET_TRACES", raising=False)
    monkeypatch.delenv("GPUFLEET_PRICES", raising=False)
    return CliRunner()


def test_sim_with_no_arguments_prints_a_table_with_the_citation(runner: CliRunner) -> None:
    result = runner.invoke(app, ["sim"])
    assert result.exit_code == 0, result.output
    for policy in ("fifo", "las", "default"):
        assert policy in result.stdout
    assert "avg JCT s" in result.stdout
    assert "gpufleet synthetic workload generator" in result.stdout  # the table footer cites the workload


def test_sim_json_has_every_metric_per_policy(runner: CliRunner) -> None:
    result = runner.invoke(app, ["sim", *SMALL, "-p", "fifo,sjf", "--seed", "5", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["workload"]["citation"].startswith("gpufleet synthetic")
    assert data["workload"]["jobs"] == 60
    assert list(data["policies"]) == ["fifo", "sjf"]
    keys = {
        "avg_jct_s",
        "p50_jct_s",
        "p95_jct_s",
        "p99_jct_s",
        "avg_queueing_s",
        "p95_queueing_s",
        "avg_pending_s",
        "avg_slowdown",
        "makespan_s",
        "gpu_alloc_pct",
        "gpu_hours_allocated",
        "gpu_hours_by_model",
        "cost_usd",
        "fragmentation_pct_of_capacity",
        "fragmentation_ratio_pct_of_idle",
        "preemptions",
        "lost_work_s",
        "lost_gpu_hours",
        "jain_slowdown",
        "jain_gpu_share",
        "avg_ftf_rho",
        "max_ftf_rho",
        "ftf_unfair_pct",
        "queues",
        "fgd_steps",
    }
    for metrics in data["policies"].values():
        assert keys <= set(metrics)
        assert all(k == k.lower() and " " not in k for k in metrics)
        assert metrics["jobs_finished"] == 60
    assert "expected_duration" in data["notes"][0]


def test_sim_writes_report_files_with_prices(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["sim", *SMALL, "-p", "fifo", "--out", str(out), "--price", "A100-80GB=1.85", "--price", "H100-80GB=4.57"]
    )
    assert result.exit_code == 0, result.output
    for name in ("results.json", "results.csv", "report.md", "jct_cdf.png", "queue_time.png"):
        assert (out / name).stat().st_size > 0
    data = json.loads((out / "results.json").read_text())
    assert data["policies"]["fifo"]["cost_usd"] > 0
    assert data["policies"]["fifo"]["unpriced_models"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "fifo,nope"], "no scheduling profile named 'nope'"),
        (["-p", "fifo,fifo"], "listed twice"),
        (["-w", "no-such-workload"], "unknown workload"),
        (["-w", "philly"], "needs the public trace data"),
        (["-w", "philly", "--traces", "/no/such/dir"], "traces folder does not exist"),
        (["--set", "jobs"], "is not KEY=VALUE"),
        (["--set", "bogus=1"], "bogus"),
        (["--load-scale", "0"], "--load-scale"),
        (["--price", "T4"], "MODEL=USD"),
        (["--prices", "/no/such/prices.csv"], "price table does not exist"),
        (["--reproduce", "nothing"], "no published experiment 'nothing'"),
        (["--reproduce", "helios-philly"], "needs the public trace data"),
    ],
)
def test_errors_exit_2_with_a_fix_and_no_traceback(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sim", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stderr.startswith("error: ")
    assert "to fix:" in result.stderr
    assert "Traceback" not in result.output


def test_unknown_reproduction_with_traces(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sim", "--reproduce", "nothing", "--traces", str(tmp_path)])
    assert result.exit_code == 2
    assert "no published experiment 'nothing'" in result.stderr


def test_named_trace_without_its_folder(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sim", "-w", "tiresias", "--traces", str(tmp_path)])
    assert result.exit_code == 2
    assert "tiresias data folder is missing" in result.stderr


def test_env_var_gives_the_traces_folder(runner: CliRunner, traces_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The one short real-trace run: Tiresias' 60-job trace.
    monkeypatch.setenv("GPUFLEET_TRACES", str(traces_root))
    result = runner.invoke(app, ["sim", "-w", "tiresias", "-p", "fifo,tiresias", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["workload"]["jobs"] == 60
    assert "Tiresias" in data["workload"]["citation"]
    assert data["policies"]["fifo"]["jobs_finished"] == 60


def test_bench_sim_errors(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "sim"])
    assert result.exit_code == 2
    assert "needs the public traces" in result.stderr
    result = runner.invoke(app, ["bench", "sim", "--traces", str(tmp_path), "--case", "nope"])
    assert result.exit_code == 2
    assert "no benchmark case 'nope'" in result.stderr
    result = runner.invoke(app, ["bench", "sim", "--traces", str(tmp_path), "--policy", "nope"])
    assert result.exit_code == 2
    assert "no scheduling profile named 'nope'" in result.stderr


def test_set_options_of_a_reproduction_are_checked(runner: CliRunner, tmp_path: Path) -> None:
    # Only the FGD protocol takes a pod list; anything else given to a reproduction is refused before it runs.
    for args, message in (
        (["--reproduce", "gavel", "--set", "pods=gpuspec33"], "--set pods does not apply to --reproduce gavel"),
        (["--reproduce", "fgd", "--set", "seed=3"], "--set seed does not apply to --reproduce fgd"),
    ):
        result = runner.invoke(app, ["sim", *args, "--traces", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert message in result.stderr
        assert "to fix:" in result.stderr


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("1", (42,)),
        ("3", (42, 43, 44)),
        ("47-51", (47, 48, 49, 50, 51)),
        ("42,45", (42, 45)),
        ("7", tuple(range(42, 49))),
    ],
)
def test_seeds_are_a_count_a_range_or_a_list(text: str, seeds: tuple[int, ...]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["0", "11", "x", "51-47", "42,42", "-3"])
def test_bad_seeds_are_refused_with_the_forms_that_work(text: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        parse_seeds(text)
    assert "range (47-51)" in caught.value.fix


def test_reproduction_options_are_checked_before_anything_runs(runner: CliRunner, traces_root: Path) -> None:
    for args, message in (
        (["--reproduce", "helios-philly", "--set", "window=june"], "no Philly window named 'june'"),
        (["--reproduce", "helios-philly", "--set", "las_min_run_s=-60"], "las_min_run_s=-60 is not a duration"),
        (["--reproduce", "fgd", "--set", "las_min_run_s=60"], "--set las_min_run_s does not apply"),
        (["--reproduce", "fgd", "--load-scale", "2"], "--load-scale applies to --reproduce helios-philly"),
        (["--reproduce", "helios-philly", "--set", "pods=default"], "--set pods does not apply"),
        (["--reproduce", "helios-calibration", "-p", "sjf"], "the calibration runs strict FIFO only"),
    ):
        result = runner.invoke(app, ["sim", *args, "--traces", str(traces_root)])
        assert result.exit_code == 2, result.output
        assert message in result.stderr


def test_loads_are_a_list_of_positive_numbers() -> None:
    assert parse_loads("0.5,1,1.5,2") == (0.5, 1.0, 1.5, 2.0)
    for text in ("", "0", "1,-2", "x"):
        with pytest.raises(WorkloadError) as caught:
            parse_loads(text)
        assert "loads=0.5,1,1.5,2" in caught.value.fix


def test_a_pollux_load_is_checked_before_anything_runs(runner: CliRunner, traces_root: Path) -> None:
    for args, message in (
        (["--reproduce", "pollux", "--set", "load=abc"], "is not a list of numbers"),
        (["--reproduce", "pollux", "--set", "load=0"], "one <= 0"),
        (["--reproduce", "pollux", "--set", "load=1,2"], "is not one load"),
        (["--reproduce", "pollux", "--set", "loads=1,2"], "--set loads does not apply to --reproduce pollux"),
        (["--reproduce", "pollux-loads", "--set", "loads=1,x"], "is not a list of numbers"),
    ):
        result = runner.invoke(app, ["sim", *args, "--traces", str(traces_root)])
        assert result.exit_code == 2, result.output
        assert message in result.stderr
        assert "to fix:" in result.stderr


def test_las_min_run_setting_replaces_the_minimum_of_las_profiles_only() -> None:
    adjust = _with_las_min_run(300)
    tuned = profile("default")
    default, tiresias = adjust(tuned), adjust(profile("tiresias"))
    assert isinstance(tuned.preempt, LasPreemption)
    assert tuned.preempt.min_run_s == DEFAULT_LAS_MIN_RUN_S
    assert type(default.preempt) is type(tuned.preempt)
    assert isinstance(default.preempt, LasPreemption)
    assert default.preempt.min_run_s == 300.0
    assert default.preempt.bands.thresholds == tuned.preempt.bands.thresholds
    assert (default.order, default.scores, default.learner, default.resize) == (
        tuned.order,
        tuned.scores,
        tuned.learner,
        tuned.resize,
    )
    assert isinstance(tiresias.preempt, LasPreemption)
    assert tiresias.preempt.min_run_s == 300.0
    fifo = profile("fifo")
    assert adjust(fifo) is fifo


def test_a_maintenance_window_what_if_costs_jct_and_is_named_in_the_result(runner: CliRunner) -> None:
    """`--reservation`: what a maintenance window on a quarter of the nodes costs, on the same seeded workload."""
    base = ["sim", "-w", "synthetic", "-p", "fifo-backfill", "--json"]
    plain = json.loads(runner.invoke(app, base).stdout)
    nodes = ",".join(f"syn-{i:04d}" for i in range(8))
    held = runner.invoke(app, [*base, "--reservation", f"fw:{nodes}:2h:8h"])
    assert held.exit_code == 0, held.output
    changed = json.loads(held.stdout)
    assert any("reservation fw (maintenance" in c for c in changed["what_if"])
    assert changed["policies"]["fifo-backfill"]["avg_jct_s"] > plain["policies"]["fifo-backfill"]["avg_jct_s"]
    bad = runner.invoke(app, ["sim", "-w", "synthetic", "--reservation", "fw:syn-0000:2h"])
    assert bad.exit_code == 2
    assert "NAME:NODES:START:END" in bad.output
