"""What a node keeps back from its jobs, and the memory limit of a worker whose job gave no `memory`.

- **Reserve.** The system and the control plane keep part of the node's memory and of its process ids: by
  default max(2 GiB, 10 %) of the memory and max(1,024, 10 %) of the ids (`kernel.pid_max`, or
  `kernel.threads-max` if lower; threads count too), each at most half of what the node has. The rest is
  *allocatable*: the cgroup that holds every worker of the node is capped at it (`cgroups.Cgroups.cap_all`),
  so however many workers run and whatever each one's own limit says, the system keeps its reserve.
- **Default memory limit.** A worker whose job asked for no memory gets its queue's `memory_per_gpu` per GPU
  it holds (a fraction of a GPU, that fraction of it), or, when the queue set none, the node's allocatable
  memory divided among its GPUs. A worker holding no GPU gets its queue's `memory_no_gpu`, else one GPU's
  share. Never more than the allocatable memory, never less than `MIN_MEMORY`.

The scheduling core never sees these numbers: a job's placement is decided as before; only the limits the
node enforces change.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.errors import GpufleetError

GiB = 1 << 30
MiB = 1 << 20
MEMORY_RESERVE_MIN = 2 * GiB
PIDS_RESERVE_MIN = 1024
RESERVE_FRACTION = 10  # percent
MIN_MEMORY = 16 * MiB  # below this not even an interpreter starts: a limit this low is a mistake, not a limit
MILLI_PER_GPU = 1000


@dataclass(frozen=True, slots=True)
class HostBudget:
    """A node's memory and process ids, and what of them its jobs may never take."""

    memory: int  # bytes of RAM the node has
    memory_reserve: int
    pid_max: int  # the most processes and threads the kernel allows at once
    pids_reserve: int

    @property
    def job_memory(self) -> int:
        """Bytes every job of the node may hold together (the node's allocatable memory); 0: not known (no
        /proc/meminfo), no cap."""
        return max(MIN_MEMORY, self.memory - self.memory_reserve) if self.memory > 0 else 0

    @property
    def job_pids(self) -> int:
        """Processes and threads every job of the node may have together."""
        return max(1, self.pid_max - self.pids_reserve)

    def allocatable(self, node_memory: int = 0) -> int:
        """The allocatable memory of a node the inventory says has `node_memory` bytes (0: not said). An
        emulated node may claim more than the machine it runs on: the machine's budget bounds it."""
        if node_memory <= 0 or self.memory <= 0:
            return self.job_memory if self.memory > 0 else max(0, node_memory)
        return max(MIN_MEMORY, min(self.job_memory, node_memory - reserve_for(node_memory, self.memory_reserve)))

    def describe(self) -> str:
        return (
            f"jobs together at most {_size(self.job_memory)} of {_size(self.memory)} memory and "
            f"{self.job_pids:,} of {self.pid_max:,} processes (the rest kept for the system and the control plane)"
        )


def default_reserve(total: int, floor: int, fraction: int = RESERVE_FRACTION) -> int:
    """max(`floor`, `fraction` % of `total`), at most half of `total`."""
    return min(total // 2, max(floor, total * fraction // 100))


def reserve_for(node_memory: int, machine_reserve: int) -> int:
    """The reserve of a node of `node_memory` bytes: the machine's own (an administrator may have set it)
    unless that is more than half the node."""
    return min(node_memory // 2, machine_reserve)


def budget(
    memory: int, pid_max: int, *, memory_reserve: int | None = None, pids_reserve: int | None = None
) -> HostBudget:
    """The budget of a node with `memory` bytes and `pid_max` ids; reserves None take the defaults. Raises
    GpufleetError when a reserve leaves the jobs nothing."""
    if memory <= 0:  # not known: nothing to cap, nor to share out
        memory_reserve = 0
    mem_reserve = default_reserve(memory, MEMORY_RESERVE_MIN) if memory_reserve is None else memory_reserve
    pid_reserve = default_reserve(pid_max, PIDS_RESERVE_MIN) if pids_reserve is None else pids_reserve
    if memory > 0 and not 0 <= mem_reserve <= memory - MIN_MEMORY:
        raise GpufleetError(
            f"--memory-reserve {_size(mem_reserve)} leaves jobs less than {_size(MIN_MEMORY)} of this machine's "
            f"{_size(memory)}",
            f"give a reserve below {_size(max(0, memory - MIN_MEMORY))}, or leave it out (default: max(2GiB, 10%))",
        )
    if not 0 <= pid_reserve < pid_max:
        raise GpufleetError(
            f"--pids-reserve {pid_reserve} leaves jobs no processes of this machine's {pid_max}",
            f"give a reserve below {pid_max}, or leave it out (default: max(1024, 10%))",
        )
    return HostBudget(memory, mem_reserve, pid_max, pid_reserve)


def detect(*, memory_reserve: int | None = None, pids_reserve: int | None = None, proc: str = "/proc") -> HostBudget:
    """This machine's budget, from /proc. Raises GpufleetError (a reserve too large)."""
    return budget(_mem_total(proc), _pid_max(proc), memory_reserve=memory_reserve, pids_reserve=pids_reserve)


def default_memory(
    budget: HostBudget,
    *,
    gpu_milli: int,
    node_gpus: int,
    node_memory: int = 0,
    per_gpu: int | None = None,
    no_gpu: int | None = None,
) -> int:
    """The memory limit of a worker that asked for none: see the module's docstring."""
    allocatable = budget.allocatable(node_memory)
    if allocatable <= 0:
        return 0  # the node's memory is not known: no default to give
    share = per_gpu if per_gpu is not None else allocatable // max(1, node_gpus)
    without_gpu = no_gpu if no_gpu is not None else share
    limit = share * gpu_milli // MILLI_PER_GPU if gpu_milli > 0 else without_gpu
    return max(MIN_MEMORY, min(limit, allocatable))


def _mem_total(proc: str) -> int:
    try:
        with open(f"{proc}/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _pid_max(proc: str) -> int:
    found = []
    for name in ("pid_max", "threads-max"):
        try:
            with open(f"{proc}/sys/kernel/{name}") as f:
                found.append(int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return min(found) if found else 32768


def _size(value: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value} B"
