"""The mutable Profile against a naive model: a plain list of (time, value) steps, searched by brute force.

The Profile is optimised (blocks with lazy adds, bounds learnt from earlier searches); these property
tests drive both with the same random reserve / release / earliest_fit sequences and compare every answer
and the whole function after each step. Small blocks make block splits and cross-block holes common.
"""

from __future__ import annotations

import math
from bisect import bisect_right

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.shared.stepfn import INF, Profile, StepFunction

EXAMPLES = 500


class NaiveProfile:
    """The reference: every step in one list; each query walks all of them."""

    def __init__(self, start: float, value: int) -> None:
        self.start = start
        self.times = [start]
        self.values = [value]

    def _split(self, t: float) -> None:
        if t <= self.start or t == INF:
            return
        i = bisect_right(self.times, t) - 1
        if self.times[i] != t:
            self.times.insert(i + 1, t)
            self.values.insert(i + 1, self.values[i])

    def reserve(self, begin: float, end: float, nodes: int) -> None:
        begin = max(begin, self.start)
        if nodes == 0 or end <= begin:
            return
        self._split(begin)
        self._split(end)
        for i, t in enumerate(self.times):
            if begin <= t < end:
                self.values[i] -= nodes

    def value_at(self, t: float) -> int:
        return self.values[max(bisect_right(self.times, t) - 1, 0)]

    def fits(self, t: float, nodes: int, duration: float) -> bool:
        """``value >= nodes`` on all of ``[t, t + duration)``."""
        if self.value_at(t) < nodes:
            return False
        return all(v >= nodes for s, v in zip(self.times, self.values, strict=True) if t < s < t + duration)

    def earliest_fit(self, nodes: int, duration: float, not_before: float) -> float:
        t0 = max(not_before, self.start)
        if nodes <= 0 or duration <= 0:
            return t0
        for t in [t0] + [s for s in self.times if s > t0]:
            if self.fits(t, nodes, duration):
                return t
        return INF

    def steps(self) -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []
        for t, v in zip(self.times, self.values, strict=True):
            if out and out[-1][1] == v:
                continue
            out.append((t, v))
        return out


def as_steps(p: Profile) -> list[tuple[float, int]]:
    fn = p.to_stepfunction()
    return list(zip(fn.times, fn.values, strict=True))


# times on a coarse grid so that reservations share breakpoints, touch and nest
times = st.integers(min_value=0, max_value=60).map(float)
durations = st.one_of(st.integers(min_value=1, max_value=40).map(float), st.just(INF))
nodes = st.integers(min_value=1, max_value=10)

reserve_op = st.tuples(st.just("reserve"), times, durations, st.integers(min_value=-4, max_value=10))
release_op = st.tuples(st.just("release"), st.integers(min_value=0, max_value=1_000))
rollback_op = st.tuples(st.just("rollback"))  # give back the last reservation, as a failed group attempt
fit_op = st.tuples(st.just("fit"), nodes, durations, times)
fit_then_reserve_op = st.tuples(st.just("place"), nodes, durations, times)
operations = st.lists(
    st.one_of(reserve_op, fit_op, fit_op, fit_then_reserve_op, fit_then_reserve_op, release_op, rollback_op),
    max_size=60,
)


def _check_same(p: Profile, ref: NaiveProfile) -> None:
    assert as_steps(p) == ref.steps()
    assert p.max_value() == max(ref.values)
    assert len(p) == len(ref.times)
    h = p.horizon()  # constant from there on
    assert all(v == ref.value_at(h) for t, v in zip(ref.times, ref.values, strict=True) if t >= h)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    start=st.integers(min_value=0, max_value=10).map(float),
    capacity=st.integers(min_value=0, max_value=12),
    block=st.integers(min_value=1, max_value=6),
    ops=operations,
)
def test_profile_matches_naive_model(start, capacity, block, ops):
    p = Profile(start, capacity, block=block)
    ref = NaiveProfile(start, capacity)
    done: list[tuple[float, float, int]] = []  # reservations that may be given back
    for op in ops:
        if op[0] == "reserve":
            _, begin, duration, n = op
            p.reserve(begin, begin + duration, n)
            ref.reserve(begin, begin + duration, n)
            done.append((begin, begin + duration, n))
        elif op[0] in ("release", "rollback"):
            if done:
                begin, end, n = done.pop(op[1] % len(done) if op[0] == "release" else -1)
                p.release(begin, end, n)
                ref.reserve(begin, end, -n)
        else:
            _, n, duration, not_before = op
            got = p.earliest_fit(n, duration, not_before)
            want = ref.earliest_fit(n, duration, not_before)
            assert got == want, (n, duration, not_before, ref.steps())
            if op[0] == "place" and got < INF:
                assert p.fits_at(got, n, duration)
                p.reserve(got, got + duration, n)
                ref.reserve(got, got + duration, n)
                done.append((got, got + duration, n))
        _check_same(p, ref)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=16),
    block=st.integers(min_value=1, max_value=8),
    jobs=st.lists(st.tuples(nodes, st.integers(min_value=1, max_value=50).map(float)), max_size=80),
)
def test_backfilling_sequence_matches_naive_model(capacity, block, jobs):
    """What a pass does: place each request at its earliest fit from now, then confirm it fits there."""
    p = Profile(0.0, capacity, block=block)
    ref = NaiveProfile(0.0, capacity)
    for n, duration in jobs:
        got = p.earliest_fit(n, duration, 0.0)
        assert got == ref.earliest_fit(n, duration, 0.0)
        if got == INF:
            continue
        assert p.earliest_fit(n, duration, got) == got
        p.reserve(got, got + duration, n)
        ref.reserve(got, got + duration, n)
    _check_same(p, ref)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=8),
    block=st.integers(min_value=1, max_value=5),
    busy=st.lists(st.tuples(times, st.integers(min_value=1, max_value=12).map(float), nodes), max_size=30),
    queries=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=8),
            st.one_of(st.integers(min_value=1, max_value=60).map(lambda d: d / 2), st.just(INF)),
            st.one_of(st.just(0.0), times),
            st.booleans(),
        ),
        max_size=60,
    ),
)
def test_many_searches_over_a_fragmented_profile(capacity, block, busy, queries):
    """Many searches between few changes: the bounds learnt by one search serve the next ones."""
    p = Profile(0.0, capacity, block=block)
    ref = NaiveProfile(0.0, capacity)
    for begin, duration, n in busy:
        p.reserve(begin, begin + duration, n)
        ref.reserve(begin, begin + duration, n)
    for n, duration, not_before, take in queries:
        got = p.earliest_fit(n, duration, not_before)
        assert got == ref.earliest_fit(n, duration, not_before), (n, duration, not_before, ref.steps())
        if take and got < INF:
            p.reserve(got, got + min(duration, 3.0), n)
            ref.reserve(got, got + min(duration, 3.0), n)
    _check_same(p, ref)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=6),
    block=st.integers(min_value=1, max_value=4),
    segments=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=12),  # free gap before the busy part
            st.integers(min_value=1, max_value=4),  # busy part
            st.integers(min_value=1, max_value=6),  # nodes it takes
        ),
        min_size=1,
        max_size=25,
    ),
    data=st.data(),
)
def test_searches_for_durations_close_to_the_holes(capacity, block, segments, data):
    """A profile made of holes of known lengths, searched for durations just below, at and above them,
    in random order: the bound a search learns from a long hole must not hide it from a shorter request."""
    p = Profile(0.0, capacity, block=block)
    ref = NaiveProfile(0.0, capacity)
    t = 0.0
    for gap, busy, n in segments:
        t += gap
        p.reserve(t, t + busy, n)
        ref.reserve(t, t + busy, n)
        t += busy
    near = sorted({g + e for g, _, _ in segments for e in (-0.5, 0.0, 0.5)} | {INF})
    queries = data.draw(
        st.lists(
            st.tuples(
                st.integers(min_value=1, max_value=capacity),
                st.sampled_from(near),
                st.sampled_from([0.0, 0.0, 0.0, 1.0, 5.0, 17.0]),
                st.integers(min_value=0, max_value=4),
            ),
            min_size=1,
            max_size=40,
        )
    )
    for n, duration, not_before, take in queries:
        got = p.earliest_fit(n, duration, not_before)
        assert got == ref.earliest_fit(n, duration, not_before), (n, duration, not_before, ref.steps())
        if take == 0 and got < INF:  # sometimes place it (briefly), as a pass does
            p.reserve(got, got + 1.0, n)
            ref.reserve(got, got + 1.0, n)
    _check_same(p, ref)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    steps=st.lists(st.tuples(times, st.integers(min_value=-3, max_value=12)), min_size=1, max_size=40),
    probes=st.lists(st.floats(min_value=-5, max_value=80, allow_nan=False), max_size=20),
    clip=st.one_of(st.none(), times),
)
def test_conversions_and_point_queries(steps, probes, clip):
    steps = sorted(steps, key=lambda s: s[0])
    fn = StepFunction.from_steps(steps)
    p = Profile.from_stepfunction(fn, clip)
    want = fn if clip is None else fn.clip(clip)
    assert p.to_stepfunction() == want
    assert p.max_value() == want.max_value()
    assert len(p) == len(want.times)
    for t in probes:
        assert p.value_at(t) == want.value_at(max(t, want.start))
    for n in range(-1, 13):
        for d in (1.0, 7.0, INF):
            assert p.earliest_fit(n, d, want.start) == want.earliest_fit(n, d, want.start)


def test_unbounded_and_empty_cases():
    p = Profile(5.0, 4)
    assert p.earliest_fit(5, 1.0, 0.0) == INF
    assert p.earliest_fit(4, INF, 0.0) == 5.0
    assert p.earliest_fit(0, 10.0, 7.0) == 7.0
    assert p.earliest_fit(2, 10.0, INF) == INF
    p.reserve(0.0, 10.0, 4)
    assert p.earliest_fit(1, INF, 0.0) == 10.0
    assert p.earliest_fit(4, 3.0, 12.0) == 12.0
    p.reserve(20.0, INF, 1)
    assert p.earliest_fit(4, 10.0, 0.0) == 10.0
    assert p.earliest_fit(4, 11.0, 0.0) == INF
    assert p.earliest_fit(4, 11.0, 0.0) == INF  # answered from what the first search learnt
    p.release(20.0, INF, 1)
    assert p.earliest_fit(4, 11.0, 0.0) == 10.0  # the bound is forgotten when capacity comes back
    assert p.fits_at(10.0, 4, INF) and not p.fits_at(9.0, 1, 1.0)
    assert math.isinf(p.earliest_fit(5, 1.0, 0.0))


def test_a_rolled_back_reservation_restores_what_was_learnt_before_it():
    p = Profile(0.0, 4)
    p.reserve(0.0, 10.0, 3)
    p.reserve(12.0, 20.0, 3)
    assert p.earliest_fit(2, 5.0, 0.0) == 20.0
    p.reserve(20.0, 25.0, 4)  # a tentative placement...
    assert p.earliest_fit(2, 5.0, 0.0) == 25.0
    p.release(20.0, 25.0, 4)  # ...rolled back
    assert p.earliest_fit(2, 5.0, 0.0) == 20.0
    assert p.earliest_fit(2, 2.0, 0.0) == 10.0 and p.earliest_fit(1, 2.0, 0.0) == 0.0
    p.reserve(30.0, 40.0, 1)
    p.release(0.0, 10.0, 3)  # not the last reservation: everything learnt is forgotten
    assert p.earliest_fit(2, 5.0, 0.0) == 0.0
    assert p.horizon() == 40.0 and p.value_at(50.0) == 4
    p.reserve(30.0, 40.0, -2)  # more than was reserved comes back
    assert p.earliest_fit(5, 10.0, 0.0) == 30.0
    q = Profile(0.0, 4)
    q.reserve(0.0, 10.0, 3)
    assert q.earliest_fit(2, 5.0, 0.0) == 10.0
    q.reserve(5.0, 8.0, 1)
    q.release(5.0, 8.0, 3)  # more than that reservation: not its rollback
    assert q.earliest_fit(2, 3.0, 0.0) == 5.0


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    start=st.integers(min_value=0, max_value=10).map(float),
    capacity=st.integers(min_value=0, max_value=12),
    block=st.integers(min_value=1, max_value=6),
    before=st.lists(st.tuples(times, durations, nodes), max_size=20),
    bulk=st.lists(st.tuples(times, durations, nodes), max_size=40),
    jobs=st.lists(st.tuples(nodes, durations, times), max_size=20),
)
def test_reserving_all_at_once_is_reserving_one_by_one(start, capacity, block, before, bulk, jobs):
    """A kept lane is made from hundreds of reservations at once (reserve_all): the same breakpoints, values,
    horizon and searches as one at a time, after searches that learnt bounds, and for the backfilling after it."""
    one, all_ = Profile(start, capacity, block=block), Profile(start, capacity, block=block)
    ref = NaiveProfile(start, capacity)
    for p in (one, all_):
        for begin, duration, n in before:
            p.reserve(begin, begin + duration, n)
            p.earliest_fit(n, 5.0, begin)  # (learn something)
    for begin, duration, n in before:
        ref.reserve(begin, begin + duration, n)
    for begin, duration, n in bulk:
        one.reserve(begin, begin + duration, n)
        ref.reserve(begin, begin + duration, n)
    all_.reserve_all((begin, begin + duration, n) for begin, duration, n in bulk)
    assert as_steps(all_) == as_steps(one) == ref.steps()
    assert len(all_) == len(one) and all_.horizon() == one.horizon()
    for n, duration, not_before in jobs:
        got = all_.earliest_fit(n, duration, not_before)
        assert got == one.earliest_fit(n, duration, not_before) == ref.earliest_fit(n, duration, not_before)
        if got < INF:
            for p in (one, all_, ref):
                p.reserve(got, got + duration, n)
    _check_same(all_, ref)
