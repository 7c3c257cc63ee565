"""Test-wide configuration: hypothesis profiles.

``ci`` (the default) runs every property test with 500 examples; ``HYPOTHESIS_PROFILE=dev`` picks a quick
50-example run while iterating.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
)
settings.register_profile(
    "dev",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
