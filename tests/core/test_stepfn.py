"""StepFunction: the CAP as views carry it."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from coorm.shared.stepfn import StepFunction


def test_from_intervals_subtracts_and_clips():
    f = StepFunction.from_intervals(10, 5.0, [(0.0, 20.0, 4), (10.0, 30.0, 3), (40.0, math.inf, 2)])
    assert f.to_wire() == [[5.0, 6], [10.0, 3], [20.0, 7], [30.0, 10], [40.0, 8]]
    assert f.value_at(0.0) == 6 and f.value_at(25.0) == 7 and f.value_at(1e9) == 8


def test_canonical_form_makes_equal_functions_equal():
    a = StepFunction.from_steps([(0, 3), (5, 3), (10, 4), (10, 5)])
    assert a == StepFunction.from_steps([(0, 3), (10, 5)])
    assert StepFunction.from_wire(a.to_wire()) == a


def test_earliest_fit_finds_the_first_long_enough_hole():
    f = StepFunction.from_steps([(0, 2), (10, 8), (15, 1), (20, 8)])
    assert f.earliest_fit(8, 5) == 10.0
    assert f.earliest_fit(8, 6) == 20.0
    assert f.earliest_fit(2, 100) == 20.0
    assert f.earliest_fit(9, 1) == math.inf
    assert f.earliest_fit(1, 100, not_before=3) == 3


def test_min_over_and_clip():
    f = StepFunction.from_steps([(0, 5), (10, 2), (20, 7)])
    assert f.min_over(0, 10) == 5 and f.min_over(0, 10.5) == 2 and f.min_over(20, math.inf) == 7
    assert f.clip(15).to_wire() == [[15.0, 2], [20.0, 7]]


def test_arithmetic():
    a = StepFunction.from_steps([(0, 5), (10, 2)])
    b = StepFunction.from_steps([(0, 1), (5, 3)])
    assert (a - b).to_wire() == [[0.0, 4], [5.0, 2], [10.0, -1]]
    assert a.minimum(b).to_wire() == [[0.0, 1], [5.0, 3], [10.0, 2]]


steps = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 8)), min_size=1, max_size=12)


@given(steps, st.integers(1, 8), st.integers(1, 30), st.integers(0, 60))
def test_earliest_fit_matches_brute_force(raw, nodes, duration, t0):
    f = StepFunction.from_steps(sorted(dict(raw).items()))
    got = f.earliest_fit(nodes, duration, not_before=t0)
    start = max(t0, f.start)
    candidates = [start] + [t for t in f.times if t > start]
    expected = next((t for t in candidates if f.min_over(t, t + duration) >= nodes), math.inf)
    assert got == expected
