"""Step functions: the Cluster Availability Profile (CAP) of the papers.

A CAP maps absolute time to a number of nodes. It is a right-continuous step function that starts at
some instant (usually "now") and whose last step extends to infinity.

Two representations live here, both in this one module so that the arithmetic exists once:

* :class:`StepFunction` -- immutable, hashable, what a view is and what travels on the wire
  (``[[t0, v0], [t1, v1], ...]``). Launchers run their selection on it.
* :class:`Profile` -- mutable, used by the policy core while it places requests in one pass. It is a
  list of blocks of breakpoints with a lazy additive tag and bounds on the min/max of each block, so
  that finding the first hole that fits skips whole packed blocks instead of walking every breakpoint
  (sqrt decomposition), and it remembers, per number of nodes, where earlier searches proved no hole
  starts, so that a pass does not walk the same short gaps for every request (see the class).

Rules both keep:
* times are floats in seconds, ``math.inf`` means "never"; values are ints (nodes);
* a hole for ``(nodes, duration)`` at ``t`` means ``value >= nodes`` on all of ``[t, t + duration)``;
* the first hole is the earliest such ``t >= t0`` and is always ``t0`` or a breakpoint.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

INF = math.inf
_Bounds = tuple[tuple[float, ...], tuple[float, ...]]  # a search's bounds, by its key
_UNDO = 8  # reservations a Profile can roll back without forgetting what its searches learnt


@dataclass(frozen=True, slots=True)
class StepFunction:
    """An immutable step function: ``times[i] -> values[i]`` until ``times[i+1]``; the last step is
    unbounded. ``times`` is strictly increasing and consecutive values differ (canonical form), so two
    equal functions compare equal."""

    times: tuple[float, ...]
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.values):
            raise ValueError("a step function needs at least one step and one value per time")

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def constant(cls, value: int, start: float = 0.0) -> StepFunction:
        return cls((float(start),), (int(value),))

    @classmethod
    def from_steps(cls, steps: Iterable[Sequence[float]]) -> StepFunction:
        """From ``[(t, v), ...]`` in increasing time; collapses repeated values and times."""
        times: list[float] = []
        values: list[int] = []
        for t, v in steps:
            t = float(t)
            v = int(v)
            if times and t < times[-1]:
                raise ValueError(f"step times must increase: {t} after {times[-1]}")
            if times and t == times[-1]:
                values[-1] = v
                if len(values) > 1 and values[-2] == v:
                    times.pop()
                    values.pop()
                continue
            if values and values[-1] == v:
                continue
            times.append(t)
            values.append(v)
        return cls(tuple(times), tuple(values))

    @classmethod
    def from_intervals(
        cls, base: int, start: float, intervals: Iterable[tuple[float, float, int]]
    ) -> StepFunction:
        """``base`` from ``start`` on, minus ``nodes`` over each ``[begin, end)``. Parts before
        ``start`` are clipped. A sweep: O(m log m) for m intervals."""
        deltas: dict[float, int] = {}
        for begin, end, nodes in intervals:
            if end <= start or nodes == 0 or begin >= end:
                continue
            b = max(begin, start)
            deltas[b] = deltas.get(b, 0) - nodes
            if end != INF:
                deltas[end] = deltas.get(end, 0) + nodes
        steps: list[tuple[float, int]] = [(start, base)]
        level = base
        for t in sorted(deltas):
            level += deltas[t]
            steps.append((t, level))
        return cls.from_steps(steps)

    # -- wire ---------------------------------------------------------------------------------------
    def to_wire(self) -> list[list[float | int]]:
        return [[t, v] for t, v in zip(self.times, self.values, strict=True)]

    @classmethod
    def from_wire(cls, steps: Sequence[Sequence[float]]) -> StepFunction:
        return cls.from_steps(steps)

    # -- queries ------------------------------------------------------------------------------------
    @property
    def start(self) -> float:
        return self.times[0]

    def value_at(self, t: float) -> int:
        """The value at ``t``; before the first step, the first value."""
        i = bisect_right(self.times, t) - 1
        return self.values[max(i, 0)]

    def min_over(self, begin: float, end: float) -> int:
        """The minimum over ``[begin, end)``."""
        i = max(bisect_right(self.times, begin) - 1, 0)
        j = bisect_left(self.times, end)
        return min(self.values[i : max(j, i + 1)])

    def earliest_fit(self, nodes: int, duration: float, not_before: float | None = None) -> float:
        """The first time ``t >= not_before`` with ``value >= nodes`` on ``[t, t + duration)``;
        ``inf`` if never. This is how a launcher reads "when would this request start" off a view."""
        t0 = self.times[0] if not_before is None else max(not_before, self.times[0])
        if nodes <= 0:
            return t0
        times, values = self.times, self.values
        i = max(bisect_right(times, t0) - 1, 0)
        n = len(times)
        while i < n:
            while i < n and values[i] < nodes:
                i += 1
            if i == n:
                return INF
            start = max(t0, times[i])
            j = i + 1
            while j < n and values[j] >= nodes:
                j += 1
            end = times[j] if j < n else INF
            if end >= start + duration:
                return start
            i = j
        return INF

    def max_value(self) -> int:
        return max(self.values)

    def clip(self, start: float) -> StepFunction:
        """The same function seen from ``start`` on."""
        if start <= self.times[0]:
            return self
        i = bisect_right(self.times, start) - 1
        return StepFunction((float(start),) + self.times[i + 1 :], self.values[i:])

    def breakpoints_after(self, t: float) -> tuple[float, ...]:
        return self.times[bisect_right(self.times, t) :]

    # -- arithmetic ---------------------------------------------------------------------------------
    def _combine(self, other: StepFunction, op: Callable[[int, int], int]) -> StepFunction:
        start = min(self.times[0], other.times[0])
        times = sorted(set(self.times) | set(other.times))
        return StepFunction.from_steps(
            (t, op(self.value_at(t), other.value_at(t))) for t in times if t >= start
        )

    def __add__(self, other: StepFunction) -> StepFunction:
        return self._combine(other, lambda a, b: a + b)

    def __sub__(self, other: StepFunction) -> StepFunction:
        return self._combine(other, lambda a, b: a - b)

    def minimum(self, other: StepFunction) -> StepFunction:
        return self._combine(other, min)

    def maximum(self, other: StepFunction) -> StepFunction:
        return self._combine(other, max)

    def map(self, fn: Callable[[int], int]) -> StepFunction:
        return StepFunction.from_steps((t, fn(v)) for t, v in zip(self.times, self.values, strict=True))


class Profile:
    """Mutable availability profile of one cluster (or one pre-allocation) during a pass.

    Breakpoints are kept in blocks of at most ``2 * block`` entries. Each block stores raw values, a lazy
    amount added to all of them, and a lower bound on its raw min and an upper bound on its raw max
    (exact after a split; a reservation keeps the min exact and may leave the max high, a release the
    reverse), so that :meth:`earliest_fit` can skip blocks that cannot start or cannot stop a hole, and
    :meth:`reserve` touches only the two blocks at its ends element by element.

    During a pass a profile mostly loses capacity, and then what one search learnt stays true for the
    next ones. Per number of nodes, a staircase of bounds ``(D, x)`` says "no hole for a duration >= D
    starts before x". A search starts from the bound of its duration instead of from the profile's start;
    on its way it records, each time it steps over a too-short hole longer than all the previous ones,
    that a request longer than all of them cannot start before the next hole. Without this, conservative
    backfilling of small, long requests over a packed profile walks every short gap again and again
    (quadratic in the queue length). Capacity that comes back (a negative reservation) makes the
    staircases forget, unless it exactly rolls back one of the last reservations (a failed tentative
    placement of a group): then the staircases known before that reservation hold again.
    """

    __slots__ = ("_ts", "_vs", "_add", "_mn", "_mx", "_first", "_block", "_lbs", "_undo", "start")

    def __init__(self, start: float, value: int, block: int = 32) -> None:
        self.start = float(start)
        self._block = block
        self._ts: list[list[float]] = [[self.start]]
        self._vs: list[list[int]] = [[int(value)]]
        self._add: list[int] = [0]
        self._mn: list[int] = [int(value)]
        self._mx: list[int] = [int(value)]
        self._first: list[float] = [self.start]
        # nodes -> (durations, bounds), both ascending: no hole for a duration >= durations[k] starts
        # before bounds[k]
        self._lbs: dict[int, _Bounds] = {}
        # the last reservations with the bounds known before each: a rolled-back tentative placement
        # (the release of the last reservation) brings those bounds back
        self._undo: list[tuple[float, float, int, dict[int, _Bounds]]] = []

    @classmethod
    def from_stepfunction(cls, fn: StepFunction, start: float | None = None) -> Profile:
        fn = fn if start is None else fn.clip(start)
        p = cls(fn.times[0], fn.values[0])
        p._ts = [list(fn.times)]
        p._vs = [list(fn.values)]
        p._rebalance_all()
        return p

    # -- internals ----------------------------------------------------------------------------------
    def _rebalance_all(self) -> None:
        self._set(*self._flat())

    def _flat(self) -> tuple[list[float], list[int]]:
        """The breakpoints and values, out of their blocks."""
        return ([t for blk in self._ts for t in blk],
                [v + a for blk, a in zip(self._vs, self._add, strict=True) for v in blk])

    def _set(self, ts: list[float], vs: list[int]) -> None:
        """Hold these breakpoints and values, in blocks of ``block``."""
        b = self._block
        self._ts = [ts[i : i + b] for i in range(0, len(ts), b)] or [[self.start]]
        self._vs = [vs[i : i + b] for i in range(0, len(vs), b)]
        self._add = [0] * len(self._ts)
        self._mn = [min(v) for v in self._vs]
        self._mx = [max(v) for v in self._vs]
        self._first = [blk[0] for blk in self._ts]

    def _locate(self, t: float) -> tuple[int, int]:
        """(block, index) of the step containing ``t`` (``t >= start``)."""
        b = bisect_right(self._first, t) - 1
        if b < 0:
            return 0, 0
        return b, bisect_right(self._ts[b], t) - 1

    def _split(self, t: float) -> tuple[int, int]:
        """Make ``t`` (> start, finite) a breakpoint; its (block, index)."""
        first = self._first
        b = bisect_right(first, t) - 1
        ts = self._ts[b]
        i = bisect_right(ts, t) - 1
        if ts[i] == t:
            return b, i
        i += 1
        vs = self._vs[b]
        ts.insert(i, t)
        vs.insert(i, vs[i - 1])
        if len(ts) > 2 * self._block:
            half = len(ts) // 2
            lo, hi = vs[:half], vs[half:]
            self._ts[b : b + 1] = [ts[:half], ts[half:]]
            self._vs[b : b + 1] = [lo, hi]
            a = self._add[b]
            self._add[b : b + 1] = [a, a]
            self._mn[b : b + 1] = [min(lo), min(hi)]
            self._mx[b : b + 1] = [max(lo), max(hi)]
            first[b : b + 1] = [ts[0], ts[half]]
            if i >= half:
                return b + 1, i - half
        return b, i

    def _learn(self, nodes: int, floor: float, points: list[tuple[float, float]]) -> None:
        """Merge the bounds ``(d, x)``, "no hole longer than d before x" (d < 0: no hole at all), valid for
        durations >= ``floor``, into the staircase of ``nodes``. Staircases are tuples, replaced rather
        than changed: the undo log shares them."""
        ds, xs = self._lbs.get(nodes, ((), ()))
        for d, x in points:
            d = floor if d < 0 else max(math.nextafter(d, INF), floor)
            k = bisect_right(ds, d)
            if k and xs[k - 1] >= x:
                continue  # already known
            j = k - 1 if k and ds[k - 1] == d else k
            m = j
            n = len(ds)
            while m < n and xs[m] <= x:
                m += 1
            ds = ds[:j] + (d,) + ds[m:]
            xs = xs[:j] + (x,) + xs[m:]
        self._lbs[nodes] = (ds, xs)

    # -- public API ---------------------------------------------------------------------------------
    def value_at(self, t: float) -> int:
        b, i = self._locate(max(t, self.start))
        return self._vs[b][i] + self._add[b]

    def max_value(self) -> int:
        return max(max(vs) + a for vs, a in zip(self._vs, self._add, strict=True))

    def horizon(self) -> float:
        """The last breakpoint: from then on the profile is constant, so what does not fit at a time
        after it never will."""
        return self._ts[-1][-1]

    def earliest_fit(self, nodes: int, duration: float, not_before: float) -> float:
        """First ``t >= not_before`` with at least ``nodes`` on ``[t, t + duration)``, else ``inf``."""
        start = self.start
        t0 = not_before if not_before > start else start
        if nodes <= 0 or duration <= 0:
            return t0
        # where the search may start: the staircase's bound for the longest D <= duration
        floor, bound = 0.0, start
        stair = self._lbs.get(nodes)
        if stair is not None:
            k = bisect_right(stair[0], duration) - 1
            if k >= 0:
                floor = stair[0][k]
                bound = stair[1][k]
        learn = t0 <= bound  # then nothing before t0 fits either: what the walk sees is worth keeping
        if learn:
            t0 = bound
        if t0 == INF:
            return INF
        ts_all, vs_all, add, mn, mx = self._ts, self._vs, self._add, self._mn, self._mx
        nb = len(ts_all)
        b = bisect_right(self._first, t0) - 1
        i = bisect_right(ts_all[b], t0) - 1
        longest = -1.0  # the longest too-short hole stepped over so far
        points: list[tuple[float, float]] = []
        while True:
            # the next position whose value is >= nodes: where a hole starts
            while b < nb:
                thr = nodes - add[b]
                if mx[b] >= thr:
                    if mn[b] >= thr:
                        break
                    vs = vs_all[b]
                    n = len(vs)
                    for i in range(i, n):  # noqa: B020 -- resumes the scan in place
                        if vs[i] >= thr:
                            break
                    else:
                        i = n
                    if i < n:
                        break
                b += 1
                i = 0
            else:
                found = INF
                break
            s = ts_all[b][i]
            if s < t0:
                s = t0
            # the next position whose value is < nodes: where the hole ends
            i += 1
            while b < nb:
                thr = nodes - add[b]
                if mn[b] < thr:
                    if mx[b] < thr:
                        break
                    vs = vs_all[b]
                    n = len(vs)
                    for i in range(i, n):  # noqa: B020
                        if vs[i] < thr:
                            break
                    else:
                        i = n
                    if i < n:
                        break
                b += 1
                i = 0
            else:
                found = s
                break
            length = ts_all[b][i] - s
            if length >= duration:
                found = s
                break
            if length > longest:
                # a request longer than every hole so far cannot start before this one
                points.append((longest, s))
                longest = length
        if learn and (points or found != t0):
            points.append((longest, found))
            self._learn(nodes, floor, points)
        return found

    def fits_at(self, t: float, nodes: int, duration: float) -> bool:
        return self.earliest_fit(nodes, duration, t) == max(t, self.start)

    def reserve(self, begin: float, end: float, nodes: int) -> None:
        """Subtract ``nodes`` over ``[begin, end)`` (clipped to the profile's start)."""
        start = self.start
        if begin < start:
            begin = start
        if nodes == 0 or end <= begin:
            return
        undo = self._undo
        if nodes > 0:
            # the bounds hold before and after: keep them to go back to if this is rolled back
            undo.append((begin, end, nodes, self._lbs))
            if len(undo) > _UNDO:
                del undo[0]
            self._lbs = self._lbs.copy()
        elif undo and undo[-1][0] == begin and undo[-1][1] == end and undo[-1][2] == -nodes:
            self._lbs = undo.pop()[3]  # exactly as before that reservation: so are the bounds
        else:
            self._lbs = {}  # capacity comes back: the bounds learnt may no longer hold
            undo.clear()
        finite = end != INF
        if finite:
            b1, i1 = self._split(end)
        nb = len(self._ts)
        if begin == start:
            b0, i0 = 0, 0
        else:
            b0, i0 = self._split(begin)
            if len(self._ts) != nb:  # a block was cut in two: find the end again
                nb += 1
                if finite:
                    b1, i1 = self._locate(end)
            elif finite and b1 == b0 and self._ts[b1][i1] != end:  # begin went in before it
                i1 += 1
        if not finite:
            b1, i1 = nb, 0
        delta = -nodes
        vs_all, add = self._vs, self._add
        # a block's min and max are only kept exact in the direction the change goes: a reservation can
        # leave a max too high, a release a min too low -- bounds that only make a search look closer
        bound, keep = (self._mn, min) if delta < 0 else (self._mx, max)
        if b0 == b1:
            vs = vs_all[b0]
            new = list(map(delta.__add__, vs[i0:i1]))
            vs[i0:i1] = new
            bound[b0] = keep(bound[b0], keep(new))
            return
        if i0 == 0:
            add[b0] += delta
        else:
            vs = vs_all[b0]
            new = list(map(delta.__add__, vs[i0:]))
            vs[i0:] = new
            bound[b0] = keep(bound[b0], keep(new))
        if b1 > b0 + 1:
            add[b0 + 1 : b1] = map(delta.__add__, add[b0 + 1 : b1])
        if b1 < nb and i1 > 0:
            vs = vs_all[b1]
            new = list(map(delta.__add__, vs[:i1]))
            vs[:i1] = new
            bound[b1] = keep(bound[b1], keep(new))

    def reserve_all(self, items: Iterable[tuple[float, float, int]]) -> None:
        """:meth:`reserve` each of ``items`` (begin, end, nodes > 0), in one go over the merged breakpoints: the
        same breakpoints and values as one by one, for a profile made from hundreds of reservations at once."""
        start = self.start
        delta: dict[float, int] = {}
        for begin, end, nodes in items:
            if begin < start:
                begin = start
            if nodes == 0 or end <= begin:
                continue
            if nodes < 0:
                raise ValueError("reserve_all takes reservations only")
            delta[begin] = delta.get(begin, 0) - nodes
            if end != INF:
                delta[end] = delta.get(end, 0) + nodes
        if not delta:
            return
        old_ts, old_vs = self._flat()
        times = sorted(delta.keys() | set(old_ts))
        values: list[int] = []
        k, n_old, value, acc = 0, len(old_ts), old_vs[0], 0
        for t in times:
            while k < n_old and old_ts[k] <= t:
                value = old_vs[k]
                k += 1
            acc += delta.get(t, 0)
            values.append(value + acc)
        self._set(times, values)
        self._undo.clear()  # (the bounds learnt still hold: capacity only went)

    def release(self, begin: float, end: float, nodes: int) -> None:
        self.reserve(begin, end, -nodes)

    def to_stepfunction(self) -> StepFunction:
        return StepFunction.from_steps(
            (t, v + a)
            for ts, vs, a in zip(self._ts, self._vs, self._add, strict=True)
            for t, v in zip(ts, vs, strict=True)
        )

    def __len__(self) -> int:
        return sum(len(ts) for ts in self._ts)
