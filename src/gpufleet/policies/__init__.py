"""Scheduling policies as small plugins, one module each, and the named profiles built from them."""
