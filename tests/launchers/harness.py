"""Launchers against the real cores: a tiny shell that carries commands in and decisions out.

It does what a live shell (or the simulator) does for a launcher: opens its session and answers
``listClustersInfo`` with the given properties, builds its views from the policy's schedule after each
``ViewsChanged`` and tells it those that changed, delivers starts and ends -- both as the live system does
(:mod:`coorm.launchers.delivery`, the simulator's too) --, turns the launcher's commands into events, and
keeps its timers, interleaved with the cores' own wake-ups in virtual time. A launcher reacts to a decision
before the next decision of the same batch is delivered.
"""

from __future__ import annotations

import heapq
import math

from coorm.launchers.base import Close, ClusterProps, Launcher, Submit, Timer, Views
from coorm.launchers.base import Done as DoneCmd
from coorm.launchers.delivery import ViewDeliverer, notice
from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.events import CloseSession, Done, OpenSession, Rejected, ViewsChanged
from coorm.shared.events import Submit as SubmitEvent
from coorm.shared.requests import RequestSpec


class Harness:
    def __init__(self, props: ClusterProps, **settings) -> None:
        self.props = props
        self.cores = CoupledCores(PolicySettings(**settings), validate=True)
        self.launchers: dict[str, Launcher] = {}
        self.timers: list[tuple[float, int, str, str]] = []
        self._seq = 0
        self.rejected: list[Rejected] = []
        self.replace_refused: list[tuple[float, str, str]] = []  # replaces refused as raced: (time, app, code)
        self.decisions: list = []
        self.views_sent: dict[str, list[Views]] = {}
        self.told = ViewDeliverer()  # as the view publisher: a launcher hears of views that changed
        self.submitted: dict[str, list[RequestSpec]] = {}
        for c, n in sorted(props.nodes.items()):
            self._dispatch(self.cores.register(0.0, c, [f"{c}n{i}" for i in range(n)]))

    @property
    def now(self) -> float:
        return self.cores.now

    # -- outside actors ---------------------------------------------------------------------------------
    def open(self, at: float, app: str, launcher: Launcher | None = None) -> None:
        self.run_until(at)
        if launcher is not None:
            self.launchers[app] = launcher
            self._apply(app, launcher.on_open(at, self.props), at)
        self._dispatch(self.cores.handle(OpenSession(at=at, app=app)))

    def submit(self, at: float, app: str, *requests: RequestSpec) -> None:
        """A rigid job submitted by hand."""
        self.run_until(at)
        self._dispatch(self.cores.handle(SubmitEvent(at=at, app=app, requests=list(requests))))

    def done(self, at: float, app: str, request: str) -> None:
        self.run_until(at)
        self._dispatch(self.cores.handle(Done(at=at, app=app, request=request)))

    # -- the loop ---------------------------------------------------------------------------------------
    def run_until(self, until: float) -> None:
        while True:
            t_timer = self.timers[0][0] if self.timers else math.inf
            wake = self.cores.next_wakeup()
            t_core = math.inf if wake is None else wake
            t = min(t_timer, t_core)
            if t > until or t == math.inf:
                return
            if t_timer <= t_core:
                at, _, app, key = heapq.heappop(self.timers)
                now = max(at, self.now)
                self._dispatch(self.cores.tick(now))  # the cores catch up with the clock first
                self._apply(app, self.launchers[app].on_timer(now, key), now)
            else:
                self._dispatch(self.cores.tick(max(t, self.now)))

    def run(self, limit: float = 1e7) -> None:
        """Until every launcher has finished (or ``limit``)."""
        while not all(launcher.finished for launcher in self.launchers.values()):
            before = (self.now, len(self.timers), self.cores.next_wakeup())
            self.run_until(limit)
            if (self.now, len(self.timers), self.cores.next_wakeup()) == before:
                return  # nothing left to happen

    # -- plumbing ---------------------------------------------------------------------------------------
    def views_of(self, app: str) -> Views:
        s = self.cores.policy.schedule
        clusters = sorted(self.props.nodes)
        return Views(
            now=self.now,
            non_preemptive={c: s.np_view(app, c) for c in clusters},
            preemptive={c: s.p_view(app, c) for c in clusters},
        )

    def _dispatch(self, decisions: list) -> None:
        for d in decisions:
            self.decisions.append(d)
            if isinstance(d, Rejected):
                self.rejected.append(d)
            elif (n := notice(d)) is not None:
                if n.app in self.launchers:
                    if n.method == "on_start" and hasattr(d, "cluster"):  # (the start notification names it)
                        self.launchers[n.app].placed[n.args[0]] = d.cluster
                    self._apply(n.app, getattr(self.launchers[n.app], n.method)(self.now, *n.args), self.now)
            elif isinstance(d, ViewsChanged):
                for app in d.apps:
                    launcher = self.launchers.get(app)
                    if launcher is None or launcher.closed:
                        continue
                    views = self.views_of(app)
                    if not self.told.changes(app, {c: (views.non_preemptive[c], views.preemptive[c])
                                                   for c in views.non_preemptive}):
                        continue
                    self.views_sent.setdefault(app, []).append(views)
                    self._apply(app, launcher.on_views(views), self.now)

    def _apply(self, app: str, commands: list, now: float) -> None:
        for cmd in commands:
            if isinstance(cmd, Timer):
                self._seq += 1
                heapq.heappush(self.timers, (cmd.at, self._seq, app, cmd.key))
            elif isinstance(cmd, Submit):
                self.submitted.setdefault(app, []).extend(cmd.requests)
                out = self.cores.handle(SubmitEvent(at=now, app=app, requests=list(cmd.requests),
                                                    replaces=cmd.replaces))
                if cmd.replaces:  # (a request/reply: the launcher hears the answer first)
                    refused = out[0].code.value if isinstance(out[0], Rejected) else None
                    if refused in ("started", "ended"):
                        self.replace_refused.append((now, app, refused))
                        out = out[1:]
                    if refused in (None, "started", "ended"):
                        self._apply(app, self.launchers[app].on_replace_answered(now, cmd, refused), now)
                self._dispatch(out)
            elif isinstance(cmd, DoneCmd):
                self._dispatch(self.cores.handle(Done(at=now, app=app, request=cmd.request,
                                                      released=cmd.released)))
            elif isinstance(cmd, Close):
                self._dispatch(self.cores.handle(CloseSession(at=now, app=app)))

    # -- observing --------------------------------------------------------------------------------------
    def of(self, kind: str, **match) -> list:
        return [d for d in self.decisions
                if d.kind == kind and all(getattr(d, k) == v for k, v in match.items())]
