"""What the view publisher tells each application (:class:`ViewDeliverer`): only views that changed, and the
same with a round's memo of view pairs as without it, however the applications share view objects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.launchers.delivery import ViewDeliverer
from coorm.shared.stepfn import StepFunction


def test_a_view_seen_from_a_later_now_is_no_change_and_a_new_future_is():
    d = ViewDeliverer()
    v0 = StepFunction.from_steps([(0.0, 4), (10.0, 8)])
    assert d.changes("a", {"c": (v0, None)}) == [("c", "non_preemptive", v0)]
    later = StepFunction.from_steps([(5.0, 4), (10.0, 8)])
    assert d.changes("a", {"c": (later, None)}) == []
    other = StepFunction.from_steps([(5.0, 2), (10.0, 8)])
    assert d.changes("a", {"c": (other, None)}) == [("c", "non_preemptive", other)]


_views = st.lists(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 8)), min_size=1, max_size=4),
    min_size=1,
    max_size=4,
)


def _fn(now: float, steps: list[tuple[int, int]]) -> StepFunction:
    return StepFunction.from_steps([(now + i + k * 10.0, v) for k, (i, v) in enumerate(steps)])


@settings(max_examples=80, deadline=None)
@given(_views, st.lists(st.lists(st.integers(0, 3), min_size=6, max_size=6), min_size=1, max_size=5))
def test_a_rounds_memo_changes_nothing_of_what_is_told(pool, rounds):
    """Six applications; in each round each is shown one view of a shared pool (the same objects, as the
    publisher's shared views), from a later "now" each round: told with a memo per round, and without."""
    plain, memoised = ViewDeliverer(), ViewDeliverer()
    for k, picks in enumerate(rounds):
        now = float(k)
        views = [_fn(now, steps) for steps in pool]
        memo: dict = {}
        for i, pick in enumerate(picks):
            v = views[pick % len(views)]
            app = f"app{i}"
            expected = plain.changes(app, {"c": (v, None)})
            assert memoised.changes(app, {"c": (v, None)}, memo) == expected
