"""`gpufleet bench resize`: how long the local executor takes to resize a running job, as one JSON object.

One job runs on an emulated node of 8 GPUs under the local executor (real worker processes under their shims,
as the control plane's own user, without cgroups). Its workers checkpoint on SIGTERM by exiting at once, so
the figure is the executor's own cost, not a job's checkpoint: from the `resize` call (the checkpoint signal to
every old worker) to the RESIZED observation (every new worker's command running), polled every `POLL_S`.
The job goes through `sizes` in turn, `rounds` times over; each resize is one sample. `load_avg_1m` is the
machine's 1-minute load average at the end: wall-clock figures are only comparable at similar loads.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.domain import GpuShare, Job, WorkerPlacement, WorkerRequest
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, Observation, ObservationKind

POLL_S = 0.005
TIMEOUT_S = 60.0
GPUS = 8
# A worker that saves nothing: it exits 0 on the checkpoint signal.
WORKER = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True: time.sleep(1)"


class _WallClock:
    def now(self) -> float:
        return time.time()


def run(sizes: tuple[int, ...], rounds: int) -> dict[str, object]:
    if len(sizes) < 2 or any(not 1 <= n <= GPUS for n in sizes):
        raise GpufleetError(f"sizes {sizes} cannot be resized between", f"give 2 or more sizes of 1 to {GPUS} workers")
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-resize-"))
    node = parse_emulate(f"{GPUS}xA100-80GB", "bench")[0]
    backend = LocalBackend(root / "state", [node], _WallClock(), emulated=True)
    run_spec = RunSpec((sys.executable, "-c", WORKER))
    job = Job("bench-resize", "default", WorkerRequest(gpus=1), workers=sizes[0], run=run_spec)
    launch = Launch(job, 1, _placement(node.name, sizes[0]))
    samples: list[float] = []
    try:
        backend.launch(launch)
        _wait(backend, ObservationKind.STARTED)
        count = 0
        for _ in range(rounds):
            for size in (*sizes[1:], sizes[0]):
                count += 1
                asked = time.perf_counter()
                backend.resize(replace(launch, workers=_placement(node.name, size)), 30.0, count)
                _wait(backend, ObservationKind.RESIZED)
                samples.append(time.perf_counter() - asked)
        backend.stop(job.id, 1, 5.0, "benchmark done")
        _wait(backend, ObservationKind.STOPPED)
    finally:
        backend.shutdown(stop_jobs=True, grace_s=0.0)
        shutil.rmtree(root, ignore_errors=True)
    ordered = sorted(samples)
    return {
        "benchmark": "resize",
        "executor": "local",
        "sizes": list(sizes),
        "resizes": len(samples),
        "resize_p50_s": round(statistics.median(ordered), 4),
        "resize_max_s": round(ordered[-1], 4),
        "resize_min_s": round(ordered[0], 4),
        "samples_s": [round(s, 4) for s in samples],
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def _placement(node: str, workers: int) -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement(node, (GpuShare(i),)) for i in range(workers))


def _wait(backend: LocalBackend, kind: ObservationKind) -> Observation:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for observation in backend.poll():
            if observation.kind is kind:
                return observation
            if observation.kind in (ObservationKind.LOST, ObservationKind.EXITED):
                raise GpufleetError(f"the benchmark's job ended: {observation}", "see the executor's logs")
        time.sleep(POLL_S)
    raise GpufleetError(f"no {kind.value} within {TIMEOUT_S} s", "run it on a less loaded machine")
