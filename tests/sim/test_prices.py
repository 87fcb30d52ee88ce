"""GPU price tables: SkyPilot catalog rows or a plain model,usd_per_gpu_hour table; loose model matching."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.sim.prices import load_price_table, parse_price, prices_from
from gpufleet.sim.workload import WorkloadError
from tests.kit import traces


def test_gcp_catalog_prices_per_gpu_hour() -> None:
    costs = traces.price_tables()
    table = load_price_table(costs)
    assert table.price("T4") == pytest.approx(0.35)  # us-central1
    assert table.price("A100-80GB") == pytest.approx(1.8462)  # its own row
    assert table.price("H100-80GB") == pytest.approx(4.57009)  # memory suffix dropped -> H100
    assert table.price("V100M32") == pytest.approx(2.48)  # openb's name
    assert table.price("H200") == pytest.approx(74.49392 / 8)  # an 8-GPU row, per GPU
    assert table.price("G2") is None
    assert table.price("philly-gpu") is None
    spot = load_price_table(costs, spot=True)
    assert spot.price("T4") == pytest.approx(0.14)
    assert "host VM not included" in table.basis


def test_plain_table_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    path.write_text("model,usd_per_gpu_hour\nT4,0.5\nphilly-gpu,1.25\n")
    table = load_price_table(path).with_overrides({"t4": 0.4, "K80": 0.2})
    assert table.price("T4") == pytest.approx(0.4)
    assert table.price("philly-gpu") == pytest.approx(1.25)
    assert table.price("K80") == pytest.approx(0.2)
    assert prices_from({"X": 1.0}).price("x") == 1.0
    assert parse_price("philly-gpu=2.48") == ("philly-gpu", 2.48)


@pytest.mark.parametrize("text", ["T4", "T4=", "=1", "T4=-1", "T4=abc"])
def test_bad_price_texts(text: str) -> None:
    with pytest.raises(WorkloadError, match="to fix"):
        parse_price(text)


def test_bad_price_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        load_price_table(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="no known price table"):
        load_price_table(bad)
    worse = tmp_path / "worse.csv"
    worse.write_text("model,usd_per_gpu_hour\nT4,cheap\n")
    with pytest.raises(WorkloadError, match="line 2"):
        load_price_table(worse)
