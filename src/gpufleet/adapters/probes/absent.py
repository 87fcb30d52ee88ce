"""The probe of a control plane that samples no GPU itself: on Kubernetes each node's dcgm-exporter does, and
gpufleet's own series (allocation, queues, cost) are exported without per-GPU samples."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.ports.gpu_probe import GpuSample


class AbsentProbe:
    def sample(self, now: float) -> Sequence[GpuSample]:
        return ()
