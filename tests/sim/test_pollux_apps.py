"""Pollux's applications as measured: step times read and interpolated from the traces, statistical
efficiency between 1 and the batch scale, run times that add up, and bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads.pollux import APPLICATIONS, pollux_file
from gpufleet.sim.workloads.pollux_apps import Application, load_applications, measured_durations


@pytest.fixture(scope="module")
def apps(traces_root: Path) -> dict[str, Application]:
    return load_applications(traces_root / "pollux-osdi21", APPLICATIONS)


def test_step_times_are_the_measured_ones_and_interpolate_between_them(apps: dict[str, Application]) -> None:
    cifar = apps["cifar10"]
    # placements.csv rows: "1,32,0.0427886962890625" and "1,45,0.05048525333404541".
    assert cifar.step_time(1, 32) == 0.0427886962890625
    assert cifar.step_time(1, 45) == 0.05048525333404541
    assert 0.0427886962890625 < cifar.step_time(1, 40) < 0.05048525333404541
    # 6 GPUs are placed as our gangs are, two nodes of 3 ("33,32,0.24308855533599855").
    assert cifar.step_time(6, 6 * 32) == 0.24308855533599855
    # Beyond a node count placements.csv covers, scalability.csv ("6,6,32,0.1409..." is 6 nodes of 1: not
    # ours); 24 GPUs are 6 nodes of 4.
    assert apps["imagenet"].step_time(24, 24 * 32) > 0
    # yolov3 never runs more than 8 per GPU: a larger batch accumulates.
    yolo = apps["yolov3"]
    assert yolo.step_time(1, 16) == pytest.approx(2 * yolo.step_time(1, 8))


def test_a_size_nothing_measured_is_refused_with_a_fix(apps: dict[str, Application]) -> None:
    with pytest.raises(WorkloadError, match="no step time measured for 80 GPUs") as caught:
        apps["cifar10"].step_time(80, 80 * 32)
    assert "to fix" in str(caught.value)


@settings(max_examples=60, deadline=None)
@given(app=st.sampled_from(APPLICATIONS), scale=st.floats(1, 512), at=st.floats(0, 1))
def test_a_larger_batch_is_worth_between_one_and_its_scale_in_small_batch_steps(
    apps: dict[str, Application], app: str, scale: float, at: float
) -> None:
    application = apps[app]
    gain = application.gain(application.base_batch * scale, at * application.total_progress)
    assert 1.0 - 1e-9 <= gain <= scale + 1e-9
    assert application.gain(application.base_batch, at * application.total_progress) == pytest.approx(1.0)


def test_run_time_at_the_base_batch_is_every_step_at_its_step_time(apps: dict[str, Application]) -> None:
    ncf = apps["ncf"]
    assert ncf.seconds(1, ncf.base_batch) == pytest.approx(ncf.total_progress * ncf.step_time(1, ncf.base_batch))
    # Half-way, half the work is left.
    half = ncf.total_progress / 2
    assert ncf.seconds(1, ncf.base_batch, half) == pytest.approx(ncf.seconds(1, ncf.base_batch) / 2)


def test_every_job_of_every_workload_gets_a_run_time(traces_root: Path, apps: dict[str, Application]) -> None:
    folder = traces_root / "pollux-osdi21"
    for n in range(1, 9):
        seconds = measured_durations(pollux_file(folder, n), apps)
        assert len(seconds) == 160
        assert all(0 < s < 10 * 86_400 for s in seconds.values())


def test_a_workload_naming_an_unknown_application_or_size_is_refused(
    tmp_path: Path, apps: dict[str, Application]
) -> None:
    bad = tmp_path / "workload-9.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\nx-0,0,gpt9,1,32\n")
    with pytest.raises(WorkloadError, match="application"):
        measured_durations(bad, apps)
    bad.write_text("name,time,application,num_replicas,batch_size\nx-0,0,cifar10,80,2048\n")
    with pytest.raises(WorkloadError, match="num_replicas"):
        measured_durations(bad, apps)


def test_missing_measurements_say_where_to_put_them(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="app-traces"):
        load_applications(tmp_path, APPLICATIONS)
