"""`gpufleet exporter`: a standalone node exporter. It samples this machine's GPUs (NVML, or an emulated
inventory with `--emulate`, labelled `probe="emulated"`) and serves them on `/metrics` under dcgm-exporter's
names, with prometheus_client's HTTP server. No scheduler runs: the `job_id` and `queue` labels are empty."""

from __future__ import annotations

import signal
import socket
import threading
from typing import Annotated

import typer

from gpufleet.domain.errors import GpufleetError


def exporter(
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port (dcgm-exporter uses 9400).")] = 9400,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    emulate: Annotated[
        str | None, typer.Option(help="Emulate GPUs instead of NVML, e.g. 8xA100-80GB (labelled emulated).")
    ] = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between two samples.")] = 5.0,
    hostname: Annotated[str | None, typer.Option(help="The Hostname label [default: this machine's name].")] = None,
) -> None:
    """Serve this node's GPU metrics for Prometheus (dcgm-exporter names), without a control plane."""
    from prometheus_client import start_http_server

    from gpufleet.adapters.metrics import make_registry
    from gpufleet.adapters.probes import EmulatedProbe, Sampler
    from gpufleet.ports.gpu_probe import GpuProbe

    name = hostname or socket.gethostname().split(".")[0] or "localhost"
    try:
        probe: GpuProbe
        if emulate:
            from gpufleet.adapters.inventory.emulated_inventory import parse_emulate

            probe = EmulatedProbe(parse_emulate(emulate, name), dict)
        else:
            from gpufleet.adapters.nvml import NvmlProbe

            probe = NvmlProbe(name)
    except GpufleetError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    sampler = Sampler(probe, interval_s=interval)
    sampler.tick()
    registry = make_registry(sampler)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        typer.echo(f"error: cannot listen on {host}:{port} ({error.strerror}); to fix: pick another --port", err=True)
        raise typer.Exit(2) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signo, _frame: stop.set())
    sampler.start()
    label = " (EMULATED)" if probe.kind == "emulated" else ""
    typer.echo(f"gpufleet exporter: {probe.kind} probe{label}, every {interval:g}s, on http://{host}:{port}/metrics")
    try:
        stop.wait()
    finally:
        sampler.stop()
        server.shutdown()
        thread.join(timeout=5)
        close = getattr(probe, "close", None)
        if callable(close):
            close()
