"""`record`: sample this machine's GPUs through NVML for a while and save a recording for the `recorded` probe.

Run it on a machine with NVIDIA GPUs (ideally under a short load, e.g. a matrix-multiply loop), then
replay the file anywhere with `RecordedProbe(path)`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from gpufleet.adapters.nvml.probe import NvmlProbe
from gpufleet.adapters.probes.recorded import Recording
from gpufleet.domain.errors import GpufleetError


def record(
    path: str | Path,
    seconds: float,
    interval: float = 1.0,
    *,
    hostname: str | None = None,
    note: str = "",
    emulated: bool = False,
) -> Recording:
    """Sample every `interval` s for `seconds` s into `path` (JSON). `note` is added to the source line;
    pass `emulated=True` when NVML itself is an emulation (the fake library of the tests), so the file says so."""
    if interval <= 0 or seconds < 0:
        raise GpufleetError(f"recording {seconds} s every {interval} s", "give seconds >= 0 and interval > 0")
    probe = NvmlProbe(hostname)
    try:
        driver = probe.session.text("nvmlSystemGetDriverVersion", field="driver version") or "unknown"
        frames = []
        start = time.monotonic()
        steps = math.floor(seconds / interval + 1e-9)  # 0.5 / 0.1 is 4.999...: count the steps as a person would
        for step in range(steps + 1):
            # Sleep to the step's slot rather than a fixed time: sampling cost must not stretch the interval.
            time.sleep(max(0.0, start + step * interval - time.monotonic()))
            frames.append(tuple(probe.sample(round(step * interval, 6))))
        models = sorted({s.model_name for s in frames[0]})
        source = f"nvml, driver {driver}, {len(frames[0])} GPUs ({', '.join(models)})"
        if note:
            source += f"; {note}"
        recording = Recording(
            source=source, emulated=emulated, hostname=probe.hostname, interval_s=interval, frames=tuple(frames)
        )
    finally:
        probe.close()
    Path(path).write_text(json.dumps(recording.to_json(), indent=1) + "\n")
    return recording
