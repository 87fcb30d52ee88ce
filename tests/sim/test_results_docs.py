"""docs/results: the tuned-constants table is the code's, every held-out report it names exists, and (slow) a
slice of the committed figures re-runs to the same numbers (`scripts/results --check`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.sim.tuned import TUNED, TunedConstant, markdown
from tests.kit import traces

RESULTS = traces.REPO_ROOT / "docs" / "results"


def test_tuned_md_is_generated_from_the_registry() -> None:
    assert (RESULTS / "TUNED.md").read_text(encoding="utf-8") == markdown()


@pytest.mark.parametrize("constant", TUNED, ids=lambda c: c.name)
def test_every_tuned_constant_names_where_it_is_reported_held_out(constant: TunedConstant) -> None:
    """Each held-out set is committed, or listed in the index as not generated yet (never silently absent)."""
    assert constant.held_out
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    pending = index.split("## Not generated yet", 1)[1] if "## Not generated yet" in index else ""
    for name in constant.held_out:
        committed = (RESULTS / name / "report.md").is_file() and (RESULTS / name / "results.json").is_file()
        assert committed or f"`{name}`" in pending, f"{name}: run scripts/results --only {name}"


def test_results_carry_no_wall_clock_timing() -> None:
    for path in RESULTS.glob("*/results.json"):
        assert '"timing"' not in path.read_text(encoding="utf-8"), path


@pytest.mark.slow
def test_a_slice_of_the_committed_results_reproduces(traces_root: Path) -> None:
    env = {**os.environ, "GPUFLEET_TRACES": str(traces_root)}
    done = subprocess.run(
        [sys.executable, str(traces.REPO_ROOT / "scripts" / "results.py"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "docs/results is current" in done.stdout
