"""The heartbeats' pace (a pure core): held to its rate however many sessions open, and never so that a
session beating at the interval it was last told is reaped -- whatever the number of sessions does, whenever
the reaper looks, and across a new leader that takes over with what its predecessor stored."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.services.policy_engine.heartbeat_pacing import HeartbeatPace


def test_the_interval_doubles_past_the_rate_up_to_the_longest():
    pace = HeartbeatPace(base=2.0, timeout=10.0, rate=1000.0, longest=30.0)
    assert [pace.wanted(n) for n in (0, 2000, 2001, 4000, 4001, 8001, 10**6)] == [0, 0, 1, 1, 2, 3, 3]
    assert pace.update(5000, now=0.0) and (pace.interval(), pace.session_timeout()) == (8.0, 40.0)
    assert not pace.update(5000, now=1.0)


def test_it_rises_at_once_and_falls_one_step_once_every_session_was_told():
    pace = HeartbeatPace(base=1.0, timeout=3.0, rate=1.0, longest=8.0)
    assert pace.update(8, now=0.0) and pace.level == 3
    assert not pace.update(1, now=7.9)  # a session told 8 s at 0 may beat only at 8
    assert pace.reaping_timeout(7.9) == 24.0
    assert pace.update(1, now=8.0) and pace.level == 2
    # until 16, a session may still follow 8 s (told just before the fall): reaped after its timeout
    assert pace.reaping_timeout(15.9) == 24.0 and pace.reaping_timeout(16.0) == 12.0
    assert not pace.update(1, now=15.9)
    assert pace.update(1, now=16.0) and pace.level == 1


def test_a_new_leader_starts_from_what_its_predecessor_stored():
    pace = HeartbeatPace(base=1.0, timeout=3.0, rate=1.0, longest=8.0)
    pace.taken_over(3, now=100.0)
    assert pace.reaping_timeout(100.0) == 24.0
    assert not pace.update(0, now=107.9)
    assert pace.update(0, now=108.0) and pace.level == 2


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from([0.5, 1.0, 2.0]), ratio=st.floats(1.2, 8.0), rate=st.floats(0.5, 50.0),
       longest_levels=st.integers(0, 5), scan=st.floats(0.05, 2.0),
       counts=st.lists(st.tuples(st.floats(0.0, 20.0), st.integers(0, 400)), min_size=1, max_size=40),
       phases=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6), takeover=st.none() | st.integers(0, 39))
def test_a_session_beating_at_the_interval_it_was_told_is_never_reaped(base, ratio, rate, longest_levels, scan,
                                                                       counts, phases, takeover):
    """The number of sessions changes at random times (``counts``: after a pause, the new number); a few
    tracked sessions beat exactly when the interval they were last told runs out (the latest they may), and
    each beat's answer tells them the current one. The reaper scans every ``scan`` seconds, updating the pace
    first as the engine does; a session is never found silent past the reaping timeout, and the rate holds.
    ``takeover``: at that change, a new leader replaces the pace with one taken over from the stored level."""
    def fresh() -> HeartbeatPace:
        return HeartbeatPace(base=base, timeout=base * ratio, rate=rate, longest=base * 2 ** longest_levels)

    pace = fresh()
    stored = 0
    told = {i: pace.interval() for i in range(len(phases))}  # opened at 0: told the base interval
    last = dict.fromkeys(told, 0.0)
    beats = [(p * base, i) for i, p in enumerate(phases)]
    heapq.heapify(beats)
    n, t, next_scan = 0, 0.0, scan
    changes = []
    for pause, count in counts:
        t += pause
        changes.append((t, count))
    end = t + 2 * base * 2 ** longest_levels
    k = 0
    while True:
        now = min(beats[0][0], next_scan, changes[k][0] if k < len(changes) else end)
        if now >= end:
            break
        if k < len(changes) and changes[k][0] == now:
            n = changes[k][1]
            if takeover == k:  # the leader dies: the next one knows only the stored level
                pace = fresh()
                pace.taken_over(stored, now)
                last = dict.fromkeys(last, now)  # (a new leader counts every session as heard at its start)
            k += 1
            continue
        if next_scan == now:
            if pace.update(n, now):
                stored = max(pace.level, pace.previous)
            for i, seen in last.items():
                assert now - seen <= pace.reaping_timeout(now) + 1e-9, (i, seen, now, told[i])
            assert n <= rate * pace.interval() or pace.interval(pace.level + 1) > pace.longest
            next_scan += scan
            continue
        _, i = heapq.heappop(beats)
        assert now - last[i] <= pace.reaping_timeout(now) + 1e-9
        last[i] = now
        told[i] = pace.interval()
        heapq.heappush(beats, (now + told[i], i))
