"""`RayProbe`: GPU telemetry of every node of a Ray cluster, sampled by each node's agent.

Each agent samples its own node's GPUs (NVML on real GPUs, the emulated probe on emulated nodes, whose
samples say `probe="emulated"`), so `/metrics` shows every node's GPUs under its own `Hostname`. The
control plane tells each agent what the jobs on its emulated GPUs declare (activity and worker pids); a real
GPU reports what it really does. The agents are asked in parallel; a node that does not answer within
`timeout_s` is missing from that sample, not a reason to fail it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from gpufleet.adapters.ray.ray_inventory import RayFleet
from gpufleet.ports.gpu_probe import GpuActivity, GpuSample

log = logging.getLogger(__name__)
GpuKey = tuple[str, int]


class RayProbe:
    def __init__(
        self,
        fleet: RayFleet,
        activity: Callable[[], Mapping[GpuKey, GpuActivity]],
        pid_weights: Callable[[], Mapping[int, int]],
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self.fleet = fleet
        self.activity = activity
        self.pid_weights = pid_weights
        self.timeout_s = timeout_s
        self.kind = "emulated" if fleet.all_emulated() else "nvml"

    def sample(self, now: float) -> Sequence[GpuSample]:
        activity = self.activity()
        weights = self.pid_weights()
        asked = []
        for name, agent in self.fleet.agents():
            mine = {key: value for key, value in activity.items() if key[0] == name}
            pids = {pid for value in mine.values() for pid in value.pids}
            asked.append((name, agent.sample.remote(now, mine, {p: w for p, w in weights.items() if p in pids})))
        out: list[GpuSample] = []
        for name, ref in asked:
            try:
                out.extend(self.fleet.ray.get(ref, timeout=self.timeout_s))
            except Exception as error:  # a node that does not answer misses this sample
                log.warning("telemetry: node %s did not answer: %s", name, error)
        return out
