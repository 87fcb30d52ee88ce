"""Reading a YAML document a user wrote (a job spec, a fleet config), from a file or stdin: every way it can be
wrong is a WorkloadError that says where (file, line) and how to fix it, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpufleet.domain.errors import FieldProblem, SpecError, WorkloadError

STDIN = "-"
SPEC_EXAMPLE = "`command: …` (and name: …, gpus: …)"  # a job spec


def read_yaml_mapping(source: str | Path, what: str, example: str, stdin: TextIO | None = None) -> dict[str, Any]:
    """The mapping the YAML at `source` holds (`-`: stdin). `what` names the document in errors ("job spec");
    `example` shows what it should hold ("command: …, gpus: …")."""
    from_stdin = str(source) == STDIN
    where: str | Path = "stdin" if from_stdin else source
    if from_stdin:
        text = (stdin or sys.stdin).read()
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise WorkloadError(
                f"no such {what} file", "check the path, or give `-` to read it from stdin", path=source
            ) from None
        except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
            raise WorkloadError(
                f"cannot read the {what} ({error.__class__.__name__})", "give a readable YAML file", path=source
            ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(error, "problem", None) or str(error)
        raise WorkloadError(
            f"not valid YAML: {problem}", "fix the YAML syntax (indentation, quotes, colons)", path=where, line=line
        ) from None
    if data is None:
        raise WorkloadError(f"the {what} is empty", f"write at least {example}", path=where)
    if not isinstance(data, Mapping):
        problem = FieldProblem("(document)", f"is a {type(data).__name__}", f"write a mapping: {example}")
        raise SpecError(f"{what} {where}", (problem,))
    return dict(data)
