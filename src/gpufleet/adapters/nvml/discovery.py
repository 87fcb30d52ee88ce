"""NVML inventory: this machine as a scheduler `Node` (its GPUs with NVLink islands, CPU and memory).

NVLink islands: two GPUs are in one island when an active NVLink joins them (NVML's link state and the
PCI bus id of the link's far end), taken transitively (connected components). A GPU whose links end at an
NVSwitch joins every other such GPU: an NVSwitch fabric is one island. A GPU with no active link is an
island of its own. Islands are numbered 0.. in the order of their lowest GPU index.
"""

from __future__ import annotations

import socket
from typing import Any

import psutil

from gpufleet.adapters.nvml.models import short_model_name
from gpufleet.adapters.nvml.session import NvmlSession
from gpufleet.domain.cluster import Gpu, Node

_SWITCH = -1  # a pseudo GPU index for "the NVSwitch fabric" in the union-find


def discover_nodes(hostname: str | None = None, *, session: NvmlSession | None = None) -> tuple[Node, ...]:
    """This machine's node, read through NVML. Raises `GpufleetError` (with a fix) with no driver or no GPU."""
    own = session is None
    s = session or NvmlSession()
    try:
        name = hostname or socket.gethostname()
        handles = s.handles()
        gpus_raw = []
        for index, handle in enumerate(handles):
            model_name = s.text("nvmlDeviceGetName", handle, field="model") or "unknown"
            uuid = s.text("nvmlDeviceGetUUID", handle, field="uuid") or f"GPU-{name}-{index}"
            memory = s.call("nvmlDeviceGetMemoryInfo", handle, field="memory")
            total = int(memory.total) if memory is not None else 0
            gpus_raw.append((index, uuid, short_model_name(model_name, total), total))
        groups = nvlink_groups(s, handles)
        gpus = tuple(
            Gpu(index=i, uuid=uuid, model=model, memory=max(total, 1), nvlink_group=groups[i])
            for i, uuid, model, total in gpus_raw
        )
        cpus = psutil.cpu_count(logical=True) or 1
        return (Node(name=name, gpus=gpus, cpu_milli=cpus * 1000, memory=int(psutil.virtual_memory().total)),)
    finally:
        if own:
            s.close()


def nvlink_groups(session: NvmlSession, handles: list[Any]) -> list[int]:
    """The NVLink island of each GPU (see the module docstring)."""
    s, n = session, session.lib
    bus_to_index = {}
    for index, handle in enumerate(handles):
        pci = s.call("nvmlDeviceGetPciInfo", handle, field="nvlink_group (PCI bus id)")
        if pci is not None:
            bus_to_index[_bus_key(pci.busId)] = index
    parent = {i: i for i in [*range(len(handles)), _SWITCH]}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # A GPU without NVLink answers "not supported" (or "invalid argument" past its last link): not a hint.
    quiet = (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT)
    for index, handle in enumerate(handles):
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = s.call("nvmlDeviceGetNvLinkState", handle, link, field="nvlink_group", expected=quiet)
            if state is None:
                break  # links are numbered from 0 without gaps
            if state != n.NVML_FEATURE_ENABLED:
                continue
            peer = _link_peer(s, handle, link, bus_to_index)
            if peer is not None:
                parent[find(index)] = find(peer)
    roots: dict[int, int] = {}
    out = []
    for index in range(len(handles)):
        out.append(roots.setdefault(find(index), len(roots)))
    return out


def _link_peer(s: NvmlSession, handle: Any, link: int, bus_to_index: dict[str, int]) -> int | None:
    """The local GPU index at the far end of an active link, `_SWITCH` for an NVSwitch, None if unknown."""
    n = s.lib
    kind = s.call(
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        handle,
        link,
        field="nvlink_group (link far end)",
        expected=(n.NVML_ERROR_FUNCTION_NOT_FOUND, n.NVML_ERROR_NOT_SUPPORTED),
    )
    if kind == n.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        return _SWITCH
    remote = s.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, field="nvlink_group (link far end)")
    if remote is None:
        return None
    peer = bus_to_index.get(_bus_key(remote.busId))
    if peer is None and kind is None:
        # An older driver cannot say what is at the far end; a far end that is no local GPU is a switch.
        return _SWITCH
    return peer


def _bus_key(bus_id: bytes | str) -> str:
    """`00000000:07:00.0` and `0000:07:00.0` name the same device: compare bus, device and function only."""
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else str(bus_id)
    return ":".join(text.strip().lower().split(":")[-2:])
