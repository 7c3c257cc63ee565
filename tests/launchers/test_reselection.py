"""A selecting launcher shown its own request running before it hears that it started (issue 17).

Live, a start and the views of the pass that decided it travel apart (the start through the node allocator,
the views through the faster view publisher), so a moldable or CEM launcher may see a view in which the
request it waits with already holds its nodes. Choosing again on that view, it cancelled a request that had
started and took what was left -- and that one started, and was cancelled in its turn: the twin-spaced
run's livelock. With a ``start_lag`` it waits that long for the start; with none (the papers' simulator,
where a start is heard with its views) it chooses at once, as before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.launchers.base import ClusterProps, Done, Submit, Timer, Views
from coorm.launchers.cem import CEMLauncher, CEMModel
from coorm.launchers.moldable import MoldableLauncher
from coorm.shared.stepfn import StepFunction
from tests.launchers.test_cem import launcher as cem_launcher

UP = 8
CONFIGS = [(2, 6.0), (4, 4.0), (8, 2.0)]


def view(now: float, up: int, busy: list[tuple[float, float, int]]) -> StepFunction:
    return StepFunction.from_intervals(up, now, busy)


def views(now: float, **clusters: StepFunction) -> Views:
    return Views(now=now, non_preemptive=dict(clusters),
                 preemptive={c: StepFunction.constant(0, now) for c in clusters})


def replaced(cmds) -> bool:
    return any(isinstance(c, (Submit, Done)) for c in cmds)


# -- the moldable launcher --------------------------------------------------------------------------
def moldable_started_unheard(lag: float | None):
    """A moldable on 8 nodes, 2 of them busy until 100 s: it asks for 4 nodes at once (4 s: 2 nodes would take
    6). The next view shows its own request running (4 more nodes taken from 0.05 s) before its start is
    heard: on it, 2 nodes at once would end first."""
    m = MoldableLauncher("m", "c0", CONFIGS, start_lag=lag)
    first = m.on_views(views(0.0, c0=view(0.0, UP, [(0.0, 100.0, 2)])))
    assert [r.nodes for c in first if isinstance(c, Submit) for r in c.requests] == [4]
    mine = view(0.05, UP, [(0.0, 100.0, 2), (0.05, 4.05, 4)])
    return m, m.on_views(views(0.05, c0=mine))


def test_a_moldable_waits_for_the_start_of_its_request_the_view_shows_running():
    m, out = moldable_started_unheard(2.0)
    assert not replaced(out) and out == [Timer(2.05, "select")]
    assert m.waiting == {"m.1"} and m.resubmissions == 0 and m.held_back == 1
    assert m.on_start(0.2, "m.1", ("n4", "n5", "n6", "n7")) == [Timer(4.2, "end")]
    assert m.on_timer(2.05, "select") == []  # started meanwhile: nothing to choose
    assert m.resubmissions == 0


def test_a_moldable_chooses_again_once_no_start_came_within_the_lag():
    # a higher priority took the nodes: the start never comes, and after the lag the launcher adapts
    m, out = moldable_started_unheard(2.0)
    assert out == [Timer(2.05, "select")]
    again = m.on_timer(2.05, "select")
    assert replaced(again) and m.resubmissions == 1 and m.waiting == {"m.2"}


def test_without_a_lag_a_moldable_chooses_again_at_once_as_in_the_papers_simulator():
    m, out = moldable_started_unheard(0.0)
    assert replaced(out) and m.resubmissions == 1


def test_a_better_choice_on_a_view_where_the_request_still_fits_is_not_held_back():
    m = MoldableLauncher("m", "c0", CONFIGS, start_lag=2.0)
    m.on_views(views(0.0, c0=view(0.0, UP, [(0.0, 100.0, 2)])))  # 4 nodes
    out = m.on_views(views(1.0, c0=view(1.0, UP, [])))  # everything free: 8 nodes end sooner
    assert replaced(out) and m.resubmissions == 1 and m.held_back == 0


@settings(max_examples=300, deadline=None)
@given(
    busy=st.lists(st.tuples(st.floats(0, 50), st.floats(0.5, 60), st.integers(1, UP)), max_size=6),
    configs=st.lists(st.tuples(st.integers(1, UP), st.floats(0.5, 40)), min_size=1, max_size=4,
                     unique_by=lambda c: c[0]),
)
def test_property_a_moldable_never_replaces_its_request_on_a_view_that_differs_by_its_own_start(busy, configs):
    """Whatever the view and the configurations: once its request starts where it was expected, the view of
    that pass (its own request in it, its start not heard yet) never makes it submit or cancel."""
    m = MoldableLauncher("m", "c0", configs, start_lag=1.0)
    items = [(b, b + d, n) for b, d, n in busy]
    first = m.on_views(views(0.0, c0=view(0.0, UP, items)))
    chosen = [r for c in first if isinstance(c, Submit) for r in c.requests]
    if not chosen or m.choice is None or m.choice.start == float("inf"):
        return  # nothing fits anywhere: no request to start
    r, s = chosen[0], m.choice.start
    assert r.duration is not None
    shown = view(s, UP, [*items, (s, s + r.duration, r.nodes)])
    assert not replaced(m.on_views(views(s, c0=shown)))
    assert m.waiting == {r.id}


# -- the CEM launcher -------------------------------------------------------------------------------
def test_a_cem_waits_for_the_start_of_its_group_the_view_shows_half_running():
    """The twin-spaced livelock's first step, as traced live: a CEM asks 8 + 8 nodes on two free clusters;
    the member on c1 starts (the one on c0 waits for the PSA there to release); the view of that pass shows
    c1 taken before the start is heard. Without a lag it cancels both and asks c0 alone."""
    model = CEMModel(iterations=10, work=8.0)  # the twin's CEM on 8-node clusters

    def fresh(lag: float) -> CEMLauncher:
        return cem_launcher(ClusterProps(nodes={"c0": UP, "c1": UP}), model=model, start_lag=lag)

    for lag, expect_replaced in ((0.0, True), (2.0, False)):
        cem = fresh(lag)
        first = cem.on_views(views(0.0, c0=view(0.0, UP, []), c1=view(0.0, UP, [])))
        group = [(r.cluster, r.nodes) for c in first if isinstance(c, Submit) for r in c.requests]
        assert sorted(group) == [("c0", UP), ("c1", UP)]
        assert cem.selection is not None
        d = cem.selection.duration
        out = cem.on_views(views(0.03, c0=view(0.03, UP, []), c1=view(0.03, UP, [(0.03, 0.03 + d, UP)])))
        assert replaced(out) is expect_replaced
        if not expect_replaced:
            assert out == [Timer(2.03, "select")] and cem.held_back == 1
            ids = list(cem.group)
            assert cem.on_start(0.08, ids[1], tuple(f"c1n{i}" for i in range(UP))) == []
            assert cem.on_start(0.2, ids[0], tuple(f"c0n{i}" for i in range(UP))) == [Timer(0.2 + d, "end")]
            assert cem.on_timer(2.03, "select") == [] and cem.resubmissions == 0
