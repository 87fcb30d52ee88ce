"""What spreading a data-parallel gang costs: ring all-reduce time per step over the placement's slowest link.

Model (bandwidth term of the ring all-reduce; Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005; Patarasuk &
Yuan, JPDC 69(2), 2009): each of `n` ranks (GPUs) sends and receives `2(n-1)/n * S` bytes for `S` bytes of
gradients, so one all-reduce takes `2(n-1)/n * S / B` seconds where `B` is the bandwidth of the slowest link
of the ring. nccl-tests report the same quantity as bus bandwidth: `busbw = algbw * 2(n-1)/n` with
`algbw = S / t` (NVIDIA/nccl-tests, doc/PERFORMANCE.md), so `B` here is the bus bandwidth the ring reaches.

Links, in GB/s per direction per GPU (`Links`):
- inside a node, GPUs of one NVLink group talk over NVLink; a ring that crosses NVLink groups of a node runs
  at PCIe speed;
- between nodes, each GPU has its own network port (one NIC per GPU, as on DGX-class A100/H100 nodes), and
  NCCL runs one ring per port in parallel: a node holding `m` GPUs of the job carries `m` ports' worth of the
  ring's traffic. The ring is as fast as the node with the fewest ports in it: a 16-GPU gang on two whole
  8-GPU nodes reaches `8 x port`, the same gang spread 8 + 4 + 4 only `4 x port`.

The predicted step is compute plus synchronisation, not overlapped (a conservative bound: frameworks overlap
part of the all-reduce with the backward pass; Pollux's step model `(T_c^g + T_n^g)^(1/g)` with `g = 1` is
this sum): `overhead = t_allreduce / (step_time + t_allreduce)`, the share of each step spent in all-reduce.

Default bandwidths by GPU model (`default_links`) are vendor peaks: NVLink 2/3/4 300/600/900 GB/s
bidirectional per GPU for V100/A100/H100 (NVIDIA datasheets), PCIe 4.0 x16 32 GB/s and PCIe 5.0 x16 64 GB/s
per direction (PCI-SIG), InfiniBand HDR 200 Gb/s (25 GB/s) and NDR 400 Gb/s (50 GB/s) per port
(NVIDIA ConnectX-6/-7). Real rings reach less than peak; an inventory sets measured values per node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpufleet.domain.errors import FieldProblem, check

FloatArray = npt.NDArray[np.float64]
GB = 1e9  # bandwidths are in GB/s (10^9 bytes), as datasheets and nccl-tests give them

# Bytes per parameter of the gradient dtypes a job may declare with `params`.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "tf32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
}


def ring_factor(ranks: int | npt.NDArray[np.int64]) -> float | FloatArray:
    """`2(n-1)/n`: bytes each rank moves per byte all-reduced (nccl-tests' bus-bandwidth factor)."""
    n = np.asarray(ranks, dtype=np.float64)
    factor = np.where(n > 1, 2.0 * (n - 1.0) / np.maximum(n, 1.0), 0.0)
    return float(factor) if factor.ndim == 0 else factor


def allreduce_seconds(grad_bytes: float, ranks: int, bus_gbps: float | FloatArray) -> float | FloatArray:
    """Ring all-reduce time of `grad_bytes` over `ranks` GPUs whose slowest link carries `bus_gbps` GB/s."""
    bw = np.asarray(bus_gbps, dtype=np.float64)
    seconds = ring_factor(ranks) * grad_bytes / (np.maximum(bw, 1e-9) * GB)
    return float(seconds) if np.ndim(seconds) == 0 else np.asarray(seconds, dtype=np.float64)


def overhead_share(sync_s: float | FloatArray, step_time_s: float) -> float | FloatArray:
    """The share of a step spent in all-reduce: `sync / (step + sync)`."""
    sync = np.asarray(sync_s, dtype=np.float64)
    share = sync / (step_time_s + sync)
    return float(share) if share.ndim == 0 else share


@dataclass(frozen=True, slots=True)
class Links:
    """Bandwidths one GPU of a node has, in GB/s per direction: NVLink (inside its NVLink group), PCIe
    (between groups of the node) and its network port (to other nodes)."""

    nvlink: float
    pcie: float
    network: float

    def __post_init__(self) -> None:
        problems = [
            FieldProblem(f"{name}_gbps", f"is {value!r}", "give GB/s per direction > 0, e.g. 25 for InfiniBand HDR")
            for name, value in (("nvlink", self.nvlink), ("pcie", self.pcie), ("network", self.network))
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0)
        ]
        check(problems, "interconnect")


PCIE4_GBPS = 32.0  # PCIe 4.0 x16, per direction (PCI-SIG)
PCIE5_GBPS = 64.0  # PCIe 5.0 x16, per direction (PCI-SIG)
PCIE3_GBPS = 16.0  # PCIe 3.0 x16: half of 4.0's 16 GT/s per lane (derived)
IB_HDR_GBPS = 25.0  # InfiniBand HDR port, 200 Gb/s (NVIDIA ConnectX-6)
IB_NDR_GBPS = 50.0  # InfiniBand NDR port, 400 Gb/s (NVIDIA ConnectX-7)

# By GPU model family (the name before any "-80GB"-like suffix). NVLink: half the datasheet's bidirectional
# total per GPU. Models without NVLink (and models not listed) talk over PCIe inside the node too.
_LINKS_BY_FAMILY: dict[str, Links] = {
    "V100": Links(150.0, PCIE3_GBPS, IB_HDR_GBPS),  # NVLink 2: 300 GB/s bidirectional
    "A100": Links(300.0, PCIE4_GBPS, IB_HDR_GBPS),  # NVLink 3: 600 GB/s bidirectional
    "H100": Links(450.0, PCIE5_GBPS, IB_NDR_GBPS),  # NVLink 4: 900 GB/s bidirectional
    # Same NVLink 4 generation as H100; B200 counted at H100's rates (set measured values for NVLink 5).
    "H200": Links(450.0, PCIE5_GBPS, IB_NDR_GBPS),
    "GH200": Links(450.0, PCIE5_GBPS, IB_NDR_GBPS),
    "B200": Links(450.0, PCIE5_GBPS, IB_NDR_GBPS),
}
_PCIE_ONLY = Links(PCIE4_GBPS, PCIE4_GBPS, IB_HDR_GBPS)


def default_links(model: str | None) -> Links:
    """The default bandwidths of a GPU model (see the module's sources); PCIe 4.0 and HDR when unknown."""
    if not model:
        return _PCIE_ONLY
    family = model.split("-", 1)[0].upper()
    return _LINKS_BY_FAMILY.get(family, _PCIE_ONLY)


@dataclass(frozen=True, slots=True)
class CommNeeds:
    """What a data-parallel job synchronises each step: `grad_bytes` all-reduced per step, its step time
    without synchronisation (`step_time_s`), and the largest share of a step it accepts in all-reduce
    (`max_overhead`, e.g. 0.2; None: any placement, the score still prefers cheaper ones)."""

    grad_bytes: int
    step_time_s: float
    max_overhead: float | None = None

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if isinstance(self.grad_bytes, bool) or not isinstance(self.grad_bytes, int) or self.grad_bytes <= 0:
            problems.append(
                FieldProblem("grad_bytes", f"is {self.grad_bytes!r}", "give the gradient size in bytes > 0")
            )
        if not (math.isfinite(self.step_time_s) and self.step_time_s > 0):
            problems.append(
                FieldProblem("step_time", f"is {self.step_time_s!r}", "give one step's compute time in seconds > 0")
            )
        if self.max_overhead is not None and not (math.isfinite(self.max_overhead) and 0 < self.max_overhead < 1):
            problems.append(
                FieldProblem(
                    "max_comm_overhead", f"is {self.max_overhead!r}", "give a fraction of step time in (0, 1), e.g. 0.2"
                )
            )
        check(problems, "communication needs")

    def sync_seconds(self, ranks: int, bus_gbps: float) -> float:
        return float(allreduce_seconds(self.grad_bytes, ranks, bus_gbps))

    def overhead(self, ranks: int, bus_gbps: float) -> float:
        return float(overhead_share(self.sync_seconds(ranks, bus_gbps), self.step_time_s))

    def slowdown(self, ranks: int, bus_gbps: float) -> float:
        """Throughput relative to compute alone: `step / (step + sync)`."""
        return self.step_time_s / (self.step_time_s + self.sync_seconds(ranks, bus_gbps))

    def slowdown_of(self, ring: RingEstimate) -> float:
        """`slowdown` of an estimated placement: 1 - its overhead share."""
        return self.step_time_s / (self.step_time_s + ring.sync_s)


@dataclass(frozen=True, slots=True)
class RingEstimate:
    """The slowest link of a placement's ring and what it costs a job."""

    ranks: int
    nodes: int
    link: str  # "none" (one GPU), "nvlink", "pcie" or "network"
    bus_gbps: float
    sync_s: float
    overhead: float

    def describe(self) -> str:
        where = f"spread over {self.nodes} nodes" if self.nodes > 1 else "on one node"
        return (
            f"{where}: ~{100 * self.overhead:.0f} % of each step in all-reduce "
            f"({self.ranks} GPUs, slowest link {self.link} at {self.bus_gbps:g} GB/s, "
            f"{self.sync_s * 1000:.0f} ms a step)"
        )


def ring_bus_gbps(
    gpus_per_node: FloatArray | npt.NDArray[np.int64],
    groups_per_node: npt.NDArray[np.int64],
    nvlink: FloatArray,
    pcie: FloatArray,
    network: FloatArray,
) -> tuple[float, str]:
    """The bandwidth of a ring over GPUs on some nodes (arrays over those nodes: the job's GPUs there, how many
    NVLink groups they span, each node's links), and which kind of link limits it."""
    m = np.asarray(gpus_per_node, dtype=np.float64)
    intra = np.where(groups_per_node > 1, pcie, nvlink)
    inside = m > 1
    best = math.inf
    link = "none"
    if inside.any():
        k = int(np.argmin(np.where(inside, intra, np.inf)))
        best, link = float(intra[k]), "pcie" if groups_per_node[k] > 1 else "nvlink"
    if len(m) > 1:
        ports = m * network
        k = int(np.argmin(ports))
        if float(ports[k]) < best:
            best, link = float(ports[k]), "network"
    return (0.0, "none") if math.isinf(best) else (best, link)


def estimate(
    needs: CommNeeds,
    gpus_per_node: npt.NDArray[np.int64],
    groups_per_node: npt.NDArray[np.int64],
    nvlink: FloatArray,
    pcie: FloatArray,
    network: FloatArray,
) -> RingEstimate:
    """What a placement (arrays over its nodes, as `ring_bus_gbps` takes them) costs the job each step."""
    ranks = int(np.sum(gpus_per_node))
    bus, link = ring_bus_gbps(gpus_per_node, groups_per_node, nvlink, pcie, network)
    if ranks < 2 or bus <= 0:
        return RingEstimate(ranks, len(gpus_per_node), "none", 0.0, 0.0, 0.0)
    sync = needs.sync_seconds(ranks, bus)
    return RingEstimate(ranks, len(gpus_per_node), link, bus, sync, float(overhead_share(sync, needs.step_time_s)))
