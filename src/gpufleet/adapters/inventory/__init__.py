"""GPU inventories: where the control plane learns which nodes and GPUs it runs (emulated or probed)."""
