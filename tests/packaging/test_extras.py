"""`pip install gpufleet` without extras: the CLI client and the simulator work, and a command that needs an
extra says which one to install. Run for real: a fresh virtual environment with gpufleet's wheel and only its
base requirements (linked from this environment's installed copies, resolved from gpufleet's own metadata,
so no network is needed and nothing else leaks in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import Distribution, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gpufleet.cli.extras import EXTRA_OF, command_name, missing_extra

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("server", "postgres", "nvml", "plots", "ray")


def base_distributions() -> list[Distribution]:
    """gpufleet's requirements without extras, and theirs, as installed here."""
    found: dict[str, Distribution] = {}
    todo = [Requirement(r) for r in distribution("gpufleet").requires or []]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's, or another platform's
        dist = distribution(requirement.name)
        name = dist.metadata["Name"].lower()
        if name in found:
            continue
        found[name] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return list(found.values())


def link_installed(dist: Distribution, site: Path) -> None:
    """Make `dist`'s installed files visible in `site` (top-level entries as symlinks)."""
    here = Path(str(dist.locate_file("")))
    for top in sorted({Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}):
        target = site / top
        if not target.exists():
            target.symlink_to(here / top)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with gpufleet and its base requirements only; returns its bin folder."""
    work = tmp_path_factory.mktemp("bare")
    env = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    pip = Path(sysconfig.get_paths()["purelib"]) / "pip"
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("gpufleet-*.whl")
    python = env / "bin" / "python"
    subprocess.run([str(python), str(pip), "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for dist in base_distributions():
        link_installed(dist, site)
    return env / "bin"


def gpufleet(bare: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUFLEET"))}
    return subprocess.run(
        [str(bare / "gpufleet"), *args], check=False, capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


@pytest.mark.slow
def test_without_extras_the_client_and_the_simulator_work_and_up_says_what_to_install(
    bare: Path, tmp_path: Path
) -> None:
    python = bare / "python"
    for module in ("fastapi", "sqlalchemy", "uvicorn", "psutil", "prometheus_client", "jinja2", "pynvml", "matplotlib"):
        probe = subprocess.run([str(python), "-c", f"import {module}"], check=False, capture_output=True)
        assert probe.returncode != 0, f"{module} is importable without its extra"
    assert gpufleet(bare, "--help").returncode == 0
    assert gpufleet(bare, "submit", "--help").returncode == 0
    sim = gpufleet(bare, "sim", "-p", "fifo,default", "--set", "jobs=40", "--set", "nodes=4", "--json")
    assert sim.returncode == 0, sim.stderr
    assert set(json.loads(sim.stdout)["policies"]) == {"fifo", "default"}
    out = tmp_path / "report"
    written = gpufleet(bare, "sim", "-p", "fifo", "--set", "jobs=20", "--set", "nodes=4", "--out", str(out))
    assert written.returncode == 0, written.stderr
    assert "pip install 'gpufleet[plots]'" in written.stderr
    assert (out / "results.json").is_file()
    assert "PNG plots were not written" in (out / "report.md").read_text()
    assert not list(out.glob("*.png"))
    up = gpufleet(bare, "up", "--data-dir", str(tmp_path / "data"))
    assert up.returncode == 2
    assert up.stderr.startswith("error: gpufleet up needs the control plane's parts (")
    assert up.stderr.rstrip().endswith("to fix: pip install 'gpufleet[server]'")
    assert "Traceback" not in up.stderr


def test_every_optional_library_names_its_extra() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(declared)
    modules_of: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(dist.lower(), set()).add(module)
    for extra in EXTRAS:
        for text in declared[extra]:
            name = Requirement(text).name.lower()
            modules = {m for m in modules_of.get(name, set()) if not m.startswith("_")} or {name.replace("-", "_")}
            assert any(EXTRA_OF.get(m) == extra for m in modules), f"{name} ({extra}) has no module in EXTRA_OF"


@pytest.mark.parametrize(
    ("argv", "module", "expected"),
    [
        (["gpufleet", "up", "--port", "1"], "sqlalchemy", "gpufleet up needs the control plane's parts"),
        (["gpufleet", "bench", "api", "--jobs", "3"], "fastapi.routing", "gpufleet bench api needs"),
        (["gpufleet", "report", "usage"], "matplotlib.pyplot", "gpufleet report usage needs plotting"),
        (["gpufleet", "exporter"], "pynvml", "gpufleet exporter needs NVIDIA's management library"),
    ],
)
def test_a_missing_optional_library_becomes_one_line_with_its_extra(
    argv: list[str], module: str, expected: str
) -> None:
    error = missing_extra(ModuleNotFoundError(f"No module named {module!r}", name=module), command_name(argv))
    assert error is not None
    assert str(error).startswith(expected)
    assert str(error).endswith(f"to fix: pip install 'gpufleet[{EXTRA_OF[module.split('.', maxsplit=1)[0]]}]'")


def test_a_missing_library_that_is_no_extra_is_not_hidden() -> None:
    assert missing_extra(ModuleNotFoundError("No module named 'numpy'", name="numpy"), "gpufleet sim") is None
