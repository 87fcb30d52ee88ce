"""Plugins of one extension point: one module each."""
