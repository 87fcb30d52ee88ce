"""Fixtures for the workload loader tests: the shared public traces beside the checkout, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.sim.workload import Workload
from gpufleet.sim.workloads import load_openb, load_philly

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES = REPO_ROOT.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def traces_root() -> Path:
    """`../shared/traces` relative to the repository root; present in CI and in the dev setup."""
    if not TRACES.is_dir():
        pytest.skip(f"public traces not found at {TRACES} (expected ../shared/traces beside the checkout)")
    return TRACES


@pytest.fixture(scope="session")
def openb_dir(traces_root: Path) -> Path:
    return traces_root / "alibaba-openb-2023"


@pytest.fixture(scope="session")
def openb_default(openb_dir: Path) -> Workload:
    return load_openb(openb_dir)


@pytest.fixture(scope="session")
def openb_gpuspec33(openb_dir: Path) -> Workload:
    return load_openb(openb_dir, pods="gpuspec33")


@pytest.fixture(scope="session")
def philly(traces_root: Path) -> Workload:
    return load_philly(traces_root / "philly-2017")
