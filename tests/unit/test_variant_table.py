"""The study table shared by `gpufleet sim --comm-study`, `--budget` and `--spot-pool`."""

from __future__ import annotations

from rich.console import Console

from gpufleet.cli.variant_table import variant_table


def test_one_row_per_variant_in_the_given_order_with_the_name_first() -> None:
    report = {"variants": {"off": {"cost": 2.5, "jobs": 3}, "on": {"cost": 1.25, "jobs": 4}, "unused": {}}}
    table = variant_table(
        "T", ("COST", "JOBS"), report, ("on", "off"), lambda row: (f"{row['cost']:.2f}", str(row["jobs"]))
    )
    assert [c.header for c in table.columns] == ["VARIANT", "COST", "JOBS"]
    assert [c.justify for c in table.columns] == ["left", "right", "right"]
    assert [list(c.cells) for c in table.columns] == [["on", "off"], ["1.25", "2.50"], ["4", "3"]]
    console = Console(width=60, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    assert lines[0].strip() == "T"
    assert lines[4].startswith("│ on ")
    assert lines[4].rstrip().endswith("1.25 │    4 │")
