"""``coorm demo``: the NEA + malleable interaction of CooRMv2 Fig. 8 with a rigid job in the mix, run
through the real policy and allocator cores in virtual time, narrated step by step.

Until the live services exist this is the main job; it exercises views, pre-allocations, spontaneous
updates, preemptible filling, preemption within the grace, walltime and fair-start.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.events import Done, OpenSession, Submit, Tick
from coorm.shared.requests import RequestSpec


def _rq(rid, nodes, duration=None, type="non-preemptible", to=None, how="FREE"):
    return RequestSpec(id=rid, type=type, cluster="c0", nodes=nodes, duration=duration, related_to=to,
                       related_how=how)


class _Story:
    def __init__(self, nodes: int) -> None:
        self.cores = CoupledCores(PolicySettings(fair_start=5, reschedule_interval=1, preempt_grace=5),
                                  validate=True)
        self.cores.register(0.0, "c0", [f"n{i:02d}" for i in range(nodes)])
        self.log: list[tuple[float, str, str]] = []
        self.psa_request: str | None = None
        self.psa_updates = 0
        self._reacting = False

    def say(self, app: str, what: str) -> None:
        self.log.append((self.cores.now, app, what))

    def feed(self, event, note: str = "") -> None:
        if note:
            self.log.append((event.at, getattr(event, "app", "-"), note))
        for d in self.cores.handle(event):
            if d.kind == "assigned":
                kept = f" ({len(d.kept)} kept)" if d.kept else ""
                self.say(d.app, f"startNotify {d.request}: {len(d.nodes)} nodes{kept}")
            elif d.kind == "end" and d.reason.value not in ("next",):
                self.say(d.app, f"{d.request} ended ({d.reason.value})")
            elif d.kind == "preempt":
                self.say(d.app, f"preemptive view dropped: keep {d.allowed} of {d.held} by t={d.deadline:g}")
            elif d.kind == "rejected":
                self.say("-", f"rejected: {d.reason}")
        if not self._reacting:
            self._reacting = True
            try:
                self.psa_follow_view()
            finally:
                self._reacting = False

    def psa_follow_view(self) -> None:
        """The PSA's decision (CooRMv2 §V-A2): follow the preemptive view, killing tasks to shrink."""
        sched = self.cores.policy.schedule
        if self.psa_request is None or sched is None or "psa" not in self.cores.policy.apps:
            return
        current = self.cores.policy.requests.get(self.psa_request)
        if current is None or current.state.value != "started":
            return
        view = sched.p_view("psa", "c0").value_at(self.cores.now)
        if view == current.nodes or view <= 0:
            return
        self.psa_updates += 1
        new = f"m{self.psa_updates + 1}"
        held = self.cores.allocator.nodes_of(current.id)
        released = held[view:] if view < len(held) else ()
        what = f"kills {len(released)} tasks, keeps {view}" if released else f"grows to {view}"
        self.say("psa", what)
        self.feed(Submit(at=self.cores.now, app="psa", requests=[
            _rq(new, view, None, "preemptible", to=current.id, how="NEXT")]))
        self.feed(Done(at=self.cores.now, app="psa", request=current.id, released=tuple(released)))
        self.psa_request = new

    def until(self, t: float) -> None:
        while (w := self.cores.next_wakeup()) is not None and w <= t:
            self.feed(Tick(at=max(w, self.cores.now)))


def run(console: Console, nodes: int = 32) -> CoupledCores:
    s = _Story(nodes)
    s.feed(OpenSession(at=0.0, app="nea", app_kind="amr"), "subscribe")
    s.feed(Submit(at=0.5, app="nea", requests=[_rq("pa", 20, 3600, "pre-allocation"), _rq("n1", 6, 3600)]),
           "pre-allocation of 20, then 6 nodes inside it")
    s.until(1.0)
    s.feed(OpenSession(at=2.0, app="psa", app_kind="psa"), "subscribe")
    s.until(3.0)
    view = s.cores.policy.schedule.p_view("psa", "c0").value_at(3.0)
    s.psa_request = "m1"
    s.feed(Submit(at=3.0, app="psa", requests=[_rq("m1", view, None, "preemptible")]),
           f"preemptive view shows {view} nodes: asks for them all")
    s.feed(OpenSession(at=3.0, app="rigid", app_kind="rigid"), "subscribe")
    s.feed(Submit(at=3.5, app="rigid", requests=[_rq("r1", 8, 600)]), "rigid job: 8 nodes for 10 min")
    s.until(100.0)
    s.feed(Submit(at=100.0, app="nea", requests=[_rq("n2", 16, 3000, to="n1", how="NEXT")]),
           "spontaneous update to 16 nodes")
    s.feed(Done(at=100.0, app="nea", request="n1"))
    s.until(1800.0)
    s.feed(Done(at=1800.0, app="nea", request="n2"), "done with its work")
    s.feed(Done(at=1800.0, app="nea", request="pa"))
    s.until(1900.0)

    table = Table(title=f"CooRMv2 Fig. 8 with a rigid job, {nodes} nodes, virtual time")
    for col in ("t (s)", "app", "what happened"):
        table.add_column(col)
    for t, app, what in s.log:
        table.add_row(f"{t:g}", app, what)
    console.print(table)
    violations = [d for d in s.log if "violation" in d[2]]
    console.print(f"{s.cores.policy.epoch} scheduling passes, {s.psa_updates} PSA updates, "
                  f"{len(violations)} protocol violations")
    return s.cores
