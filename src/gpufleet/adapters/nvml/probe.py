"""`NvmlProbe`: samples every GPU of this machine through the NVML choke point (`session.py`).

Per GPU: utilisation (GPU, memory), memory used/free/total, power and enforced limit, temperature, SM
clock, volatile ECC counts, the last XID error (NVML events, drained without waiting at each sample), PCIe
throughput (NVML's 20 ms window) and NVLink throughput (NVML's cumulative counters, as a rate between two
samples), and the compute processes with their GPU memory. A reading NVML refuses is None plus one hint.
"""

from __future__ import annotations

import ctypes
import socket
from collections.abc import Sequence
from typing import Any

from gpufleet.adapters.nvml.models import short_model_name
from gpufleet.adapters.nvml.session import NvmlSession
from gpufleet.ports.gpu_probe import GpuSample

_KIB = 1024
_MAX_EVENTS_PER_SAMPLE = 64  # an XID storm must not stall a sample; the rest waits for the next one


class NvmlProbe:
    """The `nvml` probe. Opening it starts NVML and raises `GpufleetError` if there is no driver or no GPU."""

    kind = "nvml"

    def __init__(self, hostname: str | None = None, *, session: NvmlSession | None = None) -> None:
        self.hostname = hostname or socket.gethostname()
        self.session = session or NvmlSession()
        s = self.session
        self._handles = s.handles()
        self._names: list[str] = []
        self._uuids: list[str] = []
        for index, handle in enumerate(self._handles):
            self._names.append(s.text("nvmlDeviceGetName", handle, field="model") or "unknown")
            self._uuids.append(s.text("nvmlDeviceGetUUID", handle, field="uuid") or f"GPU-{self.hostname}-{index}")
        self._models = [
            short_model_name(name, self._total_memory(h)) for name, h in zip(self._names, self._handles, strict=True)
        ]
        self._nvlink_prev: list[tuple[float, int, int] | None] = [None] * len(self._handles)
        self._events = self._watch_xids()
        # As DCGM: 0 = no XID seen since the probe started; None = XIDs cannot be watched here.
        self._last_xid: list[int | None] = [0 if self._events is not None else None] * len(self._handles)

    @property
    def hints(self) -> list[str]:
        return self.session.hints

    def close(self) -> None:
        if self._events is not None:
            self.session.call("nvmlEventSetFree", self._events, field="xid")
            self._events = None
        self.session.close()

    def sample(self, now: float) -> Sequence[GpuSample]:
        self._drain_xids()
        return [self._read(index, handle, now) for index, handle in enumerate(self._handles)]

    def _read(self, index: int, handle: Any, now: float) -> GpuSample:
        s, n = self.session, self.session.lib
        util = s.call("nvmlDeviceGetUtilizationRates", handle, field="gpu_util, mem_util")
        memory = self._memory(handle)
        power = s.call("nvmlDeviceGetPowerUsage", handle, field="power_w")
        limit = s.call("nvmlDeviceGetEnforcedPowerLimit", handle, field="power_limit_w")
        temp = s.call("nvmlDeviceGetTemperature", handle, n.NVML_TEMPERATURE_GPU, field="temperature_c")
        clock = s.call("nvmlDeviceGetClockInfo", handle, n.NVML_CLOCK_SM, field="sm_clock_mhz")
        sbe = s.call(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            n.NVML_VOLATILE_ECC,
            field="ecc_sbe",
        )
        dbe = s.call(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
            field="ecc_dbe",
        )
        pcie_tx = s.call("nvmlDeviceGetPcieThroughput", handle, n.NVML_PCIE_UTIL_TX_BYTES, field="pcie_tx")
        pcie_rx = s.call("nvmlDeviceGetPcieThroughput", handle, n.NVML_PCIE_UTIL_RX_BYTES, field="pcie_rx")
        procs = s.call("nvmlDeviceGetComputeRunningProcesses_v3", handle, field="processes")
        nvlink_tx, nvlink_rx = self._nvlink(index, handle, now)
        return GpuSample(
            node=self.hostname,
            index=index,
            uuid=self._uuids[index],
            model=self._models[index],
            model_name=self._names[index],
            at=now,
            probe=self.kind,
            gpu_util=None if util is None else float(util.gpu),
            mem_util=None if util is None else float(util.memory),
            memory_used=None if memory is None else int(memory.used),
            memory_free=None if memory is None else int(memory.free),
            memory_total=None if memory is None else int(memory.total),
            power_w=None if power is None else power / 1000.0,  # NVML: milliwatts
            power_limit_w=None if limit is None else limit / 1000.0,
            temperature_c=None if temp is None else float(temp),
            sm_clock_mhz=None if clock is None else float(clock),
            ecc_sbe=None if sbe is None else int(sbe),
            ecc_dbe=None if dbe is None else int(dbe),
            xid=self._last_xid[index],
            pcie_tx=None if pcie_tx is None else float(pcie_tx) * _KIB,  # NVML: KB/s
            pcie_rx=None if pcie_rx is None else float(pcie_rx) * _KIB,
            nvlink_tx=nvlink_tx,
            nvlink_rx=nvlink_rx,
            processes=tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in procs or ()),
        )

    def _memory(self, handle: Any) -> Any | None:
        """The v2 query (whose `used` excludes the driver's reserve, as nvidia-smi shows), else v1."""
        s = self.session
        # An older library lacks v2 (function not found) or refuses its struct version: v1 answers quietly.
        quiet = (s.lib.NVML_ERROR_FUNCTION_NOT_FOUND, s.lib.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        v2 = s.call("nvmlDeviceGetMemoryInfo", handle, s.lib.nvmlMemory_v2, field="memory", expected=quiet)
        return v2 if v2 is not None else s.call("nvmlDeviceGetMemoryInfo", handle, field="memory")

    def _total_memory(self, handle: Any) -> int | None:
        memory = self._memory(handle)
        return None if memory is None else int(memory.total)

    def _nvlink(self, index: int, handle: Any, now: float) -> tuple[float | None, float | None]:
        """NVLink bytes/s from NVML's cumulative data counters (KiB): a rate needs two samples."""
        s, n = self.session, self.session.lib
        values = s.call(
            "nvmlDeviceGetFieldValues",
            handle,
            [n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX],
            field="nvlink_tx, nvlink_rx",
        )
        if values is None or any(v.nvmlReturn != n.NVML_SUCCESS for v in values):
            return None, None
        tx, rx = int(values[0].value.ullVal), int(values[1].value.ullVal)
        previous, self._nvlink_prev[index] = self._nvlink_prev[index], (now, tx, rx)
        if previous is None or now <= previous[0] or tx < previous[1] or rx < previous[2]:
            return None, None
        dt = now - previous[0]
        return (tx - previous[1]) * _KIB / dt, (rx - previous[2]) * _KIB / dt

    def _watch_xids(self) -> Any | None:
        s, n = self.session, self.session.lib
        events = s.call("nvmlEventSetCreate", field="xid")
        if events is None:
            return None
        for handle in self._handles:
            s.call("nvmlDeviceRegisterEvents", handle, n.nvmlEventTypeXidCriticalError, events, field="xid")
        return events

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        s, n = self.session, self.session.lib
        addresses = {_address(h): i for i, h in enumerate(self._handles)}
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            data = s.call("nvmlEventSetWait_v2", self._events, 0, field="xid", expected=(n.NVML_ERROR_TIMEOUT,))
            if data is None:
                return
            index = addresses.get(_address(data.device))
            if index is not None and data.eventType == n.nvmlEventTypeXidCriticalError:
                self._last_xid[index] = int(data.eventData)


def _address(handle: Any) -> int | None:
    """A device handle's address: event data carries the handle, and handles compare by address."""
    return ctypes.cast(handle, ctypes.c_void_p).value
