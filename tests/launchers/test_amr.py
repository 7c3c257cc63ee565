"""The AMR launcher (CooRMv2 §IV, §V-A1, §V-C): its decisions driven by hand, against an ideal RMS (where
it must agree with the model), and against the real policy and allocator cores."""

from __future__ import annotations

import heapq
import math

import pytest

from coorm.launchers import amr_model as m
from coorm.launchers.amr import AMRLauncher
from coorm.launchers.base import Close, ClusterProps, Done, Submit, Timer
from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared import events as ev
from coorm.shared.requests import Relation, RequestType

PRE, NP = RequestType.PRE_ALLOCATION, RequestType.NON_PREEMPTIBLE


def props(nodes: int = 5000) -> ClusterProps:
    return ClusterProps(nodes={"c0": nodes})


def ids(k: int, base: int = 0) -> tuple[str, ...]:
    return tuple(f"n{i}" for i in range(base, base + k))


def of(cmds, kind):
    return [c for c in cmds if isinstance(c, kind)]


def opened(**kw) -> tuple[AMRLauncher, Submit]:
    la = AMRLauncher("amr", "c0", **kw)
    (sub,) = la.on_open(0.0, props())
    return la, sub


def started(**kw) -> tuple[AMRLauncher, Timer]:
    """Opened and its first request started at t=1 on nodes n0..."""
    la, sub = opened(**kw)
    first = sub.requests[1]
    (timer,) = la.on_start(1.0, first.id, ids(first.nodes))
    return la, timer


def run_to_update(la: AMRLauncher, timer: Timer, grow: bool | None = None):
    """Fire step timers until the launcher sends an update (a growing or shrinking one if asked; one of
    the other direction is served at once). Returns the time, the commands and the nodes held before."""
    while la.step < la.steps:
        now, before = timer.at, la.nodes
        cmds = la.on_timer(now, timer.key)
        subs = of(cmds, Submit)
        if subs:
            if grow is None or (subs[0].requests[-1].nodes > len(before)) == grow:
                return now, cmds, before
            timer = finish_update(la, now, cmds)
        else:
            (timer,) = cmds
    raise AssertionError("no such update")


def finish_update(la: AMRLauncher, now: float, cmds) -> Timer:
    """Play the RMS of a spontaneous update served in the pass of its done: the old request ends, the
    successor starts with the nodes kept (and fresh ones when it grows)."""
    ((succ,),) = [c.requests for c in of(cmds, Submit)]
    (done,) = of(cmds, Done)
    kept = la.nodes[: succ.nodes]
    fresh = tuple(f"x{la.step}.{i}" for i in range(succ.nodes - len(kept)))
    out = la.on_end(now, done.request, "done") + la.on_start(now, succ.id, kept + fresh)
    return of(out, Timer)[-1]


# ======================================================================================================
# by hand
# ======================================================================================================
def test_open_sends_a_preallocation_of_n_eq_and_a_coallocated_first_request():
    la, sub = opened(seed=3)
    pa, first = sub.requests
    sizes = m.working_set(3)
    n_eq = m.equivalent_static_allocation(sizes, 0.75)
    assert la.n_eq == n_eq
    assert pa.type is PRE and pa.nodes == n_eq and pa.cluster == "c0"
    assert first.type is NP and first.related_to == pa.id and first.related_how is Relation.COALLOC
    assert first.nodes == min(m.nodes_for_efficiency(sizes[0], 0.75), n_eq)
    assert first.duration == pytest.approx(pa.duration - la.margin)
    plan = m.ideal_run(sizes, [min(n, n_eq) for n in m.dynamic_allocation(sizes, 0.75)])
    assert pa.duration >= 2 * plan.end  # room for the whole run and then some
    assert (pa.id, first.id) == ("amr.1", "amr.2")


def test_overcommit_scales_the_preallocation_and_the_cluster_caps_it():
    la, sub = opened(seed=3, overcommit=1.5)
    assert sub.requests[0].nodes == math.ceil(1.5 * la.n_eq)
    la = AMRLauncher("amr", "c0", seed=3, overcommit=1.1)
    assert la.on_open(0.0, props())[0].requests[0].nodes == math.ceil(1.1 * la.n_eq)  # no float surprise
    la = AMRLauncher("amr", "c0", seed=3, overcommit=3.0)
    (sub,) = la.on_open(0.0, props(2000))
    assert sub.requests[0].nodes == 2000


def test_above_0_8_it_preallocates_what_holds_the_peak():
    la, sub = opened(seed=0, target_efficiency=0.9)
    assert la.n_eq is None
    assert sub.requests[0].nodes == math.ceil(m.SMAX_MIB / m.MEM_PER_NODE_MIB)


def test_static_mode_asks_for_the_whole_preallocation_and_never_updates():
    la, sub = opened(seed=2, static=True, steps=40)
    pa, first = sub.requests
    assert first.nodes == pa.nodes
    (timer,) = la.on_start(1.0, first.id, ids(first.nodes))
    sizes = la.sizes
    assert timer.at == pytest.approx(1.0 + m.step_time(pa.nodes, sizes[0]))
    for _ in range(39):
        cmds = la.on_timer(timer.at, timer.key)
        assert not of(cmds, Submit) and not of(cmds, Done)
        (timer,) = cmds
    end = la.on_timer(timer.at, timer.key)
    assert end == [Done(first.id), Done(pa.id), Close()]
    assert la.finished and la.stats().steps_done == 40 and la.stats().updates == 0
    assert la.stats().end_time == pytest.approx(1.0 + m.static_run_time(pa.nodes, sizes))
    assert la.stats().node_seconds == pytest.approx(m.static_area(pa.nodes, sizes))


def test_a_step_takes_t_n_s_on_the_nodes_held():
    la, timer = started(seed=1)
    n = la.need(0)
    assert timer.at == pytest.approx(1.0 + m.step_time(n, la.sizes[0]))


def test_spontaneous_grow_shape():
    la, timer = started(seed=0)
    now, cmds, before = run_to_update(la, timer, grow=True)
    sub, done, step_timer = cmds
    (succ,) = sub.requests
    assert isinstance(sub, Submit) and isinstance(done, Done) and isinstance(step_timer, Timer)
    assert done.request == "amr.2" and done.released == ()
    assert succ.type is NP and succ.related_to == done.request and succ.related_how is Relation.NEXT
    assert succ.nodes == la.need(la.step) > len(before) and succ.nodes <= la.preallocation
    assert succ.duration == pytest.approx(la.pa_end - now - la.margin)
    # it keeps computing on what it has until the successor starts
    assert la.nodes == before
    assert step_timer.at == pytest.approx(now + m.step_time(len(before), la.sizes[la.step]))
    assert la.stats().updates == 1
    # the successor starts in the pass of the done: the step goes on faster from there
    fresh = tuple(f"y{i}" for i in range(succ.nodes - len(before)))
    out = la.on_end(now + 1.0, done.request, "done") + la.on_start(now + 1.0, succ.id, before + fresh)
    (resume,) = out
    left = 1 - 1.0 / m.step_time(len(before), la.sizes[la.step])
    assert resume.at == pytest.approx(now + 1.0 + left * m.step_time(succ.nodes, la.sizes[la.step]))
    assert la.held == succ.nodes and la.chain == []


def test_spontaneous_shrink_releases_its_last_node_ids_and_stops_using_them():
    la, timer = started(seed=0)
    now, cmds, before = run_to_update(la, timer, grow=False)
    sub, done, step_timer = cmds
    (succ,) = sub.requests
    assert succ.nodes < len(before) and succ.related_how is Relation.NEXT
    assert done.released == before[succ.nodes :]  # the last ones, among those it was given
    assert la.nodes == before[: succ.nodes] and la.held == succ.nodes
    assert step_timer.at == pytest.approx(now + m.step_time(succ.nodes, la.sizes[la.step]))


def test_announced_update_shape():
    la, timer = started(seed=0, announce_interval=120.0)
    now, cmds, before = run_to_update(la, timer)
    sub, done, step_timer = cmds
    bridge, target = sub.requests
    assert bridge.type is NP and bridge.nodes == len(before) and bridge.duration == 120.0
    assert bridge.related_to == done.request and bridge.related_how is Relation.NEXT
    assert target.type is NP and target.related_to == bridge.id and target.related_how is Relation.NEXT
    assert target.nodes == la.need(la.step) != len(before)  # the count needed when it was initiated
    assert target.duration == pytest.approx(la.pa_end - now - 120.0 - la.margin)
    assert done.released == () and la.nodes == before  # shrinking or not, it keeps its nodes meanwhile
    # the bridge starts at once with the same nodes, the target 120 s later
    la.on_end(now, done.request, "done")
    la.on_start(now, bridge.id, before)
    assert la.held == len(before) and la.chain == [target.id]
    assert la.on_end(now + 120.0, bridge.id, "next") == [] and la.held == 0
    out = la.on_start(now + 120.0, target.id, ids(target.nodes))
    assert la.held == target.nodes and la.chain == [] and of(out, Timer)


def test_no_second_update_while_one_is_in_flight():
    la, timer = started(seed=0, announce_interval=1e4)
    _, cmds, _ = run_to_update(la, timer)
    assert len(of(cmds, Submit)[0].requests) == 2
    (timer,) = of(cmds, Timer)
    for _ in range(30):
        cmds = la.on_timer(timer.at, timer.key)
        assert not of(cmds, Submit) and not of(cmds, Done)
        (timer,) = cmds
    assert la.stats().updates == 1


def test_a_late_successor_pauses_the_run_and_it_resumes_where_it_stopped():
    la, timer = started(seed=0)
    now, cmds, before = run_to_update(la, timer, grow=True)
    sub, done, step_timer = cmds
    (succ,) = sub.requests
    # the RMS could not start the successor in the same pass: the old request just ends
    assert la.on_end(now + 1.0, done.request, "done") == []
    assert la.held == 0 and la.current is None
    assert la.on_timer(step_timer.at, step_timer.key) == []  # its step timer is stale now
    done_before = la.progress
    assert 0 < done_before < 1
    out = la.on_start(now + 6.0, succ.id, ids(succ.nodes, 100))
    (resume,) = out
    rest = (1 - done_before) * m.step_time(succ.nodes, la.sizes[la.step])
    assert resume.at == pytest.approx(now + 6.0 + rest)
    assert la.stats().paused_seconds == pytest.approx(5.0)
    assert la.nodes == ids(succ.nodes, 100)


def test_stale_timers_are_ignored():
    la, timer = started(seed=0)
    now, cmds, _ = run_to_update(la, timer, grow=True)
    (step_timer,) = of(cmds, Timer)
    before = la.step
    newer = finish_update(la, now + 0.5, cmds)
    assert la.on_timer(step_timer.at, step_timer.key) == []
    assert la.step == before
    la.on_timer(newer.at, newer.key)
    assert la.step == before + 1


def test_end_of_run_cancels_a_waiting_update_then_gives_everything_back():
    la, timer = started(seed=0, steps=30, announce_interval=1e4)
    pa = la.pa
    now, cmds, before = run_to_update(la, timer)
    bridge, target = of(cmds, Submit)[0].requests
    old = of(cmds, Done)[0].request
    assert la.on_end(now, old, "done") == []
    (timer,) = la.on_start(now, bridge.id, before)
    for _ in range(30):
        cmds = la.on_timer(timer.at, timer.key)
        if la.finished:
            break
        (timer,) = cmds
    assert cmds == [Done(target.id), Done(bridge.id), Done(pa), Close()]
    assert la.stats().steps_done == 30


@pytest.mark.parametrize("reason", ["node_failure", "walltime", "container_ended"])
def test_a_request_ended_by_the_rms_fails_the_run(reason):
    la, timer = started(seed=0)
    cur = la.current
    cmds = la.on_end(5.0, cur, reason)
    assert cmds == [Done(la.pa), Close()]
    assert la.finished and la.stats().failed == f"{cur} ended: {reason}"


def test_a_killed_session_sends_nothing_more():
    la, timer = started(seed=0)
    assert la.on_end(5.0, la.current, "violation") == []
    assert la.finished and la.stats().failed.endswith("violation")


def test_preallocation_start_notified_on_its_own_sets_its_end():
    la, sub = opened(seed=0)
    pa, first = sub.requests
    assert la.on_start(2.0, pa.id, ()) == []
    la.on_start(3.0, first.id, ids(first.nodes))
    assert la.pa_end == pytest.approx(2.0 + pa.duration) and la.started_at == 3.0


# ======================================================================================================
# against an ideal RMS: every update served at once (or exactly the announce interval later)
# ======================================================================================================
class IdealRMS:
    """Starts what the launcher asks for when the protocol says it may start, gives fresh node IDs, and
    checks the launcher's commands: requests within the pre-allocation, only its own node IDs released,
    never two chain requests holding nodes at once."""

    def __init__(self, la: AMRLauncher, cluster: int = 5000) -> None:
        self.la = la
        self.free = list(ids(cluster))
        self.nodes: dict[str, list[str]] = {}
        self.specs: dict = {}
        self.events: list = []
        self.seq = 0
        self.pre = 0
        self.max_held = 0
        self.feed(0.0, la.on_open(0.0, ClusterProps(nodes={"c0": cluster})))

    def push(self, at, what, *args):
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, what, args))

    def take(self, k):
        got, self.free = self.free[:k], self.free[k:]
        return got

    def feed(self, now, cmds):
        for c in cmds:
            if isinstance(c, Timer):
                self.push(c.at, "timer", c.key)
            elif isinstance(c, Submit):
                for r in c.requests:
                    self.specs[r.id] = r
                    if r.type is PRE:
                        self.pre = r.nodes
                    else:
                        assert r.nodes <= self.pre
                    if r.related_how is Relation.COALLOC:
                        self.push(now, "start", r.id, None)
            elif isinstance(c, Done):
                spec = self.specs[c.request]
                if spec.type is PRE or c.request not in self.nodes:
                    continue
                mine = self.nodes.pop(c.request)
                assert set(c.released) <= set(mine)
                kept = [n for n in mine if n not in c.released]
                succ = next((s for s in self.specs.values() if s.related_to == c.request
                             and s.related_how is Relation.NEXT), None)
                self.free.extend(c.released)
                self.push(now, "handover", c.request, "done", succ.id if succ else None, kept)

    def run(self):
        while self.events and not self.la.finished:
            now, _, what, args = heapq.heappop(self.events)
            la = self.la
            if what == "timer":
                self.feed(now, la.on_timer(now, *args))
            elif what == "start":
                rid, kept = args
                spec = self.specs[rid]
                kept = list(kept or [])[: spec.nodes]
                nodes = kept + self.take(spec.nodes - len(kept))
                self.nodes[rid] = nodes
                self.max_held = max(self.max_held, sum(len(v) for v in self.nodes.values()))
                assert self.max_held <= self.pre
                self.feed(now, la.on_start(now, rid, tuple(nodes)))
                succ = next((s for s in self.specs.values() if s.related_to == rid
                             and s.related_how is Relation.NEXT), None)
                if succ is not None:  # an announced update's bridge: hand over at its end
                    self.push(now + spec.duration, "expire", rid, succ.id)
            elif what == "expire":
                rid, succ = args
                if rid in self.nodes:
                    kept = self.nodes.pop(rid)
                    self.push(now, "handover", rid, "next", succ, kept)
            elif what == "handover":
                rid, reason, succ, kept = args
                self.feed(now, la.on_end(now, rid, reason))
                if succ is not None and succ in la.waiting:
                    self.free.extend(kept[self.specs[succ].nodes :])
                    self.push(now, "start", succ, kept)
        return self.la.stats()


@pytest.mark.parametrize("seed,overcommit,interval", [(0, 1.0, 0.0), (5, 0.7, 0.0), (1, 2.0, 0.0),
                                                      (0, 1.0, 300.0), (3, 1.0, 45.0)])
def test_against_an_ideal_rms_the_launcher_is_the_model(seed, overcommit, interval):
    la = AMRLauncher("amr", "c0", seed=seed, overcommit=overcommit, announce_interval=interval, steps=300)
    rms = IdealRMS(la)
    stats = rms.run()
    assert la.finished and stats.failed is None and stats.steps_done == 300
    plan = la.planned_run()
    assert stats.end_time - stats.started_at == pytest.approx(plan.end, rel=1e-9)
    assert stats.node_seconds == pytest.approx(plan.area, rel=1e-9)
    assert stats.updates == plan.updates and stats.paused_seconds == 0
    assert rms.max_held <= la.preallocation
    assert la.running == {} and la.waiting == set()


# ======================================================================================================
# against the real cores
# ======================================================================================================
class Harness:
    """The launcher against CoupledCores: its commands become events, NodesAssigned become on_start,
    ends of started requests become on_end, and time advances through its timers and the cores'
    wake-ups."""

    def __init__(self, launcher: AMRLauncher, nodes: int, settings: PolicySettings | None = None) -> None:
        self.la = launcher
        self.cores = CoupledCores(settings or PolicySettings(reschedule_interval=1.0), validate=False)
        self.cores.register(0.0, "c0", [f"c0n{i}" for i in range(nodes)])
        self.nodes = nodes
        self.timers: list[tuple[float, str]] = []
        self.log: list = []
        self.now = 0.0

    def handle(self, event):
        out = self.cores.handle(event)
        self.log.extend(out)
        assert not [d for d in out if d.kind == "rejected"], out
        return out

    def feed(self, cmds):
        queue = list(cmds)
        app = self.la.app
        while queue:
            c = queue.pop(0)
            if isinstance(c, Timer):
                heapq.heappush(self.timers, (c.at, c.key))
                continue
            if isinstance(c, Submit):
                e = ev.Submit(at=self.now, app=app, requests=list(c.requests))
            elif isinstance(c, Done):
                e = ev.Done(at=self.now, app=app, request=c.request, released=c.released)
            else:
                e = ev.CloseSession(at=self.now, app=app)
            queue.extend(self.deliver(self.handle(e)))

    def deliver(self, decisions):
        out = []
        for d in decisions:
            if getattr(d, "app", None) != self.la.app or self.la.finished:
                continue
            if d.kind == "assigned":
                out += self.la.on_start(self.now, d.request, d.nodes)
            elif d.kind == "end" and d.started:
                out += self.la.on_end(self.now, d.request, d.reason.value)
        return out

    def run(self, until: float = 1e7):
        self.handle(ev.OpenSession(at=0.0, app=self.la.app))
        self.feed(self.la.on_open(0.0, ClusterProps(nodes={"c0": self.nodes})))
        while not self.la.finished and self.now < until:
            wake = self.cores.next_wakeup()
            t = self.timers[0][0] if self.timers else math.inf
            if wake is not None and wake <= t:
                self.now = max(wake, self.now)
                self.feed(self.deliver(self.handle(ev.Tick(at=self.now))))
            elif self.timers:
                at, key = heapq.heappop(self.timers)
                self.now = max(at, self.now)
                self.feed(self.la.on_timer(self.now, key))
            else:
                break
        return self.la.stats()

    def ends(self, app: str, reason: str):
        return [d for d in self.log if d.kind == "end" and d.app == app and d.reason.value == reason]


def _run(nodes, **kw):
    h = Harness(AMRLauncher("amr", "c0", steps=100, seed=1, **kw), nodes)
    return h, h.run()


def test_with_the_real_cores_dynamic_uses_less_area_than_static():
    overcommit = 2.0
    nodes = math.ceil(1400 * overcommit)
    dyn_h, dyn = _run(nodes, overcommit=overcommit)
    sta_h, sta = _run(nodes, overcommit=overcommit, static=True)
    for h, s in ((dyn_h, dyn), (sta_h, sta)):
        assert h.la.finished and s.failed is None and s.steps_done == 100
        assert not h.ends("amr", "violation") and not h.ends("amr", "walltime")
        assert not [d for d in h.log if d.kind == "session_ended" and d.reason != "closed"]
        assert h.cores.policy.apps == {}  # closed; everything given back
        assert h.cores.allocator.free_count("c0") == nodes
    assert dyn.updates > 10 and sta.updates == 0
    assert dyn.node_seconds < 0.85 * sta.node_seconds
    # the RMS serves every update inside the pre-allocation within a pass: close to the ideal run
    plan = dyn_h.la.planned_run()
    assert dyn.end_time - dyn.started_at == pytest.approx(plan.end, rel=0.05)
    assert dyn.paused_seconds == 0
    held = [d.nodes for d in dyn_h.log if d.kind == "start" and d.app == "amr" and d.type is NP]
    assert max(held) <= dyn.preallocation


def test_with_the_real_cores_announced_updates_are_served_an_interval_later():
    h, s = _run(1400, announce_interval=200.0)
    assert h.la.finished and s.failed is None and s.steps_done == 100
    hand_overs = h.ends("amr", "next")
    assert len(hand_overs) == s.updates > 0  # every bridge handed its nodes over at its end
    plan = h.la.planned_run()
    assert s.end_time - s.started_at == pytest.approx(plan.end, rel=0.05)


def test_with_the_real_cores_a_grow_blocked_by_a_preemptible_holder_keeps_the_old_nodes():
    """A malleable application fills the pre-allocation's idle nodes and never gives them back: the
    AMR's first grow cannot start in the pass of its done; the RMS keeps the AMR's current request
    running (the update's done takes effect when the successor takes its nodes over), so the AMR never
    pauses; the holder is killed at the end of the preemption grace."""
    settings = PolicySettings(reschedule_interval=1.0, preempt_grace=5.0)
    la = AMRLauncher("amr", "c0", steps=60, seed=1)
    h = Harness(la, 1400, settings)
    h.handle(ev.OpenSession(at=0.0, app="hog"))
    h.handle(ev.Submit(at=0.0, app="hog", requests=[
        dict(id="hog.1", type="preemptible", cluster="c0", nodes=1400 - 600)]))
    s = h.run()
    assert la.finished and s.failed is None and s.steps_done == 60
    assert h.ends("hog", "violation")
    assert not h.ends("amr", "violation")
    assert s.paused_seconds == 0.0
