"""`gpufleet throughput import FILE`: give the control plane a measured throughput table.

The round allocator (`gavel` profiles) reads job type x GPU model x GPU count throughputs. Two CSV layouts:

- Gavel's (`gavel_isolated_throughputs.csv`): gpu_type, placement, job_type, scale_factor,
  throughput_steps_per_s;
- gpufleet's: job_type, gpu_model, gpus, throughput (steps/s), and optionally placement
  (consolidated | unconsolidated; default consolidated) and a `reference` model given with --reference.

The table is checked (every row, with the row and a fix for what is wrong) and stored in the control plane's
store; `gpufleet up` reads it at start (restart the control plane for a new table to take effect). Jobs say
their type with `job_type` in their spec.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable, table_to_json
from gpufleet.server.control_plane import THROUGHPUT_SETTING
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads._csv import CsvTable
from gpufleet.sim.workloads.gavel import THROUGHPUT_COLUMNS, load_throughput_table

COLUMNS = ("job_type", "gpu_model", "gpus", "throughput")
PLACEMENTS = {"consolidated": True, "unconsolidated": False, "": True}


def read_table(path: Path, reference: str | None) -> ThroughputTable:
    """A throughput table from a CSV in either layout (see the module docstring)."""
    if not path.is_file():
        raise WorkloadError("no such file", "give the path of a throughput CSV", path=path)
    header = path.read_text(encoding="utf-8").split("\n", 1)[0]
    names = {h.strip() for h in header.split(",")}
    if set(THROUGHPUT_COLUMNS) <= names:
        table = load_throughput_table(path)
        return ThroughputTable(table.entries, source=str(path), reference=reference or table.reference)
    rows = CsvTable(path, "throughput CSV", COLUMNS)
    entries = []
    for row in rows:
        placement = row.text("placement") if "placement" in names else ""
        if placement not in PLACEMENTS:
            raise row.error("placement", f"{placement!r} is not a placement", "write consolidated or unconsolidated")
        entries.append(
            ThroughputEntry(
                row.text("job_type"),
                row.text("gpu_model"),
                row.integer("gpus", minimum=1),
                row.number("throughput", minimum=0),
                PLACEMENTS[placement],
            )
        )
    if not entries:
        raise WorkloadError("has no rows", "give one row per job type, GPU model and GPU count", path=path)
    return ThroughputTable(tuple(entries), source=str(path), reference=reference)


def store_table(url: str, table: ThroughputTable) -> None:
    from gpufleet.adapters.storage.sql import SqlStore

    store = SqlStore.open(url)
    try:
        store.set_setting(THROUGHPUT_SETTING, table_to_json(table))
    finally:
        store.close()
