"""Test support: our fake NVML library (an emulation; no GPU behind it) and a runner for the real adapter.

`build_library(dir)` compiles `fake_nvml.c` with gcc into `dir/libnvidia-ml.so.1`. `write_config` writes the
emulated GPUs. `run_adapter(code, lib_dir, config)` runs Python `code` in a fresh interpreter with the fake
library on LD_LIBRARY_PATH (nvidia-ml-py loads the library once per process, so each scenario gets its own
process) and returns what the code printed as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("fake_nvml.c")
CONFIG_ENV = "GPUFLEET_FAKE_NVML_CONFIG"


def build_library(directory: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError(
            "gcc is needed to build the fake NVML library for the NVML adapter tests; "
            "to fix: apt-get install gcc (CI images have it)"
        )
    target = directory / "libnvidia-ml.so.1"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(target), str(SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return directory


def write_config(
    path: Path,
    gpus: Sequence[Mapping[str, Any]],
    *,
    driver: str = "",
    unsupported: Sequence[str] = (),
    procs_file: Path | None = None,
) -> Path:
    """Each GPU is a mapping of directives: scalars, lists (util steps), `links` (peers or "switch"),
    `procs` ((pid, bytes) pairs). `procs_file` names a file the library re-reads at every process query
    (see `write_procs`): processes started after the library was loaded."""
    lines = ["# fake NVML configuration (emulated GPUs, for tests)"]
    if driver:
        lines.append(f"driver {driver}")
    if procs_file is not None:
        lines.append(f"procs_file {procs_file}")
    lines += [f"unsupported {fn}" for fn in unsupported]
    for gpu in gpus:
        lines.append("gpu")
        for key, value in gpu.items():
            if key == "links":
                lines += [f"link {peer}" for peer in value]
            elif key == "procs":
                lines += [f"proc {pid} {used}" for pid, used in value]
            elif isinstance(value, (list, tuple)):
                lines.append(f"{key} {' '.join(str(v) for v in value)}")
            else:
                lines.append(f"{key} {value}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_procs(path: Path, procs: Sequence[tuple[int, int, int]]) -> Path:
    """The compute processes the fake library reports from now on: (GPU index, pid, bytes) each. Written
    atomically (a query never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{gpu} {pid} {used}\n" for gpu, pid, used in procs))
    os.replace(tmp, path)
    return path


def run_adapter(code: str, lib_dir: Path | None, config: Path | None, timeout_s: float = 60) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", CONFIG_ENV)}
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    if config is not None:
        env[CONFIG_ENV] = str(config)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"adapter subprocess failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
