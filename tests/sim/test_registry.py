"""load_workload: names under a traces folder, paths with format detection, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads import NAMES, detect_format, load_workload


def test_names() -> None:
    assert set(NAMES) == {"openb", "fgd", "philly", "gavel", "pollux", "tiresias", "synthetic"}


@pytest.mark.parametrize(
    ("name", "options", "jobs"),
    [
        ("openb", {"pods": "gpuspec33"}, 8152),
        ("fgd", {"seed": 42}, None),
        ("gavel", {"rate_per_hour": 3.0, "num_jobs": 100}, 100),
        ("pollux", {"workload": 5}, 160),
        ("tiresias", {}, 60),
        ("synthetic", {"seed": 1, "jobs": 50}, 50),
    ],
)
def test_load_by_name(traces_root: Path, name: str, options: dict[str, object], jobs: int | None) -> None:
    w = load_workload(name, traces_root=traces_root, **options)
    assert w.citation
    if jobs is not None:
        assert len(w.jobs) == jobs


def test_synthetic_needs_no_traces_root() -> None:
    assert load_workload("synthetic", seed=3) == load_workload("SYNTHETIC", seed=3)


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("alibaba-openb-2023", "openb"),
        ("alibaba-openb-2023/openb_pod_list_default.csv", "openb"),
        ("alibaba-openb-2023/openb_node_list_all_node.csv", "openb"),
        ("philly-2017", "philly"),
        ("philly-2017/philly_jobs_pollux.csv", "philly"),
        ("gavel-osdi20", "gavel"),
        ("gavel-osdi20/gavel_isolated_throughputs.csv", "gavel"),
        ("pollux-osdi21", "pollux"),
        ("pollux-osdi21/workloads", "pollux"),
        ("pollux-osdi21/workloads/workload-4.csv", "pollux"),
        ("tiresias-nsdi19", "tiresias"),
        ("tiresias-nsdi19/60_job.csv", "tiresias"),
    ],
)
def test_detect_format(traces_root: Path, relative: str, expected: str) -> None:
    assert detect_format(traces_root / relative) == expected


def test_load_by_path(traces_root: Path) -> None:
    assert load_workload(str(traces_root / "pollux-osdi21" / "workloads" / "workload-4.csv")).name == (
        "pollux-workload-4"
    )
    assert len(load_workload(traces_root / "tiresias-nsdi19", cluster="n32g4").nodes) == 32
    assert load_workload(traces_root / "alibaba-openb-2023" / "openb_pod_list_gpuspec33.csv").name == "openb-gpuspec33"


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(WorkloadError, match="unknown workload 'alibaba'") as err:
        load_workload("alibaba")
    for name in NAMES:
        assert name in err.value.fix


def test_name_without_traces_root_or_folder(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="traces_root"):
        load_workload("philly")
    with pytest.raises(WorkloadError, match="philly-2017/") as err:
        load_workload("philly", traces_root=tmp_path)
    assert err.value.path == str(tmp_path / "philly-2017")


def test_bad_options_are_named(traces_root: Path) -> None:
    with pytest.raises(WorkloadError, match="needs the option 'rate_per_hour'"):
        load_workload("gavel", traces_root=traces_root)
    with pytest.raises(WorkloadError, match="takes no option 'rate'") as err:
        load_workload("tiresias", traces_root=traces_root, rate=1)
    assert "cluster" in err.value.fix
    with pytest.raises(WorkloadError, match="needs the option 'seed'"):
        load_workload("fgd", traces_root=traces_root)


def test_paths_that_are_missing_or_unknown(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(str(tmp_path / "trace.csv"))
    with pytest.raises(WorkloadError, match="not a folder of a known trace"):
        load_workload(tmp_path)
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match="no known trace format") as err:
        load_workload(odd)
    assert err.value.line == 1
