"""`gpufleet throughput import FILE`: a checked table stored where `gpufleet up` reads it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.cli.main import app
from gpufleet.domain.throughput_table import table_from_json
from gpufleet.server.control_plane import THROUGHPUT_SETTING


def stored(data_dir: Path) -> str | None:
    store = SqlStore.open(default_sqlite_url(data_dir))
    try:
        return store.get_setting(THROUGHPUT_SETTING)
    finally:
        store.close()


def test_a_gpufleet_table_is_checked_and_stored(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("job_type,gpu_model,gpus,throughput\nbert,A100,1,4.0\nbert,T4,1,0.5\nbert,A100,8,30\n")
    result = CliRunner().invoke(app, ["throughput", "import", str(csv), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    table = table_from_json(stored(tmp_path / "d") or "")
    assert table.get("bert", "a100", 8) == 30.0
    assert table.get("bert", "T4", 1) == 0.5


def test_gavels_layout_is_read_too(tmp_path: Path) -> None:
    csv = tmp_path / "g.csv"
    csv.write_text(
        "gpu_type,placement,job_type,scale_factor,throughput_steps_per_s\nv100,consolidated,LM,1,9.5\nk80,consolidated,LM,1,2\n"
    )
    result = CliRunner().invoke(app, ["throughput", "import", str(csv), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    table = table_from_json(stored(tmp_path / "d") or "")
    assert table.relative_speed("LM", "K80", 1) == 2 / 9.5  # reference: V100, as Gavel defines durations


def test_a_bad_row_is_named_with_a_fix_and_nothing_is_stored(tmp_path: Path) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text("job_type,gpu_model,gpus,throughput\nbert,A100,1,4\nbert,T4,two,1\n")
    result = CliRunner().invoke(app, ["throughput", "import", str(csv), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "line 3" in result.output
    assert "gpus" in result.output
    assert "to fix" in result.output
    assert not (tmp_path / "d" / "state.db").exists() or stored(tmp_path / "d") is None
