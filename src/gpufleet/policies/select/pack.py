"""GPU selection inside a node that keeps whole GPUs whole and NVLink groups intact.

Whole GPUs: the NVLink group with the fewest usable GPUs that still holds the worker (best fit),
else the largest groups first. A fraction: the already-shared GPU with the least room that fits,
else a whole GPU from the group with the fewest free ones.
"""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.scheduling.plugin_api import BoolArray, JobView, NodeInfo

NAME = "pack"


class PackGpus:
    name: ClassVar[str] = NAME

    def select(self, view: JobView, table: NodeInfo, node: int, usable: BoolArray) -> tuple[int, ...]:
        request = view.job.request
        indices: list[int] = usable.nonzero()[0].tolist()
        groups = table.gpu_nvlink_rows[node]
        if request.fractional:
            free: list[int] = table.gpu_milli_free[node].tolist()
            shared = [i for i in indices if free[i] < MILLI_PER_GPU]
            if shared:
                return (min(shared, key=lambda i: (free[i], i)),)
            whole_free_per_group: dict[int, int] = {}
            for i in indices:
                whole_free_per_group[groups[i]] = whole_free_per_group.get(groups[i], 0) + 1
            return (min(indices, key=lambda i: (whole_free_per_group[groups[i]], i)),)
        by_group: dict[int, list[int]] = {}
        for i in indices:
            by_group.setdefault(groups[i], []).append(i)
        fitting = [g for g, members in by_group.items() if len(members) >= request.gpus]
        if fitting:
            best = min(fitting, key=lambda g: (len(by_group[g]), g))
            return tuple(by_group[best][: request.gpus])
        chosen: list[int] = []
        for group in sorted(by_group, key=lambda g: (-len(by_group[g]), g)):
            chosen.extend(by_group[group][: request.gpus - len(chosen)])
            if len(chosen) == request.gpus:
                return tuple(sorted(chosen))
        raise GpufleetError(
            f"node {table.names[node]} passed the filters with too few usable GPUs for job {view.job.id}",
            "this is a bug in a filter plugin; report it with the snapshot",
        )
