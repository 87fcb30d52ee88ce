"""The real NVML adapter (and the real nvidia-ml-py binding) run against our fake libnvidia-ml.so.1.

The fake is an emulation for tests (tests/telemetry/fakenvml/fake_nvml.c); no GPU is involved. Each
scenario runs in its own interpreter, because nvidia-ml-py loads the library once per process.
"""

from __future__ import annotations

import ctypes.util
import json
from pathlib import Path

import psutil
import pytest

from tests.telemetry.fakenvml import run_adapter, write_config

GiB = 1024**3

SAMPLE_TWICE = """
import dataclasses, json, logging
from gpufleet.adapters.nvml import NvmlProbe, discover_nodes
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("gpufleet.nvml").addHandler(Keep())
nodes = discover_nodes("node-a")
probe = NvmlProbe("node-a")
first = [dataclasses.asdict(s) for s in probe.sample(10.0)]
second = [dataclasses.asdict(s) for s in probe.sample(15.0)]
probe.close()
print(json.dumps({"nodes": [dataclasses.asdict(n) for n in nodes], "first": first, "second": second,
                  "hints": probe.hints, "logged": records}))
"""

EXPECT_ERROR = """
import json
from gpufleet.domain.errors import GpufleetError
from gpufleet.adapters.nvml import {what}
try:
    {call}
except GpufleetError as exc:
    print(json.dumps({{"message": exc.message, "fix": exc.fix}}))
else:
    print(json.dumps({{"message": None}}))
"""

A100 = {
    "name": "NVIDIA A100-SXM4-80GB",
    "memory_total": 80 * GiB,
    "memory_used": 20 * GiB,
    "memory_reserved": GiB // 2,
    "util_gpu": [37, 90],
    "util_mem": [12, 40],
    "power_mw": 250_500,
    "power_limit_mw": 400_000,
    "temperature": 45,
    "sm_clock": 1410,
    "ecc_sbe": 3,
    "ecc_dbe": 1,
    "pcie_tx_kb": 100,
    "pcie_rx_kb": 200,
    "nvlink_tx_kib": 500,
    "nvlink_rx_kib": 250,
}


@pytest.fixture(scope="module")
def four_gpus(fake_nvml: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    config = write_config(
        tmp_path_factory.mktemp("nvml") / "four.conf",
        [
            {**A100, "uuid": "GPU-a0", "bus_id": "00000000:07:00.0", "links": [1, 1], "procs": [(4242, 20 * GiB)]},
            {**A100, "uuid": "GPU-a1", "bus_id": "00000000:0F:00.0", "links": [0, 0], "util_gpu": [1]},
            {"name": "Tesla T4", "uuid": "GPU-t4", "memory_total": 15 * GiB, "power_limit_mw": 70_000},
            {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-h100", "memory_total": 80 * GiB},
        ],
        driver="000.00-fake",
    )
    return run_adapter(SAMPLE_TWICE, fake_nvml, config)


def test_discovery_returns_the_configured_gpus_and_host_capacity(four_gpus: dict) -> None:
    (node,) = four_gpus["nodes"]
    assert node["name"] == "node-a"
    assert [(g["index"], g["uuid"], g["model"]) for g in node["gpus"]] == [
        (0, "GPU-a0", "A100-80GB"),
        (1, "GPU-a1", "A100-80GB"),
        (2, "GPU-t4", "T4"),
        (3, "GPU-h100", "H100"),
    ]
    assert [g["memory"] for g in node["gpus"]] == [80 * GiB, 80 * GiB, 15 * GiB, 80 * GiB]
    # GPUs 0 and 1 are joined by NVLink; the others have none and are islands of their own.
    assert [g["nvlink_group"] for g in node["gpus"]] == [0, 0, 1, 2]
    assert node["cpu_milli"] == psutil.cpu_count(logical=True) * 1000
    assert node["memory"] == psutil.virtual_memory().total


def test_probe_returns_the_configured_values_in_base_units(four_gpus: dict) -> None:
    gpu0 = four_gpus["first"][0]
    assert gpu0["node"] == "node-a"
    assert gpu0["uuid"] == "GPU-a0"
    assert gpu0["probe"] == "nvml"
    assert gpu0["model"] == "A100-80GB"
    assert gpu0["model_name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu0["at"] == 10.0
    assert (gpu0["gpu_util"], gpu0["mem_util"]) == (37.0, 12.0)
    # The v2 memory query: `used` excludes the driver's reserve, which is neither used nor free.
    assert gpu0["memory_used"] == 20 * GiB
    assert gpu0["memory_total"] == 80 * GiB
    assert gpu0["memory_free"] == 80 * GiB - 20 * GiB - GiB // 2
    assert gpu0["power_w"] == 250.5
    assert gpu0["power_limit_w"] == 400.0
    assert gpu0["temperature_c"] == 45.0
    assert gpu0["sm_clock_mhz"] == 1410.0
    assert (gpu0["ecc_sbe"], gpu0["ecc_dbe"]) == (3, 1)
    assert (gpu0["pcie_tx"], gpu0["pcie_rx"]) == (100 * 1024, 200 * 1024)  # NVML gives KB/s
    assert gpu0["processes"] == [[4242, 20 * GiB]]
    assert four_gpus["first"][1]["processes"] == []
    # Utilisation follows the configured steps from one sample to the next.
    assert four_gpus["second"][0]["gpu_util"] == 90.0
    assert four_gpus["second"][0]["at"] == 15.0
    assert four_gpus["first"][2]["power_limit_w"] == 70.0


def test_nvlink_throughput_is_a_rate_between_two_samples(four_gpus: dict) -> None:
    # NVML's NVLink counters are cumulative KiB: the first sample has no rate yet, the second has
    # (counter delta) x 1024 / (5 s between the samples).
    first, second = four_gpus["first"][0], four_gpus["second"][0]
    assert first["nvlink_tx"] is None
    assert first["nvlink_rx"] is None
    assert second["nvlink_tx"] == 500 * 1024 / 5.0
    assert second["nvlink_rx"] == 250 * 1024 / 5.0


def test_functions_the_library_lacks_give_none_and_one_hint_each(four_gpus: dict) -> None:
    # The fake has no XID event API: xid is None on every GPU and every sample, and the missing function
    # is hinted exactly once.
    for sample in four_gpus["first"] + four_gpus["second"]:
        assert sample["xid"] is None
    hints = four_gpus["hints"]
    assert len(hints) == 1, hints
    assert "nvmlEventSetCreate" in hints[0]
    assert "Function Not Found" in hints[0]
    assert "xid left empty" in hints[0]
    assert four_gpus["logged"] == hints


def test_a_refused_reading_is_none_and_hinted_once(fake_nvml: Path, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "nopower.conf",
        [{**A100, "uuid": f"GPU-{i}"} for i in range(3)],
        unsupported=["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors"],
    )
    out = run_adapter(SAMPLE_TWICE, fake_nvml, config)
    for sample in out["first"] + out["second"]:
        assert sample["power_w"] is None
        assert sample["ecc_sbe"] is None
        assert sample["ecc_dbe"] is None
        assert sample["power_limit_w"] == 400.0
        assert sample["gpu_util"] in (37.0, 90.0)
    power = [h for h in out["hints"] if "nvmlDeviceGetPowerUsage" in h]
    ecc = [h for h in out["hints"] if "nvmlDeviceGetTotalEccErrors" in h]
    assert len(power) == 1
    assert "Not Supported" in power[0]
    assert "power_w" in power[0]
    assert len(ecc) == 1  # one hint per (function, error), though two fields and three GPUs lost it


def test_nvswitch_gpus_form_one_island(fake_nvml: Path, tmp_path: Path) -> None:
    gpus = [{**A100, "uuid": f"GPU-s{i}", "links": ["switch"] * 2} for i in range(4)]
    gpus += [{**A100, "uuid": f"GPU-p{i}"} for i in range(2)]
    gpus.insert(2, {**A100, "uuid": "GPU-lone"})
    config = write_config(tmp_path / "switch.conf", gpus)
    code = """
import json
from gpufleet.adapters.nvml import discover_nodes
(node,) = discover_nodes("dgx")
print(json.dumps([g.nvlink_group for g in node.gpus]))
"""
    assert run_adapter(code, fake_nvml, config) == [0, 0, 1, 0, 0, 2, 3]


def test_driver_not_loaded_is_a_clear_error(fake_nvml: Path) -> None:
    # Our fake answers "driver not loaded" when it has no configuration, as NVML does without the kernel module.
    out = run_adapter(EXPECT_ERROR.format(what="NvmlProbe", call="NvmlProbe('x')"), fake_nvml, None)
    assert out["message"] == "the NVIDIA kernel driver is not loaded"
    assert "--emulate 8xA100-80GB" in out["fix"]


def test_no_gpu_is_a_clear_error(fake_nvml: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "none.conf", [])
    out = run_adapter(EXPECT_ERROR.format(what="discover_nodes", call="discover_nodes('x')"), fake_nvml, config)
    assert out["message"] == "NVML found no NVIDIA GPU on this machine"
    assert "install the NVIDIA driver" in out["fix"]
    assert "--emulate 8xA100-80GB" in out["fix"]


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this machine has a real NVML library, so 'no library' cannot be produced here",
)
def test_no_nvml_library_is_a_clear_error() -> None:
    out = run_adapter(EXPECT_ERROR.format(what="discover_nodes", call="discover_nodes()"), None, None)
    assert out["message"] == "no NVIDIA driver on this machine: NVML (libnvidia-ml.so.1) was not found"
    assert out["fix"] == "install the NVIDIA driver (it provides libnvidia-ml.so.1), or run with --emulate 8xA100-80GB"


def test_importing_the_adapter_does_not_load_pynvml() -> None:
    code = "import json, sys, gpufleet.adapters.nvml; print(json.dumps('pynvml' in sys.modules))"
    assert run_adapter(code, None, None) is False


def test_recorded_fixture_is_what_the_probe_records_from_the_fake(fake_nvml: Path, tmp_path: Path) -> None:
    """The committed fixture is reproducible: recording the fixture's emulated machine again gives it back."""
    from tests.telemetry.fixture_machine import FIXTURE, NOTE, write_fixture_config

    config = write_fixture_config(tmp_path / "dgx.conf")
    fresh = tmp_path / "fresh.json"
    code = f"""
import json
from gpufleet.adapters.nvml import record
record({str(fresh)!r}, seconds=0.5, interval=0.1, hostname="emulated-dgx", note={NOTE!r}, emulated=True)
print(json.dumps(True))
"""
    run_adapter(code, fake_nvml, config)
    assert json.loads(fresh.read_text()) == json.loads(FIXTURE.read_text())
