from __future__ import annotations

from pathlib import Path

import pytest

from tests.telemetry.fakenvml import build_library


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding our fake libnvidia-ml.so.1 (emulation, built with gcc once per test session)."""
    try:
        return build_library(tmp_path_factory.mktemp("fakenvml"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
