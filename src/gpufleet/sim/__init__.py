"""The trace-driven what-if simulator: workloads (trace loaders), and the engine, metrics and reports."""
