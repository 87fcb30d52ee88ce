"""Ray is an optional extra, loaded only at the edge: without it, `up --ray` says how to install it, and the
core, the control loop and the simulator import without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# `sys.modules["ray"] = None` makes `import ray` fail as it does where Ray is not installed.
WITHOUT_RAY = "import sys; sys.modules['ray'] = None; "


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY + code, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_up_with_ray_but_without_ray_installed_says_how_to_install_it(tmp_path: Path) -> None:
    up = "from gpufleet.cli.main import app; sys.argv[0] = 'gpufleet'; app()"
    result = _run(up, "up", "--ray", "auto", "--data-dir", str(tmp_path / "data"), "--port", "18123")
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: --ray needs Ray, which is not installed here")
    assert result.stderr.strip().endswith("to fix: pip install 'gpufleet[ray]'")
    assert "Traceback" not in result.stderr
    # Nothing half done: the data folder is not left locked.
    again = _run(up, "up", "--ray", "local", "--data-dir", str(tmp_path / "data"), "--port", "18123")
    assert "needs their inventory; to fix: add --inventory fleet.yaml" in again.stderr


def test_the_core_the_loop_and_the_simulator_never_import_ray() -> None:
    code = (
        "import gpufleet, gpufleet.control.reconciler, gpufleet.sim.engine, gpufleet.server.control_plane, "
        "gpufleet.cli.main; assert 'ray' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]], 'ray'"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import sys; " + code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


def test_up_on_a_wrong_ray_address_fails_at_once_with_the_fix(tmp_path: Path) -> None:
    # Ray itself would retry a wrong address for minutes; `up` checks it first.
    up = [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(tmp_path / "data"), "--port", "18124"]
    result = subprocess.run([*up, "--ray", "127.0.0.1:1"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: cannot reach the Ray cluster at 127.0.0.1:1: Connection refused")
    assert "to fix: check the address" in result.stderr
    nonsense = subprocess.run([*up, "--ray", "nowhere"], capture_output=True, text=True, timeout=60, check=False)
    assert "'nowhere' is not HOST:PORT; to fix: give e.g. --ray 10.0.0.1:6379, or auto" in nonsense.stderr
