"""The discrete-event simulator: the very same cores and launchers as the live system, in virtual time.

Rules:
* the policy and allocator cores are driven only through their events (open, submit, done, close,
  tick, node registration), exactly what the live services feed them;
* launchers get what the live SDK would give them: views when they change (never the same view twice),
  ``startNotify`` with node IDs (and the start of their pre-allocations), every end of a started request
  with its reason, and their own timers;
* a launcher answers "instantly" (CooRM §IV-A): its commands are fed at the time it received the
  notification; a launcher that takes time to select uses a timer (adaptation delay);
* the simulation ends when every non-background application has finished, or at ``until``.

Every message between launchers and the RMS is counted, with its size encoded as CooRM §IV-B did.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

from coorm.launchers.base import Close, ClusterProps, Done, Launcher, Submit, Timer, Views
from coorm.launchers.delivery import ViewDeliverer, notice
from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared import events as ev
from coorm.shared.requests import RequestType
from coorm.simulator import cdr


class SimulationError(RuntimeError):
    pass


@dataclass
class RequestRecord:
    app: str
    request: str
    type: str
    cluster: str
    nodes: int
    start: float
    end: float | None = None


@dataclass
class AppRecord:
    name: str
    kind: str
    submitted: float
    started: float | None = None
    ended: float | None = None
    end_reason: str | None = None


@dataclass
class Result:
    now: float
    clusters: dict[str, int]
    apps: dict[str, AppRecord]
    requests: list[RequestRecord]
    launchers: dict[str, Launcher]
    messages: int
    bytes: int
    rejections: list[tuple[float, str, str]]
    scheduling_cpu: float
    passes: int
    computed_configurations: int = 0
    extra: dict = field(default_factory=dict)


class Simulation:
    def __init__(
        self,
        clusters: dict[str, int],
        settings: PolicySettings | None = None,
        props: ClusterProps | None = None,
        *,
        validate: bool = False,
        strict: bool = True,
    ) -> None:
        self.cores = CoupledCores(settings, validate=validate)
        self.clusters = dict(clusters)
        self.props = props or ClusterProps(nodes=dict(clusters))
        self.strict = strict
        self.now = 0.0
        self._heap: list[tuple[float, int, str, str, object]] = []
        self._seq = itertools.count()
        self.launchers: dict[str, Launcher] = {}
        self.apps: dict[str, AppRecord] = {}
        self.requests: dict[str, RequestRecord] = {}
        self.messages = 0
        self.bytes = 0
        self.rejections: list[tuple[float, str, str]] = []
        self._views = ViewDeliverer()  # what each launcher was told of its views
        self._waiting_arrivals = 0
        self._cpu = 0.0
        for name, n in clusters.items():
            self._feed(lambda name=name, n=n: self.cores.register(0.0, name, [f"{name}n{i}" for i in range(n)]))

    # -- set-up ---------------------------------------------------------------------------------------
    def add(self, at: float, launcher: Launcher, name: str | None = None) -> None:
        if launcher.app in self.launchers:
            raise ValueError(f"application {launcher.app} added twice")
        self.launchers[launcher.app] = launcher
        self.apps[launcher.app] = AppRecord(name or launcher.app, launcher.kind, at)
        self._waiting_arrivals += 1
        self._push(at, "arrive", launcher.app, None)

    def _push(self, at: float, kind: str, app: str, data) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, app, data))

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, until: float = math.inf, progress=None, max_steps: int = 50_000_000) -> Result:
        for _ in range(max_steps):
            if self._all_done():
                break
            wake = self.cores.next_wakeup()
            nxt = self._heap[0][0] if self._heap else math.inf
            if wake is not None and wake <= nxt:
                t = max(wake, self.now)
                if t > until:
                    break
                self.now = t
                self._feed(lambda t=t: self.cores.tick(t))
            elif self._heap:
                t, _, kind, app, data = heapq.heappop(self._heap)
                if t > until:
                    break
                self.now = max(t, self.now)
                self._fire(kind, app, data)
            else:
                break
            if progress is not None:
                progress(self)
        else:
            raise SimulationError(f"no end after {max_steps} steps")
        return self.result()

    def _all_done(self) -> bool:
        return self._waiting_arrivals == 0 and all(
            launcher.finished or launcher.background for launcher in self.launchers.values()
        )

    def _fire(self, kind: str, app: str, data) -> None:
        launcher = self.launchers[app]
        if kind == "arrive":
            self._waiting_arrivals -= 1
            self._count(cdr.subscribe(app))
            self._feed(lambda: self.cores.handle(ev.OpenSession(at=self.now, app=app, app_kind=launcher.kind,
                                                                   adapts=launcher.adapts_to_views)))
            self._run_commands(app, launcher.on_open(self.now, self.props))
        elif kind == "timer" and not launcher.finished:
            self._run_commands(app, launcher.on_timer(self.now, data))

    # -- commands in, decisions out -------------------------------------------------------------------
    def _count(self, size: int) -> None:
        self.messages += 1
        self.bytes += size

    def _feed(self, call) -> None:
        t0 = time.process_time()
        decisions = call()
        self._cpu += time.process_time() - t0
        self._dispatch(decisions)

    def _run_commands(self, app: str, commands) -> None:
        queue = deque((app, c) for c in commands)
        while queue:
            app, c = queue.popleft()
            if isinstance(c, Timer):
                self._push(max(c.at, self.now), "timer", app, c.key)
                continue
            if isinstance(c, Submit):
                self._count(cdr.request(app, [(r.id, r.cluster, r.related_to) for r in c.requests]))
                event = ev.Submit(at=self.now, app=app, requests=list(c.requests))
            elif isinstance(c, Done):
                self._count(cdr.done(app, c.request, len(c.released)))
                event = ev.Done(at=self.now, app=app, request=c.request, released=c.released)
            elif isinstance(c, Close):
                self._count(cdr.close(app))
                record = self.apps[app]
                if record.ended is None:
                    record.ended, record.end_reason = self.now, "finished"
                event = ev.CloseSession(at=self.now, app=app)
            else:
                raise SimulationError(f"{app} sent an unknown command {c!r}")
            t0 = time.process_time()
            decisions = self.cores.handle(event)
            self._cpu += time.process_time() - t0
            for later in self._dispatch(decisions, collect=True):
                queue.append(later)

    def _dispatch(self, decisions, collect: bool = False):
        replies: list[tuple[str, object]] = []
        for d in decisions:
            kind = d.kind
            if kind == "rejected":
                self.rejections.append((self.now, d.code.value, d.reason))
                if self.strict:
                    raise SimulationError(f"t={self.now}: a launcher's command was refused: {d.reason}")
            elif kind == "start":
                self.requests[d.request] = RequestRecord(d.app, d.request, d.type.value, d.cluster, d.nodes, d.at)
                record = self.apps.get(d.app)
                if record is not None and record.started is None and d.type is not RequestType.PRE_ALLOCATION:
                    record.started = d.at
            elif kind == "assigned":
                self._count(cdr.start_notify(d.request, list(d.nodes)))
            elif kind == "end":
                rec = self.requests.get(d.request)
                if rec is not None:
                    # the nodes stay with the application until the RMS frees them, at this pass (a
                    # done is coalesced; a request handing over to its NEXT successor runs on)
                    rec.end = self.now if d.started else d.at
                if d.started and d.reason.value not in ("done", "next"):
                    self._count(cdr.close(d.request))  # a kill notification
            elif kind == "session_ended":
                launcher = self.launchers.get(d.app)
                record = self.apps.get(d.app)
                if record is not None and record.ended is None:
                    record.ended, record.end_reason = self.now, d.reason
                if launcher is not None:
                    launcher.finished = True
            elif kind == "views":
                for app in d.apps:
                    replies += self._send_views(app)
            n = notice(d)  # what the launcher is told of it, as live
            if n is not None:
                replies += self._tell(n.app, n.method, *n.args)
        if collect:
            return replies
        for app, command in replies:
            self._run_commands(app, [command])
        return []

    def _tell(self, app: str, method: str, *args) -> list[tuple[str, object]]:
        launcher = self.launchers.get(app)
        if launcher is None or launcher.finished:
            return []
        return [(app, c) for c in getattr(launcher, method)(self.now, *args)]

    def _send_views(self, app: str) -> list[tuple[str, object]]:
        launcher = self.launchers.get(app)
        record = self.apps.get(app)
        if launcher is None or launcher.finished or record is None:
            return []
        if record.started is not None and not launcher.views_after_start:
            return []
        schedule = self.cores.policy.schedule
        np_views, p_views = {}, {}
        t0 = time.process_time()  # views are the RMS's work (the view publisher's): count them
        for c in self.clusters:
            np_views[c] = schedule.np_view(app, c)
            if launcher.wants_preemptive:
                p_views[c] = schedule.p_view(app, c)
        self._cpu += time.process_time() - t0
        changes = self._views.changes(app, {c: (np_views[c], p_views.get(c)) for c in self.clusters})
        if not changes:
            return []
        self._count(cdr.change_notify([(c, len(view.times)) for c, _, view in changes]))
        views = Views(self.now, np_views, p_views)
        return [(app, c) for c in launcher.on_views(views)]

    # -- results --------------------------------------------------------------------------------------
    def result(self) -> Result:
        return Result(
            now=self.now,
            clusters=self.clusters,
            apps=self.apps,
            requests=list(self.requests.values()),
            launchers=self.launchers,
            messages=self.messages,
            bytes=self.bytes,
            rejections=self.rejections,
            scheduling_cpu=self._cpu,
            passes=self.cores.policy.epoch,
            computed_configurations=sum(lau.computed_configurations for lau in self.launchers.values()),
        )
