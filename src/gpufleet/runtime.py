"""What a job imports to keep inside the GPU share gpufleet gave it. Imports nothing heavy and nothing else
of gpufleet, so that a job pays nothing for it:

    from gpufleet.runtime import apply_gpu_memory_cap
    apply_gpu_memory_cap()        # before the first CUDA allocation

A fractional worker gets GPUFLEET_GPU_FRACTION and GPUFLEET_GPU_MEMORY_BYTES from the executor. This caps
PyTorch's caching allocator (`torch.cuda.set_per_process_memory_fraction`) and TensorFlow's device memory
(a logical device with a memory limit). JAX reads XLA_PYTHON_CLIENT_MEM_FRACTION, set by the executor, by
itself. Frameworks that are not installed are skipped; without a fraction it does nothing. Memory caps are
cooperative: a job that does not call this is not held to its share (compute is never capped).
"""

from __future__ import annotations

import importlib.util
import os


def apply_gpu_memory_cap() -> dict[str, float]:
    """Apply the worker's GPU memory share to the frameworks present. Returns what was applied, e.g.
    `{"torch": 0.5}` (fraction of the device) or `{"tensorflow": 40960.0}` (MiB); empty when nothing was."""
    fraction_text = os.environ.get("GPUFLEET_GPU_FRACTION", "")
    if not fraction_text:
        return {}
    fraction = float(fraction_text)
    memory_text = os.environ.get("GPUFLEET_GPU_MEMORY_BYTES", "")
    memory = int(memory_text) if memory_text else None
    applied: dict[str, float] = {}
    if importlib.util.find_spec("torch") is not None:
        cap = _torch_cap(fraction, memory)
        if cap is not None:
            applied["torch"] = cap
    if importlib.util.find_spec("tensorflow") is not None and memory is not None:
        cap = _tensorflow_cap(memory)
        if cap is not None:
            applied["tensorflow"] = cap
    return applied


def _torch_cap(fraction: float, memory: int | None) -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    if memory is not None:
        # The share's memory may differ from fraction x device (a request with an explicit GPU memory).
        fraction = min(1.0, memory / torch.cuda.get_device_properties(0).total_memory)
    for device in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _tensorflow_cap(memory: int) -> float | None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    mib = memory / 2**20
    for gpu in gpus:
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=int(mib))])
    return float(int(mib))
