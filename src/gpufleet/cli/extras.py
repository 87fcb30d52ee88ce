"""The optional parts of gpufleet, and what to install when a command needs one that is missing.

`pip install gpufleet` is the CLI client and the simulator. The rest are extras (`pyproject.toml`):
`server` (`gpufleet up`, the exporter and the API benchmarks), `postgres`, `nvml`, `plots`, `ray`, `kubernetes`. Their
libraries are imported only where they are used, so a command that needs a missing one fails on that import;
`main` turns that into one line that says which extra to install, instead of a stack trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufleet.domain.errors import GpufleetError

# The top-level module of every optional library -> the extra that installs it.
EXTRA_OF: Mapping[str, str] = {
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "httptools": "server",
    "uvloop": "server",
    "sqlalchemy": "server",
    "alembic": "server",
    "psutil": "server",
    "prometheus_client": "server",
    "jinja2": "server",
    "multipart": "server",
    "python_multipart": "server",
    "psycopg": "postgres",
    "pynvml": "nvml",
    "matplotlib": "plots",
    "ray": "ray",
    "kubernetes": "kubernetes",
}

PURPOSE: Mapping[str, str] = {
    "server": "the control plane's parts",
    "postgres": "the PostgreSQL driver",
    "nvml": "NVIDIA's management library",
    "plots": "plotting",
    "ray": "the Ray backend",
    "kubernetes": "the Kubernetes client",
}


class MissingExtraError(GpufleetError):
    """A command needs an optional part of gpufleet that is not installed."""

    def __init__(self, command: str, module: str, extra: str) -> None:
        self.extra = extra
        super().__init__(
            f"{command} needs {PURPOSE[extra]} ({module} is not installed)", f"pip install 'gpufleet[{extra}]'"
        )


def command_name(argv: Sequence[str]) -> str:
    """`gpufleet up`, `gpufleet bench api`: the command words of a command line (options left out)."""
    words = ["gpufleet"]
    for word in argv[1:]:
        if word.startswith("-"):
            break
        words.append(word)
        if len(words) == 3:
            break
    return " ".join(words)


def missing_extra(error: ModuleNotFoundError, command: str) -> MissingExtraError | None:
    """The extra a failed import belongs to, as an error that says what to install; None if it is not one
    of gpufleet's optional libraries (then it is a bug or a broken install, and is not hidden)."""
    module = (error.name or "").split(".")[0]
    extra = EXTRA_OF.get(module)
    return None if extra is None else MissingExtraError(command, module, extra)


def skipped_note(extra: str, what: str) -> str:
    """A note for output an installed extra would have added (`what`), with the fix."""
    return f"note: {what} skipped: {PURPOSE[extra]} not installed; to fix: pip install 'gpufleet[{extra}]'"
