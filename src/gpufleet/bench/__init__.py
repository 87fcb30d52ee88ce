"""Benchmarks printed as JSON by `gpufleet bench …`: speed is measured here, not in timed tests."""
