"""What a job imports to keep inside the GPU share gpufleet gave it. Imports nothing heavy and nothing else
of gpufleet, so that a job pays nothing for it:

    from gpufleet.runtime import apply_gpu_memory_cap
    apply_gpu_memory_cap()        # before the first CUDA allocation

A fractional worker gets GPUFLEET_GPU_FRACTION and GPUFLEET_GPU_MEMORY_BYTES from the executor. This caps
PyTorch's caching allocator (`torch.cuda.set_per_process_memory_fraction`) and TensorFlow's device memory
(a logical device with a memory limit). JAX reads XLA_PYTHON_CLIENT_MEM_FRACTION, set by the executor, by
itself. Frameworks that are not installed are skipped; without a fraction it does nothing. Memory caps are
cooperative: a job that does not call this is not held to its share (compute is never capped).

Progress reports (what the elastic scheduler sizes jobs by, and what `gpufleet show JOB --progress` draws):

    from gpufleet import runtime
    runtime.report(step=step, samples=samples_seen, loss=loss.item())   # every few steps
    runtime.checkpoint_saved(duration_s=12.5)                           # after each checkpoint

`samples` counts the samples the whole job has processed (all workers together), so only rank 0 sends;
other ranks' calls do nothing. A call never blocks and never raises: reports go into a bounded buffer that a
background thread sends in batches to $GPUFLEET_REPORT_URL with $GPUFLEET_REPORT_TOKEN (the executor sets
both). When the control plane is unreachable the oldest reports are dropped, never the job's time; at exit
the thread gets at most `EXIT_FLUSH_S` to send what is left. Outside gpufleet (no URL) the calls do nothing.

Jobs not written in Python report the same from their shell (waits at most `EXIT_FLUSH_S`, always exits 0):

    python -m gpufleet.runtime checkpoint --duration 12.5
    python -m gpufleet.runtime progress --step 100 --samples 51200 --loss 2.31

$GPUFLEET_CHECKPOINT_INTERVAL_S, when set, is how often gpufleet advises the job to checkpoint (Young/Daly
from its last reported checkpoint's duration and the failure rate of the nodes it was placed on).
"""

from __future__ import annotations

import atexit
import collections
import importlib.util
import json
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

URL_ENV = "GPUFLEET_REPORT_URL"
TOKEN_ENV = "GPUFLEET_REPORT_TOKEN"
BUFFER = 10_000  # reports kept while the control plane is unreachable; beyond it the oldest are dropped
BATCH = 500  # reports per request at most
FLUSH_S = 5.0  # how often the thread sends
TIMEOUT_S = 3.0  # one request's time limit
EXIT_FLUSH_S = 2.0  # what a job's exit waits at most for its last reports


def apply_gpu_memory_cap() -> dict[str, float]:
    """Apply the worker's GPU memory share to the frameworks present. Returns what was applied, e.g.
    `{"torch": 0.5}` (fraction of the device) or `{"tensorflow": 40960.0}` (MiB); empty when nothing was."""
    fraction_text = os.environ.get("GPUFLEET_GPU_FRACTION", "")
    if not fraction_text:
        return {}
    fraction = float(fraction_text)
    memory_text = os.environ.get("GPUFLEET_GPU_MEMORY_BYTES", "")
    memory = int(memory_text) if memory_text else None
    applied: dict[str, float] = {}
    if importlib.util.find_spec("torch") is not None:
        cap = _torch_cap(fraction, memory)
        if cap is not None:
            applied["torch"] = cap
    if importlib.util.find_spec("tensorflow") is not None and memory is not None:
        cap = _tensorflow_cap(memory)
        if cap is not None:
            applied["tensorflow"] = cap
    return applied


def _torch_cap(fraction: float, memory: int | None) -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    if memory is not None:
        # The share's memory may differ from fraction x device (a request with an explicit GPU memory).
        fraction = min(1.0, memory / torch.cuda.get_device_properties(0).total_memory)
    for device in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _tensorflow_cap(memory: int) -> float | None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    mib = memory / 2**20
    for gpu in gpus:
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=int(mib))])
    return float(int(mib))


def report(
    *,
    step: int | None = None,
    samples: float | None = None,
    loss: float | None = None,
    grad_sqr: float | None = None,
    grad_var: float | None = None,
    batch: float | None = None,
    min_batch: float | None = None,
    max_batch: float | None = None,
    gpus: int | None = None,
    nodes: int | None = None,
    **metrics: float,
) -> None:
    """Report training progress: `samples` processed so far by the whole job, the `loss` now, optionally the
    gradient's squared norm and variance (`grad_sqr`, `grad_var`: the gradient noise scale, measured at the
    current batch), how it trains (`batch`: total samples per step now; `min_batch`/`max_batch`: the range an
    adaptive job chooses it from), where it runs (`gpus`, `nodes` spanned), and any other numbers (`lr=…`).
    With `step` and `samples` counted and `nodes` given, the control plane learns the step time per placement
    and batch (what sizes elastic jobs). Non-blocking; a no-op outside gpufleet and on ranks other than 0."""
    values: dict[str, Any] = {"step": step, "samples": samples, "loss": loss, "grad_sqr": grad_sqr, **metrics}
    values |= {"grad_var": grad_var, "batch": batch, "min_batch": min_batch, "max_batch": max_batch}
    values |= {"gpus": gpus, "nodes": nodes}
    _send("progress", values)


def checkpoint_saved(*, duration_s: float) -> None:
    """Say that a checkpoint was just saved and how long saving it took. Non-blocking; see `report`."""
    _send("checkpoint", {"duration_s": duration_s})


def _send(kind: str, values: dict[str, Any]) -> None:
    """Queue one report of `kind` (the kinds and their fields: gpufleet.domain.progress.REPORT_KINDS)."""
    reporter = _reporter()
    if reporter is None:
        return
    item: dict[str, Any] = {"kind": kind, "at": time.time()}
    for name, value in values.items():
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue  # not a number: never the job's failure
        if math.isfinite(number):  # a NaN loss is the job's business, not a reason to lose the batch
            item[name] = int(value) if name in ("step", "gpus", "nodes") else number
    reporter.put(item)


class _Reporter:
    """The background sender: a bounded deque, one daemon thread, one batch per request."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.buffer: collections.deque[dict[str, Any]] = collections.deque(maxlen=BUFFER)
        self.dropped = 0
        self.sent = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # the thread and the exit flush never send the same batch twice
        self._wake = threading.Event()
        self._said_unreachable = False
        self._thread = threading.Thread(target=self._run, name="gpufleet-report", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def put(self, item: dict[str, Any]) -> None:
        with self._lock:
            if len(self.buffer) == self.buffer.maxlen:
                self.dropped += 1
            self.buffer.append(item)
            full = len(self.buffer) >= BATCH
        if full:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            self.flush(time.monotonic() + FLUSH_S)

    def flush(self, deadline: float) -> bool:
        """Send what is buffered until `deadline`; False when the control plane did not take it."""
        if not self._sending.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            return self._flush(deadline)
        finally:
            self._sending.release()

    def _flush(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            with self._lock:
                batch = [self.buffer[i] for i in range(min(BATCH, len(self.buffer)))]
            if not batch:
                return True
            status = self._post(batch, max(0.1, min(TIMEOUT_S, deadline - time.monotonic())))
            if status is None or status == 429 or status >= 500:
                return False  # unreachable, busy or unwell: keep the batch, try again later
            with self._lock:
                for _ in range(min(len(batch), len(self.buffer))):
                    self.buffer.popleft()
            if status < 300:
                self.sent += len(batch)
            elif status in (401, 403):
                self._give_up(f"the control plane refused this job's token ({status})")
                return True
            else:
                self.failures += 1  # a batch it will never take (e.g. 422): dropped, the next ones still go
        return False

    def _post(self, batch: list[dict[str, Any]], timeout: float) -> int | None:
        body = json.dumps({"reports": batch}).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except (OSError, ValueError) as error:
            if not self._said_unreachable:
                self._said_unreachable = True
                print(f"gpufleet: progress reports wait: {self.url} unreachable ({error})", file=sys.stderr)
            return None

    def _give_up(self, why: str) -> None:
        print(f"gpufleet: progress reports stop: {why}", file=sys.stderr)
        with self._lock:
            self.buffer = collections.deque(maxlen=0)

    def close(self) -> None:
        self.flush(time.monotonic() + EXIT_FLUSH_S)


_state: dict[str, _Reporter | None] = {}
_state_lock = threading.Lock()


def _reporter() -> _Reporter | None:
    """The process's sender, started on first use; None outside gpufleet or on a rank other than 0."""
    with _state_lock:
        if "reporter" not in _state:
            url = os.environ.get(URL_ENV, "")
            token = os.environ.get(TOKEN_ENV, "")
            rank = os.environ.get("RANK", "0")
            _state["reporter"] = _Reporter(url, token) if url and token and rank == "0" else None
        return _state["reporter"]


def main(argv: list[str] | None = None) -> int:
    """`python -m gpufleet.runtime checkpoint --duration 12.5` (and `progress --step … --samples … --loss …`):
    the same reports from a shell script or any language. It waits at most `EXIT_FLUSH_S` for the control plane
    and exits 0 whether or not it was reached (a warning on stderr when not); only a malformed call exits 2."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gpufleet.runtime",
        description="Report to gpufleet from a running job (uses $GPUFLEET_REPORT_URL and $GPUFLEET_REPORT_TOKEN).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    saved = commands.add_parser("checkpoint", help="a checkpoint was just saved")
    saved.add_argument("--duration", type=float, required=True, help="seconds saving it took")
    progress = commands.add_parser("progress", help="training progress")
    progress.add_argument("--step", type=int)
    progress.add_argument("--samples", type=float, help="samples the whole job has processed so far")
    progress.add_argument("--loss", type=float)
    args = parser.parse_args(argv)
    if args.command == "checkpoint":
        if not (math.isfinite(args.duration) and args.duration >= 0):
            parser.error(f"--duration {args.duration} is not a number of seconds >= 0")
        checkpoint_saved(duration_s=args.duration)
    else:
        report(step=args.step, samples=args.samples, loss=args.loss)
    reporter = _reporter()
    if reporter is None:
        print("gpufleet: not inside a gpufleet job (no $GPUFLEET_REPORT_URL): nothing sent", file=sys.stderr)
    elif not reporter.flush(time.monotonic() + EXIT_FLUSH_S):
        print("gpufleet: the report was not delivered (control plane unreachable); the job goes on", file=sys.stderr)
        with reporter._lock:
            reporter.buffer.clear()  # not again at exit: one wait is all a report may cost
    return 0


if __name__ == "__main__":
    sys.exit(main())
