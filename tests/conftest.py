"""Test-wide configuration: hypothesis profiles.

``ci`` (the default) runs every property test with the same 500 examples each time; ``HYPOTHESIS_PROFILE=dev``
picks a quick 50-example run while iterating; ``HYPOTHESIS_PROFILE=hunt`` (``HUNT_N`` examples) looks for rare bugs.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # the same 500 examples on every CI run, so that a CI result is reproducible; new examples are searched
    # for with the "hunt" profile, and what it finds becomes an example test (tests/core/test_papers.py)
    derandomize=True,
    print_blob=True,  # a failure on a CI machine can be replayed here with @reproduce_failure
)
settings.register_profile(
    "dev",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
)
# bug hunting: HYPOTHESIS_PROFILE=hunt HUNT_N=5000 pytest tests/core/test_properties.py
settings.register_profile(
    "hunt",
    max_examples=int(os.environ.get("HUNT_N", "3000")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# agents record their processes under $XDG_STATE_HOME (for a restarted agent to find): each test run gets its
# own, so that runs side by side on one machine (and a developer's own agents) never see each other's
if "COORM_AGENT_STATE_DIR" not in os.environ:
    import tempfile

    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="coorm-tests-state-")
