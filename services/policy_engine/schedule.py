"""The outcome of one pass: start times and the data every application's views are derived from.

Views are not copied per application during the pass (that would cost applications x breakpoints).
Instead the pass records, per cluster, the *base* reservations (running work, fair-start holds) and the
*placement log* (reservations made by waiting requests, in priority order), and for each application
its position in that log. An application's non-preemptive view on a cluster is the base minus the log
entries placed before its turn (CooRM §III-C: "set the view of the current application to the current
profiles"). Its preemptive view is the preemptive capacity (every node not used non-preemptibly) shared
with the other applications that want preemptible nodes.

Change detection uses a commutative hash of the reservations a view is made of, so a request moving
from "placed at now" to "running" with the same times does not count as a change.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache
from hashlib import blake2b

from coorm.services.policy_engine.shares import INCREMENTAL, preemptive_share
from coorm.shared.stepfn import INF, StepFunction

Interval = tuple[float, float, int]  # begin, end, nodes
_MASK = (1 << 64) - 1


@lru_cache(maxsize=1024)  # the clusters and the applications of the moment; bounded, as the core's state
def name_hash(name: str) -> int:
    """A name's hash, the same in every process: Python salts ``hash(str)`` per process
    (``PYTHONHASHSEED``), and a standby that restores a snapshot must compare its views' signatures with
    those the writer computed. (Numbers and tuples of numbers hash alike everywhere.)"""
    return int.from_bytes(blake2b(name.encode(), digest_size=8).digest(), "little")


def interval_hash(cluster: str, item: Interval) -> int:
    return hash((name_hash(cluster), item)) & _MASK


@dataclass(slots=True)
class PreemptibleDemand:
    app: str
    # its rank in the split: its priority, or (under KOALA's policies) (when it first started, its seq)
    priority: tuple[float, int]
    intervals: list[Interval]  # preemptible requests alive over [begin, end)
    # those of them that have started: KOALA's policies grow and shrink from what is held
    held: list[Interval] = field(default_factory=list)


@dataclass(slots=True)
class Schedule:
    epoch: int
    now: float
    policy: str
    up: dict[str, int]
    base: dict[str, list[Interval]]
    log: list[tuple[str, float, float, int]] = field(default_factory=list)
    log_ids: list[str] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    np_signature: dict[str, int] = field(default_factory=dict)
    # preemptible capacity: what is used non-preemptibly (running + placed) and physically held
    np_usage: dict[str, list[Interval]] = field(default_factory=dict)
    demands: dict[str, list[PreemptibleDemand]] = field(default_factory=dict)
    p_signature: int = 0
    priorities: dict[str, tuple[float, int]] = field(default_factory=dict)
    used_now: dict[str, int] = field(default_factory=dict)  # cluster -> nodes used non-preemptibly now
    threshold: int = 0  # nodes per cluster never handed to preemptible work (KOALA's local users')

    def settle(self, started: set[str]) -> None:
        """Requests placed at "now" that started in this pass are running work: every application,
        their own included, sees them in its view."""
        if not started:
            return
        moved = [i for i, rid in enumerate(self.log_ids) if rid in started]
        if not moved:
            return
        gone = set(moved)
        extra = 0
        for i in moved:
            c, b, e, n = self.log[i]
            self.base[c].append((b, e, n))
            extra += interval_hash(c, (b, e, n))
        # each application's mark shifts by the moved entries before it, and its signature gains those
        # after it (they were not in its view before); moved is sorted, so both come from bisecting it
        suffix = [0] * (len(moved) + 1)
        for k in range(len(moved) - 1, -1, -1):
            c, b, e, n = self.log[moved[k]]
            suffix[k] = suffix[k + 1] + interval_hash(c, (b, e, n))
        for app, mark in self.marks.items():
            k = bisect_left(moved, mark)
            self.marks[app] = mark - k
            self.np_signature[app] = (self.np_signature[app] + suffix[k]) & _MASK
        self.log = [x for i, x in enumerate(self.log) if i not in gone]
        self.log_ids = [x for i, x in enumerate(self.log_ids) if i not in gone]

    def occupy(self, items: list[tuple[str, Interval]]) -> None:
        """Under precedence to running applications (PRA) the nodes held preemptibly are in every
        non-preemptive view: those of preemptible requests started in this pass, after the placement, go
        in now, as the next pass's base will have them."""
        extra = 0
        for c, item in items:
            self.base[c].append(item)
            extra += interval_hash(c, item)
        for key in self.np_signature:
            self.np_signature[key] = (self.np_signature[key] + extra) & _MASK

    # -- non-preemptive views ---------------------------------------------------------------------
    def np_view_key(self, app: str) -> int:
        """Applications with the same key have the same non-preemptive views (those placed after the same
        requests: every application without a request sees what a newcomer would)."""
        return self.marks.get(app, len(self.log))

    def np_view(self, app: str, cluster: str) -> StepFunction:
        mark = self.marks.get(app, len(self.log))
        items = list(self.base[cluster])
        items.extend((b, e, n) for c, b, e, n in self.log[:mark] if c == cluster)
        return StepFunction.from_intervals(self.up[cluster], self.now, items)

    def final_profile(self, cluster: str) -> StepFunction:
        """What a new, lowest-priority application would see."""
        items = list(self.base[cluster])
        items.extend((b, e, n) for c, b, e, n in self.log if c == cluster)
        return StepFunction.from_intervals(self.up[cluster], self.now, items)

    # -- preemptive views -------------------------------------------------------------------------
    def preemptible_capacity(self, cluster: str) -> StepFunction:
        return StepFunction.from_intervals(self.up[cluster], self.now, self.np_usage.get(cluster, []))

    def p_view(self, app: str, cluster: str, priority: tuple[float, int] | None = None,
               until: float = INF) -> StepFunction:
        """``until``: only the view before then is wanted (a share is worked out per breakpoint)."""
        capacity = self.preemptible_capacity(cluster)
        demands = self.demands.get(cluster, [])
        others = [d for d in demands if d.app != app]
        mine = next((d for d in demands if d.app == app), None)
        if priority is None:
            priority = mine.priority if mine else self.priorities.get(app, (INF, 0))
        incremental = self.policy in INCREMENTAL
        # KOALA's policies start from what each holds, its own too: when its requests end matters
        held = mine.held if mine and incremental else []
        times = set(capacity.times)
        for intervals in [d.intervals for d in others] + [held]:
            for b, e, _ in intervals:
                for t in (b, e):
                    if self.now < t < INF:
                        times.add(t)
        ranked = sorted(others + [PreemptibleDemand(app, priority, [], held)], key=lambda d: d.priority)
        me = next(i for i, d in enumerate(ranked) if d.app == app)
        steps: list[tuple[float, int]] = []
        for t in sorted(times):
            if t >= until and steps:
                break
            wants = [_demand_at(d.intervals, t) for d in ranked]
            holds = [_demand_at(d.held, t) for d in ranked] if incremental else None
            steps.append((t, preemptive_share(capacity.value_at(t), wants, me, self.policy, holds, self.threshold)))
        return StepFunction.from_steps(steps)

    def views(self, app: str, clusters: list[str] | None = None) -> dict[str, dict[str, StepFunction]]:
        """Both views of ``app`` for every cluster (or the given ones)."""
        out: dict[str, dict[str, StepFunction]] = {}
        for c in clusters or sorted(self.up):
            out[c] = {"non_preemptive": self.np_view(app, c), "preemptive": self.p_view(app, c)}
        return out

    def signature(self, app: str) -> tuple[int, int]:
        return self.signatures([app])[0]

    def signatures(self, apps: list[str]) -> list[tuple[int, int]]:
        """Those of ``apps``, in one loop: a pass reads one per open session, thousands of them."""
        np_signature, p_signature = self.np_signature.get, self.p_signature
        final = np_signature("\x00final", 0)
        return [(np_signature(app, final), p_signature) for app in apps]


def _demand_at(intervals: list[Interval], t: float) -> int:
    return sum(n for b, e, n in intervals if b <= t < e)
