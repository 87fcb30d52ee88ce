"""The `gpufleet` command line (Typer + Rich)."""
