"""The control plane on one machine: the HTTP API, the loop thread, and `gpufleet up`."""
