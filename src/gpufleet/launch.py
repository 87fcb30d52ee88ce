"""Run a Python script inside the worker's GPU share:

    python -m gpufleet.launch train.py --lr 0.1

applies `gpufleet.runtime.apply_gpu_memory_cap()` and then runs the script as `python train.py --lr 0.1`
would (as `__main__`, with `sys.argv` = [script, args...], its folder first on `sys.path`).
Imports nothing heavy and nothing of gpufleet but `gpufleet.runtime`.
"""

from __future__ import annotations

import os
import runpy
import sys

from gpufleet.runtime import apply_gpu_memory_cap


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print("usage: python -m gpufleet.launch SCRIPT.py [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    script = argv[1]
    if not os.path.isfile(script):
        print(f"gpufleet.launch: no such script {script!r}; to fix: give the path of a Python file", file=sys.stderr)
        raise SystemExit(2)
    apply_gpu_memory_cap()
    sys.argv = argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
