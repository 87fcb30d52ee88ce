"""`--reproduce gavel` on a few jobs of Gavel's trace: rho is Gavel's (JCT over the isolated JCT, job by job), and
progress names each rate, its place in the sweep and, after the first, the time left."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.sim.isolated import isolated_jcts
from gpufleet.sim.reproduce import gavel_rho, jct_by_job, reproduce_gavel


@pytest.mark.slow
def test_rho_is_gavels_and_progress_names_the_rate(traces_root: Path) -> None:
    labels: set[str] = set()

    def progress(policy: str, arrived: int, total: int) -> None:
        labels.add(policy)

    comparison = reproduce_gavel(traces_root, policies=("gavel-mmf",), rates=(2.0, 3.0), num_jobs=40, progress=progress)
    assert [row[:2] for row in comparison.rows] == [(2.0, "gavel-mmf"), (3.0, "gavel-mmf")]
    rho_at = comparison.columns.index("avg_ftf_rho")
    for row, experiment in zip(comparison.rows, comparison.experiments, strict=True):
        run = experiment.results[0].run
        expected = gavel_rho(jct_by_job(run, None), isolated_jcts(experiment.workload))
        assert expected is not None
        assert row[rho_at] == pytest.approx(expected, abs=0.005)
    assert "[1/2] 2 jobs/h: gavel-mmf" in labels
    assert any(
        label.startswith("[2/2] 3 jobs/h, about ") and label.endswith(" min left: gavel-mmf") for label in labels
    )
