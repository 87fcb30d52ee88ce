"""The emulated GPU inventory: --emulate texts and inventory YAML files, and their errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.adapters.inventory.emulated_inventory import (
    MODEL_MEMORY_GIB,
    NVSWITCH_MODELS,
    load_inventory_yaml,
    parse_emulate,
)
from gpufleet.domain import GiB
from gpufleet.domain.comm import Links, default_links
from gpufleet.domain.errors import GpufleetError, SpecError


def test_a_dgx_like_node() -> None:
    (node,) = parse_emulate("8xA100-80GB", "box")
    assert node.name == "box"
    assert [g.index for g in node.gpus] == list(range(8))
    assert {g.model for g in node.gpus} == {"A100-80GB"}
    assert {g.memory for g in node.gpus} == {80 * GiB}
    assert {g.nvlink_group for g in node.gpus} == {0}  # one NVSwitch island
    assert [g.uuid for g in node.gpus] == [f"GPU-emulated-box-{i}" for i in range(8)]
    assert node.cpu_milli == (os.cpu_count() or 1) * 1000
    assert node.memory > 0


@pytest.mark.parametrize(
    ("text", "model", "gib"),
    [
        ("4xH100", "H100", 80),
        ("2xh200", "H200", 141),
        ("1xA100", "A100", 40),
        ("A100-40GB", "A100-40GB", 40),
        ("4xV100-32GB", "V100-32GB", 32),
        ("4xV100", "V100", 16),
        ("2xT4", "T4", 16),
        ("1xRTX4090", "RTX4090", 24),
        ("3xMyAccel-12GB", "MyAccel-12GB", 12),
    ],
)
def test_models_and_memory(text: str, model: str, gib: int) -> None:
    (node,) = parse_emulate(text, "h")
    assert {(g.model, g.memory) for g in node.gpus} == {(model, gib * GiB)}


def test_a_mixed_node_and_its_islands() -> None:
    (node,) = parse_emulate("2xT4,4xL4,8xV100", "mix")
    assert [g.model for g in node.gpus] == ["T4"] * 2 + ["L4"] * 4 + ["V100"] * 8
    # PCIe cards are islands of one; V100s come in islands of four.
    assert [g.nvlink_group for g in node.gpus] == [0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 7, 7, 7, 7]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "lists no GPUs"),
        ("0xA100", "asks for 0 GPUs"),
        ("8xFOO", "'FOO' is not in the known table"),
        ("8xA100,", "empty entry"),
        ("eight A100s", "is not COUNTxMODEL"),
        ("2xA100-0GB", "0 GB"),
    ],
)
def test_bad_texts_say_what_and_how_to_fix(text: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_emulate(text, "h")
    assert says in str(caught.value)
    assert "to fix:" in str(caught.value)


@given(
    st.lists(
        st.tuples(st.integers(1, 16), st.sampled_from(sorted(MODEL_MEMORY_GIB)), st.none() | st.integers(1, 512)),
        min_size=1,
        max_size=5,
    )
)
def test_any_valid_text_gives_the_gpus_it_lists(entries: list[tuple[int, str, int | None]]) -> None:
    text = ",".join(f"{count}x{model}" + (f"-{gib}GB" if gib else "") for count, model, gib in entries)
    (node,) = parse_emulate(text, "prop")
    expected = [
        (model + (f"-{gib}GB" if gib else ""), (gib or MODEL_MEMORY_GIB[model]) * GiB)
        for count, model, gib in entries
        for _ in range(count)
    ]
    assert [(g.model, g.memory) for g in node.gpus] == expected
    assert len({g.uuid for g in node.gpus}) == len(node.gpus)
    # An island never mixes models; a model with NVSwitch has one island per node, others islands of <= 4.
    by_island: dict[int, list[str]] = {}
    for gpu in node.gpus:
        by_island.setdefault(gpu.nvlink_group, []).append(gpu.model)
    for models in by_island.values():
        assert len(set(models)) == 1
        if models[0].split("-")[0] not in NVSWITCH_MODELS:
            assert len(models) <= 4
    for model in {g.model for g in node.gpus if g.model.split("-")[0] in NVSWITCH_MODELS}:
        assert len({g.nvlink_group for g in node.gpus if g.model == model}) == 1


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


def test_inventory_yaml_with_several_nodes(tmp_path: Path) -> None:
    nodes = load_inventory_yaml(
        write(
            tmp_path,
            """
nodes:
  - name: gpu-a
    gpus: 8xH100
    cpu: 64
    memory: 512GiB
    nvlink_groups: 2
    rack: r1
  - name: gpu-b
    gpus:
      - {model: L4, count: 2}
      - {model: Gaudi2, count: 1, memory: 96GB}
    zone: z2
    pool: spot
""",
        )
    )
    a, b = nodes
    assert (a.name, a.cpu_milli, a.memory, a.rack) == ("gpu-a", 64_000, 512 * GiB, "r1")
    assert [g.nvlink_group for g in a.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [(g.model, g.memory) for g in b.gpus] == [("L4", 24 * GiB)] * 2 + [("Gaudi2", 96 * GiB)]
    assert b.zone == "z2"
    assert (a.pool, b.pool) == ("on-demand", "spot")
    assert b.gpus[2].uuid == "GPU-emulated-gpu-b-2"


def test_inventory_yaml_defaults_names_from_the_host(tmp_path: Path) -> None:
    (node,) = load_inventory_yaml(write(tmp_path, "nodes:\n  - gpus: 2xT4\n"))
    assert node.name == os.uname().nodename
    two = load_inventory_yaml(write(tmp_path, "nodes:\n  - gpus: 2xT4\n  - gpus: 1xL4\n"))
    assert [n.name for n in two] == [f"{os.uname().nodename}-0", f"{os.uname().nodename}-1"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nodes: [\n", "not valid YAML at line"),
        ("hosts: []\n", "nodes: is missing or empty"),
        ("nodes: []\n", "nodes: is missing or empty"),
        ("nodes:\n  - gpus: 2xT4\n    cpus: 4\n", "cpus: is not a node key"),
        ("nodes:\n  - gpus: 2xT4\n    cpu: -1\n", "cpu: is -1"),
        ("nodes:\n  - gpus: 2xT4\n    memory: 64\n", "memory: is 64 (64 bytes)"),
        ("nodes:\n  - gpus: [{model: Foo, count: 2}]\n", "'Foo' is not in the known table"),
        ("nodes:\n  - gpus: [{model: T4, count: 0}]\n", "count 0"),
        ("nodes:\n  - {name: a, gpus: 1xT4}\n  - {name: a, gpus: 1xT4}\n", "a appear more than once"),
        ("nodes:\n  - gpus: 2xT4\n    nvlink_groups: 0\n", "nvlink_groups: is 0"),
        (
            "nodes:\n  - gpus: 2xT4\n    pool: preemptible\n",
            "pool: is 'preemptible'; to fix: give one of: on-demand, spot",
        ),
    ],
)
def test_bad_inventory_files_say_what_and_how_to_fix(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(GpufleetError) as caught:
        load_inventory_yaml(write(tmp_path, text))
    assert says in str(caught.value)
    assert "to fix:" in str(caught.value)


def test_a_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(GpufleetError, match=r"cannot read the inventory file .*; to fix: give the path"):
        load_inventory_yaml(tmp_path / "nope.yaml")


def test_inventory_yaml_sets_a_nodes_interconnect_and_defaults_the_rest(tmp_path: Path) -> None:
    measured, default = load_inventory_yaml(
        write(
            tmp_path,
            """
nodes:
  - name: eth
    gpus: 8xA100-80GB
    nvlink_gbps: 230
    network_gbps: 12.5
  - name: ib
    gpus: 8xH100
""",
        )
    )
    assert (measured.nvlink_gbps, measured.pcie_gbps, measured.network_gbps) == (230.0, None, 12.5)
    assert measured.links() == Links(230.0, 32.0, 12.5)  # PCIe from the A100's default
    assert default.links() == default_links("H100") == Links(450.0, 64.0, 50.0)


@pytest.mark.parametrize("value", ["fast", 0, -25, True])
def test_a_bad_bandwidth_is_refused_with_a_fix(tmp_path: Path, value: object) -> None:
    with pytest.raises(SpecError) as caught:
        load_inventory_yaml(write(tmp_path, f"nodes:\n  - gpus: 8xA100\n    network_gbps: {value}\n"))
    (problem,) = caught.value.fields
    assert problem.field == "network_gbps"
    assert "GB/s per direction" in problem.fix
