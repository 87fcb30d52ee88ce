"""gpufleet.runtime and `python -m gpufleet.launch`, run as a job would run them (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpufleet
from gpufleet.runtime import apply_gpu_memory_cap


def test_no_fraction_means_no_cap(monkeypatch) -> None:
    monkeypatch.delenv("GPUFLEET_GPU_FRACTION", raising=False)
    assert apply_gpu_memory_cap() == {}


def test_launch_runs_the_script_as_main_with_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import json, sys\n"
        "import gpufleet.runtime as r\n"
        "heavy = sorted(m for m in ('torch', 'tensorflow', 'numpy', 'gpufleet.domain') if m in sys.modules)\n"
        "print(json.dumps({'name': __name__, 'argv': sys.argv, 'path0': sys.path[0], 'heavy': heavy}))\n"
    )
    env = {**os.environ, "GPUFLEET_GPU_FRACTION": "0.5", "GPUFLEET_GPU_MEMORY_BYTES": str(40 * 2**30)}
    # Without site-packages (-S: where the tests' own PyTorch is installed, which the runtime would rightly load
    # to cap it), and gpufleet from its source folder.
    env["PYTHONPATH"] = str(Path(gpufleet.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-S", "-m", "gpufleet.launch", str(script), "--lr", "0.1"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    out = json.loads(done.stdout)
    assert out["name"] == "__main__"
    assert out["argv"] == [str(script), "--lr", "0.1"]
    assert out["path0"] == str(tmp_path)
    assert out["heavy"] == []  # the launcher and runtime load nothing heavy and no other part of gpufleet


def test_launch_without_a_script_explains(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.launch", str(tmp_path / "missing.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "no such script" in done.stderr
    assert "to fix" in done.stderr
    assert "Traceback" not in done.stderr
