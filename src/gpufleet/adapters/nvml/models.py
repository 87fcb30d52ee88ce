"""Short GPU model names, as the scheduler and job specs use them, from the names NVML reports.

Rules (`short_model_name`):

1. Vendor and product-line words go: "NVIDIA", "Tesla", "GeForce", "Quadro".
2. Form-factor and memory-technology words go: SXM2/SXM4/SXM5, PCIe, HBM2/HBM2e/HBM3/HBM3e, NVL, "Max-Q".
3. The memory size ("80GB") is kept only for families sold with several sizes that jobs must tell apart
   (A100, A800, V100): "NVIDIA A100-SXM4-80GB" -> "A100-80GB", "Tesla V100-SXM2-16GB" -> "V100-16GB". Other
   families are one name: "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA H200" -> "H200", "Tesla T4" -> "T4".
   If NVML's name of an A100/A800/V100 carries no size, it is taken from the memory NVML reports (rounded to
   the sizes sold: 16, 32, 40, 80 GB).
4. What remains is joined with "-": "NVIDIA RTX A6000" -> "RTX-A6000", "NVIDIA GeForce RTX 4090" -> "RTX-4090".
"""

from __future__ import annotations

import re

_DROP_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_FORM_FACTOR = re.compile(r"^(SXM\d*|PCIE|HBM\d*E?|NVL|MAX-Q|MAXQ)$", re.IGNORECASE)
_MEMORY = re.compile(r"^(\d+)GB$", re.IGNORECASE)
_SIZED_FAMILIES = {"A100", "A800", "V100"}
_SOLD_SIZES_GB = (16, 32, 40, 80)


def short_model_name(nvml_name: str, memory_bytes: int | None = None) -> str:
    """The scheduler's model name for a GPU that NVML calls `nvml_name` (see the module's rules)."""
    words = [w for w in re.split(r"[\s\-_]+", nvml_name.strip()) if w]
    words = [w for w in words if w.upper() not in _DROP_WORDS]
    sizes = [int(m.group(1)) for w in words if (m := _MEMORY.match(w))]
    words = [w for w in words if not _FORM_FACTOR.match(w) and not _MEMORY.match(w)]
    if not words:
        return nvml_name.strip() or "unknown"
    family = words[0].upper()
    name = "-".join(w.upper() for w in words)
    if family in _SIZED_FAMILIES and len(words) == 1:
        size = sizes[0] if sizes else _size_from_bytes(memory_bytes)
        if size:
            name = f"{family}-{size}GB"
    return name


def _size_from_bytes(memory_bytes: int | None) -> int | None:
    """The marketed size (GB) closest to what NVML reports (a little less than marketed: ECC, reserve)."""
    if not memory_bytes:
        return None
    gib = memory_bytes / 1024**3
    return min(_SOLD_SIZES_GB, key=lambda size: abs(size - gib))
