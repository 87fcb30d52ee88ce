"""GPU prices per GPU-hour, read from a CSV the user gives, and matched to a workload's GPU model names.

Two layouts are read:

- SkyPilot catalog rows (e.g. `gcp_gpu_prices_us.csv` of the `gcp-gpu-prices-skypilot` folder): columns
  `kind, name, count, region, price_usd_per_hour[, spot_price_usd_per_hour]`. Only `kind == gpu` rows are
  used (the accelerator alone; host VM prices are left out). A row prices `count` GPUs, so the per-GPU price is
  `price / count`. Where a model has rows in several regions, the row of `region` (default us-central1) is
  taken, else the cheapest one.
- A plain table: `model, usd_per_gpu_hour`.

Model names are matched loosely, since traces and clouds spell them differently: case and punctuation are
ignored, then a memory suffix is dropped (`H100-80GB` -> `H100`, `V100M32` -> `V100`, `A100-40GB` -> `A100`)
unless the full name has its own row (`A100-80GB`). Models that match nothing (the openb trace's `G2`, Philly's
`philly-gpu`, Gavel's `K80`) are left unpriced; `overrides` (the CLI's `--price MODEL=USD`) set any model.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.sim.workload import WorkloadError

PRICE_FILE = "gcp_gpu_prices_us.csv"
DEFAULT_REGION = "us-central1"
# Memory suffixes dropped when the full name has no row: `H100-80GB`, `A100 40GB`, `V100M32`.
_SUFFIXES = (re.compile(r"[-_ ]+\d+\s*GB$", re.IGNORECASE), re.compile(r"(?<=\d)M\d+$"))


def model_key(name: str) -> str:
    """A model name without case or punctuation: `A100-80GB` -> `A10080GB`."""
    return re.sub(r"[^A-Z0-9]", "", name.upper())


@dataclass(frozen=True, slots=True)
class PriceTable:
    """USD per GPU-hour by model name (as written in the source), and where the prices came from."""

    per_gpu_hour: Mapping[str, float]
    source: str
    basis: str = ""
    _keys: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for model, price in self.per_gpu_hour.items():
            if not (math.isfinite(price) and price >= 0):
                raise WorkloadError(f"price of {model!r} is {price}", "give USD per GPU-hour >= 0")
        object.__setattr__(self, "_keys", {model_key(m): m for m in sorted(self.per_gpu_hour)})

    def match(self, model: str) -> str | None:
        """The table's model name that prices `model`, or None."""
        key = model_key(model)
        if key in self._keys:
            return self._keys[key]
        for suffix in _SUFFIXES:
            short = model_key(suffix.sub("", model.strip()))
            if short != key and short in self._keys:
                return self._keys[short]
        return None

    def price(self, model: str) -> float | None:
        """USD per GPU-hour for `model`, or None when the table has no price for it."""
        matched = self.match(model)
        return None if matched is None else self.per_gpu_hour[matched]

    def with_overrides(self, overrides: Mapping[str, float]) -> PriceTable:
        if not overrides:
            return self
        prices = dict(self.per_gpu_hour)
        for model, price in overrides.items():
            matched = self.match(model)
            if matched is not None and model_key(matched) == model_key(model):
                del prices[matched]
            prices[model] = price
        extra = ", ".join(f"{m}={p:g}" for m, p in sorted(overrides.items()))
        return PriceTable(prices, self.source, f"{self.basis}; given: {extra}" if self.basis else f"given: {extra}")


def prices_from(overrides: Mapping[str, float]) -> PriceTable:
    """A table of the given prices only."""
    return PriceTable(dict(overrides), "given on the command line", "USD per GPU-hour as given")


def parse_price(text: str) -> tuple[str, float]:
    """`MODEL=USD` (USD per GPU-hour) -> (model, price)."""
    model, sep, value = text.partition("=")
    try:
        price = float(value)
    except ValueError:
        price = math.nan
    if not sep or not model.strip() or not (math.isfinite(price) and price >= 0):
        raise WorkloadError(f"price {text!r} is not MODEL=USD", "write e.g. --price philly-gpu=2.48 (USD per GPU-hour)")
    return model.strip(), price


def load_price_table(path: str | Path, *, region: str = DEFAULT_REGION, spot: bool = False) -> PriceTable:
    """Read a price CSV (the file, or a folder holding `gcp_gpu_prices_us.csv`); see the module docstring."""
    p = Path(path).expanduser()
    file = p / PRICE_FILE if p.is_dir() else p
    if not file.is_file():
        raise WorkloadError(
            "price table does not exist",
            f"give a price CSV (e.g. costs/gcp-gpu-prices-skypilot/{PRICE_FILE}) or the folder that holds it",
            path=file,
        )
    with file.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    columns = set(rows[0]) if rows else set()
    if {"model", "usd_per_gpu_hour"} <= columns:
        prices: dict[str, float] = {}
        for line, row in enumerate(rows, start=2):
            prices[row["model"].strip()] = _number(row["usd_per_gpu_hour"], file, line, "usd_per_gpu_hour")
        return PriceTable(prices, str(file), "USD per GPU-hour as given")
    needed = {"kind", "name", "count", "region", "price_usd_per_hour"}
    if not needed <= columns:
        raise WorkloadError(
            f"has columns ({', '.join(sorted(columns)) or 'none'}) of no known price table",
            "give model,usd_per_gpu_hour or SkyPilot catalog rows (kind,name,count,region,price_usd_per_hour)",
            path=file,
            line=1,
        )
    column = "spot_price_usd_per_hour" if spot else "price_usd_per_hour"
    best: dict[str, tuple[int, float, str]] = {}  # name -> (0 if in `region` else 1, per-GPU price, region)
    for line, row in enumerate(rows, start=2):
        if row["kind"].strip() != "gpu" or not (row.get(column) or "").strip():
            continue
        count = _number(row["count"], file, line, "count")
        if count <= 0:
            raise WorkloadError(f"count is {count:g}", "give the number of GPUs the row prices", path=file, line=line)
        per_gpu = _number(row[column], file, line, column) / count
        rank = (0 if row["region"].strip() == region else 1, per_gpu, row["region"].strip())
        name = row["name"].strip()
        if name not in best or rank < best[name]:
            best[name] = rank
    if not best:
        raise WorkloadError("has no GPU rows with a price", "give rows with kind=gpu and a price", path=file)
    regions = sorted({r for _, _, r in best.values()})
    basis = (
        f"{'spot' if spot else 'on-demand'} accelerator-only list price per GPU-hour (host VM not included); "
        f"region {region} where listed, else the cheapest ({', '.join(regions)})"
    )
    return PriceTable({name: round(price, 6) for name, (_, price, _) in sorted(best.items())}, str(file), basis)


def _number(text: str, file: Path, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise WorkloadError(f"{text!r} is not a price", "write a number >= 0", path=file, line=line, column=column)
    return value
