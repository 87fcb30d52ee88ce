"""Adapters at the edge: storage, GPU probes, metrics. They implement the ports."""
