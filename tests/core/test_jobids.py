"""The batch job id rule, written twice (a pattern for the wire model, string tests for the light command
line): held to each other."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.shared.jobids import JOB_ID_PATTERN, is_job_id


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="0123456789_-x \n\u0663\u00b2", max_size=32))
def test_the_string_tests_take_exactly_what_the_pattern_takes(text):
    assert is_job_id(text) == bool(re.fullmatch(JOB_ID_PATTERN, text))


def test_examples():
    assert all(map(is_job_id, ["42", "42_7", "1" * 18, "1_" + "9" * 9]))
    assert not any(map(is_job_id, ["", "_", "42_", "_7", "1" * 19, "1_" + "9" * 10, "4 2", "\u0663", "42_7_1"]))
