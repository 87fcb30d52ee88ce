"""Tables as a terminal shows them, and as a pipe needs them.

On a terminal, Rich fits a table to the window. Piped or redirected, Rich would assume 80 columns and cut ids
and queue names short (`j-45f937…`); a script needs every value whole, so off a terminal the width is
unbounded and nothing is cut or wrapped. `--format` picks and orders columns, as `squeue -o` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table

from gpufleet.domain.errors import GpufleetError

UNBOUNDED = 1 << 20  # columns of a console that is not a terminal: wide enough for any row


def on_terminal() -> bool:
    return sys.stdout.isatty()


def console() -> Console:
    """A console for stdout: the window's width on a terminal, no limit elsewhere."""
    return Console(soft_wrap=True, width=None if on_terminal() else UNBOUNDED)


def pick_columns(spec: str | None, known: Sequence[str], default: Sequence[str]) -> list[str]:
    """`--format id,name,state` as column keys (case and spaces ignored), or `default`; an unknown key is a
    GpufleetError naming the known ones."""
    if spec is None:
        return list(default)
    keys = [part.strip().lower() for part in spec.split(",") if part.strip()]
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        what = f"unknown column {unknown[0]!r}" if unknown else "no column"
        raise GpufleetError(f"--format: {what}", f"give a comma-separated list of: {','.join(known)}")
    return keys


def table(
    rows: Sequence[Any],
    columns: Sequence[str],
    cells: Mapping[str, Callable[[Any], RenderableType]],
    *,
    headers: Mapping[str, str] | None = None,
) -> Table:
    """A table of `rows` with the chosen `columns`, each row's cell made by `cells[column](row)`."""
    shown = Table(box=None, header_style="bold")
    for column in columns:
        shown.add_column((headers or {}).get(column, column.upper()), overflow="fold")
    for row in rows:
        shown.add_row(*(cells[column](row) for column in columns))
    return shown
