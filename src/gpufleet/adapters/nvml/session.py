"""The one place gpufleet talks to NVML (NVIDIA's management library, through nvidia-ml-py's `pynvml`).

`pynvml` is imported here only, inside functions, so that nothing pays for it (or needs it) unless it
reads real GPUs. Every NVML call goes through `NvmlSession.call`: an NVML error becomes `None` for the
field being read plus one logged hint per (function, error) — a GPU or driver that does not offer a
reading must never stop the collector. Only starting NVML can fail loudly, with a `GpufleetError` that
says how to fix it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gpufleet.domain.errors import GpufleetError

log = logging.getLogger("gpufleet.nvml")

NO_NVML_FIX = "install the NVIDIA driver (it provides libnvidia-ml.so.1), or run with --emulate 8xA100-80GB"

# pynvml's code for a symbol the loaded library does not export (an older driver, or our test library).
_FUNCTION_NOT_FOUND = 13


class NvmlSession:
    """An initialised NVML. Create one per probe or discovery; `close` shuts NVML down (refcounted by NVML).

    `hints` keeps every hint logged, in order, so that callers (tests, `gpufleet explain`) can show them.
    """

    def __init__(self) -> None:
        self.lib: Any = _start()
        self.hints: list[str] = []
        self._hinted: set[tuple[str, int]] = set()
        self._missing: set[str] = set()  # functions the library lacks: not called again
        self._closed = False

    def call(self, fn: str, *args: Any, field: str, expected: Iterable[int] = ()) -> Any | None:
        """`pynvml.<fn>(*args)`, or None if NVML refused. `field` names what is lost, for the hint; errors
        whose code is in `expected` are normal answers (e.g. "no event pending") and are not hinted."""
        if fn in self._missing:
            return None
        try:
            return getattr(self.lib, fn)(*args)
        except self.lib.NVMLError as exc:
            code = int(getattr(exc, "value", -1))
            if code == _FUNCTION_NOT_FOUND:
                self._missing.add(fn)
            if code not in set(expected):
                self._hint(fn, code, str(exc), field)
            return None

    def _hint(self, fn: str, code: int, text: str, field: str) -> None:
        if (fn, code) in self._hinted:
            return
        self._hinted.add((fn, code))
        if code == _FUNCTION_NOT_FOUND:
            why = "this NVML library does not have it (an older driver); update the driver to get it"
        else:
            why = "the GPU or driver does not offer it, or the process lacks permission"
        hint = f"NVML {fn} failed ({text}, code {code}): {field} left empty; {why}"
        self.hints.append(hint)
        log.warning(hint)

    def device_count(self) -> int:
        try:
            count = int(self.lib.nvmlDeviceGetCount())
        except self.lib.NVMLError as exc:
            raise GpufleetError(f"NVML could not count the GPUs ({exc})", NO_NVML_FIX) from None
        if count == 0:
            raise GpufleetError("NVML found no NVIDIA GPU on this machine", NO_NVML_FIX)
        return count

    def handles(self) -> list[Any]:
        """A handle per GPU, by index. A GPU NVML cannot open is an error: the inventory would be wrong."""
        out = []
        for index in range(self.device_count()):
            try:
                out.append(self.lib.nvmlDeviceGetHandleByIndex(index))
            except self.lib.NVMLError as exc:
                raise GpufleetError(
                    f"NVML could not open GPU {index} ({exc})",
                    "check `nvidia-smi`; a GPU that fell off the bus needs a reset or a reboot",
                ) from None
        return out

    def text(self, fn: str, *args: Any, field: str) -> str | None:
        """A string answer (name, UUID, version); nvidia-ml-py returns str or bytes depending on version."""
        value = self.call(fn, *args, field=field)
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        return value if value is None else str(value)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.call("nvmlShutdown", field="shutdown")


def _start() -> Any:
    """Import pynvml and initialise NVML, or raise a GpufleetError that says what is missing."""
    try:
        import pynvml
    except ImportError:
        raise GpufleetError(
            "NVIDIA's management library for Python (nvidia-ml-py, module pynvml) is not installed",
            "pip install 'gpufleet[nvml]'",
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise GpufleetError(
            "no NVIDIA driver on this machine: NVML (libnvidia-ml.so.1) was not found", NO_NVML_FIX
        ) from None
    except pynvml.NVMLError_DriverNotLoaded:
        raise GpufleetError(
            "the NVIDIA kernel driver is not loaded", f"load it (modprobe nvidia), or {NO_NVML_FIX}"
        ) from None
    except pynvml.NVMLError as exc:
        raise GpufleetError(f"NVML could not start ({exc})", NO_NVML_FIX) from None
    return pynvml
