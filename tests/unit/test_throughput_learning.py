"""Throughputs learned from progress reports (`domain/throughput_learning.py`): reports are measured per GPU
model, pooled per job type, and merged into an imported table without changing any imported figure."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.progress import JobProgress, Report, ReportContext, SizeThroughput, fold
from gpufleet.domain.throughput_learning import (
    MIN_LEARN_REPORTS,
    MIN_LEARN_SECONDS,
    Key,
    Pooled,
    TypedProgress,
    learned_table,
    merged,
    pooled_from_json,
    pooled_measurements,
    pooled_to_json,
)
from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable, model_key


def reports(rate: float, every_s: float, count: int, start: float = 1_000.0) -> list[Report]:
    return [Report("progress", start + i * every_s, {"samples": rate * every_s * i}) for i in range(count)]


def test_a_job_is_measured_per_model_it_ran_on_and_its_size_rate_pools_them() -> None:
    on_a100 = fold(JobProgress(), reports(100.0, 10.0, 4), ReportContext(1, 2, 2_000.0, model="A100-80GB"))
    # A second attempt on T4 (a move): counted apart, then pooled at its size.
    after = fold(on_a100, reports(25.0, 10.0, 4, start=1_100.0), ReportContext(2, 2, 2_000.0, model="T4"))
    assert [(e.model, e.gpus, e.samples_per_s) for e in after.throughput] == [
        ("A100-80GB", 2, 100.0),
        ("T4", 2, 25.0),
    ]
    assert after.samples_per_s(2) == pytest.approx((3000.0 + 750.0) / 60.0)


def history(model: str, rate: float, seconds: float, reports_count: int = 10, gpus: int = 1) -> JobProgress:
    return JobProgress(throughput=(SizeThroughput(gpus, rate * seconds, seconds, reports_count, model),))


def test_pooled_over_jobs_and_only_with_enough_time_and_reports() -> None:
    jobs = [
        TypedProgress("bert", True, history("A100-80GB", 300.0, 100.0)),
        TypedProgress("bert", True, history("A100-80GB", 500.0, 100.0)),  # pooled with the first: 400/s
        TypedProgress("bert", True, history("T4", 50.0, MIN_LEARN_SECONDS - 1)),  # too short
        TypedProgress("bert", True, history("V100", 90.0, 600.0, reports_count=MIN_LEARN_REPORTS - 1)),  # too few
        TypedProgress("bert", True, history("", 10.0, 600.0)),  # held several models: no single one
        TypedProgress("", True, history("T4", 10.0, 600.0)),  # no job type
        TypedProgress("bert", False, history("A100-80GB", 200.0, 600.0, gpus=4)),  # several workers
    ]
    table = learned_table(jobs)
    assert {(e.job_type, e.model, e.gpus, e.consolidated): e.throughput for e in table.entries} == {
        ("bert", "A100-80GB", 1, True): 400.0,
        ("bert", "A100-80GB", 4, False): 200.0,
    }


def test_merged_types_the_import_lacks_are_taken_and_gaps_filled_in_the_imports_unit() -> None:
    imported = ThroughputTable(
        (ThroughputEntry("bert", "V100", 1, 2.0), ThroughputEntry("bert", "A100", 1, 5.0)), "gavel", "V100"
    )
    learned = ThroughputTable(
        (
            ThroughputEntry("bert", "V100", 1, 200.0),  # imported: 2.0 -> the unit is /100
            ThroughputEntry("bert", "A100", 1, 600.0),  # imported: 5.0 (its figure stays)
            ThroughputEntry("bert", "T4", 1, 50.0),  # new: 50 x median(2/200, 5/600)
            ThroughputEntry("ncf", "T4", 1, 7.0),  # a type the import lacks: as it is
        )
    )
    table = merged(imported, learned)
    assert table is not None
    assert table.get("bert", "V100", 1) == 2.0
    assert table.get("bert", "A100", 1) == 5.0
    assert table.get("bert", "T4", 1) == pytest.approx(50.0 * (2 / 200 + 5 / 600) / 2)
    assert table.get("ncf", "T4", 1) == 7.0
    assert table.reference == "V100"
    # Nothing measured in common: no common unit, so nothing is added for that type.
    only_t4 = ThroughputTable((ThroughputEntry("bert", "T4", 1, 50.0),))
    assert merged(imported, only_t4) is imported
    assert merged(None, ThroughputTable(())) is None


entries = st.lists(
    st.tuples(
        st.sampled_from(["bert", "ncf", "resnet"]),
        st.sampled_from(["A100", "V100", "T4"]),
        st.sampled_from([1, 2, 4]),
        st.floats(0.1, 1e4),
    ),
    max_size=12,
    unique_by=lambda e: e[:3],
)


@given(entries, entries)
def test_merging_never_changes_an_imported_figure_and_keeps_learned_ratios(
    given_imported: list[tuple[str, str, int, float]], given_learned: list[tuple[str, str, int, float]]
) -> None:
    imported = ThroughputTable(tuple(ThroughputEntry(*e) for e in given_imported))
    learned = ThroughputTable(tuple(ThroughputEntry(*e) for e in given_learned))
    table = merged(imported, learned)
    if table is None:
        assert not imported.entries
        assert not learned.entries
        return
    for entry in imported.entries:
        assert table.get(entry.job_type, entry.model, entry.gpus) == entry.throughput
    imported_keys = {(e.job_type, model_key(e.model), e.gpus) for e in imported.entries}
    added = [e for e in table.entries if (e.job_type, model_key(e.model), e.gpus) not in imported_keys]
    learned_by_key = {(e.job_type, model_key(e.model), e.gpus): e.throughput for e in learned.entries}
    for entry in added:
        assert (entry.job_type, model_key(entry.model), entry.gpus) in learned_by_key
    # Within a type, added figures keep the learned ratios between them (one scale per type).
    for job_type in {e.job_type for e in added}:
        mine = [e for e in added if e.job_type == job_type]
        scales = {e.throughput / learned_by_key[(e.job_type, model_key(e.model), e.gpus)] for e in mine}
        assert max(scales) == pytest.approx(min(scales))


def _row_json(**change: object) -> str:
    row = {"job_type": "bert", "model": "t4", "gpus": 1, "consolidated": True, "samples": 1.0, "seconds": 1.0}
    return json.dumps({"version": 1, "pooled": [{**row, "reports": 3, **change}]})


keys = st.tuples(
    st.sampled_from(["bert", "resnet", "gpt"]), st.sampled_from(["a100-80gb", "t4"]), st.integers(1, 8), st.booleans()
)
sums = st.builds(
    Pooled,
    st.floats(0, 1e9, allow_nan=False),
    st.floats(0, 1e6, allow_nan=False),
    st.integers(0, 10_000),
)


@given(st.dictionaries(keys, sums, max_size=12))
def test_stored_sums_read_back_as_they_were(pooled: dict[Key, Pooled]) -> None:
    assert pooled_from_json(pooled_to_json(pooled)) == dict(sorted(pooled.items()))


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"pooled": 3}',
        '{"pooled": [{"job_type": "bert"}]}',
        _row_json(gpus=0),
        _row_json(seconds=-1),
    ],
)
def test_unreadable_stored_sums_say_so(text: str) -> None:
    with pytest.raises(GpufleetError, match="learned throughputs are unreadable"):
        pooled_from_json(text)


job_histories = st.lists(
    st.tuples(
        st.sampled_from(["bert", "resnet"]),
        st.booleans(),
        st.lists(
            st.tuples(st.sampled_from(["A100-80GB", "T4"]), st.integers(1, 4), st.floats(1, 1e3), st.integers(1, 9)),
            min_size=1,
            max_size=3,
            unique_by=lambda e: (e[0], e[1]),
        ),
    ),
    max_size=8,
)


@given(job_histories, st.integers(0, 8))
def test_what_ended_jobs_pooled_into_sums_teaches_what_their_histories_did(
    jobs: list[tuple[str, bool, list[tuple[str, int, float, int]]]], split: int
) -> None:
    """Pooling the jobs that ended into sums first, then the others on top, gives the table all of them give."""
    typed = [
        TypedProgress(
            job_type,
            single,
            JobProgress(
                throughput=tuple(
                    SizeThroughput(gpus, rate * 60.0 * n, 60.0 * n, 3 * n, model) for model, gpus, rate, n in sizes
                )
            ),
        )
        for job_type, single, sizes in jobs
    ]
    ended = pooled_measurements(typed[:split])
    whole = learned_table(typed)
    parts = learned_table(typed[split:], pooled_from_json(pooled_to_json(ended)))
    assert {(e.job_type, e.model, e.gpus, e.consolidated) for e in parts.entries} == {
        (e.job_type, e.model, e.gpus, e.consolidated) for e in whole.entries
    }
    for entry in whole.entries:
        learned = parts.get(entry.job_type, entry.model, entry.gpus, consolidated=entry.consolidated)
        assert learned == pytest.approx(entry.throughput, rel=1e-9)
