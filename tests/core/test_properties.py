"""Property tests of the scheduling cores (DESIGN §4 "Invariants every change keeps").

Random event sequences go through the real policy core and node allocator, wired together by
:class:`coorm.services.coupled.CoupledCores` with ``validate=True`` (the cores check their own invariants after
every event). Sequences are built one event at a time from the cores' current state, so that most
commands are valid: sessions open and close; applications submit every request type with FREE, COALLOC
and NEXT relations, malleable pairs, spontaneous and announced updates; they finish requests early
(releasing node IDs the allocator gave them), cancel waiting ones, comply (or not) with preemption
deadlines; nodes go down and come back; time advances by small steps or to the cores' next wake-up. A
few deliberately bad commands are mixed in.

A :class:`Monitor` watches every event and checks, after EVERY event:

* inv. 1 -- no node ID is held by two started requests; allocated <= up nodes per cluster; the policy's
  and the allocator's ideas of who holds nodes agree; the allocator never raises ``AllocationError``;
* inv. 2 -- a started non-preemptible request ends only by done, walltime / NEXT hand-over, node failure,
  violation, session close or its pre-allocation ending, and every end reason is backed by the event
  that justifies it (a ``done`` at that time, the planned end, a lost node, a ``PreemptionDeadline``
  already past, ...); nothing starts twice or after its end;
* the nodes the policy keeps occupied for fair-start are the node IDs the allocator holds;
* after a pass, every waiting request's start time is >= now (or infinity);
* a bad command gets an error reply (DESIGN §5).

The properties that need a comparison or a probe (inv. 3 to 6) have their own tests below. On failure
the shrunk event sequence is printed as Python (see ``repro``) so that it can be replayed by hand.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from hypothesis import event, given, note
from hypothesis import strategies as st

from coorm.services.coupled import CoupledCores
from coorm.services.node_allocator.core import ALLOCATED, DOWN, AllocationError
from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.state import RequestState
from coorm.shared.events import (
    Accepted,
    CloseSession,
    Done,
    EndReason,
    EndRequest,
    NodeDown,
    NodesAssigned,
    OpenSession,
    PassDone,
    PreemptionDeadline,
    RegisterNodes,
    Rejected,
    SessionEnded,
    StartRequest,
    Submit,
    Tick,
)
from coorm.shared.requests import Relation, RequestSpec, RequestType

INF = math.inf
EPS = 1e-9
NP = RequestType.NON_PREEMPTIBLE
PRE = RequestType.PREEMPTIBLE
PA = RequestType.PRE_ALLOCATION
STARTED = RequestState.STARTED
WAITING = RequestState.WAITING

DURATIONS = (1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 30.0, 60.0)
STEPS = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)
MAX_APPS = 6

# DESIGN §4: "a started non-preemptible request ends only by done, walltime, node failure or violation"
# (plus the NEXT hand-over at its walltime, its session closing and its pre-allocation ending).
NP_END_REASONS = {
    EndReason.DONE,
    EndReason.WALLTIME,
    EndReason.NEXT,
    EndReason.NODE_FAILURE,
    EndReason.VIOLATION,
    EndReason.SESSION_CLOSED,
    EndReason.CONTAINER_ENDED,
}

# (op, weight); the first one is what hypothesis shrinks towards
OPS = (
    ("wake", 6),
    ("tick", 5),
    ("open", 3),
    ("submit", 8),
    ("coalloc", 3),
    ("next", 3),
    ("spontaneous", 3),
    ("announced", 2),
    ("malleable", 2),
    ("done", 4),
    ("cancel", 2),
    ("comply", 2),
    ("close", 1),
    ("down", 2),
    ("up", 2),
    ("bad", 1),
)
OP_CHOICES = tuple(name for name, w in OPS for _ in range(w))

settings_st = st.builds(
    PolicySettings,
    fair_start=st.sampled_from([0.0, 2.0, 5.0]),
    reschedule_interval=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    preempt_grace=st.sampled_from([0.0, 1.0, 5.0]),
    preemptible=st.sampled_from(["filling", "strict", "fpsma", "egs"]),
    precedence=st.sampled_from(["waiting", "running"]),
    local_threshold=st.sampled_from([0, 0, 1, 3]),
)
sizes_st = st.lists(st.integers(2, 16), min_size=1, max_size=3)


# ================================================================================================
# the monitor: checks after every event
# ================================================================================================
class Monitor:
    """Follows the decisions of one :class:`CoupledCores` and checks the safety invariants after every
    event. It keeps its own record of what started and ended, built from the decisions only, so that a
    decision that contradicts an earlier one is caught."""

    def __init__(self, cores: CoupledCores) -> None:
        self.cores = cores
        self.index = 0  # events seen so far
        self.starts: dict[str, StartRequest] = {}
        self.start_index: dict[str, int] = {}
        self.ends: dict[str, EndRequest] = {}
        self.container: dict[str, str | None] = {}  # started request -> its pre-allocation ("?" unknown)
        self.done_at: dict[str, list[float]] = defaultdict(list)
        self.closed_at: dict[str, float] = {}
        self.deadlines: dict[str, list[float]] = defaultdict(list)  # app -> deadlines it was told
        self.lost_at: dict[str, list[float]] = defaultdict(list)  # request -> times one of its nodes died
        self.last_down: dict[str, int] = {}  # cluster -> index of the last event that took an up node down

    # -- around each event ---------------------------------------------------------------------------
    def before(self, ev) -> None:
        if isinstance(ev, NodeDown):
            node = self.cores.allocator.nodes.get(ev.node)
            if node is not None and node.state != DOWN:
                self.last_down[node.cluster] = self.index
                if node.state == ALLOCATED:
                    self.lost_at[node.owner].append(max(ev.at, self.cores.now))

    def after(self, ev, out: list) -> None:
        now = self.cores.now
        accepted = any(isinstance(d, Accepted) and d.stimulus_id == ev.stimulus_id for d in out)
        if isinstance(ev, Done) and accepted:
            self.done_at[ev.request].append(now)
        if isinstance(ev, CloseSession) and accepted:
            self.closed_at[ev.app] = now
        for d in out:
            if isinstance(d, PreemptionDeadline):
                self.deadlines[d.app].append(d.deadline)
        carried = {d.carry_from: d for d in out if isinstance(d, StartRequest) and d.carry_from}
        sessions_ended = {d.app: d.reason for d in out if isinstance(d, SessionEnded)}
        for d in out:
            if isinstance(d, StartRequest):
                self._on_start(d, now)
            elif isinstance(d, EndRequest):
                self._on_end(d, now, carried, sessions_ended)
            elif isinstance(d, NodesAssigned):
                s = self.starts.get(d.request)
                assert s is not None, f"nodes assigned to {d.request}, which the policy did not start"
                assert len(d.nodes) == s.nodes, (
                    f"{d.request} asked for {s.nodes} nodes and was given {len(d.nodes)}: {d.nodes}"
                )
        self.check_no_node_held_twice()
        self.check_allocated_at_most_up()
        self.check_policy_and_allocator_agree()
        self.check_fair_start_holds_agree(now)
        if any(isinstance(d, PassDone) for d in out):
            self.check_waiting_starts_not_in_past(now)
        self.index += 1

    # -- decisions -----------------------------------------------------------------------------------
    def _on_start(self, d: StartRequest, now: float) -> None:
        rid = d.request
        assert rid not in self.starts, f"request {rid} started twice (at {self.starts[rid].at} and {d.at})"
        assert rid not in self.ends, (
            f"request {rid} started at {d.at} after its EndRequest ({self.ends[rid].reason.value} at "
            f"{self.ends[rid].at}): the allocator now gives node IDs to a request the policy has ended"
        )
        assert abs(d.at - now) <= EPS, f"request {rid} started at {d.at}, but now is {now}"
        if d.carry_from is not None:
            pred = self.ends.get(d.carry_from)
            assert pred is not None and pred.successor == rid, (
                f"NEXT hand-over: {rid} keeps nodes of {d.carry_from}, whose end "
                f"({pred and pred.reason.value}) does not name it as successor"
            )
        self.starts[rid] = d
        self.start_index[rid] = self.index
        r = self.cores.policy.requests.get(rid)  # "?": started and ended within this very event
        self.container[rid] = r.container if r is not None else "?"

    def _on_end(self, d: EndRequest, now: float, carried: dict, sessions_ended: dict) -> None:
        rid = d.request
        assert rid not in self.ends, (
            f"request {rid} ended twice ({self.ends[rid].reason.value}, {d.reason.value})"
        )
        was_started = rid in self.starts
        assert d.started == was_started, (
            f"EndRequest of {rid} ({d.reason.value} at {d.at}) says started={d.started}, but its "
            f"StartRequest was {'seen' if was_started else 'never seen before it'}"
        )
        self.ends[rid] = d
        if not was_started:
            assert d.reason is EndReason.CANCELLED, f"{rid} never started but ended as {d.reason.value}"
            return
        s = self.starts[rid]
        if s.type is NP:
            # inv. 2, literally
            assert d.reason in NP_END_REASONS, (
                f"inv2: started non-preemptible request {rid} ended by {d.reason.value} (preempted?)"
            )
        assert s.at - EPS <= d.at <= now + EPS, f"{rid} started at {s.at}, ended at {d.at}, now {now}"
        # every end reason must be backed by what happened (inv. 2: "ends only by ...")
        reason, app, at = d.reason, d.app, d.at
        if reason is EndReason.DONE:
            assert any(abs(t - at) <= EPS for t in self.done_at[rid]), (
                f"{rid} ended as 'done' at {at} without an accepted done from {app} then"
            )
        elif reason is EndReason.WALLTIME:
            assert s.end is not None and abs(at - s.end) <= EPS, (
                f"{rid} ended by walltime at {at}, but its planned end is {s.end}"
            )
        elif reason is EndReason.NEXT:
            assert rid in carried and s.end is not None and abs(at - s.end) <= EPS, (
                f"{rid} ended as 'next' at {at} (planned end {s.end}) without its successor starting now"
            )
        elif reason is EndReason.NODE_FAILURE:
            assert any(abs(t - at) <= EPS for t in self.lost_at[rid]), (
                f"{rid} ended by node failure at {at}, but none of its nodes went down then"
            )
        elif reason is EndReason.VIOLATION:
            told = self.deadlines.get(app, [])
            assert any(dl <= at + EPS for dl in told), (
                f"inv2: {rid} of {app} killed for a violation at {at}, but {app} was never given a "
                f"PreemptionDeadline that had passed (deadlines told: {told})"
            )
            assert app in sessions_ended, f"{app} was killed for a violation but its session did not end"
        elif reason is EndReason.SESSION_CLOSED:
            assert self.closed_at.get(app) is not None and abs(self.closed_at[app] - at) <= EPS, (
                f"{rid} ended as session_closed at {at}, but {app} did not close then"
            )
        elif reason is EndReason.CONTAINER_ENDED:
            cont = self.container.get(rid)
            assert cont is not None, f"{rid} ended with its pre-allocation, but it ran inside none"
            if cont != "?":
                assert cont in self.ends and abs(self.ends[cont].at - at) <= EPS, (
                    f"{rid} ended with its pre-allocation {cont} at {at}, which did not end then"
                )
            else:  # it started in this very event: some pre-allocation of its own must have just ended
                assert any(
                    e.type is PA and e.app == app and e.cluster == d.cluster and abs(e.at - at) <= EPS
                    for e in self.ends.values()
                ), f"{rid} ended with its pre-allocation at {at}, but no pre-allocation of {app} ended then"
        else:
            raise AssertionError(f"started request {rid} ended as {reason.value}")

    # -- state ---------------------------------------------------------------------------------------
    def check_no_node_held_twice(self) -> None:
        """inv. 1: no node ID is held by two started requests."""
        al = self.cores.allocator
        owner: dict[str, str] = {}
        for rid, nodes in al.allocations.items():
            for n in nodes:
                assert n not in owner, f"inv1: node {n} is held by both {owner[n]} and {rid}"
                owner[n] = rid
                assert al.nodes[n].state != DOWN, f"inv1: node {n} is down but still allocated to {rid}"

    def check_allocated_at_most_up(self) -> None:
        """inv. 1: allocated <= up nodes, per cluster (and both cores agree on how many are up)."""
        al, pol = self.cores.allocator, self.cores.policy
        allocated: Counter = Counter()
        for nodes in al.allocations.values():
            for n in nodes:
                allocated[al.nodes[n].cluster] += 1
        for c in set(pol.clusters) | set(allocated):
            up = al.up(c)
            assert allocated[c] <= up, f"inv1: cluster {c} has {allocated[c]} nodes allocated, {up} up"
            assert pol.clusters.get(c) == up, (
                f"cluster {c}: policy counts {pol.clusters.get(c)} up, allocator {up}"
            )

    def check_policy_and_allocator_agree(self) -> None:
        """Every started request (other than a pre-allocation) holds exactly its number of node IDs, of its
        cluster; the allocator holds node IDs only for such requests, or for ones whose end the policy has
        decided but not yet published (coalesced until the next pass)."""
        al, pol = self.cores.allocator, self.cores.policy
        for r in pol.requests.values():
            if r.state is STARTED and not r.is_preallocation:
                got = al.allocations.get(r.id)
                assert got is not None and len(got) == r.nodes, (
                    f"started request {r.id} should hold {r.nodes} nodes, the allocator gives it {got}"
                )
                assert all(al.nodes[n].cluster == r.cluster for n in got), (
                    f"{r.id} holds nodes of another cluster"
                )
        for rid, nodes in al.allocations.items():
            r = pol.requests.get(rid)
            live = r is not None and r.state is STARTED
            # (a session closed meanwhile: the policy forgot its ended ids, the end waits in the pass's queue)
            pending_end = (rid in pol.ended and rid not in self.ends) or any(p.id == rid for p in pol._pending_ends)
            assert live or pending_end, (
                f"the allocator still gives {nodes} to {rid}, which the policy has ended "
                f"({pol.ended.get(rid)}): those nodes are leaked"
            )

    def check_fair_start_holds_agree(self, now: float) -> None:
        """Nodes the policy keeps physically occupied for fair-start are the node IDs the allocator holds
        (DESIGN §2: the allocator keeps "nodes freed by an early done ... held until the fair-start hold
        the policy decided ends"); an end not yet published may still have them allocated."""
        al, pol = self.cores.allocator, self.cores.policy
        held: Counter = Counter(n.cluster for n in al.nodes.values() if n.state == "held")
        pending: Counter = Counter()
        for rid, nodes in al.allocations.items():
            if rid not in pol.requests:
                for n in nodes:
                    pending[al.nodes[n].cluster] += 1
        policy: Counter = Counter()
        for h in pol.holds:
            if h.physical and h.until > now:
                policy[h.cluster] += h.nodes
        # holds ended early: the allocator hears of it with the next pass, and may hold them until then
        released: Counter = Counter()
        for h in pol.released_holds:
            if h.until > now:
                released[h.cluster] += h.nodes
        for c in set(held) | set(policy):
            assert held[c] <= policy[c] + released[c] and policy[c] <= held[c] + pending[c], (
                f"cluster {c}: the policy holds {policy[c]} nodes for fair-start, the allocator holds "
                f"{held[c]} (and {pending[c]} more are still allocated to requests whose end is pending)"
            )

    def check_waiting_starts_not_in_past(self, now: float) -> None:
        for r in self.cores.policy.requests.values():
            if r.state is WAITING:
                assert r.start >= now - EPS, f"after the pass at {now}, waiting {r.id} has start {r.start}"


# ================================================================================================
# the driver: builds valid-looking random events from the current state and feeds them
# ================================================================================================
class Driver:
    def __init__(
        self, data, settings: PolicySettings, sizes: list[int], register: bool = True, apps: int = 0,
        defer: bool = False,
    ) -> None:
        self.data = data
        self.defer = defer  # let random events arrive batched with the next (the pass after the batch)
        self.passes_now: list[bool] = []
        self.settings = settings
        self.cores = CoupledCores(settings, validate=True)
        self.monitor = Monitor(self.cores)
        self.nodes = {f"c{i}": [f"c{i}n{j}" for j in range(n)] for i, n in enumerate(sizes)}
        self.events: list = []
        self.outs: list[list] = []
        self.t = 0.0
        self.max_step = INF  # the longest time step a random operation may take
        self.probes = 0  # view probes checked (inv. 5)
        self._req = 0
        self._app = 0
        if register:
            for c, nodes in self.nodes.items():
                self.feed(RegisterNodes(at=0.0, cluster=c, nodes=tuple(nodes)))
        for _ in range(apps):
            self.open()

    @classmethod
    def replay(cls, events: list, settings: PolicySettings, passes_now: list[bool] | None = None) -> Driver:
        d = cls(None, settings, [], register=False)
        for i, ev in enumerate(events):
            d.feed(ev, pass_now=True if passes_now is None else passes_now[i])
        return d

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def policy(self):
        return self.cores.policy

    def feed(self, ev, pass_now: bool | None = None) -> list:
        if pass_now is None:
            pass_now = not (self.defer and self.data is not None and self.draw(st.booleans()))
        self.monitor.before(ev)
        self.events.append(ev)
        self.passes_now.append(pass_now)
        try:
            out = self.cores.handle(ev, pass_now=pass_now)
        except AllocationError as e:  # inv. 1: the allocator never has to refuse the policy
            raise AssertionError(f"inv1: the allocator raised AllocationError on {_fmt(ev)}: {e}") from e
        self.outs.append(out)
        self.t = max(self.t, self.cores.now)
        self.monitor.after(ev, out)
        return out

    def draw(self, strategy):
        return self.data.draw(strategy)

    def pick(self, seq):
        seq = list(seq)
        return seq[0] if len(seq) == 1 else self.draw(st.sampled_from(seq))

    def new_id(self) -> str:
        self._req += 1
        return f"r{self._req}"

    def apps(self) -> list[str]:
        return [a.id for a in self.policy.priority_order()]

    def live(self, app: str, state=None, types=None) -> list:
        a = self.policy.apps.get(app)
        if a is None:
            return []
        return [
            r
            for r in a.requests.values()
            if (state is None or r.state is state) and (types is None or r.type in types)
        ]

    def size(self, cluster: str) -> int:
        return len(self.nodes[cluster])

    def tick(self, at: float) -> list:
        return self.feed(Tick(at=max(at, self.t)))

    def wake(self, limit: float = 200.0) -> list:
        w = self.cores.next_wakeup()
        if w is None or w > self.t + min(limit, self.max_step):
            return self.tick(self.t + 1.0)
        return self.tick(max(w, self.t))

    def submit(self, app: str, specs: list[RequestSpec]) -> list:
        return self.feed(Submit(at=self.t, app=app, requests=specs))

    def open(self, prefix: str = "a") -> str:
        self._app += 1
        app = f"{prefix}{self._app}"
        self.feed(OpenSession(at=self.t, app=app))
        return app

    # -- request builders ----------------------------------------------------------------------------
    def nodes_for(self, cluster: str) -> int:
        return self.draw(st.integers(1, self.size(cluster) + 1))

    def duration_for(self, rtype: RequestType) -> float | None:
        if rtype is PRE and self.draw(st.booleans()):
            return None
        return self.pick(DURATIONS)

    def spec(
        self, rtype=None, cluster=None, nodes=None, duration=0.0, to=None, how=Relation.FREE
    ) -> RequestSpec:
        rtype = rtype or self.pick([NP, NP, PA, PRE])
        cluster = cluster or self.pick(self.nodes)
        nodes = nodes or self.nodes_for(cluster)
        if duration == 0.0:
            duration = self.duration_for(rtype)
        return RequestSpec(
            id=self.new_id(),
            type=rtype,
            cluster=cluster,
            nodes=nodes,
            duration=duration,
            related_to=to,
            related_how=how,
        )

    def random_batch(self, app: str) -> list[RequestSpec]:
        """One batch an application might send: FREE, COALLOC / NEXT to its own requests, a
        multi-cluster COALLOC group, a malleable pair."""
        kind = self.pick(["free", "free", "coalloc", "next", "group", "malleable"])
        mine = self.live(app)
        if kind == "coalloc" and mine:
            target = self.pick(mine)
            rtype = PRE if target.preemptible else self.pick([NP, PA, PRE])
            return [self.spec(rtype, to=target.id, how=Relation.COALLOC)]
        chain = [r for r in mine if r.successor is None]
        if kind == "next" and chain:
            target = self.pick(chain)
            return [self.spec(target.type, target.cluster, to=target.id, how=Relation.NEXT)]
        if kind == "group":
            first = self.spec(self.pick([NP, PA]))
            return [first, self.spec(first.type, to=first.id, how=Relation.COALLOC)]
        if kind == "malleable":
            r_min = self.spec(NP)
            return [r_min, self.spec(PRE, r_min.cluster, to=r_min.id, how=Relation.COALLOC)]
        return [self.spec()]

    def released_of(self, r) -> tuple[str, ...]:
        if r.is_preallocation or not self.draw(st.booleans()):
            return ()
        held = self.cores.allocator.nodes_of(r.id)
        if not held:
            return ()
        return tuple(sorted(self.draw(st.sets(st.sampled_from(held), max_size=len(held)))))

    # -- the random walk -----------------------------------------------------------------------------
    def run(self, steps: int, extra: dict | None = None) -> None:
        """``steps`` random operations; ``extra`` maps an operation name to (weight, callable)."""
        choices = OP_CHOICES
        if extra:
            choices = choices + tuple(name for name, (w, _) in extra.items() for _ in range(w))
        for _ in range(steps):
            op = self.pick(choices)
            if extra and op in extra:
                extra[op][1](self)
            else:
                getattr(self, "op_" + op)()

    def op_wake(self) -> None:
        self.wake()

    def op_tick(self) -> None:
        self.tick(self.t + self.pick([s for s in STEPS if s <= self.max_step]))

    def op_open(self) -> None:
        if len(self.policy.apps) < MAX_APPS:
            self.open()
        else:
            self.op_wake()

    def _app_or_open(self) -> str:
        apps = self.apps()
        if not apps:
            return self.open()
        return self.pick(apps)

    def op_submit(self) -> None:
        app = self._app_or_open()
        self.submit(app, [self.spec()])

    def op_coalloc(self) -> None:
        app = self._app_or_open()
        mine = self.live(app)
        if mine and self.draw(st.booleans()):
            target = self.pick(mine)
            rtype = PRE if target.preemptible else self.pick([NP, PA, PRE])
            self.submit(app, [self.spec(rtype, to=target.id, how=Relation.COALLOC)])
        else:  # a multi-cluster COALLOC group
            first = self.spec(self.pick([NP, PA, PRE]))
            second = self.spec(first.type, to=first.id, how=Relation.COALLOC)
            self.submit(app, [first, second])

    def op_next(self) -> None:
        app = self._app_or_open()
        chain = [r for r in self.live(app) if r.successor is None]
        if not chain:
            return self.op_submit()
        target = self.pick(chain)
        self.submit(app, [self.spec(target.type, target.cluster, to=target.id, how=Relation.NEXT)])

    def _started_anywhere(self, types=None) -> list:
        return [r for app in self.apps() for r in self.live(app, STARTED, types) if r.successor is None]

    def op_spontaneous(self) -> None:
        """request(n', NEXT current) then done(current), releasing some of its node IDs."""
        running = self._started_anywhere()
        if not running:
            return self.op_submit()
        cur = self.pick(running)
        self.submit(cur.app, [self.spec(cur.type, cur.cluster, to=cur.id, how=Relation.NEXT)])
        self.feed(Done(at=self.t, app=cur.app, request=cur.id, released=self.released_of(cur)))

    def op_announced(self) -> None:
        """request(n_current, delta, NEXT current), request(n', NEXT that), done(current)."""
        running = self._started_anywhere((NP, PA))
        if not running:
            return self.op_submit()
        cur = self.pick(running)
        bridge = self.spec(
            cur.type, cur.cluster, cur.nodes, self.pick(DURATIONS), to=cur.id, how=Relation.NEXT
        )
        after = self.spec(cur.type, cur.cluster, to=bridge.id, how=Relation.NEXT)
        self.submit(cur.app, [bridge, after])
        self.feed(Done(at=self.t, app=cur.app, request=cur.id))

    def op_malleable(self) -> None:
        app = self._app_or_open()
        r_min = self.spec(NP)
        self.submit(app, [r_min, self.spec(PRE, r_min.cluster, to=r_min.id, how=Relation.COALLOC)])

    def op_done(self) -> None:
        running = [r for app in self.apps() for r in self.live(app, STARTED)]
        if not running:
            return self.op_wake()
        r = self.pick(running)
        self.feed(Done(at=self.t, app=r.app, request=r.id, released=self.released_of(r)))

    def op_cancel(self) -> None:
        waiting = [r for app in self.apps() for r in self.live(app, WAITING)]
        if not waiting:
            return self.op_wake()
        r = self.pick(waiting)
        self.feed(Done(at=self.t, app=r.app, request=r.id))

    def comply(self, app: str, cluster: str, allowed: int) -> list:
        """What a well-behaved malleable launcher does when its preemptive view drops: release (done on
        its preemptible requests there, largest first, until it holds no more than allowed)."""
        held = sorted(self.live(app, STARTED, (PRE,)), key=lambda r: -r.nodes)
        total = sum(r.nodes for r in held if r.cluster == cluster)
        out: list = []
        for r in held:
            if total <= allowed:
                break
            if r.cluster == cluster:
                total -= r.nodes
                out.extend(self.feed(Done(at=self.t, app=app, request=r.id)))
        return out

    def op_comply(self) -> None:
        told = [(a, c) for a in self.apps() for c in self.policy.apps[a].deadlines]
        if not told:
            return self.op_wake()
        app, cluster = self.pick(told)
        self.comply(app, cluster, 0 if self.draw(st.booleans()) else self.size(cluster) // 2)

    def op_close(self) -> None:
        apps = self.apps()
        if not apps:
            return self.op_wake()
        self.feed(CloseSession(at=self.t, app=self.pick(apps)))

    def op_down(self) -> None:
        al = self.cores.allocator
        up = [n for ns in self.nodes.values() for n in ns if al.nodes[n].state != DOWN]
        if not up:
            return self.op_wake()
        self.feed(NodeDown(at=self.t, node=self.pick(up)))

    def op_up(self) -> None:
        al = self.cores.allocator
        down = [(c, n) for c, ns in self.nodes.items() for n in ns if al.nodes[n].state == DOWN]
        if not down:
            return self.op_wake()
        c, n = self.pick(down)
        self.feed(RegisterNodes(at=self.t, cluster=c, nodes=(n,)))

    def op_bad(self) -> None:
        """A command the RMS must refuse (with an error reply)."""
        apps = self.apps()
        if not apps:
            return self.op_wake()
        app = self.pick(apps)
        mine = self.live(app)
        others = [r for a in apps if a != app for r in self.live(a)]
        ended = [rid for rid, (owner, _, _) in self.policy.ended.items() if owner == app]
        kinds = ["unknown_request", "unknown_cluster", "unknown_app"]
        kinds += ["not_yours"] if others else []
        kinds += ["ended", "duplicate"] if ended else []
        kinds += ["next_mismatch"] if [r for r in mine if r.successor is None] else []
        kinds += ["coalloc_preemptible"] if [r for r in mine if r.preemptible] else []
        kinds += (
            ["foreign_release"]
            if self.live(app, STARTED, (NP, PRE)) and self.cores.allocator.allocations
            else []
        )
        kind = self.pick(kinds)
        t = self.t
        if kind == "unknown_request":
            ev = Done(at=t, app=app, request="nosuch")
        elif kind == "unknown_cluster":
            ev = Submit(
                at=t,
                app=app,
                requests=[RequestSpec(id=self.new_id(), cluster="nowhere", nodes=1, duration=1)],
            )
        elif kind == "unknown_app":
            ev = CloseSession(at=t, app="ghost")
        elif kind == "not_yours":
            ev = Done(at=t, app=app, request=self.pick(others).id)
        elif kind == "ended":
            ev = Done(at=t, app=app, request=self.pick(ended))
        elif kind == "duplicate":
            dup = RequestSpec(id=self.pick(ended), cluster=self.pick(self.nodes), nodes=1, duration=1)
            ev = Submit(at=t, app=app, requests=[dup])
        elif kind == "next_mismatch":
            target = self.pick([r for r in mine if r.successor is None])
            other = PRE if target.type is NP else NP
            ev = Submit(
                at=t, app=app, requests=[self.spec(other, target.cluster, to=target.id, how=Relation.NEXT)]
            )
        elif kind == "coalloc_preemptible":
            target = self.pick([r for r in mine if r.preemptible])
            ev = Submit(at=t, app=app, requests=[self.spec(NP, to=target.id, how=Relation.COALLOC)])
        else:  # foreign_release: name a node ID the request does not hold
            r = self.pick(self.live(app, STARTED, (NP, PRE)))
            mine_nodes = set(self.cores.allocator.nodes_of(r.id))
            foreign = [n for ns in self.nodes.values() for n in ns if n not in mine_nodes]
            if not foreign:
                return self.op_wake()
            ev = Done(at=t, app=app, request=r.id, released=(self.pick(foreign),))
        out = self.feed(ev)
        assert out and isinstance(out[0], Rejected), (
            f"bad command {kind} was not refused: {ev!r} -> {out[:1]}"
        )


# ================================================================================================
# helpers
# ================================================================================================
def _fmt(ev) -> str:
    fields = ev.model_dump(mode="json", exclude={"stimulus_id", "kind"}, exclude_defaults=True)
    if isinstance(ev, Submit):
        fields["requests"] = [
            r.model_dump(mode="json", exclude_defaults=True) | {"cluster": r.cluster, "nodes": r.nodes}
            for r in ev.requests
        ]
    if "at" not in fields:
        fields["at"] = 0.0
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return f"{type(ev).__name__}({args})"


def repro(settings: PolicySettings, events: list, passes_now: list[bool] | None = None) -> str:
    lines = [f"cores = CoupledCores(PolicySettings(**{settings.model_dump()!r}), validate=True)"]
    flags = passes_now or [True] * len(events)
    lines += [f"cores.handle({_fmt(ev)}{'' if now else ', pass_now=False'})"
              for ev, now in zip(events, flags, strict=True)]
    return "\n".join(lines)


class explain:
    """On failure, attach the event sequence (as Python) to hypothesis' report of the shrunk example."""

    def __init__(self, settings: PolicySettings, *drivers: Driver) -> None:
        self.settings = settings
        self.drivers = drivers

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.drivers:
            d0 = self.drivers[0]
            note("events fed (reproduction):\n" + repro(self.settings, d0.events, d0.passes_now))
            for i, d in enumerate(self.drivers[1:], 1):
                note(f"events fed to copy {i}:\n" + repro(self.settings, d.events, d.passes_now))
        return False


def steps_st(low: int = 1, high: int = 30):
    return st.integers(low, high)


# ================================================================================================
# inv. 1 and 2 (and the rest of the monitor): after every event of random runs
# ================================================================================================
@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_safety_invariants_hold_after_every_event(data, settings, sizes, steps):
    """inv. 1 (node exclusivity, allocated <= up, policy/allocator agreement, no AllocationError) and
    inv. 2 (non-preemptible requests end only by done, walltime/NEXT, node failure, violation after a
    deadline, session close or their pre-allocation ending), waiting starts >= now after a pass;
    checked by the monitor after every event."""
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(0, 3)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps)
        # let time run out so that every timer fires and its decisions are checked too
        for _ in range(10):
            if drv.cores.next_wakeup() is None:
                break
            drv.wake()
    event(
        f"requests started: {min(len(drv.monitor.starts), 10)}{'+' if len(drv.monitor.starts) >= 10 else ''}"
    )
    if any(e.reason is EndReason.VIOLATION for e in drv.monitor.ends.values()):
        event("a violation kill happened")
    if any(e.reason is EndReason.NODE_FAILURE for e in drv.monitor.ends.values()):
        event("a node failure ended a request")


# ================================================================================================
# inv. 3: a non-preemptible request that fits in its application's started pre-allocation starts
# within one pass (plus preempt_grace when preemptible holders must release)
# ================================================================================================
def _inner_free(drv: Driver, prealloc, t: float) -> int:
    """Nodes of ``prealloc`` not used from ``t`` on by the requests running inside it (they only end)."""
    inner = [r for r in drv.policy.requests.values() if r.container == prealloc.id and r.state is STARTED]
    return prealloc.nodes - sum(r.nodes for r in inner if r.end > t)


@given(data=st.data(), settings=settings_st, sizes=sizes_st, before=steps_st(0, 15), after=steps_st(0, 10))
def test_np_request_fitting_in_started_preallocation_starts_within_one_pass(
    data, settings, sizes, before, after
):
    """Precondition (where the design promises it): application A has a started pre-allocation P on
    cluster c; no node of c went down since P started (so what runs is consistent with what is up); A
    has no other waiting non-preemptible request or pre-allocation on c (nothing of its own may go
    before), no pending preemption deadline, and it could comply in time (not: several preemptible
    requests of its own to release with preempt_grace = 0 and interval 0); the request R (FREE,
    non-preemptible) fits in P's free part from the next pass tp until tp + preempt_grace + interval +
    its duration. Then, with only time passing (A releases preemptible nodes when told; other
    applications may or may not), R starts at tp, or -- if preemptible holders must release first --
    by tp + preempt_grace + interval.

    The scenario: a random prefix, a pre-allocation for some application (started by following the
    wake-ups), more random operations in short time steps, and often a preemptible request that takes
    every free node of the cluster (P's unused nodes included) just before R is submitted."""
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(1, 3)))
    with explain(settings, drv):
        drv.run(before)
        # give some application a pre-allocation and let it start
        app = drv._app_or_open()
        c = drv.pick(drv.nodes)
        up = drv.cores.allocator.up(c)
        if up > 0:
            drv.submit(app, [drv.spec(PA, c, drv.draw(st.integers(1, up)), drv.pick([120.0, 300.0, 600.0]))])
            for _ in range(12):
                if any(p.state is STARTED for p in drv.live(app, types=(PA,))):
                    break
                drv.wake()
        drv.max_step = 5.0  # keep P alive through the next random operations
        drv.run(after)
        free = drv.cores.allocator.free_count(c)
        grabbed = bool(free and drv.apps() and drv.draw(st.integers(0, 3)))
        if grabbed:
            # some application (perhaps A itself) grabs every free node preemptibly, P's unused ones
            # included: R will have to wait until they are released
            grab = drv.spec(PRE, c, free, None)
            drv.submit(drv.pick(drv.apps()), [grab])
            drv.tick(max(drv.t, drv.policy.last_pass + settings.reschedule_interval))
            event(
                "inv3: preemptible grab " + ("started" if grab.id in drv.monitor.starts else "did not start")
            )

        interval, grace = settings.reschedule_interval, settings.preempt_grace
        pol = drv.policy
        ts = drv.t
        tp = max(ts, pol.last_pass + interval)  # the pass that will see R
        slack = grace + interval
        candidates = []
        for a in drv.apps():
            if pol.apps[a].deadlines:
                continue
            for p in drv.live(a, STARTED, (PA,)):
                if drv.monitor.last_down.get(p.cluster, -1) >= drv.monitor.start_index[p.id]:
                    continue
                mine = [r for r in drv.live(a, STARTED, (PRE,)) if r.cluster == p.cluster]
                if grace == 0 and interval == 0 and len(mine) > 1:
                    # A itself would have to release several requests at the instant it is told: one
                    # done per request, and each runs a pass that finds A still above its view
                    continue
                if any(r.cluster == p.cluster and not r.preemptible for r in drv.live(a, WAITING)):
                    continue
                free = _inner_free(drv, p, tp)
                durations = [d for d in DURATIONS if tp + slack + d <= p.end]
                if free > 0 and durations:
                    candidates.append((a, p, free, durations))
        if not candidates:
            has_p = any(drv.live(a, STARTED, (PA,)) for a in drv.apps())
            event(
                "inv3: vacuous, " + ("no pre-allocation qualifies" if has_p else "no started pre-allocation")
            )
            return
        if grabbed and any(p.cluster == c for _, p, _, _ in candidates):
            candidates = [x for x in candidates if x[1].cluster == c]
        a, p, free, durations = drv.pick(candidates)
        nodes = drv.draw(st.integers(1, free))
        duration = drv.pick(durations)
        rid = drv.new_id()
        compliant = {x: x == a or drv.draw(st.booleans()) for x in drv.apps()}
        out = drv.submit(a, [RequestSpec(id=rid, type=NP, cluster=p.cluster, nodes=nodes, duration=duration)])
        assert isinstance(out[0], Accepted), f"R was refused: {out[0]}"
        bound = tp + slack
        while rid not in drv.monitor.starts:
            todo = [d for d in out if isinstance(d, PreemptionDeadline)]
            while todo:
                d = todo.pop(0)
                if compliant.get(d.app) and d.app in pol.apps:
                    todo.extend(
                        x
                        for x in drv.comply(d.app, d.cluster, d.allowed)
                        if isinstance(x, PreemptionDeadline)
                    )
            w = drv.cores.next_wakeup()
            if w is None or w > bound + EPS:
                break
            out = drv.tick(max(w, drv.t))
        started = drv.monitor.starts.get(rid)
        assert started is not None, (
            f"inv3: {rid} ({nodes} nodes, {duration}s) fits in {a}'s started pre-allocation {p.id} "
            f"({p.nodes} nodes until {p.end}, {free} free) but has not started by {bound} "
            f"(submitted at {ts}, first pass at {tp}); story: {pol.story(rid)}"
        )
        assert started.at <= bound + EPS, f"inv3: {rid} started at {started.at}, after {bound}"
        event(
            "inv3: R started at once" if started.at <= tp + EPS else "inv3: R waited for preemptible holders"
        )


# ================================================================================================
# inv. 4: adding work from a lower-priority application never moves a higher-priority application's
# start time later
# ================================================================================================
def _np_starts(drv: Driver, apps: list[str]) -> dict[str, tuple[str, float, bool]]:
    out = {}
    for a in apps:
        for r in drv.live(a):
            if not r.preemptible:
                out[r.id] = (a, r.start, r.state is STARTED)
    return out


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(3, 35))
def test_lower_priority_work_never_delays_higher_priority_starts(data, settings, sizes, steps):
    """Two copies replay the same random prefix. At the same instant T (a pass is due in both), copy A
    gets a no-op dirtying event (a new, empty, lowest-priority session) and copy B gets an extra batch
    from the lowest-priority application L. After that pass, every non-preemptible request and
    pre-allocation of every application above L is started in B if it is in A, and its start in B is
    <= its start in A. (Preemptible requests are excluded: non-preemptible work of any priority takes
    precedence over preemptible work.)"""
    a = Driver(data, settings, sizes, apps=data.draw(st.integers(2, 4)))
    with explain(settings, a):
        a.run(steps)
        apps = a.apps()
        if len(apps) < 2:
            event("inv4: fewer than two applications (vacuous)")
            return
    low, higher = apps[-1], apps[:-1]
    extra = a.random_batch(low)
    b = Driver.replay(a.events, settings)
    with explain(settings, a, b):
        T = max(a.t, a.policy.last_pass + settings.reschedule_interval)
        out_a = a.feed(OpenSession(at=T, app="zzprobe"))
        out_b = b.feed(Submit(at=T, app=low, requests=extra))
        if not isinstance(out_b[0], Accepted):
            event("inv4: extra batch refused (vacuous)")
            return
        assert any(isinstance(d, PassDone) for d in out_a), "copy A did not run the pass at T"
        assert any(isinstance(d, PassDone) for d in out_b), "copy B did not run the pass at T"
        before, after = _np_starts(a, higher), _np_starts(b, higher)
        killed = {d.app for d in out_b if isinstance(d, SessionEnded)} - {
            d.app for d in out_a if isinstance(d, SessionEnded)
        }
        compared = 0
        for rid, (app, start_a, started_a) in before.items():
            if app in killed:  # B's extra work left it holding preemptible nodes past its deadline
                continue
            assert rid in after, (
                f"inv4: {rid} of {app} is live without {low}'s extra work {extra} but gone with it"
            )
            _, start_b, started_b = after[rid]
            assert start_b <= start_a + EPS, (
                f"inv4: {low}'s extra work {[s.model_dump(exclude_defaults=True) for s in extra]} moved "
                f"{rid} of higher-priority {app} from {start_a} to {start_b}"
            )
            assert started_b or not started_a, (
                f"inv4: {rid} of {app} starts at {T} without {low}'s extra work, not with it"
            )
            compared += start_a < INF
        event(f"inv4: compared finite starts: {min(compared, 5)}{'+' if compared >= 5 else ''}")


# ================================================================================================
# inv. 5: a request sized within the application's view at time t gets a start time <= t
# ================================================================================================
def _probe_view(drv: Driver) -> None:
    """Read an application's non-preemptive view after a pass, submit a request sized within it at
    t = view.earliest_fit(nodes, duration, now), and check its placed start is <= t."""
    pol = drv.policy
    if pol.last_pass != drv.t or pol.dirty or drv.draw(st.booleans()):
        drv.open("p")  # a new lowest-priority session; with interval 0 this runs a pass now
    assert pol.last_pass == drv.t and not pol.dirty
    eligible = [a for a in drv.apps() if not [r for r in drv.live(a, WAITING) if not r.preemptible]]
    if not eligible:
        return
    # applications that run a pre-allocation are the interesting case (their requests may go inside
    # it): probe them more often, on the pre-allocation's cluster
    holders = [a for a in eligible if drv.live(a, STARTED, (PA,))]
    if holders and drv.draw(st.booleans()):
        app = drv.pick(holders)
        cluster = drv.pick(sorted({p.cluster for p in drv.live(app, STARTED, (PA,))}))
    else:
        app = drv.pick(eligible)
        cluster = drv.pick(drv.nodes)
    view = pol.schedule.np_view(app, cluster)
    top = view.max_value()
    if top <= 0:
        return
    rtype = drv.pick([NP, PA])
    nodes = drv.draw(st.integers(1, top))
    duration = drv.pick(DURATIONS)
    t = view.earliest_fit(nodes, duration, drv.t)
    if t == INF:
        return
    rid = drv.new_id()
    out = drv.submit(app, [RequestSpec(id=rid, type=rtype, cluster=cluster, nodes=nodes, duration=duration)])
    assert isinstance(out[0], Accepted), out[0]
    r = pol.requests.get(rid)
    if r is None:  # ended in that very pass: only possible by its session being killed for a violation
        (end,) = [d for d in out if d.kind == "end" and d.request == rid]
        assert app not in pol.apps and end.reason in (EndReason.VIOLATION, EndReason.CANCELLED), (
            f"{rid} of {app} ended in the pass that placed it: {end}"
        )
        return
    has_prealloc = any(p.cluster == cluster for p in drv.live(app, STARTED, (PA,)))
    assert r.start <= t + EPS, (
        f"inv5: {app}'s non-preemptive view on {cluster} at {drv.t} was {view.to_wire()}; a {rtype.value} "
        f"request of {nodes} nodes for {duration}s fits in it at {t}, but was placed at {r.start}"
        + (f" inside {r.placed_in or r.container}" if (r.placed_in or r.container) else "")
        + (" (the application has a started pre-allocation there)" if has_prealloc else "")
    )
    drv.probes += 1


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(3, 30))
def test_views_do_not_lie(data, settings, sizes, steps):
    """With a re-scheduling interval of 0 (so that the pass after a submit sees the same instant as the
    view), during random runs an application with no waiting non-preemptible work reads its
    non-preemptive view on a cluster, picks (nodes, duration) and the view's earliest fit t, submits
    that request (non-preemptible or pre-allocation), and the next pass places it at a start <= t."""
    settings = settings.model_copy(update={"reschedule_interval": 0.0})
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(0, 3)))
    with explain(settings, drv):
        drv.run(steps, extra={"probe": (8, _probe_view)})
        _probe_view(drv)
    event(f"inv5: probes checked: {min(drv.probes, 3)}{'+' if drv.probes >= 3 else ''}")


# ================================================================================================
# inv. 6: the same events in the same order give the same decisions
# ================================================================================================
def _dump(outs: list[list]) -> list[list[dict]]:
    return [[d.model_dump(mode="json") for d in out] for out in outs]


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_same_events_same_decisions(data, settings, sizes, steps):
    """The event list produced by a random run is replayed through two fresh CoupledCores; all three runs
    must make exactly the same decisions (model_dump), event by event."""
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(0, 3)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps)
    first = _dump(drv.outs)
    for copy in (1, 2):
        again = Driver.replay(drv.events, settings, drv.passes_now)
        with explain(settings, again):
            second = _dump(again.outs)
            for i, (x, y) in enumerate(zip(first, second, strict=True)):
                assert x == y, (
                    f"inv6: replay {copy} differs at event {i} ({_fmt(drv.events[i])}):\n{x}\n!=\n{y}"
                )


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_applications_with_the_same_view_key_see_the_same_non_preemptive_views(data, settings, sizes, steps):
    """The policy engine computes one non-preemptive view per ``Schedule.np_view_key`` and cluster, and
    sends it to every application with that key: they must indeed see the same."""
    drv = Driver(data, settings, sizes, apps=data.draw(st.integers(2, 4)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps)
    sched = drv.policy.schedule
    if sched is None:
        return
    by_key: dict[int, list[str]] = defaultdict(list)
    for app in drv.policy.apps:
        by_key[sched.np_view_key(app)].append(app)
    for apps in by_key.values():
        for c in sched.up:  # (a cluster registered after the last pass is not in it yet, as for the engine)
            first = sched.np_view(apps[0], c).to_wire()
            for other in apps[1:]:
                assert sched.np_view(other, c).to_wire() == first, (apps[0], other, c)
