"""A pass keeps the placements an event cannot have changed (services/policy_engine/reuse.py), and they are the ones a
pass that places everything makes.

* the random runs of test_properties, replayed through cores that place everything at every pass (``reuse``
  False), decide exactly alike, event by event; the cores that keep check every kept placement against a full
  pass as they go (``validate``);
* a submission on one cluster places units of that cluster only, from the submitter's turn on;
* a kept placement that a full pass would not make is caught (the check can fail).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PassContext, PolicyCore, PolicySettings
from coorm.shared.events import Done, NodesChanged, OpenSession, Submit, Tick
from coorm.shared.requests import Relation, RequestSpec, RequestType
from tests.core.test_properties import Driver, _dump, _fmt, explain, settings_st, sizes_st, steps_st


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_keeping_placements_decides_as_placing_everything(data, settings, sizes, steps):
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(0, 3)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps)
    kept = _dump(drv.outs)
    full = CoupledCores(settings, validate=True)
    full.policy.reuse = False
    for i, (ev, now) in enumerate(zip(drv.events, drv.passes_now, strict=True)):
        out = _dump([full.handle(ev, pass_now=now)])[0]
        assert out == kept[i], f"placing everything differs at event {i} ({_fmt(ev)}):\n{out}\n!=\n{kept[i]}"


def _loaded(validate: bool = True) -> tuple[PolicyCore, list[PassContext]]:
    """Four clusters of 8 nodes, 12 applications with more requests than fit (on every cluster, one with a
    COALLOC pair across two, one with a pre-allocation and a request inside it), one pass run."""
    core = PolicyCore(PolicySettings(reschedule_interval=0.0, fair_start=0.0), validate=validate)
    clusters = [f"c{i}" for i in range(4)]
    for c in clusters:
        core.handle(NodesChanged(at=0.0, cluster=c, up=8), pass_now=False)
    for a in range(12):
        app = f"a{a:02d}"
        core.handle(OpenSession(at=0.0, app=app), pass_now=False)
        specs = [RequestSpec(id=f"{app}-{k}", cluster=clusters[(a + k) % 4], nodes=1 + (a * 3 + k) % 6,
                             duration=float(100 + 37 * ((a * 5 + k) % 9))) for k in range(4)]
        if a == 3:
            specs.append(RequestSpec(id=f"{app}-co", cluster="c2", nodes=3, duration=250.0, related_to=f"{app}-0",
                                     related_how=Relation.COALLOC))
        if a == 5:
            specs.append(RequestSpec(id=f"{app}-pre", type=RequestType.PRE_ALLOCATION, cluster="c3", nodes=4,
                                     duration=900.0))
            specs.append(RequestSpec(id=f"{app}-in", cluster="c3", nodes=2, duration=100.0))
        core.handle(Submit(at=0.0, app=app, requests=specs), pass_now=False)
    core.handle(Tick(at=0.0))
    walks: list[PassContext] = []
    walk = core._walk

    def watched(kept, whole=False):
        ctx = walk(kept, whole=whole)
        if kept is not None or not core.validate:
            walks.append(ctx)
        return ctx

    core._walk = watched  # type: ignore[method-assign]
    return core, walks


def test_a_submission_on_one_cluster_places_that_cluster_only_from_its_turn_on():
    core, walks = _loaded()
    order = [a.id for a in core.priority_order()]
    waiting_on = {(r.app, r.cluster) for r in core.waiting() if not r.preemptible}
    assert len(waiting_on) > 20  # most applications wait on several clusters
    placed: list[tuple[str, str]] = []
    place, check = core._place_unit, core._check_kept
    checking = []

    def noted(u, placer, lanes):
        if not checking:
            placed.append((u.waiting[0].app, u.key))
        place(u, placer, lanes)

    def checked(ctx):
        checking.append(True)
        check(ctx)
        checking.clear()

    core._place_unit = noted  # type: ignore[method-assign]
    core._check_kept = checked  # type: ignore[method-assign]
    # a pass with nothing started in it, so that no unit is placed again for a request started since
    core.handle(Submit(at=0.5, app="a11", requests=[RequestSpec(id="last", cluster="c1", nodes=8, duration=50.0)]))
    assert not core._started_since
    walks.clear()
    placed.clear()
    out = core.handle(Submit(at=1.0, app="a07", requests=[RequestSpec(id="new", cluster="c1", nodes=8,
                                                                      duration=50.0)]))
    assert not any(type(d).__name__ == "Rejected" for d in out)
    (ctx,) = walks
    assert placed and ctx.kept_units > 0
    assert {key for _, key in placed} == {"c1"}  # the other clusters' units kept
    assert min(order.index(app) for app, _ in placed) == order.index("a07")  # c1's units before a07's kept
    # and the pass compared them with a full one (validate): equal, else the handle above raised


def test_a_kept_placement_a_full_pass_would_not_make_is_caught():
    core, _ = _loaded()
    kept = core._kept
    assert kept is not None
    unit = next(u for app, units in kept.units.items() for u in units
                if u.entries and u.key == "c0" and app not in core._touched)  # (kept by the next pass)
    c, b, e, n = unit.entries[0]
    unit.entries[0] = (c, b + 1.0, e + 1.0, n)  # what a wrong keep would carry over
    other = next(r for r in core.waiting() if r.cluster == "c2")
    try:
        core.handle(Done(at=1.0, app=other.app, request=other.id))
    except AssertionError as err:
        assert "kept placements differ from a full pass's in turns" in str(err)
    else:
        raise AssertionError("a wrong kept placement went through")
