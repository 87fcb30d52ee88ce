"""The checkpoint sweep: under seeded exponential failures (the simulator's failure model), the interval that
loses the least time lies within 20 % of the Young/Daly interval the control plane gives, for the published
settings; the lost-time arithmetic on hand-checked cases; the command's output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain.checkpoints import optimal_interval
from gpufleet.sim.checkpoint_sweep import DEFAULT_SETTINGS, lost_time, parse_setting, sweep
from gpufleet.sim.workload import WorkloadError


@pytest.mark.parametrize("setting", [*DEFAULT_SETTINGS, parse_setting("30:12")], ids=lambda s: s.name)
@pytest.mark.parametrize("seed", [0, 7])
def test_the_least_lost_time_lies_within_20_percent_of_young_daly(setting: object, seed: int) -> None:
    result = sweep(setting, failures=3000, seed=seed)  # type: ignore[arg-type]
    assert result.predicted_s == optimal_interval(result.setting.cost_s, result.setting.mtbf_s)
    assert 0.8 <= result.ratio <= 1.2, result.to_dict()
    # A real minimum, not an edge of the grid: far off the prediction loses clearly more.
    assert result.lost_fraction[0] > 1.3 * min(result.lost_fraction)
    assert result.lost_fraction[-1] > 1.3 * min(result.lost_fraction)


def test_lost_time_by_hand() -> None:
    never = np.array([1e12])
    # 1000 s of work saved every 300 s at 10 s a save: saves after 300, 600, 900 (none at the end): 30 s.
    assert lost_time(300.0, 10.0, never, 1000.0) == pytest.approx(30.0)
    # A failure at wall 500: one save done (work 300 kept); 500 s gone, 200 s of them work redone.
    assert lost_time(300.0, 10.0, np.array([500.0, 1e12]), 1000.0) == pytest.approx(500.0 + 700 + 20 - 1000)
    with pytest.raises(WorkloadError):
        lost_time(300.0, 10.0, np.array([5.0, 5.0]), 1000.0)


def test_bad_settings_are_refused_with_a_fix() -> None:
    for text in ["60", "a:b", "0:3", "60:-1", "3000:0.5"]:
        with pytest.raises(WorkloadError, match="give"):
            parse_setting(text)


def test_the_command_prints_the_numbers_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["sim", "--checkpoint-setting", "60:3.09", "--seed", "3", "--out", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    [row] = body["results"]
    assert row["predicted_interval_s"] == pytest.approx(math.sqrt(2 * 60 * 3.09 * 3600))
    assert row["within_20_percent"] is True
    saved = json.loads((tmp_path / "checkpoint_sweep.json").read_text())
    assert len(saved[0]["intervals_s"]) == len(saved[0]["lost_fraction"])
    if (tmp_path / "checkpoint_sweep.png").exists():
        assert (tmp_path / "checkpoint_sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = runner.invoke(app, ["sim", "--checkpoint-setting", "soon"])
    assert bad.exit_code != 0
    assert "C_S:MTBF_H" in bad.output
    assert "Traceback" not in bad.output
