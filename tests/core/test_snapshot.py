"""Snapshots of the cores (services/policy_engine/snapshot.py, snapshot_schema.py): a restored snapshot
decides exactly as the cores it was taken from; every attribute of the cores' state is carried by the
schema or declared not carried; the schema of a version does not change under it; the golden snapshot of
every version still loads; what cannot be loaded is refused with a SnapshotError that names the versions."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine import snapshot_schema as schema
from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.snapshot import SCHEMA_VERSION, Snapshot, SnapshotError, after, state_shape
from coorm.shared.events import CloseSession, Done, Negotiate, NodeDrain, OpenSession, Respond, Tick
from coorm.shared.negotiation import NegotiationTerms
from coorm.shared.requests import RequestSpec
from coorm.shared.stepfn import INF
from tests.core.driver import Driver as Scenario
from tests.core.driver import rq
from tests.core.test_properties import Driver, _dump, explain, settings_st, sizes_st, steps_st

DATA = Path(__file__).parent / "data"
SCHEMA_FILE = DATA / "snapshot_schema.txt"  # the current version's schema (snapshot_schema.describe())
RECORD = os.environ.get("COORM_RECORD_SNAPSHOT")  # set: record the current version's schema and golden file


def golden(version: int) -> Path:
    return DATA / f"snapshot_v{version}.json"


# ==================================================================================================
# restored cores decide like the originals
# ==================================================================================================
@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_a_restored_snapshot_decides_like_the_cores_it_was_taken_from(data, settings, sizes, steps):
    """A random run; the cores rebuilt from its first k events are snapshotted and restored: they hold what
    the originals held, and fed the rest of the events they make exactly the decisions the run made. Any k:
    the policy engine snapshots after a batch's last event, whose pass may not have been due (a deferred
    event's ends and closed sessions wait for the next pass), and the schema must not depend on it."""
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(0, 3)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps)
    k = data.draw(st.integers(0, len(drv.events)), label="snapshot after event")
    before = Driver.replay(drv.events[:k], settings, drv.passes_now[:k])
    snap = Snapshot.of(before.cores, "1-0", k)
    cores = snap.cores(settings, validate=True)
    assert cores is not before.cores
    assert _leaves(cores) == _leaves(before.cores)
    outs = [cores.handle(ev, pass_now=p) for ev, p in zip(drv.events[k:], drv.passes_now[k:], strict=True)]
    assert _dump(outs) == _dump(drv.outs[k:])


def _rich_state() -> Scenario:
    """Every kind of thing the cores keep: sessions, every request type and relation, a pre-allocation with
    a request inside, a preemptible request under a deadline, a NEXT update, a fair-start hold, a node
    down, a node drained, a closed session; and, from events whose pass has not run yet, a request ended
    and a session closed that the next pass will tell."""
    d = Scenario({"c0": 32, "c1": 8}, fair_start=5.0, preempt_grace=10.0)
    for app in ("nea", "mal", "rig", "gone", "late"):
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
    d.submit(6.5, "late", rq("l1", "c0", 30, 2.5e3), rq("l2", "c1", 1, 0.1 + 0.2 + 1e3), rq("l3", "c1", 1, 900),
             rq("l4", "c1", 1, 900))
    # left to the RMS: one placed by worst-fit, one that fits nowhere (it waits, its cluster not chosen)
    d.submit(6.5, "rig", RequestSpec(id="w1", placement="worst-fit", nodes=2, duration=100.0),
             RequestSpec(id="w2", placement="first-fit", clusters=["c1", "c0"], nodes=64, duration=100.0))
    d.run_until(7.0)
    d.cores.handle(NodeDrain(at=7.0, node="c1n6", reason="disk"))
    d.done(7.1, "late", "l3")  # early, while "late" waits: its node is held for "late"
    d.submit(7.1, "rig", rq("r4", "c0", 32, 60), rq("r5", "c0", 8, 100))  # r5 fits if m1 gives nodes back
    d.done(7.1, "late", "l4")  # held for "late" and "rig"
    # negotiations: an offer lapsed, one accepted (promised), one open, one standing with nothing to offer
    d.cores.handle(Negotiate(at=7.2, app="mal", terms=NegotiationTerms(
        negotiation="m-lapsed", cluster="c1", max_nodes=2, duration=50, respond_within=0.1)))
    d.cores.handle(Negotiate(at=7.2, app="nea", terms=NegotiationTerms(
        negotiation="n-acc", cluster="c1", max_nodes=1, duration=50)))
    d.cores.handle(Respond(at=7.3, app="nea", offer="n-acc.o1", answer="accept"), pass_now=False)
    d.cores.handle(Respond(at=7.3, app="mal", offer="m-lapsed.o1", answer="accept"), pass_now=False)  # too late
    d.cores.handle(Negotiate(at=7.4, app="rig", terms=NegotiationTerms(
        negotiation="r-open", cluster="c0", min_nodes=2, max_nodes=8, sizes=(2, 4, 8), duration=30)), pass_now=False)
    d.cores.handle(Negotiate(at=7.4, app="mal", terms=NegotiationTerms(
        negotiation="m-stand", cluster="c0", type="preemptible", max_nodes=64, standing=True)), pass_now=False)
    d.cores.handle(Done(at=7.5, app="late", request="l2"), pass_now=False)
    d.cores.handle(CloseSession(at=7.5, app="late"), pass_now=False)  # l3's hold ends: no one waits for it
    return d


# ==================================================================================================
# the schema carries the state, all of it
# ==================================================================================================
def _attributes(cls: type, instances: list) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return {a for obj in instances for a in vars(obj)}


def test_every_attribute_of_the_cores_state_is_carried_or_declared_not_carried():
    """The shape guard: give a class of the cores' state an attribute (or take one away) and this fails
    until snapshot_schema carries it (a new schema version with its upgrade) or says why it does not."""
    rich = _rich_state().cores
    fresh = CoupledCores()
    instances = {CoupledCores: [rich, fresh], type(rich.policy): [rich.policy, fresh.policy],
                 type(rich.allocator): [rich.allocator, fresh.allocator]}
    for cls, carried in schema.CARRIED.items():
        missing = _attributes(cls, instances.get(cls, [])) - set(carried) - set(schema.NOT_CARRIED.get(cls, {}))
        assert not missing, (
            f"{cls.__qualname__} has attribute(s) {sorted(missing)} that a snapshot does not carry: add them to "
            "snapshot_schema (CARRIED, the models, dump, build -- a new SCHEMA_VERSION with its upgrade) or, "
            "if they need not survive a restart, to NOT_CARRIED with the reason")
        gone = (set(carried) | set(schema.NOT_CARRIED.get(cls, {}))) - _attributes(cls, instances.get(cls, []))
        assert not gone, (f"snapshot_schema names attribute(s) {sorted(gone)} that {cls.__qualname__} no longer "
                          "has: change the schema (a new SCHEMA_VERSION with its upgrade)")
        fields = schema.FIELDS_OF.get(cls)
        if fields is not None:
            assert sorted(carried.values()) == sorted(fields), f"{cls.__qualname__}: CARRIED and the model disagree"
    # every class of object the state holds is one the schema knows
    known = {f"{c.__module__}.{c.__qualname__}" for c in [*schema.CARRIED, *schema.VALUE_CLASSES]}
    reached = set(state_shape(rich))
    assert reached <= known, f"the cores hold objects the snapshot schema does not know: {sorted(reached - known)}"


def test_the_schema_of_a_version_does_not_change():
    """The schema of the current version, every field and its type, is recorded
    (tests/core/data/snapshot_schema.txt, also the format's description for other languages). Change the
    models and this fails: bump SCHEMA_VERSION, write the upgrade from the previous version, then record the
    new version's schema and golden file (COORM_RECORD_SNAPSHOT=1 pytest tests/core/test_snapshot.py).
    Recording never rewrites the schema of a version already recorded: that version's snapshots are out
    there."""
    current = schema.describe()
    recorded = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    if RECORD and not recorded.startswith(f"version {SCHEMA_VERSION}\n"):
        SCHEMA_FILE.write_text(current)
        recorded = current
    version = recorded.partition("\n")[0]
    assert version == f"version {SCHEMA_VERSION}", (
        f"SCHEMA_VERSION is {SCHEMA_VERSION}, {SCHEMA_FILE.name} records {version!r}: record the new version's "
        "schema and golden file")
    assert current == recorded, (
        f"the models of schema version {SCHEMA_VERSION} changed: bump SCHEMA_VERSION and add its upgrade (if "
        f"version {SCHEMA_VERSION} was never released, delete {SCHEMA_FILE.name} and "
        f"snapshot_v{SCHEMA_VERSION}.json and record them again)")


# ==================================================================================================
# a snapshot round-trips exactly
# ==================================================================================================
def _leaves(root: object) -> list[tuple[str, str, object]]:
    """Everything a snapshot carries, as (path, type, value) in the cores' order -- and which paths lead to
    one same mutable object (an application's requests are the core's)."""
    out: list[tuple[str, str, object]] = []
    where: dict[int, str] = {}

    def walk(obj: object, path: str) -> None:
        if obj is None or isinstance(obj, (str, int, float, bool, enum.Enum)):
            out.append((path, type(obj).__name__, obj))
            return
        if not isinstance(obj, (tuple, frozenset)):
            if id(obj) in where:
                out.append((path, "same as", where[id(obj)]))
                return
            where[id(obj)] = path
        kind = type(obj).__name__
        if isinstance(obj, dict):
            out.append((path, kind, len(obj)))
            for k, v in obj.items():
                walk(v, f"{path}[{k!r}]")
        elif isinstance(obj, (list, tuple, deque)):
            out.append((path, kind, len(obj)))
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
        elif isinstance(obj, (set, frozenset)):
            out.append((path, kind, tuple(sorted(obj))))
        elif isinstance(obj, BaseModel):  # a value (a negotiation's terms): carried as its JSON
            out.append((path, kind, obj.model_dump_json()))
        else:
            cls = type(obj)
            skip = schema.NOT_CARRIED.get(cls, {})
            out.append((path, kind, None))
            for a in sorted(schema.CARRIED[cls]):
                if a not in skip:
                    walk(getattr(obj, a), f"{path}.{a}")

    walk(root, "cores")
    return out


def test_the_rich_state_survives_a_snapshot_exactly():
    d = _rich_state()
    snap = Snapshot.of(d.cores, "5-2", 99)
    doc = json.loads(snap.state)
    assert doc["version"] == SCHEMA_VERSION == int(snap.format)
    assert snap.state == json.dumps(doc, separators=(",", ":"))  # compact
    policy = doc["policy"]
    # the state is rich: each of these is in it
    assert policy["pending_ends"] and policy["pending_sessions"] and policy["holds"] and policy["schedule"]
    assert any(a["deadlines"] for a in policy["apps"]) and any(a["ended"] for a in policy["apps"])
    phase = policy["requests"]["fields"].index("phase")
    assert {r[phase] for r in policy["requests"]["rows"]} >= {"waiting", "running", "blocked"}
    cluster, placement = (policy["requests"]["fields"].index(f) for f in ("cluster", "placement"))
    assert {(r[cluster] != "", r[placement]) for r in policy["requests"]["rows"]} >= {
        (True, "worst-fit"), (False, "first-fit"), (True, None)}
    assert {n["state"] for n in doc["allocator"]["nodes"]} >= {"free", "allocated", "held", "down", "drained"}
    assert '"inf"' in snap.state and '"-inf"' not in json.dumps(policy["requests"])
    cores = snap.cores(d.policy.settings, validate=True)
    assert _leaves(cores) == _leaves(d.cores)
    assert cores.policy.settings == d.policy.settings and cores.policy.validate
    assert Snapshot.of(cores, "5-2", 99) == snap
    # and they go on alike
    tick = Tick(at=8.0)
    assert cores.handle(tick) == d.cores.handle(tick)
    assert _leaves(cores) == _leaves(d.cores)


def test_the_settings_are_the_restoring_engines():
    snap = Snapshot.of(_rich_state().cores, "5-2", 99)
    mine = PolicySettings(fair_start=1.0, pass_burst=3)
    assert snap.cores(mine).policy.settings == mine
    assert snap.cores().policy.settings == PolicySettings()
    assert not snap.cores().policy.validate


@given(x=st.floats(allow_nan=False) | st.sampled_from([INF, -INF, 5e-324, 0.1 + 0.2, 2.0**53 + 2, -0.0]))
def test_a_float_round_trips_exactly(x):
    text = json.dumps(schema._n(x), allow_nan=False)
    back = TypeAdapter(schema.Num).validate_python(json.loads(text))
    assert back == x and str(back) == str(x)  # (-0.0 keeps its sign)


@given(x=st.integers(0, (1 << 64) - 1))
def test_a_hash_round_trips_as_a_decimal_string(x):
    assert TypeAdapter(schema.U64).validate_python(json.loads(json.dumps(str(x)))) == x


# ==================================================================================================
# versions: golden files, upgrades, refusals
# ==================================================================================================
def test_every_version_has_its_golden_file_and_every_older_one_its_upgrade():
    """The golden file of each version is written once, from the rich state, when that version is the
    current one (COORM_RECORD_SNAPSHOT=1 writes the current version's if it is missing, never an older
    one's); each older version has its upgrade to the next."""
    path = golden(SCHEMA_VERSION)
    if RECORD and not path.exists():
        state = _rich_state()
        path.write_text(json.dumps(json.loads(Snapshot.of(state.cores, "1-0", 0).state), indent=1) + "\n")
    versions = sorted(int(m.group(1)) for p in DATA.iterdir() if (m := re.fullmatch(r"snapshot_v(\d+)\.json", p.name)))
    assert versions == list(range(1, SCHEMA_VERSION + 1)), f"golden snapshots of versions {versions}"
    assert sorted(schema.UPGRADES) == list(range(2, SCHEMA_VERSION + 1))


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_the_golden_snapshot_of_every_version_loads(version):
    """Written by the code of its version, read by this one (through the upgrades if it is older): the
    cores it gives hang together and go on deciding; the current version's writes it back as it was."""
    text = golden(version).read_text()
    doc = json.loads(text)
    assert doc["version"] == version
    state = json.dumps(doc, separators=(",", ":"))
    cores = Snapshot(state=state, last="1-0", format=str(version), events=0).cores(validate=True)
    # the rich state's sessions: "gone" closed; "late" closed by an event whose pass has not run
    assert set(cores.policy.apps) == {"nea", "mal", "rig"}
    assert {"pa", "m1", "n2"} <= set(cores.policy.requests)
    again = json.loads(Snapshot.of(cores, "1-0", 0).state)
    if version == SCHEMA_VERSION:
        assert again == doc
    cores.tick(cores.now + 1.0)
    out = cores.tick(cores.now + 20_000.0)  # every walltime passes
    assert any(d.kind == "end" for d in out)
    assert all(r.end > cores.now for r in cores.policy.running())


def test_the_upgrades_run_in_order_from_the_snapshots_version():
    """The loader's upgrade path, exercised with a chain of toy versions (the schema has one version yet)."""
    seen: list[int] = []

    def step(v: int):
        def up(doc: dict) -> dict:
            assert doc["version"] == v - 1
            seen.append(v)
            return {**doc, "steps": [*doc.get("steps", []), v]}
        return up

    chain = {v: step(v) for v in (2, 3, 4)}
    assert schema.upgrade({"version": 2}, 2, chain, current=4) == {"version": 4, "steps": [3, 4]}
    assert seen == [3, 4]
    assert schema.upgrade({"version": 4}, 4, chain, current=4) == {"version": 4}


def _refused(state: str, fmt: str) -> str:
    with pytest.raises(SnapshotError) as e:
        Snapshot(state=state, last="1-0", format=fmt, events=0).cores()
    return str(e.value)


def test_what_cannot_be_loaded_is_refused_with_what_to_do():
    state = Snapshot.of(_rich_state().cores, "5-2", 99).state
    afresh = "redis-cli DEL coorm:policy:snapshot coorm:policy:events"
    newer = SCHEMA_VERSION + 1
    doc = json.loads(state)
    doc["version"] = newer
    why = _refused(json.dumps(doc), str(newer))
    assert f"schema version {newer}" in why and f"versions 1 to {SCHEMA_VERSION}" in why and "newer" in why
    assert afresh in why
    why = _refused("gASVxAAAAAAAAACMF2Nvb3JtLnNlcnZpY2VzLmNvdXBsZWQ=", "5")  # a pickle of CooRM before the schema
    assert "pickle (format 5)" in why and f"versions 1 to {SCHEMA_VERSION}" in why and afresh in why
    assert "unknown format 'x'" in _refused(state, "x")
    assert "unknown format '0'" in _refused(state, "0")
    cur, other = str(SCHEMA_VERSION), str(SCHEMA_VERSION + 1)  # (a snapshot of this version: no upgrade runs)
    assert "Invalid JSON" in _refused(state[:-1], cur)
    assert f"format says schema version {cur}, its state {other}" in _refused(
        state.replace(f'"version":{cur}', f'"version":{other}', 1), cur)
    assert "Input should be an object" in _refused("[1]", cur)
    broken = json.loads(state)
    broken["policy"]["requests"]["rows"][0][4] = "four"
    broken["policy"]["clusters"] = {"c0": 32}
    why = _refused(json.dumps(broken), cur)
    assert "damaged" in why and "policy.requests.rows.0.4" in why and "policy.clusters" in why and afresh in why
    broken = json.loads(state)
    broken["policy"]["requests"]["fields"][4] = "cores"
    assert "the request table's fields must be" in _refused(json.dumps(broken), cur)
    broken = json.loads(state)
    broken["policy"]["apps"][0]["requests"].append("nobody")
    assert "application nea names request 'nobody'" in _refused(json.dumps(broken), cur)
    broken = json.loads(state)
    broken["policy"]["now"] = "NaN"
    assert "policy.now" in _refused(json.dumps(broken), cur)
    broken = json.loads(state)
    broken["allocator"]["allocations"].append(["zz", ["c9n1"]])
    assert "unknown node(s) c9n1" in _refused(json.dumps(broken), cur)
    with pytest.raises(SnapshotError, match="damaged"):
        Snapshot.from_fields({"state": state})
    assert Snapshot.from_fields({}) is None
    assert Snapshot.from_fields({"state": "x", "last": "1-0", "format": "1", "events": "3"}).events == 3


def test_the_log_is_trimmed_after_the_snapshot_entry():
    assert after("1700000000000-0") == "1700000000000-1"
    assert after("5-41") == "5-42"


def test_a_fresh_cores_snapshot_loads():
    cores = Snapshot.of(CoupledCores(), "1-0", 0).cores()
    assert cores.policy.schedule is None and not cores.allocator.nodes
    assert cores.tick(1.0) == []  # nothing to do
    assert cores.handle(OpenSession(at=2.0, app="a"))[-1].kind == "pass"
