"""The communication model (`domain.comm`) against the published figures it is built on.

Sources (compiled in ../shared/costs/published-constants/published_constants.csv, each row citing its own):
- nccl-tests' bus bandwidth (NVIDIA/nccl-tests, doc/PERFORMANCE.md): for all-reduce `busbw = algbw * 2(n-1)/n`,
  `algbw = S / t`; busbw is the rate the slowest link of the ring runs at, comparable across rank counts.
- Ring all-reduce, bandwidth term `2((p-1)/p) n beta` (Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005).
- Vendor peaks: NVLink 2/3/4 per GPU 300/600/900 GB/s bidirectional (V100/A100/H100 datasheets), PCIe 4.0/5.0
  x16 32/64 GB/s per direction (PCI-SIG), InfiniBand HDR/NDR 200/400 Gb/s per port (ConnectX-6/-7).
- One public measurement: 8x A100 NVLink sendrecv busbw 195 GB/s at 1 GiB (li-plus/playground cuda/nccl.md).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from gpufleet.domain.comm import (
    IB_HDR_GBPS,
    IB_NDR_GBPS,
    PCIE4_GBPS,
    PCIE5_GBPS,
    CommNeeds,
    allreduce_seconds,
    default_links,
    estimate,
    ring_factor,
)
from gpufleet.domain.errors import SpecError
from tests.kit.traces import published_constants

GIB = 1 << 30


@pytest.fixture(scope="module")
def constants() -> dict[tuple[str, str], list[dict[str, str]]]:
    rows: dict[tuple[str, str], list[dict[str, str]]] = {}
    with published_constants().open(newline="") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault((row["category"], row["key"]), []).append(row)
    return rows


def nccl_busbw(size: float, seconds: float, ranks: int) -> float:
    """nccl-tests' definition for all-reduce, as in doc/PERFORMANCE.md: algbw = S / t; busbw = algbw * 2(n-1)/n."""
    return size / seconds * (2 * (ranks - 1) / ranks)


@pytest.mark.parametrize("ranks", [2, 4, 8, 16, 64, 1024])
@pytest.mark.parametrize("bus_gbps", [25.0, 195.0, 300.0])
def test_the_model_reaches_exactly_the_bus_bandwidth_nccl_tests_would_report(ranks: int, bus_gbps: float) -> None:
    # Our time for 1 GiB over a ring whose slowest link runs at `bus_gbps`, fed to nccl-tests' formula, gives
    # that link's rate back: the model's B is what nccl-tests calls bus bandwidth, at any rank count.
    seconds = allreduce_seconds(GIB, ranks, bus_gbps)
    assert nccl_busbw(GIB, seconds, ranks) / 1e9 == pytest.approx(bus_gbps, rel=1e-12)


def test_the_ring_factor_is_the_published_all_reduce_factor(constants: dict) -> None:
    (row,) = constants[("collective", "nccl_busbw_factor_allreduce")]
    assert row["value"] == "2*(n-1)/n"
    assert "nccl-tests" in row["source"]
    for n in (1, 2, 3, 8, 16, 4096):
        published = 2 * (n - 1) / n if n > 1 else 0.0  # the row's formula, written out
        assert ring_factor(n) == pytest.approx(published)
    # Vectorised over rank counts as well (what the topology score computes per candidate node).
    assert np.allclose(ring_factor(np.array([2, 8, 16])), [1.0, 1.75, 1.875])


def test_worked_figures() -> None:
    # 16 GPUs all-reducing 14 GB (7B parameters in bf16) at 200 GB/s: 2*15/16 * 14e9 / 200e9 = 0.13125 s;
    # at 100 GB/s twice that; 8 GPUs inside one A100 NVLink group at 300 GB/s: 2*7/8 * 14e9 / 300e9 = 0.08167 s.
    assert allreduce_seconds(14e9, 16, 200.0) == pytest.approx(0.13125)
    assert allreduce_seconds(14e9, 16, 100.0) == pytest.approx(0.2625)
    assert allreduce_seconds(14e9, 8, 300.0) == pytest.approx(14e9 * 1.75 / 300e9)
    needs = CommNeeds(14_000_000_000, 1.0, 0.15)
    assert needs.overhead(16, 100.0) == pytest.approx(0.2625 / 1.2625)  # ~21 % of each step
    assert needs.slowdown(16, 200.0) == pytest.approx(1 / 1.13125)
    assert needs.overhead(1, 100.0) == 0.0


def test_default_bandwidths_are_the_published_peaks(constants: dict) -> None:
    nvlink = {
        row["applies_to"].split()[0]: float(row["value"])
        for row in constants[("interconnect", "nvlink_total_bw_per_gpu")]
    }
    assert nvlink == {"V100": 300.0, "A100": 600.0, "H100": 900.0}
    for model, bidirectional in nvlink.items():
        assert default_links(model).nvlink == bidirectional / 2  # per direction, as a ring uses it
    (gen4,) = constants[("interconnect", "pcie_gen4_x16")]
    (gen5,) = constants[("interconnect", "pcie_gen5_x16")]
    assert (float(gen4["value"]), float(gen5["value"])) == (PCIE4_GBPS, PCIE5_GBPS)
    assert default_links("A100-80GB").pcie == PCIE4_GBPS
    assert default_links("H100").pcie == PCIE5_GBPS
    (hdr,) = constants[("interconnect", "infiniband_hdr_port")]
    (ndr,) = constants[("interconnect", "infiniband_ndr_port")]
    assert (float(hdr["value"]) / 8, float(ndr["value"]) / 8) == (IB_HDR_GBPS, IB_NDR_GBPS)  # Gb/s -> GB/s
    assert default_links("A100-40GB").network == IB_HDR_GBPS
    assert default_links("H200").network == IB_NDR_GBPS
    # A GPU without NVLink talks over PCIe inside its node too.
    assert default_links("L4").nvlink == default_links("L4").pcie == PCIE4_GBPS


def test_a_measured_nvlink_ring_runs_below_the_peak_the_model_defaults_to(constants: dict) -> None:
    # The defaults are peaks: a measured 8x A100 NVLink busbw (195 GB/s) is 65 % of the 300 GB/s per direction
    # the model assumes, so its estimates are lower bounds on real synchronisation time (an inventory can set
    # measured values instead: `nvlink_gbps`).
    (measured,) = constants[("interconnect", "measured_sendrecv_busbw_8xA100_nvlink")]
    ratio = float(measured["value"]) / default_links("A100").nvlink
    assert ratio == pytest.approx(0.65)
    ours = allreduce_seconds(GIB, 8, default_links("A100").nvlink)
    assert ours < allreduce_seconds(GIB, 8, float(measured["value"]))


def test_the_slowest_link_of_the_ring_limits_it() -> None:
    needs = CommNeeds(14_000_000_000, 1.0)
    a100 = default_links("A100")

    def ring(gpus: list[int], groups: list[int]) -> tuple[str, float]:
        n = len(gpus)
        found = estimate(
            needs,
            np.array(gpus),
            np.array(groups),
            np.full(n, a100.nvlink),
            np.full(n, a100.pcie),
            np.full(n, a100.network),
        )
        return found.link, found.bus_gbps

    assert ring([8], [1]) == ("nvlink", 300.0)
    assert ring([8], [2]) == ("pcie", 32.0)  # across the node's NVLink groups
    assert ring([8, 8], [1, 1]) == ("network", 200.0)  # 8 ports of 25 GB/s on each node
    assert ring([8, 4, 4], [1, 1, 1]) == ("network", 100.0)  # the node with 4 of the job's GPUs limits it
    assert ring([1, 1], [1, 1]) == ("network", 25.0)
    assert ring([8, 8], [2, 1]) == ("pcie", 32.0)
    assert ring([1], [1]) == ("none", 0.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"grad_bytes": 0, "step_time_s": 1.0}, "grad_bytes"),
        ({"grad_bytes": 10, "step_time_s": 0.0}, "step_time"),
        ({"grad_bytes": 10, "step_time_s": float("nan")}, "step_time"),
        ({"grad_bytes": 10, "step_time_s": 1.0, "max_overhead": 1.0}, "max_comm_overhead"),
        ({"grad_bytes": 10, "step_time_s": 1.0, "max_overhead": 0.0}, "max_comm_overhead"),
    ],
)
def test_bad_needs_are_refused_with_the_field_and_a_fix(kwargs: dict, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        CommNeeds(**kwargs)
    assert [p.field for p in caught.value.fields] == [field]
    assert "to fix" in str(caught.value)
