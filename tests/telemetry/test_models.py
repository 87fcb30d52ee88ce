from __future__ import annotations

import pytest

from gpufleet.adapters.nvml import short_model_name

GiB = 1024**3


@pytest.mark.parametrize(
    ("nvml_name", "short"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA H200", "H200"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla V100-PCIE-32GB", "V100-32GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_nvml_names_map_to_the_schedulers_short_names(nvml_name: str, short: str) -> None:
    assert short_model_name(nvml_name) == short


def test_a_sized_family_without_size_in_its_name_takes_it_from_the_memory() -> None:
    # NVML reports a little less than the marketed size.
    assert short_model_name("NVIDIA A100-SXM4", 79 * GiB) == "A100-80GB"
    assert short_model_name("NVIDIA A100-SXM4", 39 * GiB) == "A100-40GB"
    assert short_model_name("NVIDIA A100-SXM4") == "A100"
