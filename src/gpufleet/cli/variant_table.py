"""The table the `gpufleet sim` studies print (`--comm-study`, `--budget`, `--spot-pool`): one row per variant
of the study, the variant's name left-aligned first, its figures right-aligned after it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.table import Table


def variant_table(
    title: str,
    columns: Sequence[str],
    report: Mapping[str, Any],
    variants: Sequence[str],
    cells: Callable[[Mapping[str, Any]], Sequence[str]],
) -> Table:
    """`report["variants"][name]` for each name of `variants`, in that order, as `cells` writes it under
    `columns` (the VARIANT column comes first)."""
    table = Table(title=title, header_style="bold")
    table.add_column("VARIANT", justify="left")
    for column in columns:
        table.add_column(column, justify="right")
    for name in variants:
        table.add_row(name, *cells(report["variants"][name]))
    return table
