"""Malformed inputs: every error names the file, the line and the column, and says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.domain import GpufleetError
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads import (
    fgd_workload,
    load_openb,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
    load_pollux,
    load_throughput_table,
    load_tiresias,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"
GOOD_POD = "p0,4000,8192,1,500,,LS,Running,0,100"


def _write(folder: Path, name: str, *lines: str) -> Path:
    path = folder / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _openb(folder: Path, *pod_lines: str) -> Path:
    _write(folder, "openb_node_list_all_node.csv", NODE_HEADER, "n0,32000,65536,2,T4", "n1,8000,16384,0,")
    _write(folder, "openb_pod_list_default.csv", POD_HEADER, *pod_lines)
    return folder


def _located(err: WorkloadError, path: Path, line: int, column: str | None) -> None:
    text = str(err)
    assert isinstance(err, GpufleetError)
    assert err.path == str(path)
    assert err.line == line
    assert err.column == column
    assert str(path) in text
    assert f"line {line}" in text
    if column is not None:
        assert f"column {column!r}" in text
    assert "to fix:" in text
    assert err.fix


def test_a_small_valid_openb_folder_loads(tmp_path: Path) -> None:
    w = load_openb(_openb(tmp_path, GOOD_POD, "p1,1000,0,0,0,,BE,Failed,5,6", "p2,8000,1,2,1000,T4,LS,Running,3,9"))
    assert [tj.id for tj in w.jobs] == ["p0", "p2", "p1"]
    assert w.jobs[1].job.request.models == {"T4"}


@pytest.mark.parametrize(
    ("row", "column", "match"),
    [
        ("p1,4000,8192,-1,1000,,LS,Running,0,1", "num_gpu", "below 0"),
        ("p1,4000,8192,two,1000,,LS,Running,0,1", "num_gpu", "not a whole number"),
        ("p1,4000,8192,1.5,1000,,LS,Running,0,1", "num_gpu", "not a whole number"),
        ("p1,4000,8192,1,1500,,LS,Running,0,1", "gpu_milli", "1..1000"),
        ("p1,4000,8192,1,0,,LS,Running,0,1", "gpu_milli", "1..1000"),
        ("p1,4000,8192,2,500,,LS,Running,0,1", "gpu_milli", "only single-GPU pods share"),
        ("p1,4000,8192,0,300,,LS,Running,0,1", "gpu_milli", "CPU-only"),
        ("p1,4000,8192,1,1000,H100,LS,Running,0,1", "gpu_spec", "no node has"),
        ("p1,4000,8192,0,0,T4,LS,Running,0,1", "gpu_spec", "without GPUs"),
        ("p1,x,8192,1,1000,,LS,Running,0,1", "cpu_milli", "not a whole number"),
        ("p1,4000,8192,1,1000,,LS,Running,soon,1", "creation_time", "not a number"),
        ("p1,4000,8192,1,1000,,LS,Running,-5,1", "creation_time", "below 0"),
        (",4000,8192,1,1000,,LS,Running,0,1", "name", "is empty"),
        ("p0,4000,8192,1,1000,,LS,Running,0,1", "name", "listed twice"),
    ],
)
def test_bad_pod_values_name_line_and_column(tmp_path: Path, row: str, column: str, match: str) -> None:
    folder = _openb(tmp_path, GOOD_POD, row)
    with pytest.raises(WorkloadError, match=match) as err:
        load_openb(folder)
    _located(err.value, folder / "openb_pod_list_default.csv", 3, column)


def test_unknown_model_in_constraint_is_allowed_when_not_strict(tmp_path: Path) -> None:
    folder = _openb(tmp_path, "p1,4000,8192,1,1000,H100|T4,LS,Running,0,1")
    w = load_openb(folder, strict_models=False)
    assert w.jobs[0].job.request.models == {"H100", "T4"}
    assert load_openb_pods(folder / "openb_pod_list_default.csv")[0].job.request.models == {"H100", "T4"}


def test_missing_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,gpu_milli,gpu_spec,creation_time", "p,1,1,1,,0")
    with pytest.raises(WorkloadError, match="column 'num_gpu' is missing") as err:
        load_openb_pods(path)
    _located(err.value, path, 1, "num_gpu")
    assert "num_gpu" in err.value.fix


def test_wrong_number_of_fields(tmp_path: Path) -> None:
    folder = _openb(tmp_path, GOOD_POD, "p1,4000,8192,1")
    with pytest.raises(WorkloadError, match="4 fields but the header has 10") as err:
        load_openb(folder)
    _located(err.value, folder / "openb_pod_list_default.csv", 3, None)


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    folder = _openb(tmp_path, GOOD_POD, "", "p1,4000,8192,-2,1000,,LS,Running,0,1")
    with pytest.raises(WorkloadError) as err:
        load_openb(folder)
    assert err.value.line == 4


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist") as err:
        load_openb_nodes(tmp_path / "nodes.csv")
    assert err.value.path == str(tmp_path / "nodes.csv")
    empty = _write(tmp_path, "empty.csv")
    empty.write_text("", encoding="utf-8")
    with pytest.raises(WorkloadError, match="empty"):
        load_openb_nodes(empty)
    with pytest.raises(WorkloadError, match="does not exist"):
        load_openb(tmp_path / "nowhere")
    lonely = _write(tmp_path, "openb_pod_list_default.csv", POD_HEADER, GOOD_POD)
    with pytest.raises(WorkloadError, match=r"no openb_node_list_all_node\.csv beside it"):
        load_openb(lonely)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"sn,cpu\n\xff\xfe\x00")
    with pytest.raises(WorkloadError, match="UTF-8"):
        load_openb_nodes(binary)


@pytest.mark.parametrize(
    ("row", "column", "match"),
    [
        ("n2,8000,16384,2,", "model", "is empty"),
        ("n2,8000,16384,0,T4", "model", "without GPUs"),
        ("n2,8000,16384,-2,T4", "gpu", "below 0"),
        ("n0,8000,16384,1,T4", "sn", "listed twice"),
    ],
)
def test_bad_node_rows(tmp_path: Path, row: str, column: str, match: str) -> None:
    path = _write(tmp_path, "nodes.csv", NODE_HEADER, "n0,32000,65536,2,T4", row)
    with pytest.raises(WorkloadError, match=match) as err:
        load_openb_nodes(path)
    _located(err.value, path, 3, column)


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"


@pytest.mark.parametrize(
    ("row", "column", "match"),
    [
        ("2017-10-01 00:00:09,100.0,0,0.0,vc1", "num_gpus", "below 1"),
        ("2017-10-01 00:00:09,-3,1,0.0,vc1", "duration", "not positive"),
        ("2017-10-01 00:00:09,abc,1,0.0,vc1", "duration", "not a number"),
        ("yesterday,100.0,1,100.0,vc1", "timestamp", "not a time"),
        ("2017-10-01 00:00:09,100.0,1,100.0,", "cluster", "is empty"),
        ("2017-10-01 00:00:09,100.0,32,3200.0,vc1", "num_gpus", "more than VC"),
    ],
)
def test_bad_philly_rows(tmp_path: Path, row: str, column: str, match: str) -> None:
    jobs = _write(tmp_path, "philly_jobs_pollux.csv", PHILLY_HEADER, "2017-10-01 00:00:00,60.0,1,60.0,vc1", row)
    _write(tmp_path, "philly_vc_nodes_helios.csv", "vc,node num", "vc1,2")
    with pytest.raises(WorkloadError, match=match) as err:
        load_philly(tmp_path)
    _located(err.value, jobs, 3, column)


def test_philly_without_vc_table_says_where_to_put_it(tmp_path: Path) -> None:
    _write(tmp_path, "philly_jobs_pollux.csv", PHILLY_HEADER, "2017-10-01 00:00:00,60.0,1,60.0,vc1")
    with pytest.raises(WorkloadError, match="Philly VC table does not exist") as err:
        load_philly(tmp_path)
    assert "vc_nodes=" in err.value.fix
    _write(tmp_path, "vcs.csv", "vc,node num", "vc1,0")
    with pytest.raises(WorkloadError) as err:
        load_philly(tmp_path, vc_nodes=tmp_path / "vcs.csv")
    _located(err.value, tmp_path / "vcs.csv", 2, "node num")


def test_bad_throughput_table(tmp_path: Path) -> None:
    header = "gpu_type,placement,job_type,scale_factor,throughput_steps_per_s"
    path = _write(tmp_path, "t.csv", header, "v100,consolidated,A,1,2.0", "v100,consolidated,A,2,-1")
    with pytest.raises(WorkloadError, match="below 0") as err:
        load_throughput_table(path)
    _located(err.value, path, 3, "throughput_steps_per_s")
    path = _write(tmp_path, "t.csv", header, "v100,consolidated,A,1,2.0", "v100,sideways,A,2,1")
    with pytest.raises(WorkloadError, match="consolidated or unconsolidated") as err:
        load_throughput_table(path)
    _located(err.value, path, 3, "placement")
    path = _write(tmp_path, "t.csv", header, "v100,consolidated,A,1,2.0", "V100,consolidated,A,1,3.0")
    with pytest.raises(WorkloadError, match="repeats") as err:
        load_throughput_table(path)
    assert err.value.line == 3


def test_bad_pollux_and_tiresias_rows(tmp_path: Path) -> None:
    path = _write(tmp_path, "w.csv", "name,time,application,num_replicas", "a-0,10,ncf,1", "a-1,20,ncf,0")
    with pytest.raises(WorkloadError, match="below 1") as err:
        load_pollux(path)
    _located(err.value, path, 3, "num_replicas")
    _write(
        tmp_path,
        "cluster_spec.csv",
        "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node",
        "1,2,4,8,64",
    )
    jobs = _write(tmp_path, "60_job.csv", "job_id,num_gpu,submit_time,duration", "0,1,0,10", "1,16,5,10")
    with pytest.raises(WorkloadError, match="more than the cluster has") as err:
        load_tiresias(tmp_path)
    _located(err.value, jobs, 3, "num_gpu")
    _write(tmp_path, "cluster_spec.csv", "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node")
    with pytest.raises(WorkloadError, match="0 data rows"):
        load_tiresias(tmp_path)


MINIMAL_POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def test_a_pod_list_with_only_the_five_request_columns_runs_the_fgd_protocol(tmp_path: Path) -> None:
    """Some openb pod lists give only name and requests (no models, no times): the FGD protocol needs no more."""
    _openb(tmp_path)
    _write(
        tmp_path,
        "openb_pod_list_gpushare60.csv",
        MINIMAL_POD_HEADER,
        "p0,4000,8192,1,500",
        "p1,2000,4096,0,0",
        "p2,8000,16384,2,1000",
    )
    pods = load_openb_pods(tmp_path / "openb_pod_list_gpushare60.csv")
    assert [tj.job.submitted_at for tj in pods] == [0.0, 0.0, 0.0]
    assert [tj.id for tj in pods] == ["p0", "p1", "p2"]  # the file's order
    assert all(not tj.job.request.models for tj in pods)  # any model
    workload = fgd_workload(tmp_path, seed=1, pods="gpushare60")
    assert workload.name == "openb-fgd-gpushare60-seed1"
    assert sum(tj.gpu_milli_total for tj in workload.jobs) >= 1.3 * workload.gpu_capacity_milli


def test_a_time_replay_of_a_pod_list_without_times_says_what_to_do(tmp_path: Path) -> None:
    _openb(tmp_path)
    _write(tmp_path, "openb_pod_list_minimal.csv", MINIMAL_POD_HEADER, "p0,4000,8192,1,500")
    with pytest.raises(WorkloadError, match="column 'creation_time' is missing") as caught:
        load_openb(tmp_path, pods="minimal")
    assert "FGD protocol" in caught.value.fix
    assert "--reproduce fgd --set pods=PATH" in caught.value.fix
