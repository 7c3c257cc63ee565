"""The pace of views (services/policy_engine/view_pacing.py): examples, and properties over random
sequences of changes, openings, endings and rounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.services.policy_engine.view_pacing import ViewPacer


def test_first_round_goes_at_once_then_waits_the_period():
    p = ViewPacer(period=0.1, rate=1000)
    p.changed(["a1", "a2"])
    assert p.take(5.0) == (["a1", "a2"], [])
    p.changed(["a1"])
    assert p.take(5.05) is None
    assert p.due_at() == 5.1
    p.changed(["a3"])
    assert p.take(5.1) == (["a1", "a3"], [])
    assert p.take(5.2) is None  # nothing pending
    assert p.due_at() is None


def test_a_large_round_holds_the_next_one_back_to_keep_the_rate():
    p = ViewPacer(period=0.1, rate=100)
    p.changed([f"a{i}" for i in range(50)])
    assert len(p.take(0.0)[0]) == 50
    p.changed(["a1"])
    assert p.due_at() == 0.5  # 50 notifications at 100/s


def test_a_preemption_and_a_new_session_go_at_once():
    p = ViewPacer(period=10, rate=1000)
    p.changed(["a1"])
    p.take(0.0)
    p.changed(["a1"])
    assert p.take(1.0) is None
    p.changed(["a2"], urgent=True)
    assert p.take(1.0) == (["a1", "a2"], [])  # everything pending goes with the urgent one
    p.opened("a3")
    p.changed(["a1"])
    assert p.take(2.0) is None
    p.changed(["a3"])  # its first views
    assert p.take(2.0) == (["a1", "a3"], [])
    p.changed(["a3"])  # no longer fresh
    assert p.take(3.0) is None


def test_an_ended_session_is_not_sent_views_and_is_named_as_closed():
    p = ViewPacer(period=1, rate=1000)
    p.changed(["a1", "a2"])
    p.take(0.0)
    p.changed(["a1", "a2"])
    p.ended("a2")
    assert p.take(0.5) is None
    assert p.take(1.0) == (["a1"], ["a2"])


_ops = st.lists(st.one_of(
    st.tuples(st.just("changed"), st.sets(st.sampled_from([f"a{i}" for i in range(6)]), max_size=4), st.booleans()),
    st.tuples(st.just("opened"), st.sampled_from([f"a{i}" for i in range(6)])),
    st.tuples(st.just("ended"), st.sampled_from([f"a{i}" for i in range(6)])),
    st.tuples(st.just("advance"), st.floats(0, 0.3)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_ops, st.floats(0.01, 0.5), st.floats(1, 1000))
def test_no_change_is_lost_and_the_pace_holds(ops, period, rate):
    """Rounds are taken whenever due. Every change is sent in a round no later than the gap after the
    previous one (never lost, never late); an ended session is never sent views after it ended; two
    rounds without an urgent change between them are at least the gap apart."""
    p = ViewPacer(period=period, rate=rate)
    now = 0.0
    unsent: set[str] = set()
    ended: set[str] = set()
    last_round: tuple[float, int] | None = None
    urgent_since_last = False

    def take():
        nonlocal last_round, urgent_since_last
        due = p.due_at()
        out = p.take(now)
        if due is None:
            assert out is None
            return
        if due > now:
            assert out is None
            return
        assert out is not None
        apps, _closed = out
        assert set(apps) == unsent, "a round sends exactly what changed since the last one"
        assert not set(apps) & ended
        if last_round is not None and not urgent_since_last:
            t, n = last_round
            assert now >= t + max(period, n / rate) - 1e-9
        unsent.clear()
        last_round = (now, len(apps))
        urgent_since_last = False

    for op in ops:
        if op[0] == "changed":
            apps = op[1] - ended
            p.changed(apps, urgent=op[2])
            unsent |= apps
            urgent_since_last |= bool(apps) and (op[2] or bool(apps & p.fresh))
        elif op[0] == "opened":
            if op[1] not in ended:
                p.opened(op[1])
        elif op[0] == "ended":
            p.ended(op[1])
            unsent.discard(op[1])
            ended.add(op[1])
        else:
            due = p.due_at()
            if due is not None and unsent:
                # nothing waits past its round: the loop would take it at ``due``
                assert due <= max(now, (last_round[0] + max(period, last_round[1] / rate)) if last_round else now)
            now += op[1]
        take()
