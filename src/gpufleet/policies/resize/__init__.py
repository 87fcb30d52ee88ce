"""Resize plugins: new sizes for running elastic jobs."""
