"""`gpufleet submit` from a folder, as a user types it: the job's relative `python train.py` must run there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TRAIN = """
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"cwd": os.getcwd(), "rank": os.environ.get("RANK")}) + "\\n")
"""


def submit_from(folder: Path, url: str, token: str, python: str, env: dict[str, str], out: Path) -> str:
    """Write `train.py` and a spec running `python train.py OUT` (relative) in `folder`, submit it with the CLI
    from there (no workdir anywhere), wait for it; returns what `submit --wait` printed."""
    (folder / "train.py").write_text(TRAIN)
    (folder / "train.py").chmod(0o644)
    spec = {"name": "relative", "command": [python, "train.py", str(out)], "env": env}
    (folder / "job.yaml").write_text(json.dumps(spec))
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "submit", "job.yaml", "--wait", "--url", url, "--token", token],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout
