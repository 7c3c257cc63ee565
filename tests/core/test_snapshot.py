"""Snapshots of the cores (services/policy_engine/snapshot.py): a restored snapshot decides exactly as the
cores it was taken from; the recorded shape of the state guards its format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coorm.services.policy_engine import snapshot
from coorm.services.policy_engine.snapshot import Snapshot, SnapshotError, after, state_shape
from tests.core.driver import Driver as Scenario
from tests.core.driver import rq
from tests.core.test_properties import Driver, _dump, explain, settings_st, sizes_st, steps_st

SHAPE = Path(__file__).parent / "data" / "snapshot_shape.json"


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_a_restored_snapshot_decides_like_the_cores_it_was_taken_from(data, settings, sizes, steps):
    """A random run; the cores rebuilt from its first k events are snapshotted (after an event that ran its
    pass, as the policy engine does) and restored; fed the rest of the events, they make exactly the
    decisions the run made."""
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(0, 3)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps)
    cuts = [0] + [i + 1 for i, now in enumerate(drv.passes_now) if now]
    k = data.draw(st.sampled_from(cuts), label="snapshot after event")
    before = Driver.replay(drv.events[:k], settings, drv.passes_now[:k])
    cores = Snapshot.of(before.cores, "1-0", k).cores()
    assert cores is not before.cores
    outs = [cores.handle(ev, pass_now=p) for ev, p in zip(drv.events[k:], drv.passes_now[k:], strict=True)]
    assert _dump(outs) == _dump(drv.outs[k:])


def _rich_state() -> Scenario:
    """Every kind of thing the cores keep: sessions, every request type and relation, a pre-allocation with
    a request inside, a preemptible request under a deadline, a NEXT update, a fair-start hold, a node
    down, a closed session."""
    d = Scenario({"c0": 32, "c1": 8}, fair_start=5.0, preempt_grace=10.0)
    for app in ("nea", "mal", "rig", "gone"):
        d.open(0.0, app)
    d.submit(0.0, "nea", rq("pa", "c0", 12, 10_000, type="pre-allocation"), rq("n1", "c0", 4, 5_000))
    d.submit(1.0, "mal", rq("m1", "c0", 20, None, type="preemptible"))
    d.submit(1.0, "rig", rq("r1", "c1", 4, 600), rq("r2", "c1", 4, 600, to="r1", how="COALLOC"),
             rq("r3", "c0", 2, 300, to="r1", how="NEXT"))
    d.submit(2.0, "nea", rq("n2", "c0", 10, 5_000, to="n1", how="NEXT"))
    d.done(2.0, "nea", "n1")
    d.submit(3.0, "gone", rq("g1", "c0", 40, 100))
    d.close(4.0, "gone")
    d.done(5.0, "rig", "r2")
    d.node_down(6.0, "c1n7")
    d.run_until(7.0)
    return d


def test_the_state_keeps_the_shape_its_format_names():
    """The classes and attributes a snapshot pickles are those recorded for ``snapshot.FORMAT``. If this
    fails, the cores now keep something else: bump ``FORMAT`` in services/policy_engine/snapshot.py and record
    the new shape (``COORM_RECORD_SNAPSHOT_SHAPE=1 pytest tests/core/test_snapshot.py``)."""
    shape = {"format": snapshot.FORMAT, "classes": state_shape(_rich_state().cores)}
    if os.environ.get("COORM_RECORD_SNAPSHOT_SHAPE"):
        SHAPE.write_text(json.dumps(shape, indent=1) + "\n")
    recorded = json.loads(SHAPE.read_text())
    assert shape["classes"] == recorded["classes"] or shape["format"] != recorded["format"], (
        "the cores' state changed shape: bump snapshot.FORMAT and record the new shape")
    assert shape == recorded, "snapshot.FORMAT was bumped: record the new shape"


def test_the_rich_state_survives_a_snapshot():
    d = _rich_state()
    cores = Snapshot.of(d.cores, "5-2", 99).cores()
    assert state_shape(cores) == state_shape(d.cores)
    assert cores.policy.epoch == d.policy.epoch and cores.next_wakeup() == d.cores.next_wakeup()
    assert {r: x.state for r, x in cores.policy.requests.items()} == {r: x.state for r, x in d.policy.requests.items()}


def test_a_snapshot_of_another_format_is_refused():
    snap = Snapshot.of(_rich_state().cores, "5-2", 99)
    other = Snapshot(state=snap.state, last=snap.last, format=snap.format + "x", events=snap.events)
    with pytest.raises(SnapshotError, match="format"):
        other.cores()
    with pytest.raises(SnapshotError, match="damaged"):
        Snapshot.from_fields({"state": snap.state})
    assert Snapshot.from_fields({}) is None
    assert Snapshot.from_fields({"state": "x", "last": "1-0", "format": "1", "events": "3"}).events == 3


def test_the_log_is_trimmed_after_the_snapshot_entry():
    assert after("1700000000000-0") == "1700000000000-1"
    assert after("5-41") == "5-42"
