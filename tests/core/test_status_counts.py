"""The engine's gauges come from :func:`counts_of`, a read of the cores apart from ``coorm status``'s: both
must say the same of any state (the same partition of each cluster's nodes, the same requests by cluster
and type, the same sessions by kind, the same nodes held by kind and type, the same planned starts)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.services.policy_engine.status import counts_of
from coorm.shared.events import OpenSession
from tests.core.driver import Driver, rq

TYPES = ("non-preemptible", "preemptible", "pre-allocation")
KINDS = ("rigid", "moldable", "")


def _from_status(status, sessions) -> tuple:
    kinds: dict[str, int] = {}
    kind_of = {}
    for a in status.apps:
        kind_of[a.app] = a.kind or "unknown"
        kinds[kind_of[a.app]] = kinds.get(kind_of[a.app], 0) + 1
    running: dict = {}
    waiting: dict = {}
    nodes: dict = {}
    waits: dict = {}
    for r in status.requests:
        if r.state == "started":
            running[r.cluster, r.type] = running.get((r.cluster, r.type), 0) + 1
            key = (kind_of.get(r.app, "unknown"), r.type)
            nodes[key] = nodes.get(key, 0) + len(r.node_ids)
        else:
            cluster = r.cluster or "unplaced"
            waiting[cluster, r.type] = waiting.get((cluster, r.type), 0) + 1
            if r.start is not None:
                waits.setdefault(cluster, []).append(max(0.0, r.start - status.now))
    return status.clusters, kinds, running, waiting, nodes, waits


def _drop_zeros(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # application
            st.sampled_from(TYPES),
            st.sampled_from(("a", "b")),
            st.integers(1, 6),  # nodes
            st.sampled_from((None, 30.0, 300.0)),  # duration (None: unbounded, preemptible only)
            st.integers(0, 3),  # what happens next: 0 done at once, else nothing
            st.floats(0, 50),  # time step
        ),
        min_size=1,
        max_size=25,
    )
)
def test_the_gauges_counts_say_what_the_status_says(steps):
    d = Driver({"a": 8, "b": 6})
    sessions = {}
    t = 0.0
    for k, (app_i, rtype, cluster, nodes, duration, then, dt) in enumerate(steps):
        t += dt
        app = f"app{app_i}"
        if not d.policy.has_app(app):
            kind = KINDS[app_i % len(KINDS)]
            d._advance(t)
            d._record(d.cores.handle(OpenSession(at=t, app=app, app_kind=kind)))
            sessions[app] = {"kind": kind} if app_i % 2 else {}
        if rtype != "preemptible" and duration is None:
            duration = 60.0
        out = d.submit(t, app, rq(f"{app}.r{k}", cluster, nodes, duration, type=rtype))
        if out and out[0].kind == "accepted" and then == 0 and f"{app}.r{k}" in d.policy.started:
            d.done(t, app, f"{app}.r{k}")
    counts = counts_of(d.cores, sessions)
    clusters, kinds, running, waiting, nodes, waits = _from_status(d.cores.status(sessions, "x"), sessions)
    assert counts.clusters == clusters
    assert counts.sessions == kinds
    assert counts.running == running
    assert counts.waiting == waiting
    assert _drop_zeros(counts.app_nodes) == _drop_zeros(nodes)
    assert {c: sorted(w) for c, w in counts.waits.items()} == {c: sorted(w) for c, w in waits.items()}
