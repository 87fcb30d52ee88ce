"""Hypothesis profiles for the property suite.

`ci` (the default, derandomized) keeps the property suite at about 10 s on two cores; `thorough`
(`HYPOTHESIS_PROFILE=thorough pytest tests/property`, ~1.5 min) and `deep` (~5 min) search further
with fresh random examples each run.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.register_profile(
    "thorough",
    max_examples=600,
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.register_profile(
    "deep",
    max_examples=2500,
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
