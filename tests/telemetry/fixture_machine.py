"""The emulated machine behind tests/fixtures/nvml/emulated-dgx-a100.json (made with our fake NVML library).

8 x A100-SXM4-80GB on an NVSwitch, in four states a reclaim policy must tell apart: busy training (0-3),
a job holding memory with no kernels (4: reserved-but-idle), a light data-bound job (5), and free (6, 7).
Regenerate the fixture with `python -m tests.telemetry.fixture_machine` after changing the probe.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.telemetry.fakenvml import build_library, run_adapter, write_config

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvml" / "emulated-dgx-a100.json"
NOTE = "EMULATED: recorded from gpufleet's fake NVML library (tests/telemetry/fakenvml), not from a real GPU"
GiB = 1024**3


def write_fixture_config(path: Path) -> Path:
    base = {"name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB, "memory_reserved": GiB // 2,
            "power_limit_mw": 400_000, "links": ["switch"] * 12}  # fmt: skip
    gpus = []
    for i in range(8):
        gpu = {**base, "uuid": f"GPU-emulated-dgx-{i}", "bus_id": f"00000000:{0x07 + 8 * i:02X}:00.0"}
        if i < 4:
            gpu |= {"util_gpu": [93, 97, 88, 99, 95, 91], "util_mem": [48, 52, 40, 55, 50, 47],
                    "memory_used": 71 * GiB, "power_mw": 352_000, "temperature": 66, "sm_clock": 1410,
                    "pcie_tx_kb": 1_200_000, "pcie_rx_kb": 900_000, "procs": [(30100 + i, 71 * GiB)],
                    "nvlink_tx_kib": 2_000_000, "nvlink_rx_kib": 2_000_000}  # fmt: skip
        elif i == 4:
            gpu |= {"util_gpu": [0, 0, 1, 0, 0, 0], "util_mem": [0], "memory_used": 38 * GiB, "power_mw": 61_000,
                    "temperature": 34, "sm_clock": 1410, "procs": [(30200, 38 * GiB)]}  # fmt: skip
        elif i == 5:
            gpu |= {"util_gpu": [31, 44, 22, 38, 27, 41], "util_mem": [9, 14, 6, 12, 8, 13],
                    "memory_used": 12 * GiB, "power_mw": 148_000, "temperature": 47, "sm_clock": 1410,
                    "pcie_tx_kb": 300_000, "pcie_rx_kb": 2_500_000, "procs": [(30300, 12 * GiB)]}  # fmt: skip
        else:
            gpu |= {"util_gpu": [0], "util_mem": [0], "power_mw": 52_000, "temperature": 31, "sm_clock": 210}
        gpus.append(gpu)
    return write_config(path, gpus, driver="000.00-gpufleet-fake-nvml")


def regenerate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_library(Path(tmp))
        config = write_fixture_config(Path(tmp) / "dgx.conf")
        code = f"""
import json
from gpufleet.adapters.nvml import record
record({str(FIXTURE)!r}, seconds=0.5, interval=0.1, hostname="emulated-dgx", note={NOTE!r}, emulated=True)
print(json.dumps(True))
"""
        run_adapter(code, lib, config)
    print(f"wrote {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    assert shutil.which("gcc")
    assert subprocess
    regenerate()
