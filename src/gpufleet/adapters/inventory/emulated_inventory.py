"""Emulated GPU inventory: nodes with GPUs that are not there, for running the control plane on any machine.

    parse_emulate("8xA100-80GB", "box")          one node "box" with 8 A100-80GB in one NVSwitch group
    parse_emulate("2xT4,4xL4", "box")            a mixed node
    load_inventory_yaml("inventory.yaml")        several nodes, written out

The inventory YAML:

    nodes:
      - name: gpu-a                # default: this machine's host name (-<i> when there are several)
        gpus: 8xA100-80GB          # or a list: [{model: L4, count: 4, memory: 24GB}, ...]
        cpu: 64                    # cores; default this machine's
        memory: 512GiB             # with a unit (GB and GiB both count in 1024s); default this machine's
        nvlink_groups: 2           # split the GPUs evenly into islands; default by model (see below)
        rack: r1
        zone: z1
        pool: spot                 # on-demand (default), spot or reserved: which price its GPU-hours bill at
        nvlink_gbps: 300           # interconnect per GPU, GB/s per direction: NVLink inside an NVLink group,
        pcie_gbps: 32              #   PCIe between the node's groups, and its network port to other nodes;
        network_gbps: 25           #   default by GPU model (gpufleet.domain.comm.default_links)

GPU UUIDs are deterministic and plainly fake (`GPU-emulated-<node>-<i>`). Default NVLink islands: SXM
models with NVSwitch (A100, H100, H200, B200, …) form one island per node per model, V100 islands of 4
(the hybrid cube mesh), PCIe models (T4, L4, …) one island per GPU.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from gpufleet.domain.cluster import NODE_POOLS, Gpu, Node
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.resources import GiB

# Model -> memory in GiB, for models whose name does not say it. An explicit "-NNGB" suffix wins.
MODEL_MEMORY_GIB: dict[str, int] = {
    "B200": 180,
    "H200": 141,
    "H100": 80,
    "H800": 80,
    "GH200": 96,
    "A100": 40,
    "A800": 80,
    "A40": 48,
    "A30": 24,
    "A10": 24,
    "A10G": 24,
    "A16": 16,
    "A2": 16,
    "L40S": 48,
    "L40": 48,
    "L4": 24,
    "T4": 16,
    "V100": 16,
    "P100": 16,
    "P40": 24,
    "K80": 12,
    "RTX6000ADA": 48,
    "RTXA6000": 48,
    "RTX4090": 24,
    "RTX3090": 24,
    "MI300X": 192,
    "MI250X": 128,
}
# Models whose GPUs in one node share an NVSwitch fabric (one island); V100 islands hold 4 GPUs.
NVSWITCH_MODELS = frozenset({"A100", "A800", "H100", "H800", "H200", "B200", "GH200", "MI300X"})
ISLAND_OF_4 = frozenset({"V100", "P100"})

_ENTRY = re.compile(
    r"^(?:(?P<count>\d+)\s*[xX*]\s*)?"  # 8x
    r"(?P<model>[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*?)"  # A100, V100-SXM2
    r"(?:-(?P<mem>\d+)\s*[gG](?:i?[bB])?)?$"  # -80GB
)
_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGTP]i?B?|B)?\s*$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_EXAMPLE = "e.g. 8xA100-80GB, 4xH100 or 2xT4,4xL4"


def parse_emulate(text: str, hostname: str) -> tuple[Node, ...]:
    """One node named `hostname` with the GPUs `text` lists (`COUNTxMODEL[-NNGB]`, comma-separated)."""
    gpus = _parse_gpu_text(text, "GPU emulation spec")
    return (_node(hostname, gpus, cpu_milli=None, memory=None, nvlink_groups=None, rack="", zone=""),)


def load_inventory_yaml(path: str | os.PathLike[str]) -> tuple[Node, ...]:
    """The nodes an inventory YAML file describes (the format is in this module's docstring)."""
    import yaml

    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GpufleetError(
            f"cannot read the inventory file {where}: {exc.strerror or exc}", "give the path of a readable YAML file"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise GpufleetError(
            f"the inventory file {where} is not valid YAML{at}: {getattr(exc, 'problem', None) or exc}",
            "fix the YAML syntax (indentation, colons, quotes)",
        ) from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise SpecError(
            f"inventory {where}",
            (FieldProblem("nodes", "is missing or empty", "give a list under `nodes:`, one entry per node"),),
        )
    unknown_top = sorted(set(data) - {"nodes"})
    if unknown_top:
        raise SpecError(
            f"inventory {where}",
            (FieldProblem(", ".join(map(str, unknown_top)), "is not a known key", "only `nodes:` is read"),),
        )
    hostname = _hostname()
    entries = data["nodes"]
    nodes = [
        _yaml_node(entry, i, hostname if len(entries) == 1 else f"{hostname}-{i}", where)
        for i, entry in enumerate(entries)
    ]
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(
            f"inventory {where}",
            (
                FieldProblem(
                    "nodes[].name", f"{', '.join(duplicates)} appear more than once", "give each node a unique name"
                ),
            ),
        )
    return tuple(nodes)


# --- parts --------------------------------------------------------------------------------------------

_LINK_KEYS = ("nvlink_gbps", "pcie_gbps", "network_gbps")
_NODE_KEYS = frozenset({"name", "gpus", "cpu", "memory", "nvlink_groups", "rack", "zone", "pool", *_LINK_KEYS})


def _yaml_node(entry: object, i: int, default_name: str, where: str) -> Node:
    what = f"inventory {where}, nodes[{i}]"
    if not isinstance(entry, Mapping):
        raise SpecError(what, (FieldProblem(f"nodes[{i}]", "is not a mapping", "write `- name: ...` with its keys"),))
    problems: list[FieldProblem] = []
    unknown = sorted(str(k) for k in set(entry) - _NODE_KEYS)
    if unknown:
        problems.append(FieldProblem(", ".join(unknown), "is not a node key", f"use {', '.join(sorted(_NODE_KEYS))}"))
    name = entry.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        problems.append(FieldProblem("name", f"is {name!r}", "give the node a name"))
        name = default_name
    gpus: list[tuple[str, int]] = []
    try:
        gpus = _yaml_gpus(entry.get("gpus", []))
    except _BadValueError as bad:
        problems.append(FieldProblem("gpus", bad.problem, bad.fix))
    cpu_milli = memory = groups = None
    cpu = entry.get("cpu")
    if cpu is not None:
        if isinstance(cpu, bool) or not isinstance(cpu, int | float) or cpu <= 0:
            problems.append(FieldProblem("cpu", f"is {cpu!r}", "give the number of cores, e.g. 64"))
        else:
            cpu_milli = round(cpu * 1000)
    if entry.get("memory") is not None:
        try:
            memory = _size(entry["memory"])
        except _BadValueError as bad:
            problems.append(FieldProblem("memory", bad.problem, bad.fix))
    raw_groups = entry.get("nvlink_groups")
    if raw_groups is not None:
        if isinstance(raw_groups, bool) or not isinstance(raw_groups, int) or raw_groups < 1:
            problems.append(FieldProblem("nvlink_groups", f"is {raw_groups!r}", "give a whole number >= 1"))
        else:
            groups = raw_groups
    labels = {k: entry.get(k, "") for k in ("rack", "zone")}
    for key, value in labels.items():
        if not isinstance(value, str):
            problems.append(FieldProblem(key, f"is {value!r}", "give a text label"))
    pool = entry.get("pool", "on-demand")
    if pool not in NODE_POOLS:
        problems.append(FieldProblem("pool", f"is {pool!r}", f"give one of: {', '.join(NODE_POOLS)}"))
    links: dict[str, float] = {}
    for key in _LINK_KEYS:
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
            problems.append(
                FieldProblem(key, f"is {value!r}", "give GB/s per direction per GPU > 0, e.g. 25 for InfiniBand HDR")
            )
        else:
            links[key] = float(value)
    if problems:
        raise SpecError(what, tuple(problems))
    node = _node(
        name.strip(),
        gpus,
        cpu_milli=cpu_milli,
        memory=memory,
        nvlink_groups=groups,
        rack=str(labels["rack"]),
        zone=str(labels["zone"]),
    )
    if pool == node.pool and not links:
        return node
    return dataclasses.replace(
        node,
        pool=str(pool),
        nvlink_gbps=links.get("nvlink_gbps"),
        pcie_gbps=links.get("pcie_gbps"),
        network_gbps=links.get("network_gbps"),
    )


def _yaml_gpus(value: object) -> list[tuple[str, int]]:
    if isinstance(value, str):
        return _gpu_entries(value)
    if not isinstance(value, list):
        raise _BadValueError(f"is {value!r}", f"write a list of {{model, count, memory}} or a text such as {_EXAMPLE}")
    gpus: list[tuple[str, int]] = []
    for j, item in enumerate(value):
        if isinstance(item, str):
            gpus.extend(_gpu_entries(item))
            continue
        if not isinstance(item, Mapping):
            raise _BadValueError(f"entry {j} is {item!r}", "write {model: A100, count: 8, memory: 80GB}")
        extra = sorted(str(k) for k in set(item) - {"model", "count", "memory"})
        if extra:
            raise _BadValueError(f"entry {j} has unknown keys {', '.join(extra)}", "use model, count and memory")
        model, count = item.get("model"), item.get("count", 1)
        if not isinstance(model, str) or not model.strip():
            raise _BadValueError(f"entry {j} has model {model!r}", "name the GPU model, e.g. A100")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise _BadValueError(f"entry {j} has count {count!r}", "give a whole number of GPUs >= 1")
        name, memory = _model(model.strip(), None)
        if item.get("memory") is not None:
            memory = _size(item["memory"])
        elif memory is None:
            raise _BadValueError(_unknown_model(model), f"add `memory:` to entry {j}, e.g. memory: 24GB")
        gpus.extend([(name, memory)] * count)
    return gpus


def _parse_gpu_text(text: str, what: str) -> list[tuple[str, int]]:
    try:
        return _gpu_entries(text)
    except _BadValueError as bad:
        raise SpecError(what, (FieldProblem("emulate", bad.problem, bad.fix),)) from None


def _gpu_entries(text: str) -> list[tuple[str, int]]:
    """`"2xT4,4xL4-24GB"` -> [(model, memory bytes)] per GPU, in order."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip():
        raise _BadValueError("lists no GPUs", f"write COUNTxMODEL entries separated by commas, {_EXAMPLE}")
    if not all(parts):
        raise _BadValueError(f"{text!r} has an empty entry", f"remove the extra comma, {_EXAMPLE}")
    gpus: list[tuple[str, int]] = []
    for part in parts:
        match = _ENTRY.match(part)
        if match is None:
            raise _BadValueError(f"{part!r} is not COUNTxMODEL[-NNGB]", _EXAMPLE)
        count = int(match["count"]) if match["count"] is not None else 1
        if count < 1:
            raise _BadValueError(f"{part!r} asks for {count} GPUs", "give a count of 1 or more, or leave the entry out")
        mem_gib = int(match["mem"]) if match["mem"] is not None else None
        if mem_gib == 0:
            raise _BadValueError(f"{part!r} has 0 GB of memory", "give the GPU's memory, e.g. -80GB")
        name, memory = _model(match["model"], mem_gib)
        if memory is None:
            raise _BadValueError(
                _unknown_model(match["model"]), f"add its memory to the name, e.g. {count}x{match['model']}-24GB"
            )
        gpus.extend([(name, memory)] * count)
    return gpus


def _model(written: str, mem_gib: int | None) -> tuple[str, int | None]:
    """The model's name (known models in their usual spelling, the memory suffix kept) and its memory."""
    base = written.upper().replace(" ", "")
    known = base if base in MODEL_MEMORY_GIB else None
    if mem_gib is None:
        # A suffix the entry pattern left in the name, as in "V100-SXM2-32GB" written through YAML.
        tail = re.search(r"-(\d+)GB?$", base)
        if tail is not None:
            mem_gib = int(tail[1])
            base = base[: tail.start()]
            known = base if base in MODEL_MEMORY_GIB else None
    name = base if known else written
    if mem_gib is not None:
        return f"{name}-{mem_gib}GB", mem_gib * GiB
    if known:
        return name, MODEL_MEMORY_GIB[known] * GiB
    return name, None


def _unknown_model(model: str) -> str:
    return f"GPU model {model!r} is not in the known table ({', '.join(sorted(MODEL_MEMORY_GIB))}) and has no memory"


def _node(
    name: str,
    gpus: list[tuple[str, int]],
    *,
    cpu_milli: int | None,
    memory: int | None,
    nvlink_groups: int | None,
    rack: str,
    zone: str,
) -> Node:
    groups = _islands([model for model, _ in gpus], nvlink_groups)
    return Node(
        name=name,
        gpus=tuple(
            Gpu(i, f"GPU-emulated-{name}-{i}", model, mem, nvlink_group=groups[i])
            for i, (model, mem) in enumerate(gpus)
        ),
        cpu_milli=cpu_milli if cpu_milli is not None else (os.cpu_count() or 1) * 1000,
        memory=memory if memory is not None else _machine_memory(),
        rack=rack,
        zone=zone,
    )


def _islands(models: list[str], nvlink_groups: int | None) -> list[int]:
    """The NVLink island of each GPU: split evenly when asked, else by model (see the module docstring)."""
    if nvlink_groups is not None:
        per = max(1, -(-len(models) // nvlink_groups))
        return [i // per for i in range(len(models))]
    islands: list[int] = []
    next_island = 0
    current: dict[str, tuple[int, int]] = {}  # model -> (island, GPUs in it)
    for model in models:
        family = re.sub(r"-\d+GB$", "", model.upper())
        size = 0 if family in NVSWITCH_MODELS else 4 if family in ISLAND_OF_4 else 1
        island, used = current.get(model, (-1, 0))
        if island < 0 or (size and used >= size):
            island, used = next_island, 0
            next_island += 1
        current[model] = (island, used + 1)
        islands.append(island)
    return islands


def _size(value: object) -> int:
    """Bytes from a number of bytes or a text with a unit: 80GB, 512GiB, 64G. GB and GiB both count in 1024s,
    as GPU and memory makers mean them (an "80GB" GPU has 81920 MiB)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _BadValueError(f"is {value!r}", "give a size with a unit, e.g. 80GB or 512GiB")
    if isinstance(value, int):
        size = value
    elif (match := _SIZE.match(value)) is not None:
        unit = (match["unit"] or "").upper().replace("I", "").replace("B", "")
        size = int(float(match["num"]) * 1024 ** _POWERS[unit])
    else:
        raise _BadValueError(f"is {value!r}", "give a size with a unit, e.g. 80GB or 512GiB")
    if size < 2**20:
        raise _BadValueError(f"is {value!r} ({size} bytes)", "give a size with a unit, e.g. 80GB or 512GiB")
    return size


def _machine_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _hostname() -> str:
    return os.uname().nodename or "localhost"


class _BadValueError(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
