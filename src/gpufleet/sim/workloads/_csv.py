"""Reading trace CSVs with errors that name the file, the line and the column, and say how to fix them."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from gpufleet.domain import SpecError
from gpufleet.sim.workload import WorkloadError


def existing_file(path: Path, what: str, fix: str) -> Path:
    if not path.is_file():
        problem = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise WorkloadError(f"{what} {problem}", fix, path=path)
    return path


class Row:
    """One data row; `line` is its line number in the file (the header is line 1), `index` its 0-based order."""

    __slots__ = ("_table", "index", "line", "values")

    def __init__(self, table: CsvTable, index: int, line: int, values: list[str]) -> None:
        self._table = table
        self.index = index
        self.line = line
        self.values = values

    def error(self, column: str | None, problem: str, fix: str) -> WorkloadError:
        return WorkloadError(problem, fix, path=self._table.path, line=self.line, column=column)

    def text(self, column: str, *, required: bool = True) -> str:
        value = self.values[self._table.columns[column]]
        if required and not value:
            raise self.error(column, "is empty", f"give a value in every row of column {column!r}")
        return value

    def integer(self, column: str, *, minimum: int | None = None) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            try:
                as_float = float(raw)
            except ValueError:
                as_float = math.nan
            if not (math.isfinite(as_float) and as_float.is_integer()):
                raise self.error(column, f"{raw!r} is not a whole number", "write a whole number, e.g. 4") from None
            value = int(as_float)
        if minimum is not None and value < minimum:
            raise self.error(column, f"{value} is below {minimum}", f"give {minimum} or more")
        return value

    def number(self, column: str, *, minimum: float | None = None, positive: bool = False) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a number", "write a number, e.g. 3600 or 12.5") from None
        if not math.isfinite(value):
            raise self.error(column, f"{raw!r} is not a finite number", "write a finite number")
        if positive and value <= 0:
            raise self.error(column, f"{raw} is not positive", "give a value > 0")
        if minimum is not None and value < minimum:
            raise self.error(column, f"{raw} is below {minimum:g}", f"give {minimum:g} or more")
        return value

    def spec_error(self, err: SpecError, field_columns: Mapping[str, str]) -> WorkloadError:
        """Turn a domain SpecError raised while building this row's job into a located WorkloadError."""
        first = err.fields[0] if err.fields else None
        column = field_columns.get(first.field.split(".")[0]) if first else None
        problems = "; ".join(f"{field_columns.get(f.field, f.field)}: {f.problem}" for f in err.fields)
        fixes = "; ".join(f.fix for f in err.fields)
        return self.error(column, f"invalid {err.what}: {problems}", fixes)


class CsvTable:
    """A CSV file with a header row, read whole. Blank lines are skipped; cells are stripped."""

    def __init__(self, path: Path, what: str, required: Sequence[str], *, optional: Sequence[str] = ()) -> None:
        self.path = existing_file(path, what, f"give the path to the {what}")
        self.what = what
        try:
            with path.open(encoding="utf-8-sig", newline="") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header is None:
                    raise WorkloadError(
                        f"the {what} is empty", f"write a header row: {','.join(required)}", path=path, line=1
                    )
                names = [h.strip() for h in header]
                self.columns: dict[str, int] = {}
                for i, name in enumerate(names):
                    if name in self.columns:
                        raise WorkloadError(
                            "is repeated in the header", "keep one column of each name", path=path, line=1, column=name
                        )
                    self.columns[name] = i
                missing = [c for c in required if c not in self.columns]
                if missing:
                    raise WorkloadError(
                        f"column {missing[0]!r} is missing from the header (it has: {', '.join(names)})",
                        f"a {what} needs the columns {', '.join(required)}"
                        + (f" (optional: {', '.join(optional)})" if optional else ""),
                        path=path,
                        line=1,
                        column=missing[0],
                    )
                self.rows: list[Row] = []
                width = len(names)
                for raw in reader:
                    values = [v.strip() for v in raw]
                    if not any(values):
                        continue
                    if len(values) != width:
                        raise WorkloadError(
                            f"has {len(values)} fields but the header has {width}",
                            "give every row one value per header column (quote values that contain commas)",
                            path=path,
                            line=reader.line_num,
                        )
                    self.rows.append(Row(self, len(self.rows), reader.line_num, values))
        except UnicodeDecodeError as err:
            raise WorkloadError(
                f"is not UTF-8 text ({err.reason})", f"save the {what} as UTF-8 CSV", path=path
            ) from None
        except csv.Error as err:
            raise WorkloadError(f"is not valid CSV ({err})", f"save the {what} as plain CSV", path=path) from None

    def has(self, column: str) -> bool:
        return column in self.columns

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def read_header(path: Path) -> tuple[str, ...]:
    """The column names of a CSV file (first line), for format detection."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return ()
    return tuple(h.strip() for h in header)
