"""Nodes, their GPUs and topology, and what is allocated on them."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.resources import MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU. `nvlink_group` numbers the NVLink/NVSwitch island inside its node."""

    index: int
    uuid: str
    model: str
    memory: int
    nvlink_group: int = 0


NODE_POOLS = ("on-demand", "spot", "reserved")  # the values of `costs.Pool`
NODE_ADMITS = ("all", "checkpointing", "none", "probe")


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: its GPUs, CPU and memory capacity, topology labels and health."""

    name: str
    gpus: tuple[Gpu, ...] = ()
    cpu_milli: int = 0
    memory: int = 0
    rack: str = ""
    zone: str = ""
    cordoned: bool = False
    healthy: bool = True
    pool: str = "on-demand"  # where its capacity comes from, which sets its price: on-demand, spot or reserved
    # Which new placements it takes: `all`; `checkpointing` (workers that resume from checkpoints only) or
    # `none`, while the circuit breaker of its spot pool is open; `probe` (one job, the pool's probe), while it
    # is half-open and has no probe yet. Set by the control plane, not the inventory.
    admits: str = "all"

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if self.admits not in NODE_ADMITS:
            problems.append(FieldProblem("admits", f"is {self.admits!r}", f"give one of: {', '.join(NODE_ADMITS)}"))
        if self.pool not in NODE_POOLS:
            problems.append(FieldProblem("pool", f"is {self.pool!r}", f"give one of: {', '.join(NODE_POOLS)}"))
        if not self.name:
            problems.append(FieldProblem("name", "is empty", "give every node a unique name"))
        if self.cpu_milli < 0 or self.memory < 0:
            problems.append(FieldProblem("capacity", "is negative", "give CPU and memory >= 0"))
        indices = [g.index for g in self.gpus]
        if indices != list(range(len(self.gpus))):
            problems.append(FieldProblem("gpus", f"indices are {indices}", "number GPUs 0..n-1 in order"))
        for gpu in self.gpus:
            if not gpu.model:
                problems.append(FieldProblem(f"gpus[{gpu.index}].model", "is empty", "name the model"))
            if gpu.memory <= 0:
                problems.append(
                    FieldProblem(f"gpus[{gpu.index}].memory", f"is {gpu.memory}", "give the memory in bytes")
                )
        check(problems, f"node {self.name!r}")

    @property
    def schedulable(self) -> bool:
        return self.healthy and not self.cordoned

    @property
    def models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)


@dataclass(frozen=True, slots=True)
class GpuShare:
    """The part of one GPU that a worker holds: a milli-GPU share (1000 = whole) and GPU memory."""

    index: int
    milli: int = MILLI_PER_GPU
    memory: int = 0


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    """Where one worker runs: its node, the GPUs (or shares) on it, and the CPU and memory it holds."""

    node: str
    gpus: tuple[GpuShare, ...] = ()
    cpu_milli: int = 0
    memory: int = 0

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(s.index for s in self.gpus)


def make_node(
    name: str,
    model: str,
    gpus: int,
    gpu_memory: int,
    *,
    cpu_milli: int = 96_000,
    memory: int = 1024**4,
    nvlink_groups: int = 1,
    rack: str = "",
    zone: str = "",
) -> Node:
    """A node of `gpus` identical GPUs split evenly into `nvlink_groups` NVLink islands."""
    per_group = max(1, -(-gpus // max(1, nvlink_groups)))
    return Node(
        name=name,
        gpus=tuple(Gpu(i, f"GPU-{name}-{i}", model, gpu_memory, nvlink_group=i // per_group) for i in range(gpus)),
        cpu_milli=cpu_milli,
        memory=memory,
        rack=rack,
        zone=zone,
    )
