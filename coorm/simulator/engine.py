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

Every message between launchers and the RMS is counted, with its size encoded as CooRM §IV-B did (and,
per application, what it is told: ``AppRecord.notifications``).

With :class:`~coorm.simulator.delays.Delays` (optional; none: the instant RMS above), the delays of the
live system are modelled -- notification and command latencies, paced views, process launch and exit,
session opening -- as that module's rules say.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field

from coorm.launchers.base import Close, ClusterProps, Done, Launcher, Negotiate, Respond, Submit, Timer, Views
from coorm.launchers.delivery import ViewDeliverer, answer, notice
from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.view_pacing import ViewPacer
from coorm.shared import events as ev
from coorm.shared.requests import RequestType
from coorm.simulator import cdr
from coorm.simulator.delays import Delays


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
    heard_started: float | None = None  # when its launcher heard of its first start (= started, instant RMS)
    notifications: int = 0  # what its launcher was told (views, starts, ends), and their CDR size
    notification_bytes: int = 0


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
    # replaces refused because what they replaced had started (or ended) first: (time, app, code)
    replace_refused: list[tuple[float, str, str]] = field(default_factory=list)


class Simulation:
    def __init__(
        self,
        clusters: dict[str, int],
        settings: PolicySettings | None = None,
        props: ClusterProps | None = None,
        *,
        validate: bool = False,
        strict: bool = True,
        delays: Delays | None = None,
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
        # replaces refused because what they replace had started (or ended) first: (time, app, code)
        self.replace_refused: list[tuple[float, str, str]] = []
        self._views = ViewDeliverer()  # what each launcher was told of its views
        self._waiting_arrivals = 0
        self._cpu = 0.0
        # the live system's delays (None: the papers' instant RMS, and the code paths it always had)
        self.delays = None if delays is None or delays.instant else delays
        self._process_work: set[str] = set()
        self._heard_by: dict[str, float] = {}  # app -> when its latest notification reaches it
        # with Delays.view_notify, views travel apart from the other notifications: app -> when its latest
        # view reaches it, and until when it opens or launches (it hears no view meanwhile either)
        self._views_by: dict[str, float] = {}
        self._busy_by: dict[str, float] = {}
        self._applied_by: dict[str, float] = {}  # app -> when its latest command reaches the RMS
        self._answered_by: dict[str, float] = {}  # app -> when it has the answer to its latest command (reply)
        self._pacer: ViewPacer | None = None
        if self.delays is not None and self.delays.view_period is not None:
            self._pacer = ViewPacer(period=self.delays.view_period, rate=self.delays.view_rate)
        self._round_at: float | None = None  # when the pending round of views is on the heap
        # the live system's samples of its delays, drawn from (seeded) instead of the constants when given
        self._samples = dict(self.delays.samples) if self.delays is not None else {}
        self._draws = random.Random(self.delays.seed) if self._samples and self.delays is not None else None
        self._session_over: set[str] = set()  # the RMS ended these sessions: they hear of nothing more
        self._in_flight = 0  # commands sent that the RMS has not applied yet (the run waits for them)
        self._kept: dict[str, int] = {}  # request -> nodes it kept from its predecessor (nothing to launch there)
        for name, n in clusters.items():
            self._feed(lambda name=name, n=n: self.cores.register(0.0, name, [f"{name}n{i}" for i in range(n)]))

    # -- set-up ---------------------------------------------------------------------------------------
    def add(self, at: float, launcher: Launcher, name: str | None = None, *, process_work: bool = False) -> None:
        """``process_work``: the application's work is its processes (it ends when they exit): with delays,
        its work starts ``launch`` after it hears of its start and it hears of the end ``exit`` later."""
        if launcher.app in self.launchers:
            raise ValueError(f"application {launcher.app} added twice")
        if process_work:
            self._process_work.add(launcher.app)
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
        return self._waiting_arrivals == 0 and self._in_flight == 0 and all(
            launcher.finished or launcher.background for launcher in self.launchers.values()
        )

    def _fire(self, kind: str, app: str, data) -> None:
        if self.delays is not None and self._fire_delayed(kind, app, data):
            return
        launcher = self.launchers[app]
        if kind == "arrive":
            self._waiting_arrivals -= 1
            self._count_opening(app)
            self._feed(lambda: self.cores.handle(ev.OpenSession(at=self.now, app=app, app_kind=launcher.kind,
                                                                   adapts=launcher.adapts_to_views)))
            self._run_commands(app, launcher.on_open(self.now, self.props))
        elif kind == "timer" and not launcher.finished:
            self._run_commands(app, launcher.on_timer(self.now, data))

    # -- commands in, decisions out -------------------------------------------------------------------
    def _count(self, size: int) -> None:
        self.messages += 1
        self.bytes += size

    def _count_opening(self, app: str) -> None:
        """A new launcher's subscribe, then its cluster-info queries and their replies (it asks before its
        first request, live as in CooRM): not notifications, so not in its record's."""
        self._count(cdr.subscribe(app))
        for size in cdr.cluster_queries(sorted(self.clusters)):
            self._count(size)

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
            # (a negotiation is a request/reply live: its latency is not modelled, it is answered at once)
            if (self.delays is not None and (self.delays.command > 0 or self.delays.reply > 0)
                    and isinstance(c, (Submit, Done, Close))):
                self._send_later(app, c)
                continue
            if isinstance(c, Submit) and c.replaces:
                self._replace(app, c, queue)
                continue
            if isinstance(c, Submit):
                self._count(cdr.request(app, [(r.id, cdr.where(r), r.related_to) for r in c.requests]))
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
            elif isinstance(c, (Negotiate, Respond)):
                self._negotiate(app, c, queue)
                continue
            else:
                raise SimulationError(f"{app} sent an unknown command {c!r}")
            self._apply(event, queue)

    def _apply(self, event, queue: deque) -> None:
        """A launcher's command reaches the cores; what its launchers answer at once joins ``queue``."""
        t0 = time.process_time()
        decisions = self.cores.handle(event)
        self._cpu += time.process_time() - t0
        for later in self._dispatch(decisions, collect=True):
            queue.append(later)

    def _replace(self, app: str, c: Submit, queue: deque) -> None:
        """A request that replaces waiting ones (one message live, its answer awaited): the launcher hears the
        answer at once -- accepted, or refused because what it replaces has started (``started``) or ended, a
        race the protocol resolves, counted in ``replace_refused``, not a launcher's mistake -- then what else
        the event caused is dispatched as any command's."""
        # sized as CooRM's protocol sends it (the papers' figures count its CDR bytes): the request, then a done
        # of each request it replaces -- its IDL has no replace; live it is one JSON message
        self._count(cdr.request(app, [(r.id, cdr.where(r), r.related_to) for r in c.requests]))
        for old in c.replaces:
            self._count(cdr.done(app, old, 0))
        event = ev.Submit(at=self.now, app=app, requests=list(c.requests), replaces=c.replaces)
        t0 = time.process_time()
        decisions = self.cores.handle(event)
        self._cpu += time.process_time() - t0
        first = decisions[0] if decisions else None
        refused = first.code.value if isinstance(first, ev.Rejected) else None
        raced = refused in ("started", "ended")
        if raced:
            self.replace_refused.append((self.now, app, refused))
            decisions = decisions[1:]
        launcher = self.launchers.get(app)
        # (any other refusal is the launcher's mistake: dispatched below as a rejection, as a request's is)
        if launcher is not None and not launcher.finished and (raced or refused is None):
            queue.extend((app, later) for later in launcher.on_replace_answered(self.now, c, refused))
        queue.extend(self._dispatch(decisions, collect=True))

    def _negotiate(self, app: str, c: Negotiate | Respond, queue: deque) -> None:
        """A negotiation's message (a request/reply live): the launcher hears the policy core's answer at once;
        what else the event caused is dispatched as any command's. A refused answer (an offer that lapsed
        meanwhile) is part of the protocol, not a launcher's mistake: it is told, not raised."""
        if isinstance(c, Negotiate):
            self._count(cdr.close(c.terms.negotiation) + 48)  # (the terms: a few numbers and a list of sizes)
            event: object = ev.Negotiate(at=self.now, app=app, terms=c.terms)
        else:
            self._count(cdr.close(c.offer) + 16)
            event = ev.Respond(at=self.now, app=app, offer=c.offer, answer=c.answer, nodes=c.nodes)
        t0 = time.process_time()
        decisions = self.cores.handle(event)  # type: ignore[arg-type]
        self._cpu += time.process_time() - t0
        reply = answer(app, c, decisions[0]) if decisions else None
        queue.extend(self._dispatch(decisions[1:], collect=True))
        launcher = self.launchers.get(app)
        if reply is not None and launcher is not None and not launcher.finished:
            queue.extend((app, later) for later in getattr(launcher, reply.method)(self.now, *reply.args))

    def _dispatch(self, decisions, collect: bool = False):
        replies: list[tuple[str, object]] = []
        for d in decisions:
            kind = d.kind
            if kind == "rejected":
                self.rejections.append((self.now, d.code.value, d.reason))
                # (with delays, a done that reaches the RMS after the request's walltime is the race the live
                # runner ignores too: "ended")
                if self.strict and not (self.delays is not None and d.code.value == "ended"):
                    raise SimulationError(f"t={self.now}: a launcher's command was refused: {d.reason}")
            elif kind == "start":
                self.requests[d.request] = RequestRecord(d.app, d.request, d.type.value, d.cluster, d.nodes, d.at)
                record = self.apps.get(d.app)
                if record is not None and record.started is None and d.type is not RequestType.PRE_ALLOCATION:
                    record.started = d.at
            elif kind == "assigned":
                self._count(cdr.start_notify(d.request, list(d.nodes)))
                if d.kept:  # its NEXT predecessor's nodes: its processes run on there already
                    self._kept[d.request] = len(d.kept)
            elif kind == "end":
                rec = self.requests.get(d.request)
                if rec is not None:
                    # the nodes stay with the application until the RMS frees them, at this pass (a
                    # done is coalesced; a request handing over to its NEXT successor runs on)
                    rec.end = self.now if d.started else d.at
                if d.started and d.reason.value not in ("done", "next"):
                    self._count(cdr.close(d.request))  # a kill notification
            elif kind == "session_ended":
                self._session_over.add(d.app)
                if self._pacer is not None:
                    self._pacer.ended(d.app)
                launcher = self.launchers.get(d.app)
                record = self.apps.get(d.app)
                if record is not None and record.ended is None:
                    record.ended, record.end_reason = self.now, d.reason
                if launcher is not None:
                    launcher.finished = True
            elif kind == "views" and self._pacer is not None:
                self._pacer.changed(d.apps)
                self._schedule_round()
            elif kind == "preempt" and self._pacer is not None:
                self._pacer.changed((d.app,), urgent=True)
                self._schedule_round()
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
        if launcher is None or app in self._session_over:
            return []
        size = (cdr.start_notify(args[0], list(args[1])) if method == "on_start"
                else cdr.close(getattr(args[0], "negotiation", args[0])))  # (on_offer: an OfferSeen)
        if self.delays is not None:
            self._hear_later(app, (method, args, size))
            return []
        return self._heard(app, method, args, size)

    def _heard(self, app: str, method: str, args: tuple, size: int) -> list[tuple[str, object]]:
        """The launcher hears of a decision now."""
        launcher = self.launchers.get(app)
        record = self.apps.get(app)
        if launcher is None or record is None:
            return []
        record.notifications += 1  # (one that closed is still told until the RMS ends its session, as live)
        record.notification_bytes += size
        if launcher.finished:
            return []
        if method == "on_views":
            return [(app, c) for c in launcher.on_views(args[0])]
        if method == "ignored":  # a view it is sent and no longer follows
            return []
        if method == "on_start" and record.heard_started is None and args[1]:
            record.heard_started = self.now
        if method == "on_start" and (rec := self.requests.get(args[0])) is not None:
            launcher.placed[args[0]] = rec.cluster  # (the start notification names it)
        commands = getattr(launcher, method)(self.now, *args)
        fresh = len(args[1]) - self._kept.pop(args[0], 0) if method == "on_start" else 0
        if fresh > 0 and self.delays is not None:
            # it launches its processes on the new nodes, hearing of nothing else meanwhile
            busy = (self.delays.launch + self.delays.launch_per_node * fresh) * self._delay("launch_factor", 1.0)
            self._heard_by[app] = max(self._heard_by.get(app, -math.inf), self.now + busy)
            self._busy_by[app] = max(self._busy_by.get(app, -math.inf), self.now + busy)
        if method == "on_start" and self.delays is not None and args[1] and app in self._process_work:
            # its work's end is heard ``exit + exit_per_node x nodes + exit_per_launching x launching`` after
            # start + work (live, its processes start as its nodes' agents get to them, and report their exits)
            line = self.delays.exit + self.delays.exit_per_node * len(args[1])
            if self.delays.exit_per_launching:
                line += self.delays.exit_per_launching * self._launching(app, args[0])
            exit_ = line * self._delay("exit_factor", 1.0) if "exit" not in self._samples else self._delay("exit")
            commands = [Timer(c.at + exit_, c.key) if isinstance(c, Timer) else c for c in commands]
        return [(app, c) for c in commands]

    # -- the live system's delays (Delays) ------------------------------------------------------------
    def _launching(self, app: str, request: str) -> int:
        """The nodes of the other applications' requests (pre-allocations aside: nothing runs on them) the RMS
        started within ``exit_window`` before ``request`` or with it: their launches load the machine the
        agents share, so this one's processes start later and their exits are heard later."""
        assert self.delays is not None
        rec = self.requests.get(request)
        if rec is None:
            return 0
        own = rec.start
        return sum(r.nodes for r in self.requests.values() if r.app != app and r.start is not None
                   and r.type != RequestType.PRE_ALLOCATION.value and own - self.delays.exit_window <= r.start <= own)

    def _delay(self, name: str, constant: float | None = None) -> float:
        """Delay ``name``: drawn from the live system's samples of it if given, else its constant."""
        assert self.delays is not None
        pool = self._samples.get(name)
        if pool and self._draws is not None:
            return self._draws.choice(pool)
        return getattr(self.delays, name) if constant is None else constant

    def _hear_later(self, app: str, notice_: tuple) -> None:
        assert self.delays is not None
        if self.delays.view_notify is not None and notice_[0] in ("on_views", "ignored"):
            # the view publisher's path: its own latency and order, not behind a start not heard yet
            at = max(self.now + self._delay("view_notify"), self._views_by.get(app, -math.inf),
                     self._busy_by.get(app, -math.inf))
            self._views_by[app] = at
            self._push(at, "hear", app, notice_)
            return
        at = max(self.now + self._delay("notify"), self._heard_by.get(app, -math.inf))  # in the order taken
        self._heard_by[app] = at
        self._push(at, "hear", app, notice_)

    def _send_later(self, app: str, command) -> None:
        assert self.delays is not None
        sent = max(self.now, self._answered_by.get(app, -math.inf))  # once the command before it is answered
        at = max(sent + self._delay("command"), self._applied_by.get(app, -math.inf))  # in the order sent
        self._applied_by[app] = at
        self._in_flight += 1
        if isinstance(command, Close):
            record = self.apps[app]
            if record.ended is None:  # the application ended when it closed, not when the RMS heard of it
                record.ended, record.end_reason = sent, "finished"
        elif self.delays.reply > 0:
            # it awaits the answer, hearing of nothing meanwhile (its views neither)
            answered = max(at, sent + self._delay("reply"))
            self._answered_by[app] = answered
            for by in (self._heard_by, self._busy_by):
                by[app] = max(by.get(app, -math.inf), answered)
        self._push(at, "command", app, command)

    def _schedule_round(self) -> None:
        assert self._pacer is not None
        due = self._pacer.due_at()
        if due is None:
            return
        at = max(due, self.now)
        if self._round_at is None or at < self._round_at:
            self._round_at = at
            self._push(at, "round", "", None)

    def _fire_delayed(self, kind: str, app: str, data) -> bool:
        """Handle a delayed step (True), or leave ``kind`` to the instant RMS's code (False)."""
        assert self.delays is not None
        if kind == "arrive":
            self._waiting_arrivals -= 1
            self._count_opening(app)
            command, opened = self.now + self._delay("command"), self.now + self._delay("open")
            self._applied_by[app] = command
            # (the session first: at equal times the heap keeps this order, and a later command queues after it)
            self._push(command, "command", app, "open")
            self._in_flight += 1
            self._push(opened, "opened", app, None)
            self._heard_by[app] = self._busy_by[app] = opened  # its launcher runs first, then hears
        elif kind == "opened":
            self._run_commands(app, self.launchers[app].on_open(self.now, self.props))
        elif kind == "command":
            self._in_flight -= 1
            self._command_arrives(app, data)
        elif kind == "hear":
            if (answered := self._answered_by.get(app, -math.inf)) > self.now:
                self._push(answered, "hear", app, data)  # it awaits an answer: it hears of this after it
                return True
            method, args, size = data  # (views keep the time of their round, as live: ChangeNotify.now)
            for a, c in self._heard(app, method, args, size):
                self._run_commands(a, [c])
        elif kind == "round":
            self._round_at = None
            assert self._pacer is not None
            round_ = self._pacer.take(self.now)
            if round_ is not None:
                for a in round_[0]:
                    self._send_views(a)
            self._schedule_round()
        else:
            return False
        return True

    def _command_arrives(self, app: str, c) -> None:
        launcher = self.launchers[app]
        if c == "open":
            if self._pacer is not None:
                self._pacer.opened(app)
            self._feed(lambda: self.cores.handle(ev.OpenSession(at=self.now, app=app, app_kind=launcher.kind,
                                                                   adapts=launcher.adapts_to_views)))
            if self.delays.live_views and launcher.adapts_to_views:
                # the SDK asks for its views as they stand once subscribed (the first round may have gone
                # before it listened), within its opening
                schedule = self.cores.policy.schedule
                np_views = {c: schedule.np_view(app, c) for c in self.clusters}
                p_views = {c: schedule.p_view(app, c) for c in self.clusters} if launcher.wants_preemptive else {}
                size = cdr.change_notify([(c, len(v.times)) for c, v in [*np_views.items(), *p_views.items()]])
                if not self.delays.opening_views:  # (as before: counted; its launcher follows a round's)
                    self._hear_later(app, ("ignored", (), size))
                    return
                # its launcher has them as it starts to run, before any round's
                at = max(self.now, self._busy_by.get(app, -math.inf))
                self._views_by[app] = max(at, self._views_by.get(app, -math.inf))
                self._push(at, "hear", app, ("on_views", (Views(self.now, np_views, p_views),), size))
            return
        if isinstance(c, Submit) and c.replaces:
            answered: deque = deque()  # (its answer is heard at once: a request/reply)
            self._replace(app, c, answered)
            for a, later in answered:
                self._run_commands(a, [later])
            return
        if isinstance(c, Submit):
            self._count(cdr.request(app, [(r.id, cdr.where(r), r.related_to) for r in c.requests]))
            event: object = ev.Submit(at=self.now, app=app, requests=list(c.requests))
        elif isinstance(c, Done):
            self._count(cdr.done(app, c.request, len(c.released)))
            event = ev.Done(at=self.now, app=app, request=c.request, released=c.released)
        elif isinstance(c, Close):
            self._count(cdr.close(app))
            event = ev.CloseSession(at=self.now, app=app)
        elif isinstance(c, (Negotiate, Respond)):
            answered: deque = deque()  # (its answer is heard at once: a request/reply)
            self._negotiate(app, c, answered)
            for a, later in answered:
                self._run_commands(a, [later])
            return
        else:
            raise SimulationError(f"{app} sent an unknown command {c!r}")
        queue: deque = deque()
        self._apply(event, queue)
        for a, later in queue:
            self._run_commands(a, [later])

    def _send_views(self, app: str) -> list[tuple[str, object]]:
        launcher = self.launchers.get(app)
        record = self.apps.get(app)
        if launcher is None or launcher.finished or record is None:
            return []
        live_views = self.delays is not None and self.delays.live_views
        # with the views apart from the starts, a launcher follows its views until it hears its start (as
        # live: it may be shown its own request running first); else until the RMS starts it
        apart = self.delays is not None and self.delays.view_notify is not None
        follows = (record.heard_started if apart else record.started) is None or launcher.views_after_start
        if not follows and not live_views:
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
        size = cdr.change_notify([(c, len(view.times)) for c, _, view in changes])
        self._count(size)
        views = Views(self.now, np_views, p_views)
        if self.delays is not None:
            self._hear_later(app, ("on_views", (views,), size) if follows else ("ignored", (), size))
            return []
        return self._heard(app, "on_views", (views,), size)

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
            replace_refused=self.replace_refused,
        )
